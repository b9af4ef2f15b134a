"""KVWrite and causal GQA attention over a ``(kv_heads, L, head_dim)`` cache (rows that see
their whole call, and a relative position bias, too)."""

import math

import numpy as np
import pytest

from iron_spec.operators import Attention, KVWrite, native
from iron_spec.operators.attention import alibi_bias, alibi_slopes, bfloat16
from iron_spec.operators.relative import position_bias

OP = Attention()
KV = KVWrite()


# --- KVWrite ---------------------------------------------------------------------------

def test_kv_write_places_rows_at_start(run_kernel, randn):
    x = randn(2, 3, 4)  # (n, kv_heads, head_dim)
    cache = np.zeros((3, 6, 4), np.float32)
    for written in (run_kernel(KV, x, cache, start=4), KV.reference(x, cache.copy(), start=4)):
        assert written.shape == (3, 6, 4)
        for i in range(2):
            for g in range(3):
                np.testing.assert_array_equal(written[g, 4 + i], x[i, g])
        np.testing.assert_array_equal(written[:, :4], 0.0)  # earlier positions untouched


def test_kv_write_kernel_writes_the_cache_in_place(randn):
    x = randn(1, 2, 4)
    cache = np.zeros((2, 5, 4), np.float32)
    KV.kernel(np.empty(0, np.float32), x, cache, scratch=np.empty(1, np.float32), start=2)
    np.testing.assert_array_equal(cache[:, 2], x[0])
    np.testing.assert_array_equal(np.delete(cache, 2, axis=1), 0.0)


def test_kv_write_shape_mismatch():
    assert KV.shape((1, 2, 4), (2, 9, 4)) == (2, 9, 4)
    with pytest.raises(ValueError):
        KV.shape((1, 3, 4), (2, 9, 4))


# --- attention: hand cases -------------------------------------------------------------

def _cache(*rows_per_head):
    """A float64 cache from per-kv-head lists of rows (the kernel gets it in float32)."""
    return np.array(rows_per_head, np.float64)


def test_one_key_returns_its_value(run_kernel, randn):
    # A query at position 0 sees one key: softmax weight 1, output = that value, per head.
    q = randn(1, 4, 8)
    keys, values = randn(2, 5, 8), randn(2, 5, 8)
    expected = np.repeat(values[:, 0], 2, axis=0).reshape(1, 32)  # heads 0,1 -> kv 0; 2,3 -> kv 1
    np.testing.assert_allclose(OP.reference(q, keys, values), expected, rtol=1e-15)
    np.testing.assert_allclose(run_kernel(OP, q, keys, values), expected, rtol=1e-6)


def test_two_keys_by_hand(run_kernel):
    # head_dim 4, default scale 4 ** -0.5 = 0.5: scores 0 and 0.5 * 2 ln 3 = ln 3, so
    # weights 1/4 and 3/4, and values 0 and 4 give 3.
    q = np.array([[[1.0, 0.0, 0.0, 0.0]]])
    keys = _cache([[0.0, 0.0, 0.0, 0.0], [2 * math.log(3.0), 0.0, 0.0, 0.0]])
    values = _cache([[0.0, 0.0, 8.0, 0.0], [4.0, 4.0, 0.0, 0.0]])
    expected = [[3.0, 3.0, 2.0, 0.0]]  # 1/4 * v0 + 3/4 * v1
    np.testing.assert_allclose(OP.reference(q, keys, values, start=1), expected, rtol=1e-12)
    np.testing.assert_allclose(run_kernel(OP, q, keys, values, start=1), expected,
                               rtol=1e-6, atol=1e-6)


def test_explicit_scale_replaces_default(run_kernel):
    # scale 1: scores 0 and ln 3 directly (head_dim 1 would give the same with the default).
    q = np.array([[[math.log(3.0), 0.0]]])
    keys = _cache([[0.0, 0.0], [1.0, 0.0]])
    values = _cache([[0.0, 0.0], [1.0, -1.0]])
    expected = [[0.75, -0.75]]
    np.testing.assert_allclose(OP.reference(q, keys, values, start=1, scale=1.0), expected,
                               rtol=1e-12)
    np.testing.assert_allclose(run_kernel(OP, q, keys, values, start=1, scale=1.0), expected,
                               rtol=1e-6)


def test_equal_scores_average_the_values():
    q = np.zeros((1, 1, 2))
    keys = np.ones((1, 3, 2))
    values = _cache([[3.0, 0.0], [0.0, 6.0], [0.0, 0.0]])
    np.testing.assert_allclose(OP.reference(q, keys, values, start=2), [[1.0, 2.0]], rtol=1e-15)


