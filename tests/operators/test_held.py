"""Weights held as stored (operators.held, operators/_cpu_held.h): every kernel against an
independent reference, on every instruction set this CPU runs.

The values a held weight stands for come from gguf-py's own dequantizer (llama.cpp's
Python reference) and ml_dtypes' widening, never from the code under test; the products are
float64 sums of them.
"""

from __future__ import annotations

import gguf
import ml_dtypes
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from iron_spec.operators import formats, held, native
from iron_spec.operators.embedding import Embedding
from iron_spec.operators.linear import Linear
from iron_spec.runtime import holding

pytestmark = pytest.mark.skipif(native.LIB is None, reason="operators._cpu not built or off")

BLOCK_FORMS = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
FLOAT_FORMS = ["F32", "F16", "BF16"]


def drawn_blocks(form: str, rows: int, k: int, rng) -> np.ndarray:
    """Random bytes of ``form``'s blocks, every float16 scale and minimum a small finite
    number (ggml-common.h's layouts): every bit pattern of the integers is met."""
    block, nbytes = held.BLOCKS[form]
    raw = rng.integers(0, 256, (rows, k // block, nbytes), dtype=np.uint8)
    at = {"Q6_K": (208,), "Q4_1": (0, 2), "Q5_1": (0, 2), "Q4_K": (0, 2), "Q5_K": (0, 2)}
    for o in at.get(form, (0,)):
        scale = (rng.standard_normal((rows, k // block)) * 0.01).astype(np.float16)
        raw[..., o:o + 2] = scale.view(np.uint8).reshape(rows, k // block, 2)
    return raw.reshape(rows, -1)


def weight(form: str, rows: int, k: int, rng):
    """A held matrix of ``form`` and the float64 values gguf-py / ml_dtypes say it holds."""
    if form in BLOCK_FORMS:
        data = drawn_blocks(form, rows, k, rng)
        values = gguf.quants.dequantize(data, T[form])
        return holding.blocks(form, data, (rows, k)), values.astype(np.float64)
    w = rng.standard_normal((rows, k)).astype(np.float32)
    if form == "F16":
        w = w.astype(np.float16)
    elif form == "BF16":
        w = w.astype(ml_dtypes.bfloat16)
    return w, w.astype(np.float64)


def instruction_sets():
    """Every path this CPU runs: each instruction set (VNNI off), and AVX-512 with VNNI's
    integer dot products (a held block form's GEMV) where the CPU has them."""
    if native.LIB is None:
        return []
    sets = list(native.LIB.available())
    was = native.LIB.vnni()
    try:
        native.LIB.vnni(True)
        sets.append("avx512+vnni")
    except ValueError:
        pass
    native.LIB.vnni(was)
    return sets


@pytest.fixture(params=instruction_sets())
def on(request):
    before, vnni = native.LIB.simd(), native.LIB.vnni()
    native.LIB.use(request.param.split("+")[0])
    native.LIB.vnni(request.param.endswith("+vnni"))
    yield request.param
    native.LIB.use(before)
    native.LIB.vnni(vnni)


@pytest.mark.parametrize("form", BLOCK_FORMS + FLOAT_FORMS)
def test_widen_gives_gguf_pys_values(form, on):
    rng = np.random.default_rng(1)
    w, values = weight(form, 7, 512, rng)
    out = np.empty((7, 512), np.float32)
    native.LIB.widen(out, held.raw(w), held.code(w))
    assert np.array_equal(out, values.astype(np.float32))  # the same values (-0.0 == 0.0)
    assert np.array_equal(held.widen(w), values.astype(np.float32))  # numpy's, likewise


def bound(x: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A float32 dot product's error bound: k eps sum |x w| (Higham), eps 2^-24."""
    return x.shape[-1] * 2.0 ** -24 * (np.abs(x) @ np.abs(values).T) + 1e-30


@pytest.mark.parametrize("form", BLOCK_FORMS + FLOAT_FORMS)
@pytest.mark.parametrize("k", [256, 576, 1024 + 256])
def test_gemv_is_the_product_of_the_stored_values(form, k, on):
    """One row: a float form's against x itself; a block form's against x8's values
    (formats.x8_values: x per 32 values at 8 bits, as llama.cpp's integer dot products meet
    it), the float32 sums' bound around them."""
    if form in held.BLOCKS and k % held.BLOCKS[form][0]:
        pytest.skip("rows of whole blocks only")
    rng = np.random.default_rng(k)
    rows = 37  # groups of 4 and a rest; two threads' parts split unevenly
    w, values = weight(form, rows, k, rng)
    x = rng.standard_normal((1, k)).astype(np.float32)
    b = rng.standard_normal(rows).astype(np.float32)
    y = np.empty((1, rows), np.float32)
    native.LIB.gemv(y[0], x[0], held.raw(w), b, held.code(w))
    xv = formats.x8_values(x) if form in BLOCK_FORMS else x.astype(np.float64)
    want = xv @ values.T + b
    assert np.all(np.abs(y - want) <= bound(xv, values) + 1e-6)


# bfloat16's and Q8_0's GEMMs round x, as llama.cpp's: test_held_gemm.py
@pytest.mark.parametrize("form", [f for f in BLOCK_FORMS + FLOAT_FORMS if f not in ("BF16", "Q8_0")])
def test_gemm_is_the_product_of_the_stored_values(form, on):
    rng = np.random.default_rng(2)
    rows, k, m = 53, 512, 70  # tiles of 12 and 6 columns, panels of 32 rows and a rest
    w, values = weight(form, rows, k, rng)
    x = rng.standard_normal((m, k)).astype(np.float32)
    out = np.empty((m, rows), np.float32)
    native.LIB.gemm(out, x, held.raw(w), None, held.code(w))
    # A prompt chunk meets x as it is, but rounded to bfloat16 on bfloat16 (test_held_gemm)
    xv = x.astype(ml_dtypes.bfloat16 if form == "BF16" else np.float32).astype(np.float64)
    want = xv @ values.T
    assert np.all(np.abs(out - want) <= bound(xv, values))


def test_one_row_of_a_gemm_is_the_gemv():
    rng = np.random.default_rng(3)
    w, _ = weight("Q4_K", 9, 256, rng)
    x = rng.standard_normal((1, 256)).astype(np.float32)
    a, b = np.empty((1, 9), np.float32), np.empty((1, 9), np.float32)
    native.LIB.gemm(a, x, held.raw(w), None, held.code(w))
    native.LIB.gemv(b[0], x[0], held.raw(w), None, held.code(w))
    assert a.tobytes() == b.tobytes()


def test_a_held_weight_of_other_bytes_is_refused():
    w = np.zeros((4, 34), np.uint8)
    with pytest.raises(ValueError, match="not 4 rows of 64 values in form 8"):
        native.LIB.gemv(np.empty(4, np.float32), np.ones(64, np.float32), w, None, 8)
    with pytest.raises(ValueError, match="form 5 holds no row"):
        native.LIB.gemv(np.empty(4, np.float32), np.ones(32, np.float32), w, None, 5)
    with pytest.raises(ValueError, match="holds no row of 40 values"):
        native.LIB.gemv(np.empty(4, np.float32), np.ones(40, np.float32), w, None, 8)


@pytest.mark.parametrize("form", ["Q6_K", "BF16", "F16", "Q8_0"])
def test_the_linear_operator_checks_against_its_reference(form):
    """Linear's kernel, native step and numpy fallback on a held weight, each within its
    tolerance of its reference (what check=True asserts of every step)."""
    rng = np.random.default_rng(4)
    op = Linear()
    w, values = weight(form, 40, 256, rng)
    for m in (1, 5):
        x = rng.standard_normal((m, 256)).astype(np.float32)
        out = np.empty((m, 40), np.float32)
        op.kernel(out, x, op.pack(1, w))
        ref_ins = op.reference_inputs([x, w], [x, op.pack(1, w)])
        want = op.reference(*ref_ins)
        tol = op.tolerance(x.shape, w.shape)
        assert np.all(np.abs(out - want) <= tol.bound(op.scale(want, *ref_ins)))
        assert op.lower(out, x, op.pack(1, w)) is not None


@pytest.mark.parametrize("form", ["Q4_K", "BF16", "Q8_0"])
def test_the_embedding_gathers_the_stored_values(form):
    rng = np.random.default_rng(5)
    w, values = weight(form, 30, 256, rng)
    ids = np.array([3, 0, 29, 3], np.int32)
    op = Embedding()
    out = np.empty((4, 256), np.float32)
    op.kernel(out, ids, w, scale=2.0)
    assert np.array_equal(out, (values[ids] * 2.0).astype(np.float32))
    assert np.array_equal(op.reference(ids, w, scale=2.0), values[ids] * 2.0)
    step = op.lower(out, ids, w, scale=2.0)
    assert step is not None and step.ints[-1] == held.code(w)


@pytest.mark.parametrize("form", ["Q5_K", "BF16"])
def test_a_programs_steps_run_the_held_kernels(form):
    """A compiled plan's native steps (OP_GEMV, a bounded OP_GEMM, OP_EMBEDDING) on a held
    weight give what the Python entries give, bit for bit."""
    rng = np.random.default_rng(6)
    w, _ = weight(form, 24, 256, rng)
    raw, code = held.raw(w), held.code(w)
    x = rng.standard_normal((8, 256)).astype(np.float32)
    want = np.empty((8, 24), np.float32)
    native.LIB.gemm(want, x, raw, None, code)
    one = np.empty((1, 24), np.float32)
    native.LIB.gemv(one[0], x[0], raw, None, code)
    y, out = np.empty((1, 24), np.float32), np.empty((8, 24), np.float32)
    ids, rows = np.array([2, 23, 0, 5, 5, 1, 9, 7], np.int32), np.empty((8, 256), np.float32)
    steps = [(Linear().lower(y, x[:1], w), None),
             (Linear().lower(out, x, w), None, 8),
             (Embedding().lower(rows, ids, w), None, 8)]
    prog = native.program(steps)
    native.run(prog, {"rows": 8}, 0, 3)
    assert y.tobytes() == one.tobytes() and out.tobytes() == want.tobytes()
    assert np.array_equal(rows, held.gather(w, ids))
    native.run(prog, {"rows": 1}, 1, 2)  # one row of the chunk's GEMM: the GEMV's
    assert out[0].tobytes() == one.tobytes()


def test_a_program_refuses_held_bytes_that_do_not_fit():
    w = np.zeros((4, 34), np.uint8)
    step = native.Step(native.OP_GEMV, (np.empty((1, 4), np.float32), np.ones((1, 64), np.float32),
                                        w, None), (4, 64, held.CODES["Q8_0"]))
    with pytest.raises(ValueError, match="array 2 is 136 bytes"):
        native.program([(step, None)])


@pytest.mark.parametrize("form", BLOCK_FORMS + FLOAT_FORMS)
def test_nonfinite_counts_what_gguf_py_widens_to_nan_or_inf(form):
    rng = np.random.default_rng(7)
    w, _ = weight(form, 6, 256, rng)
    raw = held.raw(w).copy()
    if form in BLOCK_FORMS:  # a scale (and, where it has one, a minimum) made infinite
        block, nbytes = held.BLOCKS[form]
        at = 208 if form == "Q6_K" else 2 if form in ("Q4_1", "Q5_1", "Q4_K", "Q5_K") else 0
        raw.reshape(-1, nbytes)[3, at + 1] |= 0x7C
    else:
        raw.reshape(-1).view(np.uint8)[17 * raw.itemsize - 1] |= 0x7F  # a top byte: exponent
        raw.reshape(-1).view(np.uint8)[17 * raw.itemsize - 2] |= 0xFF
    values = gguf.quants.dequantize(raw.view(np.uint8) if form != "F16" else raw, T[form]) \
        if form in BLOCK_FORMS else held.widen_all(raw.view(w.dtype) if form == "BF16" else raw)
    want = int(np.count_nonzero(~np.isfinite(values)))
    assert want > 0
    assert native.LIB.nonfinite(raw, held.code(w)) == want


@pytest.mark.parametrize("form", BLOCK_FORMS)
def test_gemv_on_x8_is_within_half_a_step_of_x_a_block(form, on):
    """The stated cost of 8-bit activations (docs/checking.md): against x itself, a block
    form's one-row product is off by at most sum over blocks of (dx / 2) * sum |w| (each of
    x's values at most half of its block's step dx = max|x| / 127 away), plus the float32
    sums' bound."""
    rng = np.random.default_rng(5)
    rows, k = 29, 512
    w, values = weight(form, rows, k, rng)
    x = rng.standard_normal((1, k)).astype(np.float32) * rng.uniform(0.1, 10, (1, k)).astype(np.float32)
    y = np.empty((1, rows), np.float32)
    native.LIB.gemv(y[0], x[0], held.raw(w), None, held.code(w))
    _, dx = formats.quantize_x8(x)
    step = np.repeat(dx.astype(np.float64) / 2, 32, axis=-1)  # (1, k): each value's half step
    xv = x.astype(np.float64)
    assert np.all(np.abs(y - xv @ values.T) <= step @ np.abs(values).T + bound(xv, values) * 2)
