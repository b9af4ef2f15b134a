"""A bfloat16 KV cache: what the cache write holds (as torch's and ml_dtypes' rounding),
and every attention kernel reading it (numpy's, the C pool's at each instruction set)
against the float64 reference on the values it holds."""

import ml_dtypes
import numpy as np
import pytest

from iron_spec.operators import Attention, KVWrite, native
from iron_spec.operators.formats import to_bfloat16, widen_bfloat16

OP, KV = Attention(), KVWrite()


def _ml_dtypes(x: np.ndarray) -> np.ndarray:
    """ml_dtypes' bfloat16 (round to nearest even, as torch's) of float32 ``x``, as bits."""
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def test_to_bfloat16_by_hand():
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, -2.5, 0.0, -0.0,
                  np.finfo(np.float32).max, -np.inf, 2**-130], np.float32)
    # 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to even (1); 1 + 3 * 2^-8 halfway
    # between 1 + 2^-7 and 1 + 2^-6: to even (1 + 2^-6); just past halfway rounds up; the
    # largest float32 rounds past bfloat16's largest: infinity; a subnormal keeps its top half (2^-130: bit 19).
    want = [0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xC020, 0x0000, 0x8000, 0x7F80, 0xFF80, 0x0008]
    assert to_bfloat16(x).tolist() == want


def test_to_bfloat16_is_ml_dtypes_rounding_nans_quiet(rng):
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    finite = np.isfinite(x)
    np.testing.assert_array_equal(to_bfloat16(x)[finite], _ml_dtypes(x[finite]))
    nan = np.isnan(x)
    assert nan.any()
    back = widen_bfloat16(to_bfloat16(x[nan]))
    assert np.isnan(back).all()
    np.testing.assert_array_equal(np.signbit(back), np.signbit(x[nan]))


@pytest.mark.parametrize("ring,rows", [(None, [4, 5, 6]), (6, [4, 5, 0])])
def test_kv_write_into_a_bfloat16_cache_holds_each_value_rounded(randn, ring, rows):
    x = randn(3, 2, 8, scale=3.0)
    cache = np.zeros((2, 6 if ring else 8, 8), np.uint16)
    KV.kernel(np.empty(0, np.float32), x, cache, scratch=np.empty(1, np.float32), start=4,
              ring=ring)
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(cache[:, row], _ml_dtypes(x[i]))
    untouched = np.ones(cache.shape[1], bool)
    untouched[rows] = False
    np.testing.assert_array_equal(cache[:, untouched], 0)


CASES = [  # n, H, G, D, start, L, window, softcap, ring
    (1, 9, 3, 64, 40, 64, None, None, None),    # decode deep in a GQA cache (SmolLM2's 9 / 3)
    (1, 4, 1, 256, 30, 32, None, None, None),   # decode, Gemma 3 270M's head_dim
    (1, 2, 2, 512, 9, 16, None, None, None),    # decode past the widened block's head_dim
    (1, 4, 2, 16, 20, 32, 5, None, None),       # sliding window, decode
    (1, 4, 2, 16, 30, 6, 6, None, 6),           # a ring exactly its window
    (7, 8, 2, 32, 0, 16, None, None, None),     # a prompt
    (5, 4, 1, 32, 6, 16, None, None, None),     # a later chunk, MQA
    (6, 4, 2, 16, 3, 12, 4, 50.0, None),        # window and softcap, chunk
    (5, 4, 2, 16, 20, 8, 4, None, 8),           # a chunk over a ring's wrap
    (3, 2, 2, 256, 1, 8, 2, 30.0, None),        # all at once, wide heads
]


def _kernel(q, keys, values, attrs):
    out = np.full(OP.shape(q.shape, keys.shape, values.shape, **attrs), np.nan, np.float32)
    scratch = np.full(OP.scratch(q.shape, keys.shape, values.shape, **attrs), np.nan,
                      np.float32)
    OP.kernel(out, q, keys, values, scratch=scratch, **attrs)
    return out


