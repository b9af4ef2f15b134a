"""A native program's steps (``Operator.lower``, operators/_cpu_program.h): each operator's
native step judged by the same float64 reference and tolerance as its numpy kernel, the
steps that have none left to the plan, and a program refusing arrays that do not fit."""

from __future__ import annotations

import numpy as np
import pytest

from iron_spec.operators import native
from iron_spec.operators.activation import Activation, GatedActivation
from iron_spec.operators.attention import Attention, KVWrite, alibi_slopes
from iron_spec.operators.base import PerCall
from iron_spec.operators.elementwise import Add, Clamp, Columns, Mul, TakeRow
from iron_spec.operators.embedding import Embedding
from iron_spec.operators.layernorm import LayerNorm
from iron_spec.operators.linear import Linear
from iron_spec.operators.norm import RMSNorm
from iron_spec.operators.positions import AddRows
from iron_spec.operators.rope import Rope, rope_inv_freq, rope_tables
from iron_spec.operators.softcap import Softcap

pytestmark = pytest.mark.skipif(not native.PROGRAM, reason="no native program here "
                                "(operators._cpu not built, or IRON_SPEC_PROGRAM / _NATIVE off)")


def lowered(op, *inputs, packed=(), start=None, **attrs):
    """The operator's native step run alone on float32 copies of ``inputs`` (``packed``
    through ``op.pack``), its output and scratch NaN first; the array it wrote."""
    while inputs and inputs[-1] is None:  # an absent optional input: not given
        inputs = inputs[:-1]
    shapes = tuple(np.shape(x) for x in inputs)
    every = dict(attrs, **({} if start is None else {"start": start}))
    args = [None if x is None else op.pack(i, x, **every) if i in packed else
            np.array(x, np.float32 if np.asarray(x).dtype.kind == "f" else np.asarray(x).dtype)
            for i, x in enumerate(inputs)]
    out = np.full(op.shape(*shapes, **every), np.nan, np.float32)
    scratch = np.full(max(1, op.scratch(*shapes, **every)), np.nan, np.float32)
    step = op.lower(out, *args, scratch=scratch, **attrs)
    assert step is not None, f"{op.name} {attrs} has no native step"
    prog = native.program([(step, start)])
    native.run(prog, {"start": start or 0, "position": start or 0, "rows": 1}, 0, 1)
    return args[op.writes] if op.writes is not None else out


def check(op, *inputs, packed=(), start=None, **attrs):
    while inputs and inputs[-1] is None:
        inputs = inputs[:-1]
    got = lowered(op, *inputs, packed=packed, start=start, **attrs)
    every = dict(attrs, **({} if start is None else {"start": start}))
    ref_in = [None if x is None else np.array(x) for x in inputs]
    ref = op.reference(*ref_in, **every)
    shapes = tuple(np.shape(x) for x in inputs)
    bound = op.tolerance(*shapes, **every).bound(op.scale(ref, *inputs, **every))
    err = np.abs(got.astype(np.float64) - ref)
    assert (err <= bound).all(), f"{op.name} {every}: worst {np.nanmax(err)}"
    return got


@pytest.mark.parametrize("rows, cols", [(1, 1), (7, 37), (960, 576)])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_row(randn, rows, cols, bias):
    check(Linear(), randn(1, cols), randn(rows, cols), randn(rows) if bias else None, packed=(1,))


@pytest.mark.parametrize("x, w", [((1, 576), (576,)), ((1, 37), (37,)), ((1, 4, 64), (64,)),
                                  ((1, 3, 20), (3, 20))])
@pytest.mark.parametrize("plus_one", [False, True])
def test_rms_norm_per_row_and_per_head(randn, x, w, plus_one):
    check(RMSNorm(), randn(*x, scale=3.0), randn(*w), packed=(1,), eps=1e-6, plus_one=plus_one)


@pytest.mark.parametrize("scale", [1.0, 0.22])
def test_add(randn, scale):
    check(Add(), randn(1, 577), randn(1, 577), scale=scale)


