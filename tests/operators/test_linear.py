"""Linear: ``x @ weight.T + bias`` (torch.nn.Linear, weight ``(out, in)``)."""

import numpy as np
import pytest

from iron_spec.operators import Linear

OP = Linear()
# A hand case: x (2, 3), weight (2, 3), bias (2,).
X = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
W = np.array([[1.0, 0.0, -1.0], [0.5, 0.5, 0.5]], np.float32)
B = np.array([10.0, -1.0], np.float32)
XW = [[1 - 3, 0.5 * (1 + 2 + 3)], [4 - 6, 0.5 * (4 + 5 + 6)]]  # [[-2, 3], [-2, 7.5]]
XW_B = [[-2 + 10, 3 - 1], [-2 + 10, 7.5 - 1]]


def test_reference_hand_case_without_bias():
    np.testing.assert_array_equal(OP.reference(X, W), XW)


def test_reference_hand_case_with_bias():
    np.testing.assert_array_equal(OP.reference(X, W, B), XW_B)


def test_kernel_hand_case(run_kernel):
    # Small integers and halves: float32 is exact here.
    np.testing.assert_array_equal(run_kernel(OP, X, W, packed=(1,)), XW)
    np.testing.assert_array_equal(run_kernel(OP, X, W, B, packed=(1, 2)), XW_B)


@pytest.mark.parametrize("n", [1, 7])  # a GEMV (one decode row) and a GEMM (a prompt chunk)
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_within_tolerance(check_kernel, randn, n, bias):
    inputs = [randn(n, 256), randn(96, 256, scale=0.1)] + ([randn(96)] if bias else [])
    check_kernel(OP, *inputs, packed=tuple(range(1, len(inputs))))


def test_shape_and_mismatches():
    assert OP.shape((4, 3), (2, 3)) == (4, 2)
    assert OP.shape((4, 3), (2, 3), (2,)) == (4, 2)
    with pytest.raises(ValueError):
        OP.shape((4, 3), (3, 2))  # weight is (out, in), not (in, out)
    with pytest.raises(ValueError):
        OP.shape((4, 3), (2, 3), (3,))
