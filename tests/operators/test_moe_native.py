"""The decode step's native router and experts (operators/_cpu_experts.h, a native program's
OP_ROUTER and OP_EXPERTS) on each row of transformers' recorded cases: the same choices as
transformers, the outputs within the operators' float64 references' tolerance, in every
weight form the GEMV reads and on every instruction set; and only the routed experts read."""

from __future__ import annotations

import numpy as np
import pytest

from iron_spec.operators import OPERATORS, native
from tests.operators import test_experts as ex
from tests.operators import test_router as rt


def lowered(op, *inputs, **attrs):
    """The operator's native step run alone on float32 copies of ``inputs`` (None: absent),
    its output and scratch NaN first; what it wrote."""
    shapes = tuple(None if x is None else np.shape(x) for x in inputs)
    args = [None if x is None else np.array(x, np.float32) for x in inputs]
    out = np.full(op.shape(*shapes, **attrs), np.nan, np.float32)
    scratch = np.full(max(1, op.scratch(*shapes, **attrs)), np.nan, np.float32)
    step = op.lower(out, *args, scratch=scratch, **attrs)
    assert step is not None, f"{op.name} {attrs} has no native step"
    native.run(native.program([(step, None)]), {"start": 0, "rows": 1, "position": 0}, 0, 1)
    return out

pytestmark = pytest.mark.skipif(not native.PROGRAM, reason="no native program here")

ROUTER, EXPERTS = OPERATORS["router"], OPERATORS["experts"]
NATIVE_ROUTERS = [c for c in rt.CASES if "sparsemixer" not in rt._attrs(c)]
NATIVE_EXPERTS = [c for c in ex.CASES if not c.startswith("jetmoe")]


@pytest.mark.parametrize("case", NATIVE_ROUTERS)
def test_router_step_chooses_as_transformers(case):
    x, *rest = rt._inputs(case)
    attrs = rt._attrs(case)
    for r in range(x.shape[0]):
        got = lowered(ROUTER, x[r:r + 1], *rest, **attrs)
        np.testing.assert_array_equal(got[0, 0], rt.GOLDEN[f"{case}.indices"][r], err_msg=case)
        np.testing.assert_allclose(got[0, 1], rt.GOLDEN[f"{case}.weights"][r], rtol=2e-5,
                                   atol=1e-6, err_msg=case)


def _rows(case):
    inputs, attrs, want = ex._case(case)
    x, routing, *weights = inputs
    for r in range(x.shape[0]):
        yield [x[r:r + 1], routing[r:r + 1], *weights], attrs, want[r]


def _judge(got, inputs, attrs, reduced=False, x8=False):
    ref_in = [None if v is None else np.array(v, np.float64) for v in inputs]
    ref = EXPERTS.reference(*ref_in, **attrs)
    shapes = tuple(None if v is None else v.shape for v in inputs)
    bound = EXPERTS.tolerance(*shapes, **attrs).bound(EXPERTS.scale(ref, *ref_in, **attrs))
    if x8:  # one row on a block form: both GEMVs meet their input rounded to 8 bits a
        # 32-value block (formats.quantize_x8, as llama.cpp's Q8_0/Q8_K activations), a step
        # of 1/127 of the block's largest: about 1% of the output's largest here, measured
        bound = bound + 2.0 ** -6 * np.abs(ref).max()
    elif reduced:  # x met as int16 blocks by Q8_0's GEMV: 2^-16 of a block's largest a value
        bound = bound + 2.0 ** -14 * np.abs(ref).max()
    err = np.abs(got - ref)
    assert (err <= bound).all(), f"worst {err.max()} vs {bound.min()}"


@pytest.mark.parametrize("case", NATIVE_EXPERTS)
def test_experts_step_within_reference(case):
    for inputs, attrs, _ in _rows(case):
        got = lowered(EXPERTS, *inputs, **attrs)
        _judge(got, inputs, attrs)


