"""depthwise_conv and dynamic_conv against sums written out by hand (torch's Conv1d
cross-correlation with padding kernel // 2; ConvBERT's softmaxed taps over unfold windows),
and the numpy kernels against the references."""

from __future__ import annotations

import numpy as np
import pytest

from iron_spec.operators import OPERATORS
from tests.operators.conftest import _check_kernel

DEPTHWISE, DYNAMIC = OPERATORS["depthwise_conv"], OPERATORS["dynamic_conv"]


def test_depthwise_is_a_cross_correlation_per_column_zero_padded():
    # Column 0 by taps (1, 2, 3): out[i] = x[i-1] + 2 x[i] + 3 x[i+1]; column 1 by (0, 1, 0).
    x = np.array([[1.0, 5.0], [2.0, 6.0], [4.0, 7.0]], np.float32)
    w = np.array([[1.0, 2.0, 3.0], [0.0, 1.0, 0.0]], np.float32)
    want = [[2 * 1 + 3 * 2, 5.0], [1 + 2 * 2 + 3 * 4, 6.0], [2 + 2 * 4, 7.0]]
    got, ref = _check_kernel(DEPTHWISE, x, w)
    np.testing.assert_allclose(got, want, rtol=0, atol=0)
    np.testing.assert_allclose(ref, want, rtol=0, atol=1e-15)


def test_dynamic_conv_weighs_each_rows_window_by_its_softmaxed_taps():
    # One head of 2 columns, kernel 3: row 1's logits (0, log 3, -inf) give taps (1/4, 3/4,
    # 0) over rows 0, 1, 2; row 0's window starts at a zero row.
    values = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)
    logits = np.array([[0.0, 0.0, 0.0], [0.0, np.log(3.0), -1e30], [5.0, -1e30, -1e30]],
                      np.float32)
    want = [[(0 + 1 + 3) / 3, (0 + 2 + 4) / 3], [0.25 * 1 + 0.75 * 3, 0.25 * 2 + 0.75 * 4],
            [3.0, 4.0]]
    got, ref = _check_kernel(DYNAMIC, logits, values, heads=1, kernel=3)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
    # The logit log 3 is float32 here: the taps are 1/4, 3/4 to its rounding.
    np.testing.assert_allclose(ref, want, rtol=1e-7, atol=0)


def test_dynamic_conv_heads_read_their_own_columns_and_taps():
    # Two heads of one column, kernel 1: each row's one tap is 1 whatever its logit.
    values = np.array([[1.0, -2.0], [3.0, 4.0]], np.float32)
    got, _ = _check_kernel(DYNAMIC, np.array([[7.0, -3.0], [0.0, 9.0]], np.float32), values,
                           heads=2, kernel=1)
    np.testing.assert_allclose(got, values, rtol=0, atol=0)


@pytest.mark.parametrize("n, heads, kernel", [(1, 2, 5), (11, 2, 5), (24, 4, 9), (3, 1, 7)])
def test_kernels_meet_the_references(n, heads, kernel):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, 16)).astype(np.float32)
    _check_kernel(DEPTHWISE, x, rng.standard_normal((16, kernel)).astype(np.float32))
    logits = rng.standard_normal((n, heads * kernel)).astype(np.float32) * 3
    _check_kernel(DYNAMIC, logits, x, heads=heads, kernel=kernel)


def test_even_kernels_and_shapes_that_do_not_meet_are_refused():
    with pytest.raises(ValueError, match="kernel 4 is not an odd number"):
        DEPTHWISE.shape((3, 2), (2, 4))
    with pytest.raises(ValueError, match="do not meet"):
        DYNAMIC.shape((3, 6), (3, 5), heads=2, kernel=3)