@pytest.mark.parametrize("b", [None, (1, 3, 8), (1,), (8,), (3, 8)])
def test_mul_broadcast_from_trailing_axes(randn, b):
    check(Mul(), randn(1, 3, 8), None if b is None else randn(*b), scale=0.7)


def test_mul_along_a_leading_axis_is_left_to_numpy(randn):
    a, b = randn(2, 3, 8), randn(2, 1, 1)
    assert Mul().lower(np.empty_like(a), a, b) is None


@pytest.mark.parametrize("act", ["silu", "swish", "gelu_pytorch_tanh", "gelu_new", "sigmoid"])
@pytest.mark.parametrize("fused", [False, True])
def test_gated_activation(simd, randn, act, fused):
    # Out to both tails of exp and tanh, and near 0 (tanh's 1 - e cancels there).
    gate = randn(1, 2 * 37 if fused else 37, scale=12.0)
    gate[0, :8] *= 1e-4
    gate[0, 8:11] = [0.0, -0.0, 88.0]
    check(GatedActivation(), gate, None if fused else randn(1, 37), act=act)


def test_an_activation_without_a_native_form_is_left_to_numpy(randn):
    g = randn(1, 8)
    assert GatedActivation().lower(np.empty_like(g), g, g, scratch=np.empty(24, np.float32),
                                   act="mish") is None


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary", [16, 8])
@pytest.mark.parametrize("start", [0, 5, 31])
def test_rope_row(randn, interleaved, rotary, start):
    cos, sin = rope_tables(rope_inv_freq(rotary, 10000.0)[0], 32, 1.0)
    check(Rope(), randn(1, 3, 16), cos, sin, packed=(1, 2), start=start, interleaved=interleaved)


@pytest.mark.parametrize("ring, start", [(None, 0), (None, 9), (6, 4), (6, 13)])
def test_kv_write_places_the_row_where_the_reference_does(rng, ring, start):
    x = rng.standard_normal((1, 2, 8)).astype(np.float32)
    cache = rng.standard_normal((2, 6 if ring else 16, 8)).astype(np.float32)
    got = lowered(KVWrite(), x, cache, start=start, ring=ring)
    want = KVWrite().reference(x, cache.astype(np.float64), start=start, ring=ring)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("window, softcap, ring, start", [
    (None, None, None, 0), (None, None, None, 20), (4, None, None, 20), (None, 2.5, None, 7),
    (4, None, 8, 19)])
@pytest.mark.parametrize("alibi", [False, True])
def test_attention_one_query(simd, randn, window, softcap, ring, start, alibi):
    keys, values = randn(2, ring or 32, 16), randn(2, ring or 32, 16)
    check(Attention(), randn(1, 6, 16), keys, values, start=start, window=window,
          softcap=softcap, ring=ring, alibi=alibi_slopes(6) if alibi else None)


@pytest.mark.parametrize("scale", [1.0, 24.0 ** 0.5])
def test_embedding_row(randn, scale):
    check(Embedding(), np.array([5], np.int32), randn(11, 24), scale=scale)


def test_a_program_refuses_arrays_that_do_not_fit(randn):
    x, w, y = randn(1, 8), randn(4, 8), np.empty((1, 5), np.float32)
    step = native.Step(native.OP_GEMV, (y, x, w, None), (4, 8))
    with pytest.raises(ValueError, match="step 0 .*array 0 is 20 bytes"):
        native.program([(step, None)])


def test_a_position_past_the_cache_is_refused_naming_the_step(randn):
    cache = np.zeros((2, 4, 8), np.float32)
    step = KVWrite().lower(cache, randn(1, 2, 8), cache)
    prog = native.program([(step, PerCall("position"))])
    with pytest.raises(ValueError, match="step 0: kv_write: positions 4 .. 4 are past the cache.s 4 rows"):
        native.run(prog, {"start": 4, "position": 4, "rows": 1}, 0, 1)
    assert not cache.any()
    with pytest.raises(ValueError, match="steps 0 .. 2 are not within 0 .. 1"):
        native.run(prog, {"start": 0, "position": 0, "rows": 1}, 0, 2)


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(12, 2, 16), (5, 1, 24), (8, 8, 20),
                                                       (9, 3, 64), (20, 2, 64)])
