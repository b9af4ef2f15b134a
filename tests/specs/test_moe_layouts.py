"""A mixture's experts as checkpoints store them, read from files: one tensor per expert
(renamed through an ``{expert}`` hole), transformers 5's fused 3-D stacks, the same stored
transposed (gpt-oss), gate and up stacked apart and flat (DBRX); each written from drawn toy
weights under the checkpoint's names, read back through the spec, giving the drawn model's
logits (which tests/specs/test_goldens.py holds to transformers'). And the routing check
itself: a golden whose routing is changed where no tie is near fails it."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from iron_spec.cli.check import golden_path
from iron_spec.runtime import checks
from iron_spec.runtime.golden import Golden
from iron_spec.runtime.session import Session
from iron_spec.spec.build import load_model
from tests.conftest import SPECS, edited_spec

IDS = list(range(3, 40, 2))


def written(spec, tmp_path, tensors=None):
    drawn = load_model(spec if not isinstance(spec, str) else SPECS / f"{spec}.yaml",
                       random_weights=0, toy=True)
    if tensors is None:
        tensors = {k: np.ascontiguousarray(v) for k, v in drawn.checkpoint_tensors().items()}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(drawn.config_json))
    return drawn, tensors


@pytest.mark.parametrize("spec,name,shape", [
    # Mixtral: w1/w3/w2 one Linear per expert, under block_sparse_moe (renamed).
    ("mixtral", "model.layers.1.block_sparse_moe.experts.7.w1.weight", (48, 64)),
    # Granite MoE: transformers 5's fused stacks, input_linear (E, 2I, H).
    ("granitemoe", "model.layers.0.block_sparse_moe.input_linear.weight", (8, 64, 64)),
    # gpt-oss: fused and transposed, gate_up_proj (E, H, 2I) and down_proj (E, I, H), gate
    # and up interleaved, with biases.
    ("gpt_oss", "model.layers.0.mlp.experts.down_proj", (8, 32, 64)),
    # DBRX: w1, v1, w2 stacked flat (E * I, H), w2 transposed.
    ("dbrx", "transformer.blocks.0.ffn.experts.mlp.w2", (8 * 32, 64)),
    # ERNIE 4.5 MoE: the selection bias stored as one row (1, E).
    ("ernie4_5_moe", "model.layers.1.mlp.moe_statics.e_score_correction_bias", (1, 8)),
])
def test_a_written_mixture_reads_back(spec, name, shape, tmp_path):
    drawn, tensors = written(spec, tmp_path)
    assert name in tensors, sorted(n for n in tensors if ".1." in n or ".0." in n)[:40]
    assert tensors[name].shape == shape
    loaded = load_model(SPECS / f"{spec}.yaml", checkpoint=tmp_path, prefill_chunk=16)
    assert loaded.fingerprint() == drawn.fingerprint()
    np.testing.assert_array_equal(Session(loaded.lm).logits(IDS), Session(drawn.lm).logits(IDS))


def test_per_expert_and_fused_checkpoints_are_one_model(tmp_path):
    # The same drawn experts stored per expert (Qwen3-MoE's released checkpoints) and as
    # transformers 5 saves them (gate_up_proj (E, 2I, H): gate rows then up rows; down_proj
    # (E, H, I)), and gate and up stacked apart (E, I, H) each: the same logits.
    (tmp_path / "a").mkdir()
    drawn, tensors = written("qwen3_moe", tmp_path / "a")
    fused, split = {}, {}
    for k, v in tensors.items():
        if ".mlp.experts." not in k:
            fused[k] = split[k] = v
    for layer in (0, 2):  # layer 1 is dense (mlp_only_layers)
        pre = f"model.layers.{layer}.mlp.experts"
        stack = {p: np.stack([tensors[f"{pre}.{e}.{p}.weight"] for e in range(8)])
                 for p in ("gate_proj", "up_proj", "down_proj")}
        assert stack["gate_proj"].shape == (8, 32, 64)
        fused[f"{pre}.gate_up_proj"] = np.concatenate([stack["gate_proj"], stack["up_proj"]], 1)
        fused[f"{pre}.down_proj"] = split[f"{pre}.down_proj"] = stack["down_proj"]
        split[f"{pre}.gate_proj"], split[f"{pre}.up_proj"] = stack["gate_proj"], stack["up_proj"]
    want = Session(drawn.lm).logits(IDS)
    for layout, stored in (("fused", fused), ("split", split)):
        (tmp_path / layout).mkdir()
        save_file(stored, str(tmp_path / layout / "model.safetensors"))
        (tmp_path / layout / "config.json").write_text(json.dumps(drawn.config_json))
        spec = edited_spec(tmp_path / layout, "qwen3_moe", "    count: num_experts\n",
                           f"    count: num_experts\n    params: {layout}\n")
        loaded = load_model(spec, checkpoint=tmp_path / layout, prefill_chunk=16)
        np.testing.assert_array_equal(Session(loaded.lm).logits(IDS), want)


def test_the_experts_are_views_of_one_stack():
    # Per-expert params are rows of the layer's stacked arrays: a checkpoint's tensors are
    # copied into the stack one at a time, never gathered afterwards.
    loaded = load_model(SPECS / "mixtral.yaml", random_weights=0, toy=True)
    experts = loaded.lm.model.layers[0].mlp.experts
    one = dict(loaded.lm.named_params())["model.layers.0.mlp.experts.5.up_proj.weight"]
    assert experts.w_in.shape == (8, 96, 64) and np.shares_memory(one.array, experts.w_in)
    np.testing.assert_array_equal(one.array, experts.w_in[5, 48:])


def test_a_changed_routing_fails_and_names_where(tmp_path):
    loaded = load_model(SPECS / "olmoe.yaml", random_weights=0, toy=True)
    golden = Golden.read(golden_path(loaded), loaded.fingerprint())
    assert checks.routing_against(loaded.lm, golden).passed
    chosen, logits = golden.routing[0]
    # Position 5 of the first router: transformers' logits of one chosen expert and of the
    # one they rank last swapped, and its choice with them (no tie: far apart).
    changed, moved = np.array(chosen, copy=True), np.array(logits, copy=True)
    last, first = int(np.argmin(moved[5])), int(changed[5, 0])
    moved[5, [first, last]] = moved[5, [last, first]]
    changed[5, 0] = last
    other = dataclasses.replace(golden, routing=[(changed, moved)] + list(golden.routing[1:]))
    result = checks.routing_against(loaded.lm, other)
    assert not result.passed
    assert result.numbers["mismatches"] == 1 and "at position 5" in result.figure, result.figure


def _bfloat16_file(spec, tmp_path):
    """A toy checkpoint of ``spec`` whose matrices are stored bfloat16 (rounded from the
    drawn values), and the bfloat16 tensors."""
    import ml_dtypes
    drawn = load_model(SPECS / f"{spec}.yaml", random_weights=0, toy=True)
    tensors = {k: np.ascontiguousarray(v) for k, v in drawn.checkpoint_tensors().items()}
    tensors = {k: v.astype(ml_dtypes.bfloat16) if v.ndim >= 2 else v
               for k, v in tensors.items()}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(drawn.config_json))
    return tensors


@pytest.mark.parametrize("spec,name,expert", [
    ("mixtral", "model.layers.1.block_sparse_moe.experts.7.w1.weight", None),  # per expert
    ("granitemoe", "model.layers.0.block_sparse_moe.input_linear.weight", 3),  # fused
    ("gpt_oss", "model.layers.0.mlp.experts.down_proj", 5),  # fused, stored transposed
])
def test_experts_stored_bfloat16_are_held_as_stored(spec, name, expert, tmp_path):
    """Under weights "stored" a bfloat16 file's expert stacks stay bfloat16 (the file's
    bits, in the model's layout), and the model gives the float32 model's logits on the
    same values to within float32's error."""
    import ml_dtypes
    from iron_spec.operators.experts import HeldStack
    from iron_spec.runtime.blocks.experts import expert_stacks
    tensors = _bfloat16_file(spec, tmp_path)
    held = load_model(SPECS / f"{spec}.yaml", checkpoint=tmp_path, prefill_chunk=16)
    wide = load_model(SPECS / f"{spec}.yaml", checkpoint=tmp_path, prefill_chunk=16,
                      weights="float32")
    stacks = expert_stacks(held.lm)
    assert stacks and all(isinstance(s, HeldStack) and s.form == "BF16" for s in stacks)
    assert not any(isinstance(s, HeldStack) for s in expert_stacks(wide.lm))
    p = dict(held.lm.named_params())
    stored = tensors[name]
    if expert is None:  # a per-expert tensor: its param is a row view of the held stack
        param = next(v for k, v in p.items() if k.endswith("layers.1.mlp.experts.7.gate_proj.weight"))
        np.testing.assert_array_equal(param.array.view(np.uint16), stored.view(np.uint16))
    else:  # a fused stack: expert ``expert`` of the held stack is the file's
        experts = held.lm.model.layers[0]
        experts = getattr(experts, "mlp", None) or experts.block_sparse_moe
        stack = experts.experts.w_down if spec == "gpt_oss" else experts.experts.w_in
        want = stored[expert].T if spec == "gpt_oss" else stored[expert]
        np.testing.assert_array_equal(stack[expert], want.astype(np.float32))
    a, b = Session(held.lm).logits(IDS), Session(wide.lm).logits(IDS)
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * np.abs(b).max())