@pytest.mark.parametrize("form", ["bfloat16-rounded", "int8"])
@pytest.mark.parametrize("simd", ["portable", "avx2", "avx512"])
def test_experts_step_on_reduced_weights(form, simd):
    if simd not in native.LIB.available():
        pytest.skip(f"this CPU lacks {simd}")
    rng = np.random.default_rng(7)
    E, I, H, k = 6, 96, 64, 3  # rows per expert 2I = 192, down rows H = 64
    x = rng.standard_normal((1, H)).astype(np.float32)
    w_in = rng.standard_normal((E, 2 * I, H)).astype(np.float32)
    w_down = rng.standard_normal((E, H, I)).astype(np.float32)
    routing = np.array([[[1, 3, 4], [0.2, 0.5, 0.3]]], np.float32)
    packed_in = EXPERTS.pack_reduced(2, w_in, form)
    packed_down = EXPERTS.pack_reduced(3, w_down, form)
    before = native.LIB.simd()
    native.LIB.use(simd)
    try:
        out = np.full((1, H), np.nan, np.float32)
        scratch = np.full(EXPERTS.scratch(x.shape, routing.shape, w_in.shape, w_down.shape),
                          np.nan, np.float32)
        step = EXPERTS.lower(out, x, routing, packed_in, packed_down, scratch=scratch)
        native.run(native.program([(step, None)]), {"start": 0, "rows": 1, "position": 0}, 0, 1)
    finally:
        native.LIB.use(before)
    widened = [x, routing, EXPERTS.widen_reduced(2, packed_in), EXPERTS.widen_reduced(3, packed_down)]
    _judge(out, widened, {}, reduced=form == "int8")


def test_unrouted_experts_are_never_read():
    rng = np.random.default_rng(3)
    E, I, H = 5, 8, 32
    x = rng.standard_normal((1, H)).astype(np.float32)
    w_in = rng.standard_normal((E, 2 * I, H)).astype(np.float32)
    w_down = rng.standard_normal((E, H, I)).astype(np.float32)
    w_in[[0, 2, 4]] = np.nan
    w_down[[0, 2, 4]] = np.nan
    routing = np.array([[[1, 3], [0.6, 0.4]]], np.float32)
    got = lowered(EXPERTS, x, routing, w_in, w_down)
    assert np.isfinite(got).all()


def test_a_routed_index_outside_the_experts_is_refused():
    x = np.ones((1, 8), np.float32)
    w_in, w_down = np.ones((2, 4, 8), np.float32), np.ones((2, 8, 2), np.float32)
    routing = np.array([[[0, 5], [0.5, 0.5]]], np.float32)
    with pytest.raises(ValueError, match="outside the experts"):
        lowered(EXPERTS, x, routing, w_in, w_down)


# ---- a prompt chunk's rows: one GEMM per expert hit --------------------------------------

@pytest.mark.parametrize("case", NATIVE_EXPERTS)
def test_experts_chunk_within_reference(case):
    """Every recorded row at once (the chunk's GEMM per expert), each row within the float64
    reference's tolerance of transformers' inputs."""
    inputs, attrs, _ = ex._case(case)
    assert inputs[0].shape[0] > 1
    got = lowered(EXPERTS, *inputs, **attrs)
    _judge(got, inputs, attrs)


def _held_stack(stack: np.ndarray, form: str, rng):
    """``stack`` as one held matrix of its E * rows rows: quantized by gguf-py where it
    quantizes the form, drawn blocks where it does not (the K forms)."""
    from iron_spec.operators.experts import HeldStack
    from iron_spec.runtime import holding
    from tests.operators.test_held import drawn_blocks
    E, R, H = stack.shape
    if form in ("Q4_K", "Q6_K"):
        matrix = holding.blocks(form, drawn_blocks(form, E * R, H, rng), (E * R, H))
    else:
        matrix = holding.convert(stack.reshape(E * R, H), form, "w")
    return HeldStack(matrix, E)


def _run(inputs, attrs, rows, capacity=None):
    """The step over ``inputs`` (x, routing at ``capacity`` rows, else their own), the
    call's ``rows`` of them run."""
    shapes = tuple(None if v is None else v.shape for v in inputs)
    out = np.full(EXPERTS.shape(*shapes, **attrs), np.nan, np.float32)
    scratch = np.full(EXPERTS.scratch(*shapes, **attrs), np.nan, np.float32)
    step = EXPERTS.lower(out, *inputs, scratch=scratch, **attrs)
    assert step is not None
    bound = () if capacity is None else (capacity,)
    native.run(native.program([(step, None, *bound)]), {"start": 0, "rows": rows,
                                                        "position": 0}, 0, 1)
    return out