@pytest.mark.parametrize("alibi", [False, True])
def test_attention_groups_of_any_size_and_heads_of_any_width(simd, randn, heads, kv_heads,
                                                             head_dim, alibi):
    # Groups of more query heads than one pass takes (8), widths past whole vectors, and
    # positions past a block of eight keys.
    keys, values = randn(kv_heads, 40, head_dim), randn(kv_heads, 40, head_dim)
    check(Attention(), randn(1, heads, head_dim), keys, values, start=37, softcap=4.0,
          alibi=alibi_slopes(heads, 4.0) if alibi else None)


@pytest.mark.parametrize("x, w", [((1, 64), (64,)), ((1, 37), (37,)), ((1, 3, 20), (3, 20))])
@pytest.mark.parametrize("bias, plus_one", [(False, False), (True, False), (True, True)])
def test_layer_norm(randn, x, w, bias, plus_one):
    xs = randn(*x, scale=2.0) + 5.0  # far from zero mean: the two passes keep it exact
    check(LayerNorm(), xs, randn(*w), randn(*w) if bias else None, packed=(1,), eps=1e-5,
          plus_one=plus_one)


def test_columns(randn):
    check(Columns(), randn(1, 30), begin=7, end=19)


@pytest.mark.parametrize("act", ["silu", "gelu_new", "gelu", "gelu_python", "relu", "relu2",
                                 "quick_gelu", "sigmoid"])
def test_activation(simd, randn, act):
    x = randn(1, 45, scale=6.0)
    x[0, :4] = [0.0, -0.0, 1e-5, -1e-5]
    check(Activation(), x, act=act)


def test_an_activation_keeps_nan_as_numpy_does(randn):
    x = randn(1, 16)
    x[0, 3] = np.nan
    for act in ("relu", "relu2", "silu", "gelu"):
        assert np.isnan(lowered(Activation(), x, act=act)[0, 3]), act


def test_clamp(randn):
    check(Clamp(), randn(1, 40, scale=3.0), limit=1.7)


@pytest.mark.parametrize("n", [5, 1000])
def test_softcap(simd, randn, n):
    check(Softcap(), randn(1, n, scale=40.0), cap=30.0)


def test_add_rows(randn):
    check(AddRows(), randn(1, 24), randn(9, 24), start=6)


# ---- bounded steps: a prompt chunk's, over the call's rows of arrays at their capacity ----

C = 8  # the capacity: every bounded array's rows


