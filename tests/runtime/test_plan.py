"""runtime.plan: what compiling fuses, checked against the same recording compiled unfused.

A fused RoPE changes which calls run, never a value: it computes each element with the same
two products and one sum as the two RoPE steps it replaces, so the logits match to the bit.
(A fused projection does not: BLAS blocks one wide GEMM differently from three narrow ones,
a few ulps apart, which the per-step checks and goldens bound.)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from iron_spec.spec.build import load_model
from iron_spec.runtime.graph import CallSpec, Recorder
from iron_spec.runtime.plan import Plan
from iron_spec.operators import PerCall

SPECS = Path(__file__).resolve().parents[2] / "specs"


def recording(lm, prompt: bool):
    C = lm.config.prefill_chunk if prompt else 1
    rec = Recorder(CallSpec(prompt, C, start=PerCall("start" if prompt else "position")))
    return rec, lm.body(rec)


def ops(plan: Plan) -> list[str]:
    return [s.op.name for s in plan.steps]


@pytest.mark.parametrize("spec, ropes_per_layer", [
    ("llama3", 1),   # k and q straight from the fused q/k/v GEMM: one RoPE
    ("helium", 1),   # the same on interleaved pairs
    ("qwen3", 2),    # each normed on its own first (q_norm, k_norm): two
])
def test_rope_of_k_and_q_is_one_step_where_both_come_from_the_projection(spec, ropes_per_layer):
    lm = load_model(SPECS / f"{spec}.yaml", random_weights=0, toy=True).lm
    plan = Plan(*recording(lm, False))
    assert ops(plan).count("rope") == ropes_per_layer * len(lm.model.layers)


@pytest.mark.parametrize("spec, fused_pairs", [
    ("llama3", True),
    ("helium", True),   # interleaved pairs, tables packed per pair
    ("phi3", False),    # q, k and v split from one qkv_proj by copying steps: not fused
    ("gemma3", False),  # q and k normed first
])
@pytest.mark.parametrize("prompt", [False, True])
def test_fused_rope_gives_the_same_logits_bit_for_bit(spec, fused_pairs, prompt, monkeypatch):
    lm = load_model(SPECS / f"{spec}.yaml", random_weights=0, toy=True).lm
    C = lm.config.prefill_chunk
    ids = np.random.default_rng(0).integers(0, lm.config.vocab_size, C).astype(np.int32)
    call = ({"start": 0, "rows": C - 1, "position": C - 2} if prompt
            else {"start": 5, "rows": 1, "position": 5})
    inputs = {"ids": ids if prompt else ids[:1]}

    def logits(plan: Plan) -> np.ndarray:
        for _, state in lm.named_states():
            state.array[...] = 0.0
        if not prompt:  # the cache up to the position, as a prompt would have left it
            for _, state in lm.named_states():
                state.array[...] = np.random.default_rng(1).standard_normal(state.array.shape)
        return plan.run(inputs, call).copy()

    fused = Plan(*recording(lm, prompt))
    got = logits(fused)
    monkeypatch.setattr(Plan, "_fuse_ropes", lambda self, steps: list(steps))
    plain = Plan(*recording(lm, prompt))
    assert ops(plain).count("rope") == ops(fused).count("rope") * (2 if fused_pairs else 1)
    np.testing.assert_array_equal(got, logits(plain))