def test_experts_converted_to_q8_0_are_gguf_pys_blocks():
    """weights "q8_0": each expert stack is the blocks gguf-py's quantizer (llama.cpp's
    reference) writes for its float32 rows."""
    import gguf
    drawn = load_model(SPECS / "qwen3_moe.yaml", random_weights=0, toy=True)
    held = load_model(SPECS / "qwen3_moe.yaml", random_weights=0, toy=True, weights="q8_0")
    a, b = drawn.lm.model.layers[0].mlp.experts, held.lm.model.layers[0].mlp.experts
    E, R, H = a.w_in.shape
    want = gguf.quants.quantize(a.w_in.reshape(E * R, H), gguf.GGMLQuantizationType.Q8_0)
    assert b.w_in.form == "Q8_0"
    np.testing.assert_array_equal(b.w_in.raw(), want)
    assert b.w_in.nbytes == E * R * H // 32 * 34


@pytest.mark.parametrize("weights", ["q8_0", "bfloat16"])
def test_compiled_steps_read_the_held_stacks_themselves(weights):
    """The decode step's and the prompt chunk's experts steps read the held stacks as they
    are: no float32 copy made at compile (a copy would read four bytes a weight)."""
    from iron_spec.operators.experts import HeldStack
    loaded = load_model(SPECS / "olmoe.yaml", random_weights=0, toy=True, weights=weights)
    experts = loaded.lm.model.layers[0].mlp.experts
    for version in (loaded.lm.decode_step, loaded.lm.prompt_chunk):
        runs = [r for r in version.plan.runs if r.step.op.name == "experts"]
        assert runs and all(isinstance(r.ins[2], HeldStack) and isinstance(r.ins[3], HeldStack)
                            for r in runs)
        assert any(r.ins[2] is experts.w_in for r in runs)
