"""The recurrent token mixers' operators: each kernel (chunked over a prompt's rows, a row at a
time in a decode step) against its float64 reference, which runs the plain recurrence a row
at a time; the state each carries from call to call; a sequence split into calls anywhere
computing what one call does.

The references themselves were compared with transformers' torch fallbacks
(``causal_conv1d_fn``, ``mamba_selective_scan``, ``mamba2_chunk_scan``,
``torch_chunk_gated_delta_rule``) in float64: 4e-16 for the convolution, 1e-7 relative for
the rest, which transformers runs in float32 whatever the model's dtype. The models' goldens
(tests/goldens/) judge them in CI.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from iron_spec.operators import OPERATORS


def decays(rng, shape, lo=0.5, hi=0.99):
    """``A_log`` whose decay ``exp(-exp(A_log) * dt)`` lies in [lo, hi] for dt near 1: state
    the recurrence remembers over tens of rows, so an error in how it is carried shows."""
    return np.log(-np.log(rng.uniform(lo, hi, shape))).astype(np.float32)


def inputs(name, rng, n):
    """An operator's inputs for ``n`` rows (its state last), and its attributes."""
    f = lambda *s, scale=1.0: (rng.standard_normal(s) * scale).astype(np.float32)  # noqa: E731
    if name == "causal_conv":
        C, K = 12, 4
        return [f(n, C), f(C, K, scale=0.5), f(C, scale=0.1), f(K - 1, C)], {"act": "silu"}
    if name == "selective_scan":
        D, N = 10, 6
        # dt near 1 after softplus (dt_raw about 0.5), so the decays are about exp(A).
        return [f(n, D), 0.55 + f(n, D, scale=0.2), decays(rng, (D, N)), f(n, N), f(n, N),
                f(D), f(n, D), f(D, N)], {}
    if name == "ssd":
        H, P, G, N = 4, 6, 2, 8
        return [f(n, H * P), f(n, H, scale=0.2), decays(rng, (H,)), f(n, G * N, scale=0.4),
                f(n, G * N, scale=0.4), f(H), np.full(H, 0.55, np.float32), f(H, P, N)], \
            {"heads": H, "groups": G, "dt_min": 0.0, "dt_max": math.inf}
    if name == "gated_delta_rule":
        Hk, Dk, Hv, Dv = 2, 8, 4, 6
        return [f(n, Hk * Dk), f(n, Hk * Dk), f(n, Hv * Dv), f(n, Hv, scale=0.2), f(n, Hv),
                decays(rng, (Hv,)), np.full(Hv, 0.55, np.float32), f(Hv, Dk, Dv, scale=0.3)], \
            {"k_heads": Hk, "v_heads": Hv}
    raise KeyError(name)


PACKED = {"causal_conv": (1,), "selective_scan": (2,), "ssd": (2,), "gated_delta_rule": (5,)}
RECURRENT = sorted(PACKED)


def kernel(name, ins, start, **attrs):
    """The kernel on float32 copies of ``ins`` (weights packed): its output and the state."""
    op = OPERATORS[name]
    shapes = [None if x is None else x.shape for x in ins]
    args = [None if x is None else op.pack(i, x, **attrs) if i in PACKED[name] else x.copy()
            for i, x in enumerate(ins)]
    out = np.full(op.shape(*shapes, start=start, **attrs), np.nan, np.float32)
    scratch = np.full(max(1, op.scratch(*shapes, start=start, **attrs)), np.nan, np.float32)
    op.kernel(out, *args, scratch=scratch, start=start, **attrs)
    return out, args[op.updates]


def reference(name, ins, start, **attrs):
    """The float64 reference on ``ins``: its output and the state it updated."""
    op = OPERATORS[name]
    args = [None if x is None else np.array(x, np.float64) for x in ins]
    return op.reference(*args, start=start, **attrs), args[op.updates]


def assert_within(name, got, ref, ins, attrs, state=False):
    op = OPERATORS[name]
    shapes = [None if x is None else x.shape for x in ins]
    if state:
        bound = op.state_tolerance(*shapes, **attrs).bound(op.state_scale(ref))
    else:
        bound = op.tolerance(*shapes, **attrs).bound(op.scale(ref, *ins, **attrs))
    err = np.abs(np.asarray(got, np.float64) - ref)
    assert np.isfinite(got).all() and (err <= bound).all(), \
        f"{name}: worst {err.max():.3g}, bound there {np.broadcast_to(bound, err.shape).flat[err.argmax()]:.3g}"