def test_softcap_by_hand(run_kernel):
    # Score 100 capped at 1 * tanh(100 / 1) = 1 (to 1e-86): weights 1 : e, values 0 and 1.
    q = np.array([[[100.0]]])
    keys = _cache([[0.0], [1.0]])
    values = _cache([[0.0], [1.0]])
    expected = math.e / (1.0 + math.e)  # 0.7310585786300049
    np.testing.assert_allclose(OP.reference(q, keys, values, start=1, softcap=1.0), [[expected]],
                               rtol=1e-12)
    np.testing.assert_allclose(run_kernel(OP, q, keys, values, start=1, softcap=1.0),
                               [[expected]], rtol=1e-6)
    # without the cap, the second key takes all the weight
    np.testing.assert_allclose(OP.reference(q, keys, values, start=1), [[1.0]], rtol=1e-12)


def test_rows_of_weights_sum_to_one():
    # With every value 1 the output is the sum of the softmax weights.
    rng = np.random.default_rng(3)
    q = rng.standard_normal((5, 4, 8)) * 3
    keys = rng.standard_normal((2, 9, 8)) * 3
    out = OP.reference(q, keys, np.ones((2, 9, 8)), start=4, window=3, softcap=5.0)
    np.testing.assert_allclose(out, 1.0, rtol=1e-14)


# --- attention: masks and cache reads --------------------------------------------------

def _both(run_kernel, q, keys, values, **attrs):
    return [OP.reference(q, keys, values, **attrs), run_kernel(OP, q, keys, values, **attrs)]


def test_causal_query_ignores_later_keys(run_kernel, randn):
    n = 6
    q, keys, values = randn(n, 2, 8), randn(1, n, 8), randn(1, n, 8)
    base = _both(run_kernel, q, keys, values)
    for p in range(n - 1):
        k2, v2 = keys.copy(), values.copy()
        k2[:, p + 1:] = randn(1, n - p - 1, 8, scale=10.0)
        v2[:, p + 1:] = randn(1, n - p - 1, 8, scale=10.0)
        for before, after in zip(base, _both(run_kernel, q, k2, v2)):
            np.testing.assert_allclose(after[: p + 1], before[: p + 1], rtol=0, atol=1e-6)
            assert not np.allclose(after[p + 1:], before[p + 1:])  # later rows do see them


def test_decode_reads_only_cache_up_to_its_position(run_kernel, randn):
    # Positions after p hold NaN (unwritten cache); a query at p must not see them, and its
    # output is that of a cache holding positions 0..p alone.
    p, L = 4, 10
    q = randn(1, 4, 8)
    keys, values = randn(2, L, 8), randn(2, L, 8)
    keys[:, p + 1:] = np.nan
    values[:, p + 1:] = np.nan
    short = _both(run_kernel, q, keys[:, : p + 1].copy(), values[:, : p + 1].copy(), start=p)
    for got, want in zip(_both(run_kernel, q, keys, values, start=p), short):
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_decode_equals_the_prompt_row(run_kernel, randn):
    # One query at p with start=p gives row p of a whole-prompt call; so does a chunk.
    n = 7
    q, keys, values = randn(n, 4, 16), randn(2, n, 16), randn(2, n, 16)
    for window in (None, 3):
        ref_all, got_all = _both(run_kernel, q, keys, values, window=window)
        for p in (0, 3, 6):
            ref, got = _both(run_kernel, q[p: p + 1], keys, values, start=p, window=window)
            np.testing.assert_allclose(ref, ref_all[p: p + 1], rtol=1e-12)
            np.testing.assert_allclose(got, got_all[p: p + 1], rtol=1e-5, atol=1e-6)
        ref, got = _both(run_kernel, q[4:], keys, values, start=4, window=window)  # a chunk
        np.testing.assert_allclose(ref, ref_all[4:], rtol=1e-12)
        np.testing.assert_allclose(got, got_all[4:], rtol=1e-5, atol=1e-6)


def test_gqa_equals_repeated_kv_heads(run_kernel, randn):
    # transformers' repeat_kv: kv head g serves query heads g * R .. g * R + R - 1.
    q, keys, values = randn(3, 6, 8), randn(2, 5, 8), randn(2, 5, 8)
    for grouped, repeated in zip(
            _both(run_kernel, q, keys, values, start=2),
            _both(run_kernel, q, np.repeat(keys, 3, axis=0), np.repeat(values, 3, axis=0),
                  start=2)):
        np.testing.assert_allclose(grouped, repeated, rtol=1e-5, atol=1e-6)
    # and it is not the tiled order (head h reading kv head h % G)
    tiled = OP.reference(q, np.tile(keys, (3, 1, 1)), np.tile(values, (3, 1, 1)), start=2)
    assert not np.allclose(OP.reference(q, keys, values, start=2), tiled)


def test_heads_are_concatenated_in_order(randn):
    # Output columns h * D .. (h + 1) * D are head h alone.
    q, keys, values = randn(2, 4, 8), randn(4, 2, 8), randn(4, 2, 8)
    out = OP.reference(q, keys, values)
    for h in range(4):
        alone = OP.reference(q[:, h: h + 1], keys[h: h + 1], values[h: h + 1])
        np.testing.assert_allclose(out[:, 8 * h: 8 * h + 8], alone, rtol=1e-14)