def chunk(op, *inputs, rows, bounded=(0,), apart=(), packed=(), start=None, **attrs):
    """``op``'s native step over arrays of ``C`` rows (the inputs in ``bounded``: row
    ``rows`` on NaN, or -1 for ids, so a row read past the call's shows), run at ``rows``
    rows from ``start``; inputs in ``apart`` as column views of wider arrays (rows apart).
    Returns what it wrote and the float64 reference of the call's rows."""
    shapes = tuple(np.shape(x) for x in inputs)
    every = dict(attrs, **({} if start is None else {op.call_attr: start}))
    args = []
    for i, x in enumerate(inputs):
        if i in packed:
            args.append(op.pack(i, x, **every))
            continue
        a = np.array(x, np.float32 if np.asarray(x).dtype.kind == "f" else np.asarray(x).dtype)
        if i in bounded:
            a[rows:] = -1 if a.dtype.kind == "i" else np.nan
        if i in apart:
            wide = np.full((a.shape[0], 3 * (a.size // a.shape[0])), np.nan, np.float32)
            wide[:, : a.size // a.shape[0]] = a.reshape(a.shape[0], -1)
            a = wide[:, : a.size // a.shape[0]].reshape(a.shape)
            assert not a.flags.c_contiguous
        args.append(a)
    out = np.full(op.shape(*shapes, **every), np.nan, np.float32)
    scratch = np.full(max(1, op.scratch(*shapes, **every)), np.nan, np.float32)
    step = op.lower(out, *args, scratch=scratch, **attrs)
    assert step is not None and step.rows is not None, f"{op.name} has no bounded step"
    at = PerCall("rows", -1) if op.call_attr == "index" else None if start is None \
        else PerCall("start")
    prog = native.program([(step, at, C)])
    first = start or 0
    native.run(prog, {"start": first, "rows": rows, "position": first + rows - 1}, 0, 1)
    ref_in = [np.asarray(x)[:rows] if i in bounded else np.asarray(x) for i, x in enumerate(inputs)]
    if op.call_attr == "index":
        every["index"] = rows - 1
    ref = op.reference(*ref_in, **every)
    got = args[op.writes] if op.writes is not None else out
    return got, ref, ref_in, every


def judged(op, *inputs, rows, **kw):
    """``chunk``'s rows within the operator's tolerance of its reference, the rows past the
    call's untouched (NaN)."""
    got, ref, ref_in, every = chunk(op, *inputs, rows=rows, **kw)
    shapes = tuple(np.shape(x) for x in ref_in)
    bound = op.tolerance(*shapes, **every).bound(op.scale(ref, *ref_in, **every))
    mine = got[:ref.shape[0]].astype(np.float64)
    assert (np.abs(mine - ref) <= bound).all(), f"{op.name}: worst {np.nanmax(np.abs(mine - ref))}"
    if op.keeps_bound:
        assert np.isnan(got[rows:]).all(), f"{op.name} wrote past the call's rows"


@pytest.mark.parametrize("rows", [1, 5, C])
def test_bounded_linear_is_the_gemm_over_the_calls_rows(randn, rows):
    judged(Linear(), randn(C, 37), randn(19, 37), randn(19), rows=rows, packed=(1,))


@pytest.mark.parametrize("x, w", [((C, 37), (37,)), ((C, 3, 20), (20,)), ((C, 3, 20), (3, 20))])
def test_bounded_rms_norm_and_layer_norm_over_rows_apart(simd, randn, x, w):
    judged(RMSNorm(), randn(*x, scale=3.0), randn(*w), rows=5, packed=(1,), apart=(0,), eps=1e-6)
    judged(LayerNorm(), randn(*x, scale=2.0) + 5.0, randn(*w), randn(*w), rows=5, packed=(1,),
           apart=(0,), eps=1e-5)


@pytest.mark.parametrize("act", ["silu", "gelu_pytorch_tanh", "gelu", "relu2", "sigmoid"])
def test_bounded_gated_and_plain_activation(simd, randn, act):
    judged(GatedActivation(), randn(C, 37, scale=4.0), randn(C, 37), rows=3, bounded=(0, 1),
           apart=(0, 1), act=act)
    judged(GatedActivation(), randn(C, 2 * 37, scale=4.0), rows=3, act=act)  # fused gate, up
    judged(Activation(), randn(C, 45, scale=6.0), rows=6, act=act)


def test_bounded_elementwise(randn):
    judged(Add(), randn(C, 33), randn(C, 33), rows=4, bounded=(0, 1), scale=0.5)
    judged(Mul(), randn(C, 3, 8), randn(3, 8), rows=4, scale=1.0)
    judged(Clamp(), randn(C, 40, scale=3.0), rows=7, apart=(0,), limit=1.7)
    judged(Softcap(), randn(C, 40, scale=40.0), rows=2, cap=30.0)
    judged(Columns(), randn(C, 30), rows=3, begin=7, end=19)
    judged(AddRows(), randn(C, 24), randn(20, 24), rows=5, start=9)


@pytest.mark.parametrize("interleaved", [False, True])
def test_bounded_rope_turns_row_r_at_table_row_start_plus_r(simd, randn, interleaved):
    cos, sin = rope_tables(rope_inv_freq(12, 10000.0)[0], 32, 1.0)
    judged(Rope(), randn(C, 3, 16), cos, sin, rows=6, packed=(1, 2), apart=(0,), start=26,
           interleaved=interleaved)


@pytest.mark.parametrize("ring, start, rows", [(None, 0, C), (None, 9, 3), (12, 4, 5),
                                               (12, 10, 5), (12, 23, C)])
def test_bounded_kv_write_places_each_row_where_the_reference_does(randn, ring, start, rows):
    cache = randn(2, ring or 24, 8)
    got, ref, _, _ = chunk(KVWrite(), randn(C, 2, 8), cache, rows=rows, start=start,
                           apart=(0,), ring=ring)
    assert np.array_equal(got, ref)  # a copy: exact, and no row of the cache but these


@pytest.mark.parametrize("window, softcap, ring, start, rows", [
    (None, None, None, 0, C), (None, None, None, 11, 5), (4, None, None, 20, 7),
    (None, 2.5, None, 3, 1), (4, None, 12, 19, C)])
@pytest.mark.parametrize("alibi", [False, True])
def test_bounded_attention_of_a_chunk(simd, randn, window, softcap, ring, start, rows, alibi):
    keys, values = randn(2, ring or 32, 16), randn(2, ring or 32, 16)
    judged(Attention(), randn(C, 6, 16), keys, values, rows=rows, apart=(0,), start=start,
           window=window, softcap=softcap, ring=ring, alibi=alibi_slopes(6) if alibi else None)


@pytest.mark.parametrize("rows", [1, 6])
def test_bounded_embedding_and_take_row(randn, rows):
    ids = np.array([5, 0, 10, 3, 3, 7, 1, 2], np.int32)
    judged(Embedding(), ids, randn(11, 24), rows=rows, scale=2.0)
    x = randn(C, 24)
    got, _, _, _ = chunk(TakeRow(), x, rows=rows)
    assert np.array_equal(got[0], x[rows - 1])  # the call's last row, as it is


def test_a_bounded_step_refuses_rows_past_its_capacity(randn):
    x, y = randn(C, 8), np.empty((C, 8), np.float32)
    prog = native.program([(Add().lower(y, x, x), None, C)])
    for rows in (0, C + 1):
        with pytest.raises(ValueError, match=f"step 0: rows {rows} are not within 1 .. the "
                                             f"capacity of {C}"):
            native.run(prog, {"start": 0, "rows": rows, "position": 0}, 0, 1)


def test_a_program_refuses_bounded_arrays_that_do_not_fit(randn):
    x, y = randn(C, 8), np.empty((C, 8), np.float32)
    with pytest.raises(ValueError, match="int 0 .64. is no multiple of its capacity of 5"):
        native.program([(Add().lower(y, x, x), None, 5)])
    with pytest.raises(ValueError, match="step 0 .op 0. takes no rows"):
        native.program([(Linear().lower(y[:1], x[:1], randn(8, 8)), None, 1)])
    wide = randn(C, 16)
    with pytest.raises(ValueError, match="step 0's array 1 is not a C-contiguous array"):
        native.program([(native.Step(native.OP_ADD, (y, wide[:, :8], x), (64,), (1.0,), 0),
                         None, C)])
    with pytest.raises(ValueError, match="step 0 .op 15.: array 0 is 256 bytes"):
        native.program([(native.Step(native.OP_GEMM, (y, x, randn(4, 8), None), (4, 8, C), (),
                                     2), None, C)])


def test_bounded_positions_past_the_cache_or_table_are_refused(randn):
    call = {"start": 20, "rows": 5, "position": 24}
    cache = np.zeros((2, 24, 8), np.float32)
    prog = native.program([(KVWrite().lower(cache, randn(C, 2, 8), cache), PerCall("start"), C)])
    with pytest.raises(ValueError, match="kv_write: positions 20 .. 24 are past the cache's 24"):
        native.run(prog, call, 0, 1)
    assert not cache.any()  # nothing written
    ring = np.zeros((2, 12, 8), np.float32)  # a ring not yet grown to its 16 rows
    prog = native.program([(KVWrite().lower(ring, randn(C, 2, 8), ring, ring=16),
                            PerCall("start"), C)])
    with pytest.raises(ValueError, match="kv_write: positions 10 .. 14 are past"):
        native.run(prog, {"start": 10, "rows": 5, "position": 14}, 0, 1)
    cos, sin = rope_tables(rope_inv_freq(16, 10000.0)[0], 24, 1.0)
    x, out = randn(C, 3, 16), np.empty((C, 3, 16), np.float32)
    step = Rope().lower(out, x, Rope().pack(1, cos), Rope().pack(2, sin))
    with pytest.raises(ValueError, match=r"rope: positions 20 .. 24 are past the table's 24"):
        native.run(native.program([(step, PerCall("start"), C)]), call, 0, 1)
    q, keys = randn(C, 4, 8), randn(2, 24, 8)
    out, scratch = np.empty((C, 32), np.float32), np.empty(100000, np.float32)
    step = Attention().lower(out, q, keys, keys, scratch=scratch)
    with pytest.raises(ValueError, match="attention: the queries' positions are past the cache"):
        native.run(native.program([(step, PerCall("start"), C)]), call, 0, 1)
    step = Attention().lower(out, q, keys, keys, scratch=scratch[:100])
    with pytest.raises(ValueError, match="attention: the scratch is short for these positions"):
        native.run(native.program([(step, PerCall("start"), C)]), {**call, "start": 0}, 0, 1)
    table, y = randn(22, 8), np.empty((C, 8), np.float32)
    step = AddRows().lower(y, randn(C, 8), table)
    with pytest.raises(ValueError, match="add_rows: positions 20 .. 24 are past the table's 22"):
        native.run(native.program([(step, PerCall("start"), C)]), call, 0, 1)


def test_an_id_outside_the_vocabulary_is_refused_naming_its_row(randn):
    ids, out = np.array([1, 2, 11, 0, 0, 0, 0, 0], np.int32), np.zeros((C, 4), np.float32)
    prog = native.program([(Embedding().lower(out, ids, randn(11, 4)), None, C)])
    native.run(prog, {"start": 0, "rows": 2, "position": 1}, 0, 1)  # rows 0, 1: in it
    with pytest.raises(ValueError, match=r"embedding: row 2's token id 11 is outside the "
                                         r"vocabulary \(0 .. 10\)"):
        native.run(prog, {"start": 0, "rows": 3, "position": 2}, 0, 1)


def test_a_profile_counts_each_step_by_its_code(randn):
    # A program of three GEMVs and an add, run twice: 6 gemv and 2 add calls counted, and
    # nothing once the profile has ended.
    x, w = randn(8), randn(4, 8)
    ys = [np.empty(4, np.float32) for _ in range(3)]
    steps = [(native.Step(native.OP_GEMV, (y, x, w, None), (4, 8)), None) for y in ys]
    total = np.empty(4, np.float32)
    steps.append((Add().lower(total, ys[0], ys[1]), None))
    prog = native.program(steps)
    call = {"start": 0, "position": 0, "rows": 1}
    with native.profile() as prof:
        native.run(prog, call, 0, 4)
        native.run(prog, call, 0, 4)
    assert {k: calls for k, (calls, _) in prof.items()} == {"gemv": 6, "add": 2}
    assert all(seconds >= 0 for _, seconds in prof.values())
    np.testing.assert_allclose(total, w @ x + w @ x, rtol=1e-5)
    with native.profile() as prof:
        pass
    assert prof == {}
    native.run(prog, call, 0, 4)  # outside: counted nowhere
    with native.profile() as prof:
        native.run(prog, call, 3, 4)
    assert {k: calls for k, (calls, _) in prof.items()} == {"add": 1}
