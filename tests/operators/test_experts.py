"""The experts against transformers' own experts modules (``moe_golden/experts.npz``, recorded
from transformers 5.25 by ``moe_golden/record.py`` on drawn float64 weights, inputs and
routing), each family's stored layout turned into ours here by plain transposes, and the
float32 kernel against the reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from iron_spec.operators import OPERATORS
from tests.operators.conftest import _check_kernel

OP = OPERATORS["experts"]
GOLDEN = np.load(Path(__file__).parent / "moe_golden" / "experts.npz")


def _t(a):  # (E, a, b) -> (E, b, a): a transposed stack of matrices
    return np.ascontiguousarray(np.swapaxes(a, 1, 2))


def _routing(case: str) -> np.ndarray:
    idx, w = GOLDEN[f"{case}.indices"], GOLDEN[f"{case}.weights"]
    order = np.argsort(idx, axis=-1)
    return np.stack([np.take_along_axis(idx, order, -1).astype(np.float64),
                     np.take_along_axis(w, order, -1)], axis=1)


def _case(case: str):
    """Our inputs and attributes for each recorded module, and what it returned."""
    g = lambda name: GOLDEN[f"{case}.{name}"]  # noqa: E731
    x, routing, want = g("x"), _routing(case), g("out")
    E = routing.shape[-1]
    if case == "qwen3_moe":
        return [x, routing, g("gate_up_proj"), g("down_proj")], {"act": "silu"}, want
    if case == "gpt_oss":  # stored (E, H, 2I) with gate and up interleaved; (E, I, H)
        return ([x, routing, _t(g("gate_up_proj")), _t(g("down_proj")), g("gate_up_proj_bias"),
                 g("down_proj_bias")],
                {"gate_up": "interleaved", "limit": float(g("limit")),
                 "alpha": float(g("alpha")), "up_offset": 1.0}, want)
    if case == "dbrx":  # w1, v1 (E * I, H); w2 (E * I, H) = each expert's down transposed
        E = g("mlp.w1").shape[0] // 6
        w1, v1, w2 = (g(f"mlp.{n}").reshape(-1, 6, x.shape[1]) for n in ("w1", "v1", "w2"))
        return [x, routing, np.concatenate([w1, v1], axis=1), _t(w2)], {"act": "silu"}, want
    if case == "ergo":  # up (E, H, I), down (E, I, H): stored transposed
        return ([x, routing, _t(g("up_proj")), _t(g("down_proj")), None, None,
                 g("post_expert_norm.weight")],
                {"kind": "plain", "act": "relu2", "norm_eps": float(g("eps"))}, want)
    if case == "llama4":  # gate_up (E, H, 2I), down (E, I, H); the score times the input
        return ([x, routing, _t(g("gate_up_proj")), _t(g("down_proj"))],
                {"act": "silu", "weight_input": True}, want)
    # JetMoE's slots are in its top-k's order; ours ascending by expert: the same slots,
    # each its expert's own, so its per-slot arrays are put in our order.
    order = np.argsort(g("indices"), axis=-1)
    if case == "jetmoe_map":
        return ([x, routing, g("input_linear.weight")], {"kind": "linear", "slots": "each"},
                np.take_along_axis(want, order[..., None], 1))
    if case == "jetmoe_reduce":
        # The module adds its bias after the sum (a step of its own in a model).
        return ([np.take_along_axis(x, order[..., None], 1), routing,
                 g("output_linear.weight")], {"kind": "linear"}, want - g("bias"))
    raise KeyError(case)


CASES = sorted({k.split(".")[0] for k in GOLDEN.files if k.endswith(".out")})


def test_every_layout_is_recorded():
    assert set(CASES) == {"qwen3_moe", "gpt_oss", "dbrx", "ergo", "llama4", "jetmoe_map",
                          "jetmoe_reduce"}


@pytest.mark.parametrize("case", CASES)
def test_reference_is_transformers_experts(case):
    inputs, attrs, want = _case(case)
    # ErgoExpertNorm norms in float32 (F.rms_norm of hidden_states.float()): its island.
    tol = dict(rtol=2e-6, atol=1e-6) if case == "ergo" else dict(rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(OP.reference(*inputs, **attrs), want, err_msg=case, **tol)


@pytest.mark.parametrize("case", CASES)
def test_float32_kernel_within_tolerance(case):
    inputs, attrs, _ = _case(case)
    inputs = [None if v is None else v.astype(np.float32) for v in inputs]
    _check_kernel(OP, *inputs, **attrs)


def test_by_hand_two_experts_weighted():
    # H = 1, I = 1: expert e's gate and up are (e + 1) and 1, down 2: silu((e+1) x) * x * 2.
    x = np.array([[1.0]], np.float32)
    w_in = np.array([[[1.0], [1.0]], [[2.0], [1.0]], [[3.0], [1.0]]], np.float32)
    w_down = np.full((3, 1, 1), 2.0, np.float32)
    routing = np.array([[[0.0, 2.0], [0.25, 0.75]]], np.float32)
    silu = lambda v: v / (1 + np.exp(-v))  # noqa: E731
    want = 0.25 * silu(1.0) * 2 + 0.75 * silu(3.0) * 2
    np.testing.assert_allclose(OP.reference(x, routing, w_in, w_down), [[want]], rtol=1e-12)


def test_only_the_chosen_experts_are_read():
    # The unchosen expert's weights are NaN: a kernel reading them would give NaN.
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    w_in = rng.standard_normal((4, 6, 8)).astype(np.float32)
    w_down = rng.standard_normal((4, 8, 3)).astype(np.float32)
    w_in[1] = np.nan
    w_down[1] = np.nan
    routing = np.array([[[0, 2], [0.5, 0.5]], [[2, 3], [0.1, 0.9]], [[0, 3], [1.0, 1.0]]],
                       np.float32)
    got, _ = _check_kernel(OP, x, routing, w_in, w_down)
    assert np.isfinite(got).all()


@pytest.mark.parametrize("bad, match", [
    (dict(kind="mixed"), "kind 'mixed' is not one of"),
    (dict(kind="plain", limit=7.0), "clamp a gated expert"),
    (dict(gate_up="pairs"), "gate_up 'pairs' is not one of"),
])
def test_refusals_name_the_attribute(bad, match):
    with pytest.raises(ValueError, match=match):
        OP.shape((2, 8), (2, 2, 3), (4, 6, 8), (4, 8, 6 if bad.get("kind") == "plain" else 3),
                 **bad)