def test_window_one_sees_only_its_own_position(run_kernel, randn):
    q, keys, values = randn(5, 2, 4), randn(1, 5, 4), randn(1, 5, 4)
    expected = np.repeat(values[0][:, None], 2, axis=1).reshape(5, 8)
    for got in _both(run_kernel, q, keys, values, window=1):
        np.testing.assert_allclose(got, expected, rtol=1e-6)


@pytest.mark.parametrize("window", [2, 3])
def test_window_sees_keys_p_minus_window_plus_one_to_p(run_kernel, randn, window):
    # transformers' sliding_window: a query at p attends kv positions p - window + 1 .. p.
    n = 8
    q, keys, values = randn(n, 2, 4), randn(1, n, 4), randn(1, n, 4)
    base = _both(run_kernel, q, keys, values, window=window)
    for p in range(window, n):
        first_seen = p - window + 1
        k2, v2 = keys.copy(), values.copy()
        k2[:, :first_seen] = randn(1, first_seen, 4, scale=10.0)
        v2[:, :first_seen] = randn(1, first_seen, 4, scale=10.0)
        for before, after in zip(base, _both(run_kernel, q, k2, v2, window=window)):
            # rows p.. all start at or after first_seen
            np.testing.assert_allclose(after[p:], before[p:], rtol=0, atol=1e-6)
        # the oldest key in the window does count
        v3 = values.copy()
        v3[:, first_seen] += 5.0
        assert not np.allclose(OP.reference(q, keys, v3, window=window)[p], base[0][p])


def test_window_at_least_the_sequence_is_no_window(randn):
    q, keys, values = randn(4, 2, 8), randn(2, 4, 8), randn(2, 4, 8)
    np.testing.assert_allclose(OP.reference(q, keys, values, window=4),
                               OP.reference(q, keys, values), rtol=1e-15)


# --- attention: kernel against reference -----------------------------------------------

@pytest.mark.parametrize("n,H,G,D,start,L,window,softcap", [
    (1, 4, 4, 16, 0, 8, None, None),      # first decode step
    (1, 9, 3, 64, 40, 64, None, None),    # decode deep in a GQA cache (SmolLM2's 9 / 3)
    (7, 8, 2, 32, 0, 16, None, None),     # a prompt
    (5, 4, 1, 32, 6, 16, None, None),     # a later chunk, MQA
    (6, 4, 2, 16, 3, 12, 4, None),        # sliding window, chunk
    (1, 4, 2, 16, 20, 32, 5, None),       # sliding window, decode
    (4, 4, 2, 16, 2, 8, None, 50.0),      # softcap (Gemma 2's 50)
    (3, 2, 2, 256, 1, 8, 2, 30.0),        # all at once, wide heads
])
def test_kernel_within_tolerance(check_kernel, randn, n, H, G, D, start, L, window, softcap):
    q = randn(n, H, D, scale=2.0)
    keys, values = randn(G, L, D, scale=2.0), randn(G, L, D)
    check_kernel(OP, q, keys, values, start=start, window=window, softcap=softcap)


def test_kernel_with_explicit_scale_within_tolerance(check_kernel, randn):
    check_kernel(OP, randn(3, 4, 16), randn(2, 8, 16), randn(2, 8, 16), start=2, scale=0.3)


def test_shape_and_mismatches():
    assert OP.shape((3, 6, 8), (2, 10, 8), (2, 10, 8)) == (3, 48)
    with pytest.raises(ValueError):
        OP.shape((3, 5, 8), (2, 10, 8), (2, 10, 8))  # 5 heads do not group into 2
    with pytest.raises(ValueError):
        OP.shape((3, 6, 8), (2, 10, 4), (2, 10, 4))  # head_dim differs
    with pytest.raises(ValueError):
        OP.shape((3, 6, 8), (2, 10, 8), (2, 9, 8))   # keys and values differ


@pytest.mark.parametrize("window", [None, 700])
def test_one_query_over_a_long_cache_matches_the_reference(window):
    # Past attention.LONG positions one query runs a GEMV per head: same definition.
    from iron_spec.operators.attention import LONG
    op = Attention()
    rng = np.random.default_rng(5)
    G, R, D, L = 2, 3, 16, 1200
    q = rng.standard_normal((1, G * R, D)).astype(np.float32)
    keys = rng.standard_normal((G, L, D)).astype(np.float32)
    values = rng.standard_normal((G, L, D)).astype(np.float32)
    start = 1000
    assert start + 1 - (0 if window is None else start - window + 1) >= LONG
    out = np.empty((1, G * R * D), np.float32)
    scratch = np.empty(op.scratch(q.shape, keys.shape, values.shape), np.float32)
    op.kernel(out, q, keys, values, scratch=scratch, start=start, window=window)
    want = op.reference(q, keys, values, start=start, window=window)
    tol = op.tolerance(q.shape, keys.shape, values.shape)
    assert np.all(np.abs(out - want) <= tol.bound(op.scale(want, q, keys, values, start=start)))


