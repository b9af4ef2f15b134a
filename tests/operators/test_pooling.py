"""Mean over a call's rows, L2 normalization of rows, tanh."""

import numpy as np
import pytest

from iron_spec.operators import L2Normalize, MeanRows, Tanh


def test_mean_rows_hand_case():
    x = np.array([[1.0, 10.0], [2.0, 20.0], [6.0, 0.0]])
    np.testing.assert_allclose(MeanRows().reference(x), [[3.0, 10.0]], rtol=1e-15)
    assert MeanRows().shape((3, 2)) == (1, 2)


def test_l2_normalize_hand_case():
    np.testing.assert_allclose(L2Normalize().reference(np.array([[3.0, 4.0], [0.0, -2.0]])),
                               [[0.6, 0.8], [0.0, -1.0]], rtol=1e-15)


def test_l2_normalize_a_zero_row_stays_zero():
    np.testing.assert_array_equal(L2Normalize().reference(np.zeros((1, 3))), np.zeros((1, 3)))


def test_tanh_hand_case():
    np.testing.assert_allclose(Tanh().reference(np.array([[0.0, np.log(3.0)]])), [[0.0, 0.8]],
                               rtol=1e-15)


@pytest.mark.parametrize("n", [1, 5, 128])
def test_kernels_within_tolerance(check_kernel, randn, n):
    check_kernel(MeanRows(), randn(n, 48) + np.float32(3.0))
    check_kernel(L2Normalize(), randn(n, 48))
    check_kernel(Tanh(), randn(n, 48, scale=3.0))
