"""Gemma 3n's behaviours (AltUp streams, Laurel, per-layer inputs into the streams, KV
sharing, the weightless v norm) flipped one at a time against specs/gemma3n_text.yaml's
golden: each must miss transformers' logits on the same weights by far more than the gate
(KL mean 1e-6), while the spec as shipped meets it."""

from __future__ import annotations

import re

import pytest

from iron_spec.spec.build import load_model
from iron_spec.spec.errors import SpecError
from tests.specs.test_attention_flips import _judged_on_the_right_weights
from tests.specs.test_position_flips import flipped_kl
from tests.conftest import SPECS, edited_spec

NAME = "gemma3n_text"


@pytest.mark.parametrize("old,new", [
    # The toy runs on stream 1 of 3: stream 0 is another model.
    ("active: altup_active_idx", "active: 0"),
    # correct_output_scale left out of the per-layer input's gate.
    ("correct_scale: altup_correct_scale", "correct_scale: false"),
    # Values as v_proj makes them (Gemma3nTextAttention's v_norm has no weight: it is
    # still a norm). The per-layer input's mix scale cannot be flipped so: what it scales
    # passes per_layer_projection into post_per_layer_input_norm, which undoes it.
    ("v_norm: true", "v_norm: false"),
    # The activation sparsity off (the toy cuts layers 0 and 1).
    ("activation_sparsity: layer_activation_sparsity", "activation_sparsity: 0.0"),
    # Ids from 200 (the per-layer table's rows) read row 5, not transformers' 0.
    ("outside_row: 0", "outside_row: 5"),
    # Every layer sliding (the toy's window 8 is shorter than its prompts).
    ("full_attention: {attention: {rope: global}}",
     "full_attention: {attention: {rope: global, window: sliding_window}}"),
], ids=["altup-active-0", "altup-no-correct-scale", "no-v-norm", "no-sparsity",
        "outside-row-5", "all-sliding"])
def test_a_flipped_option_misses_the_golden(tmp_path, old, new):
    assert flipped_kl(tmp_path, NAME, old, new) > 1e-4


@pytest.mark.parametrize("old,new,param,count", [
    # No Laurel branch: its three tensors per layer (five layers) unread.
    ("  laurel: {rank: laurel_rank}\n", "", ".laurel.linear_left.weight", 5),
    # One stream: no AltUp at all, its router and coefficients unread.
    ("  altup:\n    inputs: altup_num_inputs\n    active: altup_active_idx\n"
     "    correct_scale: altup_correct_scale\n", "", ".altup.modality_router.weight", 5),
], ids=["no-laurel", "no-altup"])
def test_a_behaviour_dropped_misses_the_golden(tmp_path, old, new, param, count):
    text = (SPECS / f"{NAME}.yaml").read_text()
    assert old in text
    path = tmp_path / f"{NAME}.yaml"
    path.write_text(text.replace(old, new, 1))
    right, flipped = _judged_on_the_right_weights(NAME, path, param, count)
    assert right < 1e-6
    assert flipped > 1e-3, flipped


@pytest.mark.parametrize("old,new,message", [
    ("active: altup_active_idx", "active: 3", "altup active stream 3 is not one of the 3 streams"),
    ("inputs: altup_num_inputs", "inputs: 0", "altup inputs is 0"),
    ("laurel: {rank: laurel_rank}", "laurel: {rank: -1}", "laurel rank -1 is not"),
    ("outside_row: 0", "outside_row: 200", "outside_row 200 is not a row of"),
], ids=["active-past-the-streams", "no-streams", "negative-rank", "outside-row-past-the-table"])
def test_an_option_out_of_range_is_refused_naming_it(tmp_path, old, new, message):
    text = (SPECS / f"{NAME}.yaml").read_text()
    assert old in text
    path = tmp_path / f"{NAME}.yaml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(SpecError, match=message) as e:
        load_model(path, random_weights=0, toy=True)
    assert f"{NAME}.yaml:" in str(e.value)


def test_an_id_past_the_per_layer_table_without_outside_row_is_refused_naming_it(tmp_path):
    # Found by a new user's trial: the float64 reference raised numpy's bare "index 250 is
    # out of bounds for axis 0 with size 200", the compiled plan a ValueError mid-plan that
    # called the table the vocabulary. The toy's vocabulary is 256, its table 200 rows.
    import numpy as np

    import iron_spec

    line = [s for s in (SPECS / f"{NAME}.yaml").read_text().splitlines() if "outside_row: 0" in s]
    assert len(line) == 1
    path = edited_spec(tmp_path, NAME, line[0] + "\n", "")
    model = iron_spec.load(str(path), random_weights=0, toy=True)
    lm = model.loaded.lm
    assert (lm.config.vocab_size, lm.config.per_layer_input.vocab_size) == (256, 200)
    says = ("is outside the per-layer-input table model.embed_tokens_per_layer, 200 rows "
            "(per_layer_input.vocab_size) of the vocabulary's 256, and the spec gives no "
            "layer.per_layer_input.outside_row")
    chunk = np.zeros(lm.prompt_chunk.capacity, np.int64)
    chunk[:3] = [1, 250, 3]
    for call in (lambda: lm.prompt_chunk.reference(chunk, start=0, rows=3),
                 lambda: lm.prompt_chunk(chunk, start=0, rows=3)):
        with pytest.raises(IndexError, match=r"^token id 250 \(ids\[1\]\) " + re.escape(says)):
            call()
    for call in (lm.decode_step.reference, lm.decode_step):
        with pytest.raises(IndexError, match=r"^token id 250 \(token\) " + re.escape(says)):
            call(token=250, position=0)
    prompt = [1, 2, 3] * 10
    model.complete(prompt, max_new_tokens=1, temperature=0)
    held = model._session.held
    with pytest.raises(IndexError, match=r"^token id 200 \(position 31 of the history\) "):
        model.complete(prompt + [5, 200], max_new_tokens=1)
    assert model._session.held == held  # refused before anything ran
    assert model.complete([1, 199, 3], max_new_tokens=1, temperature=0).token_ids  # 199 is a row
