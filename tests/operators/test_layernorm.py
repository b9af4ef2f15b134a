"""LayerNorm: ``(x - mean) / sqrt(var + eps) * w + b`` per row, the biased variance."""

import numpy as np
import pytest

from iron_spec.operators import LayerNorm

OP = LayerNorm()


def test_reference_hand_case():
    # mean 2.5, biased variance 1.25: (x - 2.5) / sqrt(1.25).
    x = np.array([[1.0, 2.0, 3.0, 4.0]])
    expected = np.array([[-1.5, -0.5, 0.5, 1.5]]) / np.sqrt(1.25)
    np.testing.assert_allclose(OP.reference(x, np.ones(4), np.zeros(4), eps=0.0), expected,
                               rtol=1e-15)


def test_reference_weight_bias_and_eps():
    # x normalizes to [-1, 1] (mean 0, variance 1) when eps is 0; eps 3 halves it.
    x = np.array([[-1.0, 1.0]])
    w, b = np.array([2.0, 3.0]), np.array([10.0, 20.0])
    np.testing.assert_allclose(OP.reference(x, w, b, eps=0.0), [[8.0, 23.0]], rtol=1e-15)
    np.testing.assert_allclose(OP.reference(x, w, b, eps=3.0), [[9.0, 21.5]], rtol=1e-15)


def test_reference_a_constant_row_is_its_bias():
    x = np.full((1, 5), 7.0)
    b = np.arange(5.0)
    np.testing.assert_allclose(OP.reference(x, np.ones(5), b, eps=1e-12), [b], atol=1e-15)


def test_reference_without_bias():
    x = np.array([[0.0, 4.0]])  # mean 2, variance 4: [-1, 1]
    np.testing.assert_allclose(OP.reference(x, np.array([3.0, 3.0]), eps=0.0), [[-3.0, 3.0]])


@pytest.mark.parametrize("n,d", [(1, 8), (7, 64), (33, 384)])
def test_kernel_within_tolerance(check_kernel, randn, n, d):
    # An offset mean, as hidden states have: the kernel's two passes must not cancel.
    x = randn(n, d) + np.float32(5.0)
    check_kernel(OP, x, 1 + randn(d, scale=0.1), randn(d, scale=0.1), packed=(1, 2), eps=1e-12)


def test_kernel_without_bias(check_kernel, randn):
    check_kernel(OP, randn(4, 16), randn(16), packed=(1,), eps=1e-5)


def test_shape_refuses_a_mismatched_weight():
    with pytest.raises(ValueError, match="weight"):
        OP.shape((2, 8), (7,), (8,))


def test_reference_plus_one_scales_by_one_plus_weight():
    # As NemotronLayerNorm1P: x normalizes to [-1, 1]; weight [1, -0.5] scales by [2, 0.5].
    x = np.array([[-1.0, 1.0]])
    got = OP.reference(x, np.array([1.0, -0.5]), np.array([0.0, 1.0]), eps=0.0, plus_one=True)
    np.testing.assert_allclose(got, [[-2.0, 1.5]], rtol=1e-15)


def test_reference_per_head_rows():
    # (n, heads, d): each head's row normalized on its own. Head 0 [0, 4] -> [-1, 1];
    # head 1 [10, 12] -> [-1, 1] too (mean 11, variance 1).
    x = np.array([[[0.0, 4.0], [10.0, 12.0]]])
    np.testing.assert_allclose(OP.reference(x, np.ones(2), eps=0.0), [[[-1, 1], [-1, 1]]])


def test_kernel_per_head_within_tolerance(check_kernel, randn):
    check_kernel(OP, randn(5, 4, 16) + np.float32(3.0), 1 + randn(16, scale=0.1),
                 randn(16, scale=0.1), packed=(1, 2), eps=1e-5)


def test_kernel_plus_one_packs_the_one(check_kernel, randn):
    check_kernel(OP, randn(3, 32), randn(32, scale=0.1), randn(32, scale=0.1), packed=(1, 2),
                 eps=1e-5, plus_one=True)


def test_shape_refuses_a_vector():
    with pytest.raises(ValueError, match=r"\(n, \.\.\., d\)"):
        OP.shape((8,), (8,))


def test_reference_weights_per_head():
    # (1, 2 heads, 2): both heads normalize to [-1, 1]; head 0 scaled by [1, 2], head 1 by
    # [3, 4] and shifted by [0, 10], as StableLmLayerNormPerHead's own norm per head.
    x = np.array([[[0.0, 4.0], [10.0, 12.0]]])
    w, b = np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([[0.0, 0.0], [0.0, 10.0]])
    np.testing.assert_allclose(OP.reference(x, w, b, eps=0.0), [[[-1, 2], [-3, 14]]])


def test_kernel_weights_per_head_within_tolerance(check_kernel, randn):
    check_kernel(OP, randn(5, 4, 16), 1 + randn(4, 16, scale=0.1), randn(4, 16, scale=0.1),
                 packed=(1, 2), eps=1e-5)


def test_shape_takes_weights_per_head_only_of_a_per_head_x():
    assert OP.shape((2, 4, 8), (4, 8), (4, 8)) == (2, 4, 8)
    with pytest.raises(ValueError, match=r"weight \(2, 8\) is not one of \[\(8,\)\]"):
        OP.shape((2, 8), (2, 8))
    with pytest.raises(ValueError, match="bias"):
        OP.shape((2, 4, 8), (4, 8), (8,))
