"""global_window_attention against softmax attention over the rows each row may see, picked
by hand, and the numpy kernel against the reference."""

from __future__ import annotations

import numpy as np
import pytest

from iron_spec.operators import OPERATORS
from tests.operators.conftest import _check_kernel

GLOBAL = OPERATORS["global_window_attention"]


def _inputs(n, H=2, D=4, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, H, D)).astype(np.float32) for _ in range(6)]


def _attend(q, k, v, rows):
    # One head: softmax(q . k[rows] / sqrt(D)) v[rows].
    s = k[rows].astype(np.float64) @ q.astype(np.float64) / np.sqrt(len(q))
    p = np.exp(s - s.max())
    return (p / p.sum()) @ v[rows].astype(np.float64)


def test_local_rows_see_their_window_and_the_global_tokens_once():
    # 7 rows, window 1, row 5 global: row 1 sees 0, 1, 2 and 5; row 4 sees 3, 4 and 5 (its
    # neighbour 5 counted once); row 5 sees every row through the global projections.
    q, k, v, qg, kg, vg = _inputs(7)
    marks = np.array([0, 0, 0, 0, 0, 1, 0], np.int32)
    got, ref = _check_kernel(GLOBAL, q, k, v, qg, kg, vg, marks, window=1)
    out = ref.reshape(7, 2, 4)
    for h in range(2):
        np.testing.assert_allclose(out[1, h], _attend(q[1, h], k[:, h], v[:, h], [0, 1, 2, 5]),
                                   rtol=0, atol=1e-14)
        np.testing.assert_allclose(out[4, h], _attend(q[4, h], k[:, h], v[:, h], [3, 4, 5]),
                                   rtol=0, atol=1e-14)
        np.testing.assert_allclose(out[5, h], _attend(qg[5, h], kg[:, h], vg[:, h],
                                                      list(range(7))), rtol=0, atol=1e-14)


def test_without_global_tokens_it_is_the_window_alone():
    q, k, v, qg, kg, vg = _inputs(9)
    want = OPERATORS["self_attention"].reference(q, k, v, window=2)
    got = GLOBAL.reference(q, k, v, qg, kg, vg, np.zeros(9, np.int32), window=2)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-14)


@pytest.mark.parametrize("n, window, marked", [(1, 2, []), (12, 2, [0, 5]), (24, 3, [0, 12, 23]),
                                               (30, 8, [])])
def test_the_kernel_meets_the_reference(n, window, marked):
    marks = np.zeros(n, np.int32)
    marks[marked] = 1
    _check_kernel(GLOBAL, *_inputs(n, H=3, D=8, seed=n), marks, window=window)


def test_shapes_that_do_not_meet_are_refused():
    s = (8, 2, 4)
    with pytest.raises(ValueError, match="marks"):
        GLOBAL.shape(s, s, s, s, s, s, (7,), window=2)
    with pytest.raises(ValueError, match="window 0"):
        GLOBAL.shape(s, s, s, s, s, s, (8,), window=0)