@pytest.mark.parametrize("form", ["F32", "BF16", "F16", "Q8_0", "Q4_0", "Q4_K", "Q6_K"])
@pytest.mark.parametrize("rows", [1, 5])
def test_experts_on_held_stacks(form, rows):
    """Stacks held as stored (one matrix of E * rows rows in a held form, each expert's
    slice read as it is) in a decode step's row and a chunk's rows: the reference on the
    values the held form stands for (llama.cpp's dequantization), within tolerance; one row
    on a block form meets its inputs as 8-bit blocks."""
    rng = np.random.default_rng(11)
    E, I, H, k = 6, 256, 256, 2
    x = rng.standard_normal((rows, H)).astype(np.float32)
    w_in = (rng.standard_normal((E, 2 * I, H)) / 16).astype(np.float32)
    w_down = (rng.standard_normal((E, H, I)) / 16).astype(np.float32)
    chosen = np.stack([np.sort(rng.choice([0, 2, 3, 5], k, replace=False)) for _ in range(rows)])
    weights = rng.uniform(0.1, 1.0, (rows, k))
    routing = np.stack([chosen, weights], axis=1).astype(np.float32)
    held_in, held_down = _held_stack(w_in, form, rng), _held_stack(w_down, form, rng)
    got = _run([x, routing, held_in, held_down], {}, rows)
    widened = [x, routing, np.stack([held_in[e] for e in range(E)]),
               np.stack([held_down[e] for e in range(E)])]
    with np.errstate(over="ignore"):  # drawn K blocks' large values: silu's exp(-x) -> inf
        _judge(got, EXPERTS.reference_inputs(widened, [x, routing, held_in, held_down]), {},
               reduced=form.startswith("Q"), x8=form.startswith("Q") and rows == 1)


def test_a_chunk_runs_the_calls_rows_of_its_capacity():
    """A bounded step (a prompt chunk's arrays at their capacity of 8 rows) run on 3 rows:
    those rows' outputs as 3 rows alone give, the rest untouched."""
    rng = np.random.default_rng(5)
    E, I, H = 4, 16, 32
    x = rng.standard_normal((8, H)).astype(np.float32)
    w_in = rng.standard_normal((E, 2 * I, H)).astype(np.float32)
    w_down = rng.standard_normal((E, H, I)).astype(np.float32)
    routing = np.stack([np.tile([[0, 2]], (8, 1)), np.full((8, 2), 0.5)], 1).astype(np.float32)
    routing[:, 0, 1] = np.arange(8) % 3 + 1
    routing[:, 0].sort(axis=-1)
    got = _run([x, routing, w_in, w_down], {}, 3, capacity=8)
    alone = _run([x[:3], routing[:3], w_in, w_down], {}, 3)
    np.testing.assert_array_equal(got[:3], alone)
    assert np.isnan(got[3:]).all()


def test_a_chunk_reads_no_expert_its_rows_did_not_choose():
    rng = np.random.default_rng(3)
    E, I, H = 5, 8, 32
    x = rng.standard_normal((4, H)).astype(np.float32)
    w_in = rng.standard_normal((E, 2 * I, H)).astype(np.float32)
    w_down = rng.standard_normal((E, H, I)).astype(np.float32)
    w_in[[0, 2]] = np.nan
    w_down[[0, 2]] = np.nan
    routing = np.array([[[1, 3], [0.6, 0.4]], [[3, 4], [0.5, 0.5]], [[1, 4], [0.1, 0.9]],
                        [[1, 3], [0.3, 0.7]]], np.float32)
    got = lowered(EXPERTS, x, routing, w_in, w_down)
    assert np.isfinite(got).all()
    _judge(got, [x, routing, np.nan_to_num(w_in), np.nan_to_num(w_down)], {})