def _within(got, q, keys, values, attrs):
    # The reference on the values the cache holds, widened exactly.
    k64 = widen_bfloat16(keys).astype(np.float64)
    v64 = widen_bfloat16(values).astype(np.float64)
    want = OP.reference(q.astype(np.float64), k64, v64, **attrs)
    bound = OP.tolerance(q.shape, keys.shape, values.shape, **attrs).bound(
        OP.scale(want, q, k64, v64, **attrs))
    err = np.abs(got - want)
    assert (err <= bound).all(), f"{attrs}: worst {err.max()}"
    return want


@pytest.mark.parametrize("n,H,G,D,start,L,window,softcap,ring", CASES)
@pytest.mark.parametrize("kernels", ["numpy", "pool"])
def test_attention_over_a_bfloat16_cache(randn, monkeypatch, n, H, G, D, start, L, window,
                                         softcap, ring, kernels):
    if kernels == "numpy":
        monkeypatch.setattr(native, "lib", lambda: None)
    elif native.LIB is None:
        pytest.skip("operators._cpu not built")
    q = randn(n, H, D, scale=2.0)
    keys, values = to_bfloat16(randn(G, L, D, scale=2.0)), to_bfloat16(randn(G, L, D))
    attrs = dict(start=start, window=window, softcap=softcap, ring=ring)
    want = _within(_kernel(q, keys, values, attrs), q, keys, values, attrs)
    # The cache's rounding is what the reference sees: over the float32 values it would
    # differ (the test would not know a kernel that read them unrounded).
    assert np.abs(want - OP.reference(q, widen_bfloat16(keys), widen_bfloat16(values),
                                      **attrs)).max() == 0


@pytest.mark.parametrize("n,H,G,D,start,L,window,softcap,ring", CASES)
def test_each_instruction_set_reads_a_bfloat16_cache(randn, simd, n, H, G, D, start, L,
                                                     window, softcap, ring):
    q = randn(n, H, D, scale=2.0)
    keys, values = to_bfloat16(randn(G, L, D, scale=2.0)), to_bfloat16(randn(G, L, D))
    attrs = dict(start=start, window=window, softcap=softcap, ring=ring)
    _within(_kernel(q, keys, values, attrs), q, keys, values, attrs)


# A decode step's heads a kv head serves, in the AVX-512 kernel's passes of three (within
# a sweep of eight) and the AVX2 kernel's of eight; head_dim whole 64-column pieces or not;
# 512, past what the AVX2 kernel stages a bfloat16 block of (the AVX-512 one widens each
# read in its registers at any head_dim).
DECODE = [(4, 1, 48), (8, 2, 64), (10, 1, 80), (20, 2, 32), (16, 1, 128), (6, 3, 256),
          (3, 1, 512)]


@pytest.mark.parametrize("H,G,D", DECODE)
@pytest.mark.parametrize("cache", ["float32", "bfloat16"])
def test_a_decode_steps_heads_in_every_grouping(randn, simd, H, G, D, cache):
    q = randn(1, H, D, scale=2.0)
    keys, values = randn(G, 300, D, scale=2.0), randn(G, 300, D)
    if cache == "bfloat16":
        keys, values = to_bfloat16(keys), to_bfloat16(values)
        _within(_kernel(q, keys, values, dict(start=290)), q, keys, values, dict(start=290))
        return
    got = _kernel(q, keys, values, dict(start=290))
    want = OP.reference(q, keys, values, start=290)
    bound = OP.tolerance(q.shape, keys.shape, values.shape).bound(
        OP.scale(want, q, keys, values, start=290))
    assert (np.abs(got - want) <= bound).all()


@pytest.mark.skipif(native.LIB is None, reason="operators._cpu not built")
def test_the_pool_refuses_keys_and_values_of_two_dtypes(randn):
    q, out = randn(1, 2, 8), np.empty((1, 16), np.float32)
    scratch = np.empty(native.attend_scratch(2, 1, 8, 4), np.float32)
    with pytest.raises(ValueError, match="keys and values must be of one dtype"):
        native.lib().attend(out, q, to_bfloat16(randn(1, 4, 8)), randn(1, 4, 8), scratch, 1,
                            3, 0, 0.25, 0.0, 0)
    with pytest.raises(ValueError, match="float32 or uint16"):
        native.lib().attend(out, q, randn(1, 4, 8).astype(np.float16),
                            randn(1, 4, 8).astype(np.float16), scratch, 1, 3, 0, 0.25, 0.0, 0)