# --- a ring: a sliding window's cache of the last ``ring`` positions ----------------------

def test_kv_write_into_a_ring_wraps_past_its_end(run_kernel, randn):
    # Positions 5, 6, 7 in a ring of 6 rows: rows 5, 0, 1.
    x = randn(3, 2, 4)
    cache = np.zeros((2, 6, 4), np.float32)
    for written in (run_kernel(KV, x, cache, start=5, ring=6),
                    KV.reference(x, cache.copy(), start=5, ring=6)):
        for i, row in enumerate((5, 0, 1)):
            np.testing.assert_array_equal(written[:, row], x[i])
        np.testing.assert_array_equal(written[:, 2:5], 0.0)
    with pytest.raises(ValueError):
        KV.shape((7, 2, 4), (2, 6, 4), ring=6)  # more rows than the ring holds


def _ring_of(cache, t, ring):
    """The last ``ring`` of positions ``0 .. t - 1`` of ``cache``, each at row ``p % ring``."""
    out = np.zeros(cache.shape[:1] + (ring,) + cache.shape[2:], cache.dtype)
    lo = max(0, t - ring)
    out[:, np.arange(lo, t) % ring] = cache[:, lo:t]
    return out


@pytest.mark.parametrize("n,start,window,ring", [
    (5, 20, 4, 8),     # a chunk whose window and rows wrap past the ring's end
    (5, 3, 4, 8),      # the first positions, no wrap yet
    (1, 30, 6, 6),     # one query, the ring exactly its window
    (70, 100, 8, 77),  # more rows than a block of the prompt kernel, over a wrap
])
def test_attention_over_a_ring_is_the_whole_cache(run_kernel, randn, n, start, window, ring):
    t = start + n
    q, keys, values = randn(n, 4, 16), randn(2, t, 16), randn(2, t, 16)
    want = OP.reference(q, keys, values, start=start, window=window)
    rk, rv = _ring_of(keys, t, ring), _ring_of(values, t, ring)
    np.testing.assert_allclose(OP.reference(q, rk, rv, start=start, window=window, ring=ring),
                               want, rtol=1e-12, atol=1e-12)
    whole = run_kernel(OP, q, keys, values, start=start, window=window)
    got = run_kernel(OP, q, rk, rv, start=start, window=window, ring=ring)
    assert got.tobytes() == whole.tobytes()
    if n == 1 and native.lib() is not None:  # and the numpy kernel, bit for bit too
        lib = native.LIB
        try:
            native.LIB = None
            assert run_kernel(OP, q, rk, rv, start=start, window=window, ring=ring).tobytes() \
                == run_kernel(OP, q, keys, values, start=start, window=window).tobytes()
        finally:
            native.LIB = lib


def test_a_ring_shorter_than_its_window_and_rows_is_refused():
    with pytest.raises(ValueError, match="does not hold a window"):
        OP.shape((5, 4, 16), (2, 7, 16), (2, 7, 16), window=4, ring=7)  # needs 4 + 5 - 1
    with pytest.raises(ValueError, match="does not hold a window"):
        OP.shape((1, 4, 16), (2, 7, 16), (2, 7, 16), ring=7)  # a ring without a window
    assert OP.shape((5, 4, 16), (2, 8, 16), (2, 8, 16), window=4, ring=8) == (5, 64)


# --- ALiBi -----------------------------------------------------------------------------

def test_alibi_by_hand(run_kernel):
    # Equal scores (q = 0); slope ln 2: the key one position back scores -ln 2, weights
    # 1/3 and 2/3 for keys 0 and 1 from the query at 1; values 0 and 3 give 2.
    q = np.zeros((1, 1, 2))
    keys = np.ones((1, 2, 2))
    values = _cache([[0.0, 0.0], [3.0, -3.0]])
    alibi = (math.log(2.0),)
    expected = [[2.0, -2.0]]
    np.testing.assert_allclose(OP.reference(q, keys, values, start=1, alibi=alibi), expected,
                               rtol=1e-12)
    np.testing.assert_allclose(run_kernel(OP, q, keys, values, start=1, alibi=alibi), expected,
                               rtol=1e-6)
    # Two rows at once (a prompt): row 0 sees key 0 alone, row 1 as above.
    q2 = np.zeros((2, 1, 2))
    np.testing.assert_allclose(run_kernel(OP, q2, keys, values, start=0, alibi=alibi),
                               [[0.0, 0.0], [2.0, -2.0]], rtol=1e-6, atol=1e-7)


def _bloom_slopes(heads):
    # transformers' modeling_bloom.build_alibi_tensor's slopes, transcribed in float64.
    closest = 2 ** math.floor(math.log2(heads))
    base = 2 ** (-(2 ** -(math.log2(closest) - 3)))
    slopes = [base ** p for p in range(1, 1 + closest)]
    if closest != heads:
        extra = 2 ** (-(2 ** -(math.log2(2 * closest) - 3)))
        slopes += [extra ** p for p in range(1, 1 + 2 * min(closest, heads - closest), 2)]
    return slopes


