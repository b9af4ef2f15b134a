"""A prompt chunk's GEMM on weights held as bfloat16 or Q8_0 rows (operators/_cpu_held_gemm.h):
x rounded to bfloat16, or to 8 bits a block, as llama.cpp's GEMMs round it, against float64
products of ml_dtypes' rounding of x and widening of w, or gguf-py's quantizing of x and
dequantizing of w (independent of the code under test), on each kernel this CPU runs
(AVX-512 BF16's VDPBF16PS, AVX-512 VNNI's VPDPBUSD where it has them, the portable path
everywhere), across row counts, a chunk's tail, odd k, tiles' tails and long rows."""

from __future__ import annotations

import gguf
import ml_dtypes
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from iron_spec.operators import held, native
from iron_spec.operators.linear import Linear
from iron_spec.runtime import holding

pytestmark = pytest.mark.skipif(native.LIB is None, reason="operators._cpu not built or off")


@pytest.fixture(params=("avx512bf16", "portable"))
def kernel(request):
    """Each kernel in turn (the one the tile GEMM is told: _cpu_held_gemm.h follows it; where
    it is avx512bf16, Q8_0 runs on VNNI where the CPU has it)."""
    before = native.LIB.tiles()
    try:
        native.LIB.use_tiles(request.param)
    except ValueError:
        pytest.skip(f"this CPU (or its OS) offers no {request.param} kernel")
    yield request.param
    native.LIB.use_tiles(before)