@pytest.mark.parametrize("name", RECURRENT)
@pytest.mark.parametrize("n", [1, 3, 64, 150])
@pytest.mark.parametrize("start", [0, 37])
def test_kernel_matches_the_recurrence(name, n, start):
    """A prompt chunk's rows (chunked: 64, and 150 crossing two chunk boundaries) and a
    decode step's one, from a fresh sequence and from a carried state."""
    rng = np.random.default_rng(n * 7 + start)
    ins, attrs = inputs(name, rng, n)
    got, got_state = kernel(name, ins, start, **attrs)
    ref, ref_state = reference(name, ins, start, **attrs)
    assert_within(name, got, ref, ins, attrs)
    assert_within(name, got_state, ref_state, ins, attrs, state=True)


@pytest.mark.parametrize("name", RECURRENT)
def test_a_fresh_sequence_ignores_the_state_held(name):
    """At start 0 the state before the call is zeros, whatever the array held: a session
    beginning again needs no reset."""
    rng = np.random.default_rng(1)
    ins, attrs = inputs(name, rng, 5)
    zeroed = list(ins)
    zeroed[-1] = np.zeros_like(ins[-1])
    for run in (kernel, reference):
        a, sa = run(name, ins, 0, **attrs)
        b, sb = run(name, zeroed, 0, **attrs)
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(sa, sb)


#: The inputs of each operator holding a row per position (the rest: weights, the state).
ROWS = {"causal_conv": (0,), "selective_scan": (0, 1, 3, 4, 6), "ssd": (0, 1, 3, 4),
        "gated_delta_rule": (0, 1, 2, 3, 4)}


def _split(name, ins, at):
    """``ins`` cut at row ``at``: the per-row inputs split, the rest kept."""
    first = [x[:at] if i in ROWS[name] else x for i, x in enumerate(ins)]
    second = [x[at:] if i in ROWS[name] else x for i, x in enumerate(ins)]
    return first, second