def _mpt_slopes(heads, max_bias):
    # transformers' modeling_mpt.build_mpt_alibi_tensor's slopes, transcribed in float64.
    p2 = 2 ** math.ceil(math.log2(heads))
    slopes = [1.0 / 2 ** (i * max_bias / p2) for i in range(1, p2 + 1)]
    if p2 != heads:
        slopes = (slopes[1::2] + slopes[::2])[:heads]
    return slopes


@pytest.mark.parametrize("heads", [1, 2, 3, 4, 5, 6, 8, 12, 16, 20, 32, 40, 71])
def test_alibi_slopes_are_blooms_and_mpts(heads):
    np.testing.assert_allclose(alibi_slopes(heads), _bloom_slopes(heads), rtol=1e-7)
    np.testing.assert_allclose(alibi_slopes(heads, 16.0), _mpt_slopes(heads, 16.0), rtol=1e-7)
    assert alibi_slopes(8) == tuple(2.0 ** -i for i in range(1, 9))  # the paper's 1/2 .. 1/256


@pytest.mark.parametrize("n,H,G,D,start,L,window,ring", [
    (1, 4, 2, 16, 20, 32, None, None),    # decode
    (1, 6, 6, 8, 600, 640, None, None),   # decode past LONG: a GEMV per head
    (16, 6, 3, 16, 0, 32, None, None),    # a prompt chunk
    (7, 4, 1, 16, 9, 32, None, None),     # a later chunk, MQA
    (70, 2, 2, 8, 3, 80, None, None),     # more rows than a BLOCK
    (6, 4, 2, 16, 12, 20, 5, 10),         # a window's ring
])
def test_alibi_kernel_within_tolerance(check_kernel, randn, n, H, G, D, start, L, window, ring):
    alibi = alibi_slopes(H)
    q = randn(n, H, D, scale=2.0)
    keys, values = randn(G, ring or L, D, scale=2.0), randn(G, ring or L, D)
    got, ref = check_kernel(OP, q, keys, values, start=start, window=window, ring=ring,
                            alibi=alibi)
    plain = OP.reference(q, keys, values, start=start, window=window, ring=ring)
    assert np.abs(ref - plain).max() > 1e-2  # the bias moved every case


@pytest.mark.skipif(native.LIB is None, reason="operators._cpu not built")
def test_alibi_steps_run_on_the_pool(randn):
    # The C kernels take the slopes: a step with alibi lowers (tests/operators/test_program.py
    # judges what it computes).
    q, keys, values = randn(1, 2, 8), randn(2, 4, 8), randn(2, 4, 8)
    out = np.empty((1, 16), np.float32)
    scratch = np.empty(OP.scratch(q.shape, keys.shape, values.shape), np.float32)
    assert OP.lower(out, q, keys, values, scratch=scratch, alibi=(0.5, 0.25)) is not None


def test_alibi_of_other_heads_is_refused():
    with pytest.raises(ValueError, match="3 alibi slopes for 2 heads"):
        OP.shape((1, 2, 8), (2, 4, 8), (2, 4, 8), alibi=(0.5, 0.25, 0.125))
    with pytest.raises(ValueError, match="max_bias"):
        alibi_slopes(4, 0.0)


def test_bfloat16_rounds_to_nearest_even():
    # bfloat16 keeps 8 significant bits: 2 ** -0.5 = 0.70710677 -> 0.70703125 (181 / 256);
    # 257 lies halfway between 256 and 258 and goes to the even 256; 259 to 260.
    got = bfloat16(np.array([2 ** -0.5, 257.0, 259.0, 1.0, -3.0], np.float32))
    np.testing.assert_array_equal(got, [181 / 256, 256.0, 260.0, 1.0, -3.0])


def test_falcons_alibi_form_by_hand():
    # bfloat16(bfloat16(slope) * key) * scale over absolute key positions, the same for
    # every query: slope 2 ** -0.5 -> 181/256; key 3: 543/256 = 2.12109375 -> 2.125.
    bias = alibi_bias((2 ** -0.5,), np.array([5, 6]), np.array([0, 3]), 0.5)
    np.testing.assert_array_equal(bias, [[[0.0, 1.0625], [0.0, 1.0625]]])
    # Without the bfloat16 form: slope * (key - query).
    np.testing.assert_allclose(alibi_bias((0.5,), np.array([5]), np.array([0, 3])),
                               [[[-2.5, -1.0]]])


# --- attention sinks -------------------------------------------------------------------