def test_by_hand_a_chunk_adds_each_rows_experts_weighted():
    """Two rows, identity-like experts: row 0 = 0.25 * 2 x + 0.75 * 3 x ... computed by hand
    (silu(g) * u with g, u the halves of each expert's product, then down = identity)."""
    H = I = 32
    x = np.linspace(-1, 1, 2 * H, dtype=np.float32).reshape(2, H)
    eye = np.eye(H, dtype=np.float32)
    w_in = np.stack([np.concatenate([eye * (e + 1), eye]) for e in range(3)])  # g = (e+1) x, u = x
    w_down = np.stack([eye] * 3)
    routing = np.array([[[0, 2], [0.25, 0.75]], [[1, 2], [0.5, 0.5]]], np.float32)
    got = lowered(EXPERTS, x, routing, w_in, w_down)
    silu = lambda v: v / (1 + np.exp(-v))  # noqa: E731
    want = np.stack([0.25 * silu(1 * x[0]) * x[0] + 0.75 * silu(3 * x[0]) * x[0],
                     0.5 * silu(2 * x[1]) * x[1] + 0.5 * silu(3 * x[1]) * x[1]])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("case", NATIVE_ROUTERS)
def test_router_step_over_a_chunks_rows_chooses_as_transformers(case):
    x, *rest = rt._inputs(case)
    attrs = rt._attrs(case)
    got = lowered(ROUTER, x, *rest, **attrs)
    np.testing.assert_array_equal(got[:, 0], rt.GOLDEN[f"{case}.indices"], err_msg=case)
    np.testing.assert_allclose(got[:, 1], rt.GOLDEN[f"{case}.weights"], rtol=2e-5, atol=1e-6,
                               err_msg=case)


# ---- a chunk's experts on Q8_0 stacks (_cpu_experts_q8.h) -----------------------------------

def _routed(counts, k, rng):
    """Routing (rows, 2, k) whose experts are hit by ``counts[e]`` rows each (k distinct
    experts a row, ascending: no count above the rows), with drawn weights, rows shuffled."""
    slots = np.array([e for e, c in enumerate(counts) for _ in range(c)])
    rows = len(slots) // k
    assert rows * k == len(slots) and max(counts) <= rows
    chosen = slots.reshape(k, rows).T[rng.permutation(rows)]  # row r: slots r, r + rows, ...
    weights = rng.uniform(0.1, 1.0, (rows, k))
    return np.stack([chosen, weights], axis=1).astype(np.float32)


# Rows an expert hit: one (a lone row), 8 (one 8-row vector), 9 and 16 (one 16-row panel),
# 17 and 24 (a panel and an 8-row vector), 41 (two panels and a vector), and experts no row
# chose.
Q8_COUNTS = [1, 0, 8, 9, 16, 0, 17, 24, 41, 4]


def _judge_held(got, x, routing, held_in, held_down, attrs):
    """``got`` against the float64 reference on the held stacks themselves (which rounds x
    and the hidden values as the chunk's Q8_0 GEMMs meet them: ``Experts.reference_inputs``,
    ``_hidden_rounding``), a value at a rounding midpoint allowed either way
    (``Experts.reconcile``), within the operator's tolerance."""
    inputs = EXPERTS.reference_inputs([x, routing, held_in, held_down, None, None, None],
                                      [x, routing, held_in, held_down])
    ref = EXPERTS.reference(*inputs, **attrs)
    ref = EXPERTS.reconcile(ref, got, inputs, attrs)
    bound = EXPERTS.tolerance(x.shape, routing.shape, held_in.shape, held_down.shape,
                              **attrs).bound(EXPERTS.scale(ref, *inputs, **attrs))
    err = np.abs(got - ref)
    assert (err <= bound).all(), f"worst {err.max()} vs {bound.min()}"


