"""Recurrent depth (``recurrence:``) and the gated attention output, on HRM-Text's toy: each
part of the schedule and the gate flipped must miss transformers' golden, and a schedule
that cannot run is refused naming its entry."""

from __future__ import annotations

import pytest

from iron_spec.spec.build import load_model
from iron_spec.spec.errors import SpecError
from tests.conftest import SPECS
from tests.specs.test_attention_flips import _judged_on_the_right_weights
from tests.specs.test_position_flips import flipped_kl


@pytest.mark.parametrize("old,new", [
    # Two L cycles an H cycle in the toy, not one.
    ("- repeat: L_cycles", "- repeat: 1"),
    # Two H cycles, not one.
    ("- repeat: H_cycles", "- repeat: 1"),
    # H_module reads z_H + z_L, not z_H alone.
    ("inputs: [z_H, z_L], into: z_H", "inputs: [z_H], into: z_H"),
    # L_module reads z_L + z_H, not z_L alone (the learned z_L_init alone has no rows).
    ("inputs: [z_L, z_H], into: z_L", "inputs: [z_H], into: z_L"),
    # Each stack ends in its own final_norm (weightless: the same tensors without it).
    ("L_module: {final_norm: true}", "L_module: {final_norm: false}"),
    # lm_head reads z_H, not z_L.
    ("  output: z_H", "  output: z_L"),
], ids=["one-l-cycle", "one-h-cycle", "h-without-z-l", "l-without-z-l", "l-no-final-norm",
        "output-z-l"])
def test_a_flipped_schedule_misses_the_golden(tmp_path, old, new):
    assert flipped_kl(tmp_path, "hrm_text", old, new) > 1e-3


def test_attention_without_its_output_gate_misses_the_golden(tmp_path):
    text = (SPECS / "hrm_text.yaml").read_text()
    old = "rope: default, output_gate: true}"
    assert old in text
    path = tmp_path / "hrm_text.yaml"
    path.write_text(text.replace(old, "rope: default}", 1))
    # Two stacks of two layers run twelve times: 12 names of the 4 gate_proj weights.
    right, flipped = _judged_on_the_right_weights("hrm_text", path, "self_attn.gate_proj.weight",
                                                  12)
    assert right < 1e-6
    assert flipped > 1e-3, flipped


def test_every_run_of_a_layer_holds_its_own_cache():
    loaded = load_model(SPECS / "hrm_text.yaml", random_weights=0, toy=True)
    model = loaded.lm.model
    # 2 layers x (2 H cycles x (2 L runs + 1 H run)) = 12 runs, 4 of them first runs.
    assert len(model.schedule.loops) == 8
    keys = [s for name, s in loaded.lm.named_states() if name.endswith(".keys")]
    assert len(keys) == 12 and len({id(k) for k in keys}) == 12
    first = model.L_module.layers[0].self_attn.q_proj.weight
    assert model.schedule.loops[0].self_attn.q_proj.weight is first


@pytest.mark.parametrize("old,new,message", [
    ("inputs: [z_L, z_H], into: z_L", "inputs: [z_X, z_H], into: z_L",
     "state 'z_X' is read before any step writes it"),
    ("{stack: H_module,", "{stack: M_module,", "stack 'M_module' is not under recurrence/stacks"),
    ("  output: z_H", "  output: z_Q", "the output state 'z_Q' is written by no step"),
    ("z_L: learned}", "z_L: random}", "recurrence.states.z_L: text 'random' is not one of 'embeddings', 'learned'"),
    ("- repeat: H_cycles", "- repeat: initializer_range",
     "repeat is 0.4 .from 'initializer_range'., not a whole number"),
    ("{stack: L_module, inputs", "{stack: L_module, end: 3, inputs",
     "end is 3, not a whole number within 0..2"),
], ids=["unwritten-state", "unknown-stack", "unwritten-output", "unknown-init",
        "fractional-repeat", "layers-past-the-stack"])
def test_a_schedule_that_cannot_run_is_refused(tmp_path, old, new, message):
    text = (SPECS / "hrm_text.yaml").read_text()
    assert old in text
    path = tmp_path / "hrm_text.yaml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(SpecError, match=message):
        load_model(path, random_weights=0, toy=True)