def test_sinks_by_hand(run_kernel):
    # As test_two_keys_by_hand (exp scores 1 and 3), and a sink of ln 4: the denominator is
    # 1 + 3 + 4 = 8, so weights 1/8 and 3/8 and values 0 and 4 give 1.5 (half the plain 3:
    # GraniteSWA's sigmoid(logsumexp - sink) = sigmoid(ln 4 - ln 4) = 1/2).
    q = np.array([[[1.0, 0.0, 0.0, 0.0]]])
    keys = _cache([[0.0, 0.0, 0.0, 0.0], [2 * math.log(3.0), 0.0, 0.0, 0.0]])
    values = _cache([[0.0, 0.0, 8.0, 0.0], [4.0, 4.0, 0.0, 0.0]])
    sinks = np.array([math.log(4.0)])
    expected = [[1.5, 1.5, 1.0, 0.0]]
    np.testing.assert_allclose(OP.reference(q, keys, values, sinks, start=1), expected,
                               rtol=1e-12)
    np.testing.assert_allclose(run_kernel(OP, q, keys, values, sinks, start=1), expected,
                               rtol=1e-6, atol=1e-6)


def _sink_scaled(q, keys, values, sinks, start, window):
    """transformers' GraniteSWA eager_attention_forward in numpy: the plain softmax's output
    times sigmoid(logsumexp(scores) - sink), per head (an independent form of the sum)."""
    n, H, D = q.shape
    G = keys.shape[0]
    k = np.repeat(keys.astype(np.float64), H // G, axis=0)
    v = np.repeat(values.astype(np.float64), H // G, axis=0)
    s = np.einsum("nhd,htd->hnt", q.astype(np.float64), k) * D ** -0.5
    qpos, kpos = np.arange(start, start + n)[:, None], np.arange(k.shape[1])[None, :]
    allowed = (kpos <= qpos) & ((kpos > qpos - window) if window else True)
    s = np.where(allowed[None], s, -np.inf)
    lse = np.log(np.exp(s).sum(-1))
    p = np.exp(s - lse[..., None])
    out = np.einsum("hnt,htd->hnd", p, v) / (1 + np.exp(sinks[:, None, None] - lse[..., None]))
    return out.transpose(1, 0, 2).reshape(n, H * D)


@pytest.mark.parametrize("n,H,G,D,start,L,window", [
    (1, 4, 2, 16, 9, 16, None),   # decode
    (1, 4, 2, 16, 9, 16, 3),      # decode, window
    (7, 4, 2, 16, 0, 16, None),   # a prompt
    (70, 2, 1, 8, 3, 80, 5),      # more rows than a BLOCK, window
])
def test_sinks_are_granite_swas_sigmoid_scale(check_kernel, randn, n, H, G, D, start, L,
                                              window):
    q = randn(n, H, D, scale=2.0)
    keys, values = randn(G, L, D, scale=2.0), randn(G, L, D)
    sinks = randn(H, scale=2.0)
    got, ref = check_kernel(OP, q, keys, values, sinks, start=start, window=window)
    np.testing.assert_allclose(ref, _sink_scaled(q, keys, values, sinks, start, window),
                               rtol=1e-12, atol=1e-12)
    plain = OP.reference(q, keys, values, start=start, window=window)
    assert np.abs(ref - plain).max() > 1e-2  # the sinks moved every case


def test_a_step_with_sinks_stays_on_numpy(randn):
    # The C pool's softmax has no sink term: such a step gives no native step.
    q, keys, values = randn(1, 2, 8), randn(2, 4, 8), randn(2, 4, 8)
    out = np.empty((1, 16), np.float32)
    scratch = np.empty(OP.scratch(q.shape, keys.shape, values.shape, (2,)), np.float32)
    assert OP.lower(out, q, keys, values, randn(2), scratch=scratch) is None


def test_sinks_of_other_heads_are_refused():
    with pytest.raises(ValueError, match=r"sinks \(3,\) are not one per head \(2,\)"):
        OP.shape((1, 2, 8), (2, 4, 8), (2, 4, 8), (3,))


# --- values of another width than the keys ---------------------------------------------

@pytest.mark.parametrize("n,H,G,D,Dv,start,L,window", [
    (1, 4, 4, 24, 16, 9, 16, None),   # decode
    (7, 4, 4, 24, 16, 0, 16, None),   # a prompt
    (70, 2, 2, 8, 12, 3, 80, 5),      # more rows than a BLOCK, wider values, window
])
def test_values_of_their_own_width(check_kernel, randn, n, H, G, D, Dv, start, L, window):
    q = randn(n, H, D, scale=2.0)
    keys, values = randn(G, L, D, scale=2.0), randn(G, L, Dv)
    got, ref = check_kernel(OP, q, keys, values, start=start, window=window)
    assert got.shape == (n, H * Dv)
    # Each value column is the same convex combination: widening the values by columns of
    # their own leaves the first Dv columns as they were (an independent computation: the
    # reference over values padded to the keys' width).
    padded = np.concatenate([values, np.zeros((G, L, max(D - Dv, 0)), np.float32)], axis=2)
    wide = OP.reference(q, keys, padded[..., :max(D, Dv)] if Dv <= D else values[..., :D],
                        start=start, window=window).reshape(n, H, -1)
    k = min(D, Dv)
    np.testing.assert_allclose(ref.reshape(n, H, Dv)[..., :k], wide[..., :k], rtol=1e-12,
                               atol=1e-12)
    out = np.empty((n, H * Dv), np.float32)
    scratch = np.empty(OP.scratch(q.shape, keys.shape, values.shape), np.float32)
    assert OP.lower(out, q, keys, values, scratch=scratch) is None  # numpy's


# --- a bias per key (a dynamic mask) ----------------------------------------------------

def test_key_bias_by_hand(run_kernel):
    # Equal scores, a bias of ln 3 on the second key: weights 1/4 and 3/4 over values 0 and
    # 4 give 3 (kv head 0; one query head).
    q = np.array([[[0.0, 0.0, 0.0, 0.0]]])
    keys = _cache([[1.0, 0.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0]])
    values = _cache([[0.0, 0.0, 0.0, 0.0], [4.0, 4.0, 0.0, 0.0]])
    bias = np.array([[[0.0], [math.log(3.0)]]])
    expected = [[3.0, 3.0, 0.0, 0.0]]
    np.testing.assert_allclose(OP.reference(q, keys, values, None, bias, start=1), expected,
                               rtol=1e-12)
    np.testing.assert_allclose(run_kernel(OP, q, keys, values, None, bias, start=1), expected,
                               rtol=1e-6, atol=1e-6)


def _biased(q, keys, values, bias, start, window):
    """DogeAttention's eager form in numpy: scores * scaling + the mask (each kv head's bias
    repeated to its query heads), the causal and window mask, softmax."""
    n, H, D = q.shape
    G = keys.shape[0]
    k = np.repeat(keys.astype(np.float64), H // G, axis=0)
    v = np.repeat(values.astype(np.float64), H // G, axis=0)
    b = np.repeat(bias[..., 0].astype(np.float64), H // G, axis=0)
    s = np.einsum("nhd,htd->hnt", q.astype(np.float64), k) * D ** -0.5 + b[:, None, :]
    qpos, kpos = np.arange(start, start + n)[:, None], np.arange(k.shape[1])[None, :]
    allowed = (kpos <= qpos) & ((kpos > qpos - window) if window else True)
    s = np.where(allowed[None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hnt,htd->nhd", p, v).reshape(n, H * D)


@pytest.mark.parametrize("n,H,G,D,start,L,window", [
    (1, 4, 2, 16, 9, 16, None),   # decode
    (7, 4, 2, 16, 0, 16, None),   # a prompt
    (70, 2, 1, 8, 3, 80, 5),      # more rows than a BLOCK, window
])
def test_key_bias_is_dogess_added_mask(check_kernel, randn, n, H, G, D, start, L, window):
    q = randn(n, H, D, scale=2.0)
    keys, values = randn(G, L, D, scale=2.0), randn(G, L, D)
    bias = np.exp(randn(G, L, 1))
    got, ref = check_kernel(OP, q, keys, values, None, bias, start=start, window=window)
    np.testing.assert_allclose(ref, _biased(q, keys, values, bias, start, window), rtol=1e-12,
                               atol=1e-12)


def test_key_bias_in_a_ring_reads_its_rows(check_kernel, randn):
    # A ring of 8 rows (positions p at row p % 8) against the same positions laid out in order.
    G, H, D, n, start, window, ring = 2, 4, 8, 3, 11, 5, 8
    q = randn(n, H, D)
    keys, values, bias = randn(G, 14, D), randn(G, 14, D), randn(G, 14, 1)
    rk, rv, rb = (np.zeros((G, ring, x.shape[2]), np.float32) for x in (keys, values, bias))
    for p in range(14 - ring, 14):
        rk[:, p % ring], rv[:, p % ring], rb[:, p % ring] = keys[:, p], values[:, p], bias[:, p]
    got, ref = check_kernel(OP, q, rk, rv, None, rb, start=start, window=window, ring=ring)
    np.testing.assert_allclose(ref, OP.reference(q, keys, values, None, bias, start=start,
                                                 window=window), rtol=1e-12, atol=1e-12)


def test_a_step_with_a_key_bias_stays_on_numpy(randn):
    q, keys, values = randn(1, 2, 8), randn(2, 4, 8), randn(2, 4, 8)
    out = np.empty((1, 16), np.float32)
    scratch = np.empty(OP.scratch(q.shape, keys.shape, values.shape, None, (2, 4, 1)),
                       np.float32)
    assert OP.lower(out, q, keys, values, None, randn(2, 4, 1), scratch=scratch) is None
    with pytest.raises(ValueError, match="is not one value per key"):
        OP.shape((1, 2, 8), (2, 4, 8), (2, 4, 8), None, (2, 3, 1))


# --- rows that see their call, and a relative position bias --------------------------------


def _seeing_the_call(q, keys, values, start, bias):
    """Every query of a call at ``start ..`` over every key up to the call's last row, its
    scores plus ``bias`` ``(heads, n, t)``, written out one query and head at a time."""
    n, H, D = q.shape
    G, t = keys.shape[0], start + n
    out = np.zeros((n, H, D))
    for i in range(n):
        for h in range(H):
            g = h // (H // G)
            s = np.array([float(np.dot(q[i, h], keys[g, j])) * D ** -0.5 + bias[h, i, j]
                          for j in range(t)])
            w = np.exp(s - s.max())
            out[i, h] = (w[:, None] * values[g, :t]).sum(0) / w.sum()
    return out.reshape(n, H * D)


@pytest.mark.parametrize("start,n", [(0, 6), (3, 4), (8, 1)])
def test_a_call_seen_whole_with_a_relative_bias(run_kernel, randn, start, n):
    H, G, D, L = 4, 2, 8, 12
    q, keys, values = randn(n, H, D), randn(G, L, D), randn(G, L, D)
    table = randn(48, H)
    relative = (32, 128, True, (4, 3, 0, 2))
    t = start + n
    bias = position_bias(table.astype(np.float64), np.arange(start, t), np.arange(t), *relative)
    want = _seeing_the_call(q, keys, values, start, bias)
    attrs = dict(start=start, relative=relative, sees="call")
    for got in (OP.reference(q, keys, values, None, None, table, **attrs),
                run_kernel(OP, q, keys, values, None, None, table, **attrs)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_seeing_the_call_is_refused_beside_a_window():
    with pytest.raises(ValueError, match="sees 'call' is own or call"):
        OP.shape((2, 2, 4), (1, 8, 4), (1, 8, 4), sees="call", window=4)


# --- chunked attention and a query temperature (Llama 4) ----------------------------------

def test_chunk_is_attention_within_each_chunk_alone(run_kernel, randn):
    # create_chunked_causal_mask: a query at p sees keys p - p % chunk .. p, so each chunk of
    # a sequence is a sequence of its own (a hand split, no mask of ours involved).
    n, chunk = 11, 4
    q, keys, values = randn(n, 4, 8), randn(2, n, 8), randn(2, n, 8)
    alone = np.concatenate([OP.reference(q[c:c + chunk], keys[:, c:c + chunk].copy(),
                                         values[:, c:c + chunk].copy())
                            for c in range(0, n, chunk)])
    for got in _both(run_kernel, q, keys, values, chunk=chunk):
        np.testing.assert_allclose(got, alone, rtol=1e-5, atol=1e-6)
    for start in (3, 5, 8):  # decode steps and chunks starting mid-chunk
        for rows in (1, n - start):
            for got in _both(run_kernel, q[start:start + rows], keys, values, start=start,
                             chunk=chunk):
                np.testing.assert_allclose(got, alone[start:start + rows], rtol=1e-5,
                                           atol=1e-6)


def test_temperature_scales_each_query_by_its_position(run_kernel, randn):
    # Llama4TextAttention: q times 1 + attn_scale * log1p(floor((p + 1) / floor_scale)).
    n, a, f = 9, 0.5, 3
    q, keys, values = randn(n, 2, 8), randn(1, n, 8), randn(1, n, 8)
    factor = 1 + a * np.log1p(np.floor((np.arange(n) + 1) / f))
    want = OP.reference(q * factor[:, None, None], keys, values)
    assert not np.allclose(want, OP.reference(q, keys, values))
    for got in _both(run_kernel, q, keys, values, temperature=(a, f)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for got in _both(run_kernel, q[6:7], keys, values, start=6, temperature=(a, f)):
        np.testing.assert_allclose(got, want[6:7], rtol=1e-5, atol=1e-6)


def test_chunk_refuses_a_ring_or_seeing_the_call():
    with pytest.raises(ValueError, match="chunk"):
        OP.shape((2, 2, 4), (1, 8, 4), (1, 8, 4), chunk=4, ring=8, window=4)
    with pytest.raises(ValueError, match="chunk"):
        OP.shape((2, 2, 4), (1, 8, 4), (1, 8, 4), chunk=4, sees="call")


def test_kv_tiled_is_transformers_repeat_of_the_kv_heads(run_kernel, randn):
    # JetMoeAttention: key_states.repeat(1, top_k, 1, 1): query head h reads kv head h % G.
    q, keys, values = randn(5, 6, 8), randn(2, 5, 8), randn(2, 5, 8)
    want = OP.reference(q, np.tile(keys, (3, 1, 1)), np.tile(values, (3, 1, 1)))
    assert not np.allclose(want, OP.reference(q, keys, values))
    for got in _both(run_kernel, q, keys, values, kv_tiled=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for got in _both(run_kernel, q[3:4], keys, values, start=3, kv_tiled=True):
        np.testing.assert_allclose(got, want[3:4], rtol=1e-5, atol=1e-6)