@pytest.mark.parametrize("bias", [False, True])
def test_q8_0_chunk_is_the_dense_q8_0_gemm_per_expert(bias):
    """A chunk on Q8_0 stacks: each expert's rows through the dense prompt GEMM on held Q8_0
    (``_cpu.gemm``: x as 8-bit blocks by VPDPBUSD, _cpu_held_gemm.h), relu between, the
    outputs added weighted in the experts' order: the same bits, whatever the rows per
    expert."""
    from iron_spec.operators import held
    if "avx512" not in native.LIB.available():
        pytest.skip("this CPU lacks AVX-512")
    rng = np.random.default_rng(17)
    E, I, H, k = len(Q8_COUNTS), 96, 64, 2
    routing = _routed(Q8_COUNTS, k, rng)
    rows = routing.shape[0]
    x = rng.standard_normal((rows, H)).astype(np.float32)
    held_in = _held_stack((rng.standard_normal((E, I, H)) / 8).astype(np.float32), "Q8_0", rng)
    held_down = _held_stack((rng.standard_normal((E, H, I)) / 8).astype(np.float32), "Q8_0", rng)
    b_in = rng.standard_normal((E, I)).astype(np.float32) if bias else None
    b_down = rng.standard_normal((E, H)).astype(np.float32) if bias else None
    attrs = dict(kind="plain", act="relu")
    got = _run([x, routing, held_in, held_down, b_in, b_down], attrs, rows)

    def gemm(v, stack, e, b):
        n = stack.shape[1]
        w = stack.raw()[e * n:(e + 1) * n]  # expert e's held rows, as they are
        twice = v.shape[0] == 1  # one row is the GEMV's: the chunk runs it as two
        v = np.concatenate([v, v]) if twice else v
        out = np.empty((v.shape[0], n), np.float32)
        native.LIB.gemm(out, v, w, None if b is None else b[e], held.code(stack.matrix))
        return out[:1] if twice else out

    want = np.zeros((rows, H), np.float32)
    idx = routing[:, 0].astype(int)
    for e in range(E):
        r, s = np.nonzero(idx == e)
        if len(r):
            y = gemm(np.maximum(gemm(x[r], held_in, e, b_in), np.float32(0)), held_down, e,
                     b_down)
            want[r] += y * routing[r, 1, s][:, None]
    np.testing.assert_array_equal(got, want)


def _q8_chunk(rng, H: int, I: int = 64, k: int = 2):
    """A chunk routed over Q8_COUNTS' experts (top-k): x (rows, H), its routing, and Q8_0
    stacks gate-up (E, 2I, H) and down (E, H, I) drawn at rng."""
    E = len(Q8_COUNTS)
    routing = _routed(Q8_COUNTS, k, rng)
    x = rng.standard_normal((routing.shape[0], H)).astype(np.float32)
    held_in = _held_stack((rng.standard_normal((E, 2 * I, H)) / 8).astype(np.float32), "Q8_0", rng)
    held_down = _held_stack((rng.standard_normal((E, H, I)) / 8).astype(np.float32), "Q8_0", rng)
    return x, routing, held_in, held_down


def test_q8_0_chunk_rows_come_out_alone():
    """On Q8_0 stacks each row's output bits are its own: a row's bits are the same run with
    the whole chunk or with only some of its rows (its expert's panel shared or not)."""
    x, routing, held_in, held_down = _q8_chunk(np.random.default_rng(19), H=96)
    rows = routing.shape[0]
    whole = _run([x, routing, held_in, held_down], {}, rows)
    for lo, hi in ((0, 2), (3, 20), (20, rows)):
        part = _run([x[lo:hi], routing[lo:hi], held_in, held_down], {}, hi - lo)
        np.testing.assert_array_equal(part, whole[lo:hi])
    _judge_held(whole, x, routing, held_in, held_down, {})


@pytest.mark.parametrize("attrs", [dict(weight_input=True), dict(gate_up="interleaved",
                                                                  limit=7.0, alpha=1.702,
                                                                  up_offset=1.0)])
def test_q8_0_chunk_other_experts_within_reference(attrs):
    """Llama 4's weighted inputs (each slot's x its own, quantized per slot) and gpt-oss's
    clamped interleaved experts on a chunk of Q8_0 stacks, within the reference's tolerance."""
    x, routing, held_in, held_down = _q8_chunk(np.random.default_rng(23), H=64)
    rows = routing.shape[0]
    got = _run([x, routing, held_in, held_down], attrs, rows)
    _judge_held(got, x, routing, held_in, held_down, attrs)
