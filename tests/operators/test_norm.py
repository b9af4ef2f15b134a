"""RMSNorm: ``x / sqrt(mean(x^2) + eps) * w``, or ``* (1 + w)`` (Gemma) via ``pack``."""

import numpy as np
import pytest

from iron_spec.operators import RMSNorm

OP = RMSNorm()


def test_reference_hand_case():
    # mean(x^2) = 4, so rms = 2 and x / rms = [1, -1, 1, -1].
    x = np.array([[2.0, -2.0, 2.0, -2.0]])
    w = np.array([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_allclose(OP.reference(x, w, eps=0.0), [[1.0, -2.0, 3.0, -4.0]], rtol=1e-15)


def test_reference_eps_enters_under_the_root():
    # mean(x^2) = 1, eps = 3: divide by sqrt(4) = 2.
    x = np.array([[1.0, -1.0]])
    np.testing.assert_allclose(OP.reference(x, np.ones(2), eps=3.0), [[0.5, -0.5]], rtol=1e-15)


def test_reference_rows_are_independent():
    x = np.array([[3.0, 4.0], [30.0, 40.0]])  # mean(x^2) 12.5 and 1250
    expected = np.array([[3.0, 4.0]]) / np.sqrt(12.5)
    np.testing.assert_allclose(OP.reference(x, np.ones(2), eps=0.0), np.vstack([expected] * 2),
                               rtol=1e-15)


def test_reference_plus_one_scales_by_one_plus_weight():
    x = np.array([[2.0, -2.0]])  # normalizes to [1, -1]
    w = np.array([0.0, 1.0])
    np.testing.assert_allclose(OP.reference(x, w, eps=0.0, plus_one=True), [[1.0, -2.0]],
                               rtol=1e-15)


def test_pack_adds_one_only_for_plus_one():
    w = np.array([0.0, 1.0, -0.5], np.float32)
    np.testing.assert_array_equal(OP.pack(1, w, plus_one=True), [1.0, 2.0, 0.5])
    np.testing.assert_array_equal(OP.pack(1, w, plus_one=False), w)
    assert OP.pack(1, w, plus_one=True).dtype == np.float32


def test_kernel_hand_case_with_packed_plus_one(run_kernel):
    x = np.array([[2.0, -2.0, 2.0, -2.0]], np.float32)
    w = np.array([0.0, 1.0, 2.0, 3.0], np.float32)  # packed to [1, 2, 3, 4]
    got = run_kernel(OP, x, w, packed=(1,), eps=0.0, plus_one=True)
    np.testing.assert_array_equal(got, [[1.0, -2.0, 3.0, -4.0]])


def test_zero_row_is_zero_not_nan(run_kernel):
    x = np.zeros((1, 8), np.float32)
    w = np.ones(8, np.float32)
    np.testing.assert_array_equal(OP.reference(x, w, eps=1e-6), x)
    np.testing.assert_array_equal(run_kernel(OP, x, w, packed=(1,), eps=1e-6), x)


@pytest.mark.parametrize("plus_one", [False, True])
@pytest.mark.parametrize("eps", [1e-6, 1e-5])
@pytest.mark.parametrize("n,d", [(1, 64), (5, 576)])
def test_kernel_within_tolerance(check_kernel, randn, plus_one, eps, n, d):
    x = randn(n, d, scale=3.0)
    w = randn(d, scale=0.2) + (0.0 if plus_one else 1.0)
    check_kernel(OP, x, w, packed=(1,), eps=eps, plus_one=plus_one)


def test_kernel_output_has_unit_rms_with_unit_weight(run_kernel, randn):
    x = randn(4, 128, scale=7.0)
    got = run_kernel(OP, x, np.ones(128, np.float32), packed=(1,), eps=0.0)
    np.testing.assert_allclose(np.sqrt(np.mean(got.astype(np.float64) ** 2, axis=-1)), 1.0,
                               rtol=1e-6)


def test_shape_mismatch():
    assert OP.shape((3, 8), (8,)) == (3, 8)
    with pytest.raises(ValueError):
        OP.shape((3, 8), (4,))
