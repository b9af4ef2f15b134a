"""operators._cpu, the decode pool's kernels: the same operators, judged by the same float64
references and tolerances as their numpy kernels, and the numpy kernels still right when the
extension is off. In CI the extension must be built (it is compiled at install)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from iron_spec.operators import formats, native
from iron_spec.operators.attention import Attention
from iron_spec.operators.linear import Linear

SIMD = ("portable", "avx2", "avx512")
OFF = "the decode pool is off here (IRON_SPEC_NATIVE) or operators._cpu is not built"
needs_native = pytest.mark.skipif(native.LIB is None, reason=OFF)


def test_ci_builds_the_extension():
    if os.environ.get("CI") == "true":
        assert native.BUILT, "operators._cpu did not build: pip install -e . needs a C compiler"


@pytest.fixture(params=["native", "numpy"])
def kernels(request, monkeypatch):
    """Run a test on the decode pool's kernels, then again on numpy's alone."""
    if request.param == "native":
        if native.LIB is None:
            pytest.skip(OFF)
    else:
        monkeypatch.setattr(native, "LIB", None)
    return request.param




@pytest.mark.parametrize("rows, cols", [(1, 1), (3, 5), (4, 8), (7, 37), (960, 576), (37, 1536)])
@pytest.mark.parametrize("bias", [False, True])
def test_one_row_linear_within_tolerance(kernels, check_kernel, randn, rows, cols, bias):
    args = [randn(1, cols), randn(rows, cols)] + ([randn(rows)] if bias else [])
    check_kernel(Linear(), *args, packed=(1,))


@pytest.mark.parametrize("rows, cols", [(1, 1), (5, 13), (7, 37), (960, 576), (37, 1536)])
def test_each_instruction_set_within_tolerance(simd, check_kernel, randn, rows, cols):
    check_kernel(Linear(), randn(1, cols), randn(rows, cols), randn(rows), packed=(1,))
    assert native.LIB.simd() == simd


def test_the_best_instruction_set_runs_unless_one_is_picked(monkeypatch):
    if native.LIB is None:
        pytest.skip(OFF)
    available = native.LIB.available()
    assert available[0] == "portable" and set(available) <= set(SIMD)
    with pytest.raises(ValueError, match="sse9 is not an instruction set of these kernels"):
        native.LIB.use("sse9")
    missing = [s for s in SIMD if s not in available]
    if missing:
        with pytest.raises(ValueError, match=f"{missing[0]} kernels need an instruction set"):
            native.LIB.use(missing[0])
        monkeypatch.setenv("IRON_SPEC_SIMD", missing[0])
        with pytest.raises(ValueError, match=f"IRON_SPEC_SIMD={missing[0]}: .*this CPU runs"):
            native._pick_simd()
    assert native.LIB.simd() in available  # a refused pick changes nothing


@needs_native
def test_gemv_by_hand():
    w = np.array([[1, 2, 3], [4, 5, 6], [0.5, 0, -1], [2, 2, 2], [1, 0, 0]], np.float32)
    x = np.array([1, -1, 2], np.float32)
    y = np.full(5, np.nan, np.float32)
    native.lib().gemv(y, x, w, np.array([0, 0, 0, 0, 10], np.float32))
    assert y.tolist() == [5.0, 11.0, -1.5, 4.0, 11.0]  # 1-2+6, 4-5+12, .5-2, 2-2+4, 1+10


# (heads, kv_heads, head_dim, cache, start, window, softcap): GQA and MHA, head widths with
# and without a whole vector of lanes, a short and a long cache, a window, a softcap.
CASES = [
    (9, 3, 64, 4096, 127, None, None),
    (9, 3, 64, 4096, 1999, None, None),
    (4, 1, 256, 700, 600, 512, None),
    (8, 4, 16, 40, 0, None, None),
    (6, 2, 20, 50, 33, None, 5.0),
    (4, 4, 24, 30, 29, 7, None),
    (2, 1, 8, 5000, 4999, None, None),
]


@pytest.mark.parametrize("H, G, D, L, start, window, softcap", CASES)
def test_one_query_attention_within_tolerance(kernels, check_kernel, randn, H, G, D, L, start,
                                              window, softcap):
    check_kernel(Attention(), randn(1, H, D, scale=2.0), randn(G, L, D), randn(G, L, D),
                 start=start, window=window, softcap=softcap)


@needs_native
def test_attention_of_one_key_is_its_value():
    # A query at position 0 sees one key: softmax weight 1, whatever the score.
    keys = np.random.default_rng(0).standard_normal((2, 8, 16)).astype(np.float32)
    values = np.random.default_rng(1).standard_normal((2, 8, 16)).astype(np.float32)
    q = np.ones((1, 4, 16), np.float32) * 50.0
    op = Attention()
    out = np.empty((1, 64), np.float32)
    op.kernel(out, q, keys, values, scratch=np.empty(op.scratch(q.shape, keys.shape, values.shape),
                                                     np.float32), start=0)
    want = np.repeat(values[:, 0], 2, axis=0).reshape(-1)  # heads 0, 1 read kv head 0
    np.testing.assert_allclose(out[0], want, rtol=1e-6)


@needs_native
@pytest.mark.parametrize("bad, match", [
    (lambda y, x, w: (y, x, w.astype(np.float64), None), "w must be float32"),
    (lambda y, x, w: (y, x, w[:, ::2], None), "w must be a C-contiguous"),
    (lambda y, x, w: (y, x, w[:2], None), r"w must be \(len\(y\), len\(x\)\) = \(3, 3\), not 6"),
    (lambda y, x, w: (y[:2], x, w[:3, :2].copy(), None), r"= \(2, 3\), not 6 values"),  # transposed
    (lambda y, x, w: (y, y, w, None), "y must not share memory with x, w or b"),
    (lambda y, x, w: (y, x, w, np.zeros(2, np.float32)), "b holds 2 values, not y's 3"),
])
def test_gemv_refuses_what_does_not_fit(bad, match):
    y, x, w = np.full(3, 7.0, np.float32), np.ones(3, np.float32), np.ones((3, 3), np.float32)
    with pytest.raises(ValueError, match=match):
        native.lib().gemv(*bad(y, x, w))
    assert y.tolist() == [7.0, 7.0, 7.0]  # refused before anything is written


@needs_native
def test_attend_refuses_a_scratch_too_small_or_a_position_past_the_cache():
    lib = native.lib()
    q, out = np.ones((4, 8), np.float32), np.empty((4, 8), np.float32)
    keys = np.ones((2, 10, 8), np.float32)
    scratch = np.empty(native.attend_scratch(4, 2, 8, 10), np.float32)
    with pytest.raises(ValueError, match="shapes do not fit"):
        lib.attend(out, q, keys, keys, scratch[:5], 2, 3, 0, 1.0, 0.0, 0)
    with pytest.raises(ValueError, match="shapes do not fit"):
        lib.attend(out, q, keys, keys, scratch, 2, 10, 0, 1.0, 0.0, 0)  # position 10 of 10
    with pytest.raises(ValueError, match="shapes do not fit"):
        lib.attend(out, q, keys, keys, scratch, 3, 3, 0, 1.0, 0.0, 0)  # 4 heads, 3 kv heads
    for start, window, kv_heads in [(sys.maxsize, 0, 2), (-1, 0, 2), (3, -1, 2), (3, 0, 0)]:
        with pytest.raises(ValueError, match="start must be within the cache"):
            lib.attend(out, q, keys, keys, scratch, kv_heads, start, window, 1.0, 0.0, 0)
    # A ring holds a window: none without one, nor one shorter than the window.
    for window, ring in [(0, 10), (11, 10), (3, -1)]:
        with pytest.raises(ValueError, match="ring >= 0"):
            lib.attend(out, q, keys, keys, scratch, 2, 3, window, 1.0, 0.0, ring)
    # Past the cache's end only where the cache is the whole ring.
    with pytest.raises(ValueError, match="shapes do not fit"):
        lib.attend(out, q, keys, keys, scratch, 2, 10, 4, 1.0, 0.0, 12)  # a ring of 12, 10 rows
    lib.attend(out, q, keys, keys, scratch, 2, 25, 4, 1.0, 0.0, 10)  # position 25 at row 5


@needs_native
def test_attend_over_a_ring_is_the_whole_cache_bit_for_bit():
    # Positions 0 .. 40 of a whole cache, and the last 12 of them in a ring of 12 rows
    # (position p at row p % 12): one query at 40 with a window of 9 reads the same keys in
    # the same order, so the same bits.
    lib, rng = native.lib(), np.random.default_rng(3)
    G, H, D, t = 2, 4, 40, 41  # head_dim 40: the 32-wide blocks and a scalar tail
    keys, values = rng.standard_normal((2, G, t, D)).astype(np.float32)
    ring_k, ring_v = np.zeros((G, 12, D), np.float32), np.zeros((G, 12, D), np.float32)
    ring_k[:, np.arange(t - 12, t) % 12] = keys[:, t - 12:]
    ring_v[:, np.arange(t - 12, t) % 12] = values[:, t - 12:]
    q = rng.standard_normal((H, D)).astype(np.float32)
    scratch = np.empty(native.attend_scratch(H, G, D, t), np.float32)
    whole, ring = np.empty((H, D), np.float32), np.empty((H, D), np.float32)
    lib.attend(whole, q, keys, values, scratch, G, t - 1, 9, 0.25, 0.0, 0)
    lib.attend(ring, q, ring_k, ring_v, scratch, G, t - 1, 9, 0.25, 0.0, 12)
    assert ring.tobytes() == whole.tobytes()


def test_threads_follow_the_blas_environment_up_to_the_cores(monkeypatch):
    monkeypatch.setattr(native, "cores", lambda: 8)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")
    assert native.threads() == 3
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "64")  # more threads than cores stall
    assert native.threads() == 8
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "0")  # not a count: the next variable
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert native.threads() == 5
    monkeypatch.delenv("OPENBLAS_NUM_THREADS")
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert native.threads() == 8


# --- bfloat16 weights --------------------------------------------------------------------

def bfloat16_exact(rng, *shape):
    """float32 values that hold exactly in bfloat16 (their low 16 bits zero)."""
    x = rng.standard_normal(shape).astype(np.float32)
    return ((x.view(np.uint32) >> 16) << 16).view(np.float32)


@pytest.mark.parametrize("rows, cols", [(1, 8), (5, 13), (7, 37), (960, 576), (9, 1536), (6, 100)])
def test_bfloat16_gemv_within_tolerance_of_float64(simd, rng, rows, cols):
    # Widening bfloat16 is exact: the kernel must meet numpy's float64 product of the same
    # values (rows past whole groups of 4, columns past whole chunks of 32).
    w = bfloat16_exact(rng, rows, cols)
    x = rng.standard_normal(cols).astype(np.float32)
    b = rng.standard_normal(rows).astype(np.float32)
    half = Linear().pack_reduced(1, w, "bfloat16")
    assert half.dtype == np.uint16 and half.shape == w.shape
    got = np.full(rows, np.nan, np.float32)
    native.lib().gemv(got, x, half, b)
    want = w.astype(np.float64) @ x.astype(np.float64) + b
    bound = cols / 8 * 2.0**-23 * (np.abs(w.astype(np.float64)) @ np.abs(x) + np.abs(b)) + 1e-6
    assert (np.abs(got - want) <= bound).all()


@pytest.mark.parametrize("rows, cols", [(1, 8), (5, 13), (7, 37), (960, 576), (9, 1536)])
def test_bfloat16_gemv_is_the_float32_gemv_bit_for_bit(simd, rng, rows, cols):
    # Widening bfloat16 is exact and both kernels sum in the same order: the same bits.
    w = bfloat16_exact(rng, rows, cols)
    x = rng.standard_normal(cols).astype(np.float32)
    b = rng.standard_normal(rows).astype(np.float32)
    want, got = np.empty(rows, np.float32), np.empty(rows, np.float32)
    native.lib().gemv(want, x, w, b)
    native.lib().gemv(got, x, Linear().pack_reduced(1, w, "bfloat16"), b)
    assert got.tobytes() == want.tobytes()


@needs_native
def test_bfloat16_gemv_by_hand(simd):
    # Five rows (a group of 4, then a group of 1) of 33 columns (a chunk of 32, then one):
    # row r is r + 1 at column r and 2 at column 32; x is 1 at column c < 32 and 0.5 at 32.
    w = np.zeros((5, 33), np.float32)
    for r in range(5):
        w[r, r] = r + 1
        w[r, 32] = 2
    w[4, 20] = -3  # past the first 16 columns: the high half of a pair
    x = np.ones(33, np.float32)
    x[32] = 0.5
    y = np.full(5, np.nan, np.float32)
    native.lib().gemv(y, x, Linear().pack_reduced(1, w, "bfloat16"), None)
    assert y.tolist() == [1 + 1, 2 + 1, 3 + 1, 4 + 1, 5 - 3 + 1]


def test_row_groups_by_hand():
    # Two rows of 33 bfloat16 columns (one group): each chunk of 32 as pairs (j, 16 + j), the
    # rows after one another, then each row's last column.
    w = np.arange(66, dtype=np.uint16).reshape(2, 33)
    g = formats.group_bfloat16(w).reshape(-1)
    assert g[:4].tolist() == [0, 16, 1, 17] and g[30:36].tolist() == [15, 31, 33, 49, 34, 50]
    assert g[64:].tolist() == [32, 65]
    # Five Q8_0 rows of one block: a group of 4 (their 4 scales, then their 4 x 32 values),
    # then a group of 1.
    q = np.arange(5 * 34, dtype=np.uint8).reshape(5, 34)
    gq = formats.group_q8_0(q).reshape(-1)
    assert gq[:8].tolist() == [0, 1, 34, 35, 68, 69, 102, 103]
    assert gq[8:11].tolist() == [2, 3, 4] and gq[40:42].tolist() == [36, 37]
    assert gq[136:].tolist() == q[4].tolist()


@pytest.mark.parametrize("rows, cols", [(1, 1), (3, 5), (4, 32), (7, 37), (9, 64), (13, 100)])
def test_row_groups_undo(rng, rows, cols):
    bits = rng.integers(0, 2**16, (rows, cols)).astype(np.uint16)
    grouped = formats.group_bfloat16(bits)
    assert grouped.shape == bits.shape and (formats.ungroup_bfloat16(grouped) == bits).all()
    if cols % 32 == 0:
        blocks = rng.integers(0, 256, (rows, cols // 32 * 34)).astype(np.uint8)
        grouped = formats.group_q8_0(blocks)
        assert grouped.shape == blocks.shape and (formats.ungroup_q8_0(grouped) == blocks).all()


def test_bfloat16_weights_refuse_a_value_they_would_round(rng):
    w = bfloat16_exact(rng, 4, 8)
    w[2, 3] = np.float32(1.0) + np.float32(2.0 ** -10)  # needs 10 mantissa bits; bfloat16 has 7
    with pytest.raises(ValueError, match="1 of 32 values do not hold exactly in bfloat16"):
        Linear().pack_reduced(1, w, "bfloat16")
    assert Linear().pack_reduced(2, w[0], "bfloat16") is None  # a bias stays float32


@pytest.mark.parametrize("kernels", ["native", "numpy"], indirect=True)
def test_linear_reads_bfloat16_weights_on_either_kernel(kernels, rng):
    w = bfloat16_exact(rng, 6, 16)
    x = rng.standard_normal((1, 16)).astype(np.float32)
    out = np.empty((1, 6), np.float32)
    Linear().kernel(out, x, Linear().pack_reduced(1, w, "bfloat16"))
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


@needs_native
def test_a_forked_child_gets_a_pool_of_its_own_even_mid_call():
    # Another thread inside a pool call holds its lock when the process forks; the child
    # must not wait for a thread it does not have.
    import threading
    import time
    lib = native.lib()
    w, x = np.ones((512, 512), np.float32), np.ones(512, np.float32)
    stop = threading.Event()

    def busy():
        y = np.empty(512, np.float32)
        while not stop.is_set():
            lib.gemv(y, x, w, None)

    worker = threading.Thread(target=busy)
    worker.start()
    try:
        for _ in range(10):
            pid = os.fork()
            if pid == 0:  # the child: one call, right or not, then out
                y = np.empty(512, np.float32)
                native.lib().gemv(y, x, w, None)
                os._exit(0 if (y == 512.0).all() and native.lib().threads() >= 1 else 1)
            deadline = time.monotonic() + 20
            while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            if done[0] == 0:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                pytest.fail("a forked child hung in the pool")
            assert os.waitstatus_to_exitcode(done[1]) == 0
    finally:
        stop.set()
        worker.join()


def test_rounded_bfloat16_by_hand():
    # bfloat16 keeps 7 mantissa bits: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 (to even: 1),
    # 1 + 3 * 2^-8 a tie between 1 + 2^-7 and 1 + 2^-6 (to even: 1 + 2^-6), and
    # 1 + 2^-8 + 2^-20 lies past the tie (up: 1 + 2^-7).
    w = np.array([[1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, -2.0]], np.float32)
    bits = Linear().pack_reduced(1, w, "bfloat16-rounded")
    assert bits.dtype == np.uint16
    assert formats.widen_bfloat16(bits).tolist() == [[1.0, 1 + 2**-6, 1 + 2**-7, -2.0]]
    with pytest.raises(ValueError, match="not finite"):
        formats.round_bfloat16(np.array([np.inf], np.float32))


def test_q8_0_blocks_by_hand():
    # A block whose largest magnitude is 127 has d = 1 (float16 0x3c00, bytes 00 3c) and
    # q = the values rounded half away from zero; a block of zeros has d = 0.
    row = np.zeros(64, np.float32)
    row[:32] = np.arange(32) - 16.0
    row[0], row[1], row[2] = 127.0, 2.5, -2.5
    packed = formats.quantize_q8_0(row[None])
    assert packed.dtype == np.uint8 and packed.shape == (1, 68)
    assert packed[0, :2].tolist() == [0x00, 0x3C]
    q = packed[0, 2:34].view(np.int8)
    assert q[:3].tolist() == [127, 3, -3] and q[3:].tolist() == list(range(-13, 16))
    assert packed[0, 34:].tolist() == [0] * 34
    want = row.copy()
    want[1], want[2] = 3.0, -3.0
    assert formats.widen_q8_0(packed).tolist() == [want.tolist()]
    # Another scale: max 63.5 -> d = 0.5; 10.2 / 0.5 = 20.4 -> 20 -> 10.0.
    b = np.zeros((1, 32), np.float32)
    b[0, :2] = [63.5, 10.2]
    assert formats.widen_q8_0(formats.quantize_q8_0(b))[0, :2].tolist() == [63.5, 10.0]
    with pytest.raises(ValueError, match="multiple of 32"):
        Linear().pack_reduced(1, np.ones((2, 40), np.float32), "int8")


def test_q8_0_error_is_within_half_a_step(rng):
    w = rng.standard_normal((64, 96)).astype(np.float32)
    back = formats.widen_q8_0(formats.quantize_q8_0(w))
    d = np.abs(w.reshape(64, 3, 32)).max(axis=2, keepdims=True) / 127
    # Half a step, and float16's rounding of d (2^-11 relative) over up to 127 steps.
    bound = (d / 2 + d * 127 * 2.0**-11).repeat(32, axis=2).reshape(64, 96)
    assert (np.abs(back - w) <= bound * (1 + 1e-6)).all()


@pytest.mark.parametrize("rows, cols", [(1, 32), (5, 64), (7, 96), (960, 576), (37, 1536)])
def test_q8_0_gemv_within_tolerance_of_its_values(simd, rng, rows, cols):
    # The GEMV on Q8_0 weights computes (x as int16 blocks) . (d * q): judged by numpy's
    # float64 product of exactly those values.
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    packed = Linear().pack_reduced(1, w, "int8")
    x = rng.standard_normal((1, cols)).astype(np.float32)
    b = rng.standard_normal(rows).astype(np.float32)
    out = np.full((1, rows), np.nan, np.float32)
    Linear().kernel(out, x, packed, b)
    values = formats.widen_q8_0(formats.quantize_q8_0(w)).astype(np.float64)
    x16 = formats.x16_values(x)
    ref = x16 @ values.T + b
    bound = cols / 8 * 2.0**-23 * (np.abs(x16) @ np.abs(values).T + np.abs(b)) + 1e-6
    assert (np.abs(out - ref) <= bound).all()
    op = Linear()
    assert (op.reference_inputs([x, values, b], [x, packed, b])[0] == x16).all()


def test_q8_0_gemv_is_the_same_bits_on_avx2_and_avx512(rng):
    # Each block's sum is an exact integer and both instruction sets round it, d * dx and
    # the fused multiply-add alike: the same bits, on a machine that has both.
    if native.LIB is None or "avx512" not in native.LIB.available():
        pytest.skip("needs a CPU with AVX2 and AVX-512")
    w = rng.standard_normal((37, 1536)).astype(np.float32)
    x = rng.standard_normal(1536).astype(np.float32)
    packed = Linear().pack_reduced(1, w, "int8")
    before, got = native.LIB.simd(), []
    try:
        for simd in ("avx2", "avx512"):
            native.LIB.use(simd)
            y = np.full(37, np.nan, np.float32)
            native.lib().gemv(y, x, packed, None)
            got.append(y.tobytes())
    finally:
        native.LIB.use(before)
    assert got[0] == got[1]


@pytest.mark.parametrize("kernels", ["native", "numpy"], indirect=True)
def test_q8_0_gemv_meets_x_as_int16_blocks_on_either_kernel(kernels, rng):
    # x's 16-bit rounding is a few parts in 1e5 of a block's largest value: a product of
    # float x would sit past the bound of the kernel's own, whose x the reference rounds alike.
    w = rng.standard_normal((8, 64)).astype(np.float32)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    x[0, 0] = 300.0  # one large value: the rest of the block rounds to steps of 300 / 32767
    packed = Linear().pack_reduced(1, w, "int8")
    out = np.full((1, 8), np.nan, np.float32)
    Linear().kernel(out, x, packed)
    values = formats.widen_q8_0(formats.quantize_q8_0(w)).astype(np.float64)
    exact, rounded = x.astype(np.float64) @ values.T, formats.x16_values(x) @ values.T
    bound = 8 * 2.0**-23 * np.abs(formats.x16_values(x)) @ np.abs(values).T + 1e-6
    assert (np.abs(out - rounded) <= bound).all()
    assert (np.abs(exact - rounded) > bound).any()


def test_x16_by_hand():
    # max |x| = 32767: dx = 1 and q = x rounded, ties to even (2.5 -> 2, -3.5 -> -4); a block
    # of zeros has dx = 0; an infinite value makes its block's dx NaN.
    x = np.zeros(96, np.float32)
    x[:5] = [32767, 2.5, -3.5, 1.5, 0.25]
    x[64] = np.inf
    q, dx = formats.quantize_x16(x)
    assert q[:5].tolist() == [32767, 2, -4, 2, 0] and not q[5:64].any()
    assert dx[:2].tolist() == [1.0, 0.0] and np.isnan(dx[2])
    # max 32767 / 32768: dx = 2^-15 exactly, so multiples of 2^-15 hold exactly.
    y = np.zeros(32, np.float32)
    y[:3] = [32767 / 32768, -0.5, 2.0**-15]
    assert (formats.x16_values(y) == y).all()
    with pytest.raises(ValueError, match="multiple of 32"):
        formats.quantize_x16(np.ones(40, np.float32))


@needs_native
def test_q8_0_gemv_of_a_long_row_and_a_nan():
    # Past X16_STACK (16384) values x is quantized on the heap: the same sums. A NaN in x
    # makes the rows NaN, never a finite wrong number.
    k = 16384 + 64
    w = np.zeros((3, k), np.float32)
    w[0, 0], w[1, k - 1], w[2, 5000] = 127.0, -127.0, 63.5
    x = np.zeros(k, np.float32)
    x[0], x[k - 1], x[5000] = 32767 / 32768, 0.5, 1.0
    y = np.full(3, np.nan, np.float32)
    packed = Linear().pack_reduced(1, w, "int8")
    native.lib().gemv(y, x, packed, None)
    assert y.tolist() == [127 * 32767 / 32768, -63.5, 63.5]
    x[7] = np.nan
    native.lib().gemv(y, x, packed, None)
    assert np.isnan(y).all()


@needs_native
def test_q8_0_gemv_by_hand():
    # Two rows of one block: d = 1 (max 127) and d = 0.5 (max 63.5), against x whose max is
    # 32767 / 32768 (its dx 2^-15: these values hold exactly as int16 blocks).
    w = np.zeros((2, 32), np.float32)
    w[0, :3] = [127, 5, 2]
    w[1, :3] = [63.5, 1.5, -4]
    x = np.zeros(32, np.float32)
    x[:3] = [32767 / 32768, -0.5, 0.25]
    y = np.full(2, np.nan, np.float32)
    native.lib().gemv(y, x, formats.group_q8_0(formats.quantize_q8_0(w)), None)
    assert y.tolist() == [127 * 32767 / 32768 - 2.5 + 0.5, 63.5 * 32767 / 32768 - 0.75 - 1]


@needs_native
def test_q8_0_gemv_refuses_rows_of_the_wrong_width():
    y, x = np.empty(2, np.float32), np.ones(64, np.float32)
    with pytest.raises(ValueError, match=r"Q8_0 w must be \(len\(y\), len\(x\) / 32 \* 34\)"):
        native.lib().gemv(y, x, np.zeros((2, 64), np.uint8), None)
    with pytest.raises(ValueError, match="a multiple of 32"):
        native.lib().gemv(y, np.ones(40, np.float32), np.zeros((2, 34), np.uint8), None)


@pytest.mark.parametrize("rows, cols, out", [(2, 1, 1), (5, 13, 7), (17, 64, 50), (33, 576, 97),
                                             (256, 96, 12), (19, 40, 9), (5, 33, 10),
                                             (40, 70, 11), (3, 8, 5), (3, 64, 104)])
def test_prompt_gemm_within_tolerance(simd, check_kernel, randn, monkeypatch, rows, cols, out):
    # Rows past whole panels (2 * lanes), columns past whole tiles of 12 (AVX-512) or 6 (1 to
    # 11 left over), and past blocks of 48 or 96.
    monkeypatch.setattr(native, "GEMM", "native")
    check_kernel(Linear(), randn(rows, cols), randn(out, cols), randn(out), packed=(1,))


@needs_native
def test_prompt_gemm_by_hand():
    x = np.array([[1, 2], [3, 4], [-1, 0]], np.float32)
    w = np.array([[1, 0], [0, 1], [1, 1], [2, -1]], np.float32)
    out = np.full((3, 4), np.nan, np.float32)
    native.lib().gemm(out, x, w, np.array([0, 0, 0, 10], np.float32))
    assert out.tolist() == [[1, 2, 3, 10], [3, 4, 7, 12], [-1, 0, -1, 8]]
    with pytest.raises(ValueError, match=r"gemm: out \(m, n\), x \(m, k\), w float32 \(n, k\)"):
        native.lib().gemm(out, x, w[:, :1].copy(), None)


def _attention64(q, keys, values, start, window=None, softcap=None):
    """Causal GQA attention in float64, written out per head and row (transformers'
    eager_attention_forward with repeat_kv, a causal and sliding-window mask): the values
    the prompt chunk's kernel must give, apart from the operator's own reference."""
    n, H, D = q.shape
    G = keys.shape[0]
    out = np.zeros((n, H, D))
    for h in range(H):
        k, v = keys[h // (H // G)].astype(np.float64), values[h // (H // G)].astype(np.float64)
        for i in range(n):
            p = start + i
            seen = np.arange(0 if window is None else max(0, p - window + 1), p + 1)
            s = k[seen] @ q[i, h].astype(np.float64) * D ** -0.5
            if softcap is not None:
                s = np.tanh(s / softcap) * softcap
            e = np.exp(s - s.max())
            out[i, h] = e @ v[seen] / e.sum()
    return out.reshape(n, H * D)


# n: rows past whole blocks (2 lanes' worth) and fewer than one; D: not a multiple of the
# lanes nor of the six value columns a tile sums; windows shorter than the chunk.
CHUNK_CASES = [
    (2, 2, 1, 5, 0, None, None),
    (17, 4, 2, 64, 0, None, None),
    (40, 3, 3, 13, 9, None, None),
    (9, 2, 1, 15, 4, None, None),
    (33, 6, 2, 20, 50, 7, 5.0),
    (70, 4, 1, 256, 30, 16, None),
]


@pytest.mark.parametrize("n, H, G, D, start, window, softcap", CHUNK_CASES)
def test_prompt_chunk_attention_matches_float64(simd, randn, n, H, G, D, start, window, softcap):
    L = start + n + 3
    q, keys, values = randn(n, H, D, scale=2.0), randn(G, L, D), randn(G, L, D)
    op = Attention()
    out = np.full((n, H * D), np.nan, np.float32)
    scratch = np.full(op.scratch(q.shape, keys.shape, values.shape, start=start, window=window),
                      np.nan, np.float32)
    op.kernel(out, q, keys, values, scratch=scratch, start=start, window=window, softcap=softcap)
    want = _attention64(q, keys, values, start, window, softcap)
    # A convex combination of values: float32's error is a few ulps of the largest |value|.
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-6 * np.abs(values).max() * D ** 0.5)


@needs_native
def test_prompt_chunk_attention_reads_a_column_view_and_a_ring():
    # q as the fused projection's column view (rows apart), over a ring of 8 rows whose
    # chunk wraps past its end: the same values as over the whole cache.
    rng = np.random.default_rng(3)
    n, H, G, D, start, window, ring = 5, 4, 2, 16, 20, 4, 8
    fused = rng.standard_normal((n, (H + 2 * G) * D)).astype(np.float32)
    q = fused[:, :H * D].reshape(n, H, D)
    assert not q.flags.c_contiguous
    t = start + n
    keys = rng.standard_normal((G, t, D)).astype(np.float32)
    values = rng.standard_normal((G, t, D)).astype(np.float32)
    rk, rv = np.zeros((G, ring, D), np.float32), np.zeros((G, ring, D), np.float32)
    rk[:, np.arange(t - ring, t) % ring] = keys[:, t - ring:]
    rv[:, np.arange(t - ring, t) % ring] = values[:, t - ring:]
    scratch = np.empty(native.attend_chunk_scratch(D, t), np.float32)
    out = np.full((n, H * D), np.nan, np.float32)
    native.lib().attend_chunk(out, q, rk, rv, scratch, G, start, window, D ** -0.5, 0.0, ring)
    np.testing.assert_allclose(out, _attention64(q, keys, values, start, window),
                               rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="attend_chunk: shapes do not fit"):
        native.lib().attend_chunk(out, q, rk, rv, scratch[:10], G, start, window, 0.25, 0.0,
                                  ring)
    with pytest.raises(ValueError, match="attend_chunk: shapes do not fit"):  # ring < 4 + 5 - 1
        native.lib().attend_chunk(out, q, rk[:, :7].copy(), rv[:, :7].copy(), scratch, G,
                                  start, window, 0.25, 0.0, 7)


@pytest.mark.parametrize("act", ["silu", "gelu_pytorch_tanh"])
@pytest.mark.parametrize("n, m", [(2, 3), (5, 17), (33, 64)])
def test_prompt_chunk_gated_activation_matches_float64(simd, randn, act, n, m):
    # gate and up as a fused projection's column views, m not a multiple of the lanes.
    from iron_spec.operators.activation import GatedActivation
    fused = randn(n, 2 * m, scale=4.0)
    g, u = fused[:, :m], fused[:, m:]
    x = g.astype(np.float64)
    if act == "silu":  # x sigmoid(x), transformers' SiLU
        want = x / (1 + np.exp(-x))
    else:  # transformers' GELUTanh
        want = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    want *= u
    out = np.full((n, m), np.nan, np.float32)
    GatedActivation().kernel(out, g, u, scratch=None, act=act)
    # Where gelu's 1 + tanh cancels (x far below 0), float32 keeps ulps of |x u|, not of
    # the tiny result: the bound the operator's own tolerance takes too.
    assert (np.abs(out - want) <= 1e-6 + 1e-5 * np.abs(want) + 2.0 ** -21 * np.abs(x * u)).all()


@pytest.mark.parametrize("shape, wshape", [((3, 5), (5,)), ((17, 64), (64,)),
                                           ((6, 3, 13), (13,)), ((6, 3, 13), (3, 13))])
def test_prompt_chunk_rms_norm_matches_float64(simd, randn, shape, wshape):
    # x a column view where it has heads (a fused projection's q), odd widths.
    from iron_spec.operators.norm import RMSNorm
    wide = randn(shape[0], 2 * int(np.prod(shape[1:])), scale=3.0)
    x = wide[:, : int(np.prod(shape[1:]))].reshape(shape)
    w = randn(*wshape)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-5) * w
    out = np.full(shape, np.nan, np.float32)
    RMSNorm().kernel(out, x, w, scratch=np.full(64, np.nan, np.float32), eps=1e-5)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


@needs_native
def test_prompt_chunk_rows_refuse_what_does_not_fit():
    x, out = np.ones((4, 8), np.float32), np.empty((4, 8), np.float32)
    with pytest.raises(ValueError, match="gated: out, x and up do not fit"):
        native.lib().gated(out, x, x[:3], 0)
    with pytest.raises(ValueError, match="gated: out, x and up do not fit"):
        native.lib().gated(out, x, x, 7)
    with pytest.raises(ValueError, match=r"rms_norm: out, x and w do not fit"):
        native.lib().rms_norm(out, x, np.ones(7, np.float32), 1e-6)
    with pytest.raises(ValueError, match="x must be float32"):
        native.lib().rms_norm(out, x[:, ::2], np.ones(4, np.float32), 1e-6)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("n, heads, D, R, start", [(2, 1, 4, 4, 0), (5, 3, 24, 12, 7),
                                                   (33, 2, 64, 64, 100)])
def test_prompt_chunk_rope_matches_float64(simd, randn, interleaved, n, heads, D, R, start):
    # x as a fused projection's column view; R (the rotary width) short of D, half of it
    # not a multiple of the lanes.
    from iron_spec.operators.rope import Rope
    wide = randn(n, 2 * heads * D)
    x = wide[:, : heads * D].reshape(n, heads, D)
    pos = np.arange(start + n + 2, dtype=np.float64)[:, None]
    theta = pos * 10000.0 ** (-np.arange(0, R, 2) / R)  # (positions, R / 2)
    cos, sin = np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)
    x64, c, s = x.astype(np.float64), cos[start:start + n, None], sin[start:start + n, None]
    want = x64.copy()
    if interleaved:  # transformers' rotate_every_two (GPT-J)
        a, b = x64[..., 0:R:2], x64[..., 1:R:2]
        want[..., 0:R:2], want[..., 1:R:2] = a * c - b * s, b * c + a * s
    else:  # rotate_half (Llama)
        a, b = x64[..., : R // 2], x64[..., R // 2: R]
        want[..., : R // 2], want[..., R // 2: R] = a * c - b * s, b * c + a * s
    op = Rope()
    out = np.full((n, heads, D), np.nan, np.float32)
    op.kernel(out, x, op.pack(1, cos, interleaved=interleaved),
              op.pack(2, sin, interleaved=interleaved), scratch=None, start=start,
              interleaved=interleaved)
    np.testing.assert_allclose(out, want, rtol=0, atol=4e-7 * np.abs(x64).max())
