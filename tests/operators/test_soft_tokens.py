"""What a tower's soft tokens meet: average pooling over a patch grid (torch's AvgPool2d by
hand), placing soft rows (masked_scatter), and attention whose rows reach past their own
position (an image's rows see the whole image; transformers' blockwise mask by hand)."""

import numpy as np
import pytest

from iron_spec.operators import Attention, AveragePool, PlaceRows, ReachAttention

POOL, PLACE, REACH = AveragePool(), PlaceRows(), ReachAttention()


def test_average_pool_is_avgpool2d_by_hand(check_kernel, randn):
    x = randn(36, 5)  # a 6x6 grid of rows
    got, _ = check_kernel(POOL, x, side=6, kernel=3)
    grid = x.astype(np.float64).reshape(6, 6, 5)
    want = np.array([[grid[3 * i: 3 * i + 3, 3 * j: 3 * j + 3].mean(axis=(0, 1))
                      for j in range(2)] for i in range(2)]).reshape(4, 5)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_average_pool_refuses_a_grid_the_windows_do_not_tile():
    with pytest.raises(ValueError, match="tile"):
        POOL.shape((36, 5), side=6, kernel=4)
    with pytest.raises(ValueError, match="grid"):
        POOL.shape((35, 5), side=6, kernel=3)


def test_place_rows_replaces_the_masked_rows_exactly(run_kernel, randn):
    x, soft = randn(6, 4), randn(6, 4)
    mask = np.array([0, 1, 1, 0, 0, 1], np.int32)
    got = run_kernel(PLACE, x, soft, mask)
    for i in range(6):
        np.testing.assert_array_equal(got[i], soft[i] if mask[i] else x[i])
    np.testing.assert_array_equal(PLACE.reference(x, soft, mask), got)


def blockwise(n, start, groups, window=None):
    """transformers' mask for a chunk of ``n`` rows at ``start``: causal, or'ed with
    ``blockwise_overlay`` over ``groups`` (runs [a, b)), and'ed with the sliding window
    (``create_masks_for_vision_model``): ``(n, start + n)``."""
    group = np.full(start + n, -1)
    for g, (a, b) in enumerate(groups):
        group[a:b] = g
    q = np.arange(start, start + n)[:, None]
    k = np.arange(start + n)[None, :]
    allowed = (k <= q) | ((group[q] == group[k]) & (group[q] >= 0))
    if window is not None:
        allowed &= k > q - window
    return allowed


def attention_by_hand(q, keys, values, allowed, scale):
    n, H, D = q.shape
    G = keys.shape[0]
    k = np.repeat(keys.astype(np.float64), H // G, 0)
    v = np.repeat(values.astype(np.float64), H // G, 0)
    s = np.einsum("nhd,htd->hnt", q.astype(np.float64), k[:, :allowed.shape[1]]) * scale
    s = np.where(allowed[None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hnt,htd->nhd", p, v[:, :allowed.shape[1]]).reshape(n, -1)


@pytest.mark.parametrize("window", [None, 5])
def test_reach_attention_is_the_blockwise_mask(check_kernel, randn, window):
    start, n, L = 3, 10, 16
    q, keys, values = randn(n, 4, 8), randn(2, L, 8), randn(2, L, 8)
    groups = [(5, 9), (9, 12)]  # two images side by side: neither sees the other's later rows
    reach = np.arange(start, start + n, dtype=np.int32)
    for a, b in groups:
        reach[a - start: b - start] = b - 1
    got, _ = check_kernel(REACH, q, keys, values, reach, start=start, scale=0.3, window=window)
    want = attention_by_hand(q, keys, values, blockwise(n, start, groups, window), 0.3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_reach_attention_at_own_positions_is_causal_attention(run_kernel, randn):
    start, n = 4, 7
    q, keys, values = randn(n, 4, 8), randn(2, 12, 8), randn(2, 12, 8)
    reach = np.arange(start, start + n, dtype=np.int32)
    got = run_kernel(REACH, q, keys, values, reach, start=start, window=3, softcap=20.0)
    want = Attention().reference(q, keys, values, start=start, window=3, softcap=20.0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_reach_attention_refuses_shapes_that_do_not_meet():
    with pytest.raises(ValueError, match="reach"):
        REACH.shape((4, 2, 8), (2, 9, 8), (2, 9, 8), (5,))
