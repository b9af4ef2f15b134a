"""Bidirectional self-attention over a call's rows: every row sees every row, nothing else."""

import math

import numpy as np
import pytest

from iron_spec.operators import SelfAttention
from iron_spec.operators.relative import relative_buckets

OP = SelfAttention()


def _loops(q, k, v, scale):
    """Attention written out one query at a time, from the definition."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    n, H, D = q.shape
    G = k.shape[1]
    out = np.zeros((n, H, D))
    for i in range(n):
        for h in range(H):
            g = h // (H // G)
            s = [scale * float(np.dot(q[i, h], k[j, g])) for j in range(n)]
            top = max(s)
            w = [math.exp(x - top) for x in s]
            out[i, h] = sum(wj * v[j, g] for wj, j in zip(w, range(n))) / sum(w)
    return out.reshape(n, H * D)


def test_reference_equal_keys_average_the_values():
    n, H, D = 3, 2, 4
    q = np.random.default_rng(0).standard_normal((n, H, D))
    k = np.ones((n, H, D))
    v = np.arange(n * H * D, dtype=np.float64).reshape(n, H, D)
    expected = np.broadcast_to(v.mean(axis=0), (n, H, D)).reshape(n, H * D)
    np.testing.assert_allclose(OP.reference(q, k, v), expected, rtol=1e-14)


def test_reference_a_single_row_is_its_value():
    v = np.array([[[1.0, 2.0], [3.0, 4.0]]])
    np.testing.assert_allclose(OP.reference(np.ones((1, 2, 2)), np.ones((1, 2, 2)), v),
                               [[1.0, 2.0, 3.0, 4.0]])


@pytest.mark.parametrize("H,G", [(4, 4), (4, 2)])
def test_reference_matches_the_definition(randn, H, G):
    q, k, v = randn(5, H, 8), randn(5, G, 8), randn(5, G, 8)
    np.testing.assert_allclose(OP.reference(q, k, v, scale=0.3), _loops(q, k, v, 0.3),
                               rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(OP.reference(q, k, v), _loops(q, k, v, 8 ** -0.5),
                               rtol=1e-12, atol=1e-14)


def test_no_row_is_masked():
    # The first row's output moves when the last row's value does: bidirectional.
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((4, 2, 8)) for _ in range(3))
    w = v.copy()
    w[-1] += 1.0
    assert not np.allclose(OP.reference(q, k, v)[0], OP.reference(q, k, w)[0])


@pytest.mark.parametrize("n,H,G,D", [(1, 4, 4, 8), (9, 12, 12, 32), (16, 8, 2, 16)])
def test_kernel_within_tolerance(check_kernel, randn, n, H, G, D):
    check_kernel(OP, randn(n, H, D, scale=2.0), randn(n, G, D, scale=2.0), randn(n, G, D))


def test_shape_refuses_rows_that_differ():
    with pytest.raises(ValueError, match="does not meet"):
        OP.shape((4, 2, 8), (3, 2, 8), (3, 2, 8))


def _banded_loops(q, k, v, scale, window):
    """_loops with row i seeing only rows j with |i - j| <= window (transformers'
    sliding_window_bidirectional_overlay), from the definition."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    n, H, D = q.shape
    G = k.shape[1]
    out = np.zeros((n, H, D))
    for i in range(n):
        seen = [j for j in range(n) if abs(i - j) <= window]
        for h in range(H):
            g = h // (H // G)
            s = [scale * float(np.dot(q[i, h], k[j, g])) for j in seen]
            w = [math.exp(x - max(s)) for x in s]
            out[i, h] = sum(wj * v[j, g] for wj, j in zip(w, seen)) / sum(w)
    return out.reshape(n, H * D)


def test_window_zero_sees_only_its_own_row():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((5, 2, 4)) for _ in range(3))
    np.testing.assert_allclose(OP.reference(q, k, v, window=0), v.reshape(5, 8), rtol=1e-14)


@pytest.mark.parametrize("window", [1, 2, 6])
def test_window_reference_and_kernel_match_the_definition(window):
    rng = np.random.default_rng(window)
    n, H, G, D = 7, 4, 2, 8
    q = rng.standard_normal((n, H, D)).astype(np.float32)
    k = rng.standard_normal((n, G, D)).astype(np.float32)
    v = rng.standard_normal((n, G, D)).astype(np.float32)
    want = _banded_loops(q, k, v, D ** -0.5, window)
    np.testing.assert_allclose(OP.reference(q, k, v, window=window), want, rtol=1e-12, atol=1e-14)
    out = np.empty((n, H * D), np.float32)
    scratch = np.empty(OP.scratch(q.shape, k.shape, v.shape, window=window), np.float32)
    OP.kernel(out, q, k, v, scratch=scratch, window=window)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


# --- a relative position bias ------------------------------------------------------------

# transformers' MPNetEncoder.relative_position_bucket(arange(-300, 301)) (32 buckets,
# max_distance 128), as (first relative position, bucket) where the bucket changes.
MPNET_BUCKETS = [(-300, 15), (-90, 14), (-63, 13), (-45, 12), (-31, 11), (-22, 10), (-15, 9),
                 (-11, 8), (-7, 7), (-6, 6), (-5, 5), (-4, 4), (-3, 3), (-2, 2), (-1, 1),
                 (0, 0), (1, 17), (2, 18), (3, 19), (4, 20), (5, 21), (6, 22), (7, 23),
                 (8, 24), (12, 25), (16, 26), (23, 27), (32, 28), (46, 29), (64, 30), (91, 31)]


def test_relative_buckets_are_mpnets():
    rel = np.arange(-300, 301)
    want = np.empty(rel.shape, np.int64)
    for (start, bucket), (end, _) in zip(MPNET_BUCKETS, MPNET_BUCKETS[1:] + [(301, None)]):
        want[(rel >= start) & (rel < end)] = bucket
    np.testing.assert_array_equal(relative_buckets(rel), want)


def test_relative_bias_by_hand(run_kernel):
    # Two rows, one head, q = 0: equal scores, so the bias decides. Row 0 sees row 1 at +1
    # (bucket 17: ln 3), itself at 0 (bucket 0: 0): weights 1/4, 3/4 of values 0 and 4.
    table = np.zeros((32, 1))
    table[17, 0] = math.log(3.0)
    q = np.zeros((2, 1, 2))
    k = np.ones((2, 1, 2))
    v = np.array([[[0.0, 0.0]], [[4.0, -4.0]]])
    # Row 1 sees row 0 at -1 (bucket 1: 0) and itself (0): the plain mean, 2.
    expected = [[3.0, -3.0], [2.0, -2.0]]
    np.testing.assert_allclose(OP.reference(q, k, v, table), expected, rtol=1e-12)
    np.testing.assert_allclose(run_kernel(OP, q, k, v, table), expected, rtol=1e-6)


def test_relative_bias_kernel_within_tolerance(check_kernel, randn):
    q, k, v = randn(40, 4, 8, scale=2.0), randn(40, 2, 8, scale=2.0), randn(40, 2, 8)
    table = randn(32, 4)
    got, ref = check_kernel(OP, q, k, v, table, max_distance=20)
    assert np.abs(ref - OP.reference(q, k, v)).max() > 1e-2


def test_relative_bias_table_of_other_heads_is_refused():
    with pytest.raises(ValueError, match="not \\(rows, 4 heads\\)"):
        OP.shape((3, 4, 8), (3, 4, 8), (3, 4, 8), (32, 2))