def x8_by_gguf(x: np.ndarray) -> np.ndarray:
    """x (m, k) float32 as the Q8_0 GEMM quantizes it, from gguf-py's quantizer: its int8 q
    per 32 values (llama.cpp's quantize_row_q8_0), times the block's scale max|x| / 127 kept
    float32 (gguf-py rounds it to float16; the kernel keeps it), in float64."""
    m, k = x.shape
    q = gguf.quants.quantize(x, T.Q8_0).reshape(m, k // 32, 34)[..., 2:].view(np.int8)
    d = np.abs(x.reshape(m, k // 32, 32)).max(-1) / np.float32(127)
    return (q.astype(np.float64) * d.astype(np.float64)[..., None]).reshape(m, k)


def rounded(x: np.ndarray) -> np.ndarray:
    return x.astype(ml_dtypes.bfloat16).astype(np.float64)


# (m, n, k): panels of 32 rows and a rest (a chunk's tail: fewer rows than prefill_chunk),
# tiles of 12 rows of w and a rest, odd k (the last value paired with zero), k past a block
# of w's rows' budget.
SHAPES = [(2, 5, 7), (31, 13, 33), (33, 37, 64), (70, 53, 577), (128, 100, 2048), (5, 25, 8193)]


@pytest.mark.parametrize("m, n, k", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_gemm_is_the_product_of_x_rounded_and_the_stored_values(kernel, m, n, k, bias):
    rng = np.random.default_rng(m * n + k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    out = np.full((m, n), np.nan, np.float32)
    native.LIB.gemm(out, x, w.view(np.uint16), b, held.ROUNDING_X)
    xr, wv = rounded(x), w.astype(np.float64)
    want = xr @ wv.T + (0.0 if b is None else b)
    # a float32 sum of k products: k eps sum |x w| (Higham), eps 2^-24
    assert np.all(np.abs(out - want) <= k * 2.0 ** -24 * (np.abs(xr) @ np.abs(wv).T) + 1e-6)
    # and x was rounded: the product of x as it is lies further off than the kernel's error
    far = np.abs(x.astype(np.float64) @ wv.T + (0.0 if b is None else b) - want)
    assert np.max(far) > 100 * np.max(np.abs(out - want))


def test_x_rounds_to_nearest_ties_to_even(kernel):
    """Values halfway between two bfloat16s go to the even one, as ml_dtypes' (and torch's)."""
    k = 4
    ones = np.ones((3, k), ml_dtypes.bfloat16)
    # 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to 1 (even); 1 + 3 * 2^-8 to 1 + 2^-6
    x = np.array([[1 + 2.0 ** -8, 0, 0, 0], [1 + 3 * 2.0 ** -8, 0, 0, 0],
                  [-(1 + 2.0 ** -8 + 2.0 ** -20), 0, 0, 0]], np.float32)
    out = np.empty((3, 3), np.float32)
    native.LIB.gemm(out, x, ones.view(np.uint16), None, held.ROUNDING_X)
    assert out[:, 0].tolist() == [1.0, 1 + 2.0 ** -6, -(1 + 2.0 ** -7)]


def test_the_linear_operator_checks_the_rounded_product():
    """Linear's check on a bfloat16 weight: the reference meets x rounded (reference_inputs),
    the kernel within the float32 GEMM's tolerance of it; one row keeps x as it is."""
    rng = np.random.default_rng(5)
    op = Linear()
    w = rng.standard_normal((40, 96)).astype(ml_dtypes.bfloat16)
    for m in (1, 17):
        x = rng.standard_normal((m, 96)).astype(np.float32)
        ref_x = op.reference_inputs([x, w], [x, held.rounding_x(op.pack(1, w))])[0]
        assert np.array_equal(ref_x, rounded(x) if m > 1 else x.astype(np.float64))
        out = np.empty((m, 40), np.float32)
        op.kernel(out, x, held.rounding_x(op.pack(1, w)))
        want = op.reference(ref_x, w)
        tol = op.tolerance(x.shape, w.shape)
        assert np.all(np.abs(out - want) <= tol.bound(op.scale(want, ref_x, w)))


# k a multiple of 32 (Q8_0 rows are whole blocks): one block, several, long rows.
Q8_SHAPES = [(2, 5, 32), (31, 13, 64), (33, 37, 96), (70, 53, 576), (128, 100, 2048),
             (5, 7, 8192)]


@pytest.mark.parametrize("m, n, k", Q8_SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_q8_0_gemm_is_the_product_of_x_quantized_and_the_stored_values(kernel, m, n, k, bias):
    rng = np.random.default_rng(m * n + k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[0, :32] *= 1e-3  # blocks of other scales
    data = gguf.quants.quantize((rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32),
                                T.Q8_0)
    wv = gguf.quants.dequantize(data, T.Q8_0).astype(np.float64)
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    out = np.full((m, n), np.nan, np.float32)
    native.LIB.gemm(out, x, data, b, held.CODES["Q8_0"])
    xv = x8_by_gguf(x)
    want = xv @ wv.T + (0.0 if b is None else b)
    # each block's products exact in integers; k / 32 scaled sums in float32
    assert np.all(np.abs(out - want) <= k * 2.0 ** -24 * (np.abs(xv) @ np.abs(wv).T) + 1e-6)
    far = np.abs(x.astype(np.float64) @ wv.T + (0.0 if b is None else b) - want)
    assert np.max(far) > 100 * np.max(np.abs(out - want))


def test_a_q8_0_block_of_nan_or_zeros(kernel):
    """A block with a NaN makes its row's sums NaN; a block of zeros adds nothing."""
    rng = np.random.default_rng(9)
    data = gguf.quants.quantize(rng.standard_normal((3, 64)).astype(np.float32), T.Q8_0)
    wv = gguf.quants.dequantize(data, T.Q8_0).astype(np.float64)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    x[1, 5] = np.nan
    x[2, :32] = 0.0
    out = np.empty((3, 3), np.float32)
    native.LIB.gemm(out, x, data, None, held.CODES["Q8_0"])
    assert np.isnan(out[1]).all() and np.isfinite(out[[0, 2]]).all()
    want = x8_by_gguf(x[2:]) @ wv.T
    assert np.allclose(out[2], want[0], rtol=1e-5, atol=1e-6)


def test_the_linear_operator_checks_the_quantized_product():
    """Linear's check on a Q8_0 weight: the reference meets x as the GEMM quantizes it (one
    row: as the GEMV's x16), the kernel within the GEMM's tolerance of it."""
    rng = np.random.default_rng(6)
    op = Linear()
    data = gguf.quants.quantize(rng.standard_normal((40, 96)).astype(np.float32), T.Q8_0)
    w = holding.blocks("Q8_0", data, (40, 96))
    for m in (1, 17):
        x = rng.standard_normal((m, 96)).astype(np.float32)
        ref_x = op.reference_inputs([x, w], [x, op.pack(1, w)])[0]
        if m > 1:
            assert np.allclose(ref_x, x8_by_gguf(x), rtol=0, atol=0)
        out = np.empty((m, 40), np.float32)
        op.kernel(out, x, op.pack(1, w))
        want = op.reference(ref_x, w)
        tol = op.tolerance(x.shape, w.shape)
        assert np.all(np.abs(out - want) <= tol.bound(op.scale(want, ref_x, w)))


def test_bfloat16_rows_round_x_only_when_asked():
    # A bfloat16 checkpoint's prompt chunk meets x as it is by default (its float32 gates
    # hold: the towers' toys, SmolLM2's every-position logits); --prefill-weights bfloat16
    # asks for llama.cpp's rounding, on the held rows themselves (a view: no tiles, no copy).
    rng = np.random.default_rng(9)
    w = rng.standard_normal((24, 64)).astype(ml_dtypes.bfloat16)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    wide = w.astype(np.float64)
    plain, asked = np.empty((5, 24), np.float32), np.empty((5, 24), np.float32)
    native.LIB.gemm(plain, x, w.view(np.uint16), None, held.CODES["BF16"])
    native.LIB.gemm(asked, x, w.view(np.uint16), None, held.ROUNDING_X)
    np.testing.assert_allclose(plain, x.astype(np.float64) @ wide.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(asked, rounded(x) @ wide.T, rtol=1e-5, atol=1e-5)
    assert not np.allclose(plain, asked, rtol=1e-6, atol=0)
    op = Linear()
    view = op.pack_reduced(1, w, "bfloat16-tiles", rows=5)
    assert isinstance(view, held.RoundingX) and np.shares_memory(view, w)
    assert op.pack_reduced(1, w, "bfloat16-tiles", rows=1) is None
