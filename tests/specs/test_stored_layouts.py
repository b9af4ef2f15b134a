"""Checkpoints in their own layouts, read from files: drawn toy weights written as the
checkpoint transformers loaded for the golden (Conv1D matrices transposed, a multi-query
c_attn, composed renames undone), read back through the spec, and judged by the same
golden; buffers a checkpoint carries (causal masks) left unread; a config a spec refuses."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from iron_spec.spec.build import load_model
from iron_spec.cli.check import golden_path
from iron_spec.spec.errors import SpecError
from iron_spec.runtime.golden import Golden
from iron_spec.runtime.session import Session
from tests.conftest import SPECS
from tests.specs.test_goldens import judge


def written(spec: str, tmp_path, extra: dict | None = None):
    drawn = load_model(SPECS / f"{spec}.yaml", random_weights=0, toy=True)
    tensors = {k: np.ascontiguousarray(v) for k, v in drawn.checkpoint_tensors().items()}
    fingerprint = drawn.fingerprint()
    save_file({**tensors, **(extra or {})}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(drawn.config_json))
    return drawn, tensors, fingerprint


@pytest.mark.parametrize("spec", ["gpt2", "gpt_bigcode", "opt"])
def test_a_written_checkpoint_reads_back_to_the_golden(spec, tmp_path):
    drawn, tensors, fingerprint = written(spec, tmp_path)
    loaded = load_model(SPECS / f"{spec}.yaml", checkpoint=tmp_path)
    assert loaded.fingerprint() == fingerprint
    judge(loaded, Golden.read(golden_path(drawn), fingerprint))


def test_gpt2_names_and_layouts_are_transformers(tmp_path):
    _, tensors, _ = written("gpt2", tmp_path)
    # GPT2Model's own names, Conv1D weights [in, out]: c_attn (64, 3 * 64), c_fc (64, 96).
    assert tensors["transformer.h.2.attn.c_attn.weight"].shape == (64, 192)
    assert tensors["transformer.h.0.mlp.c_fc.weight"].shape == (64, 96)
    assert tensors["transformer.h.0.mlp.c_proj.weight"].shape == (96, 64)
    assert "transformer.wpe.weight" in tensors and "transformer.ln_f.bias" in tensors


def test_gpt2_masks_a_checkpoint_carries_are_unused(tmp_path):
    masks = {f"transformer.h.{i}.attn.{n}": np.tril(np.ones((1, 1, 8, 8), np.float32))
             for i in range(3) for n in ("bias", "masked_bias")}
    drawn, _, fingerprint = written("gpt2", tmp_path, masks)
    loaded = load_model(SPECS / "gpt2.yaml", checkpoint=tmp_path, prefill_chunk=16)
    assert sorted(masks) == sorted(n for n in loaded.report.ignored if ".attn." in n)
    ids = list(range(3, 20))
    np.testing.assert_array_equal(Session(loaded.lm).logits(ids), Session(drawn.lm).logits(ids))


@pytest.mark.parametrize("spec,key,value,why", [
    ("opt", "do_layer_norm_before", False, "post-norm layers"),
    ("opt", "word_embed_proj_dim", 32, "project_in/project_out"),
    ("opt", "_remove_final_layer_norm", True, "no final_layer_norm"),
    ("gpt2", "scale_attn_by_inverse_layer_idx", True, "layer index \\+ 1")])
def test_layouts_not_served_are_refused_by_name(tmp_path, spec, key, value, why):
    drawn, _, _ = written(spec, tmp_path)
    config = dict(drawn.config_json, **{key: value})
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecError, match=f"(?s){key}.*{why}"):
        load_model(SPECS / f"{spec}.yaml", checkpoint=tmp_path)