@pytest.mark.parametrize("name", RECURRENT)
def test_the_reference_carries_its_state_exactly(name):
    """The reference's state after 70 rows, fed to a call of the next 80, gives the same
    rows as one call of 150: the recurrence is the state, nothing else."""
    rng = np.random.default_rng(2)
    ins, attrs = inputs(name, rng, 150)
    whole, whole_state = reference(name, ins, 0, **attrs)
    first, second = _split(name, ins, 70)
    a, state = reference(name, first, 0, **attrs)
    second[-1] = state
    b, state = reference(name, second, 70, **attrs)
    np.testing.assert_allclose(np.concatenate([a, b]), whole, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(state, whole_state, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", RECURRENT)
def test_chunked_equals_one_row_at_a_time(name):
    """The same 100 rows in one call (the chunked form) and as 100 calls of one (the decode
    step's recurrence): two algorithms, the same numbers within the kernels' tolerance."""
    rng = np.random.default_rng(3)
    n = 100
    ins, attrs = inputs(name, rng, n)
    whole, whole_state = kernel(name, ins, 0, **attrs)
    rows, state = [], ins[-1]
    rest = ins
    for t in range(n):
        one, rest = _split(name, rest, 1)
        one[-1] = state
        y, state = kernel(name, one, t, **attrs)
        rows.append(y)
    ref, ref_state = reference(name, ins, 0, **attrs)
    assert_within(name, np.concatenate(rows), ref, ins, attrs)
    assert_within(name, whole, ref, ins, attrs)
    np.testing.assert_allclose(np.concatenate(rows), whole, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(state, whole_state, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("name", RECURRENT)
def test_a_wrong_state_shows(name):
    """The state matters: the same rows from another state differ (the test can fail)."""
    rng = np.random.default_rng(4)
    ins, attrs = inputs(name, rng, 4)
    a, _ = reference(name, ins, 9, **attrs)
    other = list(ins)
    other[-1] = ins[-1] + np.float32(0.5)
    b, _ = reference(name, other, 9, **attrs)
    assert np.abs(a - b).max() > 1e-3


def test_gated_rms_norm_orders():
    """Both orders against the reference, and against each other they differ."""
    rng = np.random.default_rng(5)
    x, z = rng.standard_normal((2, 7, 24)).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(24)).astype(np.float32)
    op = OPERATORS["gated_rms_norm"]
    outs = []
    for gate_first in (False, True):
        attrs = {"group": 8, "eps": 1e-5, "gate_first": gate_first}
        out = np.full((7, 24), np.nan, np.float32)
        op.kernel(out, x, z, w, scratch=np.full(7 * 24, np.nan, np.float32), **attrs)
        ref = op.reference(x, z, w, **attrs)
        bound = op.tolerance(x.shape, z.shape, w.shape, **attrs).bound(np.abs(ref))
        assert (np.abs(out - ref) <= bound).all()
        outs.append(out)
    assert np.abs(outs[0] - outs[1]).max() > 1e-2


@pytest.mark.parametrize("name", RECURRENT)
def test_shapes_that_do_not_fit_are_refused(name):
    rng = np.random.default_rng(6)
    ins, attrs = inputs(name, rng, 3)
    op = OPERATORS[name]
    shapes = [x.shape for x in ins]
    shapes[-1] = tuple(s + 1 for s in shapes[-1])
    with pytest.raises(ValueError, match=name):
        op.shape(*shapes, **attrs)


# ---- the native steps (operators/_cpu_recurrent.h), each instruction set ---------------------

from iron_spec.operators import native  # noqa: E402

NATIVE_ROWS = {"causal_conv": (1, 5, 70), "selective_scan": (1, 5, 70), "ssd": (1,),
               "gated_delta_rule": (1,)}


def native_step(name, ins, start, **attrs):
    """The operator's native step alone on float32 copies of ``ins``: output and state."""
    op = OPERATORS[name]
    shapes = [None if x is None else x.shape for x in ins]
    args = [None if x is None else op.pack(i, x, **attrs) if i in PACKED[name] else x.copy()
            for i, x in enumerate(ins)]
    out = np.full(op.shape(*shapes, start=start, **attrs), np.nan, np.float32)
    step = op.lower(out, *args, scratch=None, **attrs)
    assert step is not None, f"{name} has no native step for {shapes}"
    prog = native.program([(step, start)])
    native.run(prog, {"start": start, "position": start, "rows": 1}, 0, 1)
    return out, args[op.updates]


@pytest.mark.skipif(not native.PROGRAM, reason="no native program here")
@pytest.mark.parametrize("name", RECURRENT)
@pytest.mark.parametrize("start", [0, 11])
def test_native_step_matches_the_recurrence(name, start, simd):
    for n in NATIVE_ROWS[name]:
        rng = np.random.default_rng(n + start)
        ins, attrs = inputs(name, rng, n)
        got, got_state = native_step(name, ins, start, **attrs)
        ref, ref_state = reference(name, ins, start, **attrs)
        assert_within(name, got, ref, ins, attrs)
        assert_within(name, got_state, ref_state, ins, attrs, state=True)


@pytest.mark.skipif(not native.PROGRAM, reason="no native program here")
@pytest.mark.parametrize("gate_first", [False, True])
@pytest.mark.parametrize("weight", ["whole", "group"])
def test_native_gated_rms_norm(gate_first, weight, simd):
    rng = np.random.default_rng(7)
    op = OPERATORS["gated_rms_norm"]
    for n in (1, 9):
        x, z = rng.standard_normal((2, n, 40)).astype(np.float32)
        w = (1 + 0.1 * rng.standard_normal(40 if weight == "whole" else 20)).astype(np.float32)
        attrs = {"group": 20, "eps": 1e-5, "gate_first": gate_first}
        out = np.full((n, 40), np.nan, np.float32)
        prog = native.program([(op.lower(out, x, z, w, **attrs), None)])
        native.run(prog, {"start": 0, "position": 0, "rows": 1}, 0, 1)
        ref = op.reference(x, z, w, **attrs)
        assert (np.abs(out - ref) <= op.tolerance(x.shape, z.shape, w.shape, **attrs).bound(
            np.abs(ref))).all()


@pytest.mark.skipif(not native.PROGRAM, reason="no native program here")
def test_native_steps_a_column_view():
    """Inputs that are columns of a fused projection (rows apart) are read as such."""
    rng = np.random.default_rng(8)
    ins, attrs = inputs("causal_conv", rng, 6)
    wide = np.zeros((6, 30), np.float32)
    wide[:, 5:17] = ins[0]
    viewed = [wide[:, 5:17]] + ins[1:]
    got, state = native_step("causal_conv", viewed, 3, **attrs)
    want, want_state = kernel("causal_conv", ins, 3, **attrs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(state, want_state)
