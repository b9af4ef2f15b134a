"""XLM and FlauBERT toys against transformers' own XLMModel and FlaubertModel (committed
goldens): a language embedding chosen per call, XLM's interleaved sinusoidal position table,
the activation gelu_activation chooses; each flipped option fails against the golden."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from iron_spec.cli.check import ENCODER_ATOL, golden_path
from iron_spec.spec.encoder import load_encoder
from iron_spec.runtime.encoder_golden import EncoderGolden
from tests.conftest import SPECS
from tests.specs.test_encoder_goldens import _fails_edited


def _states(name: str):
    loaded = load_encoder(SPECS / f"{name}.yaml", random_weights=0, toy=True)
    golden = EncoderGolden.read(golden_path(loaded), loaded.fingerprint())
    states = loaded.model.version(dataclasses.replace(loaded.model.config.pooling, kind="none"))
    return loaded, golden, states


@pytest.mark.parametrize("old, new", [
    ("  sinusoidal: {enabled: sinusoidal_embeddings, interleaved: true}\n",
     "  sinusoidal: {enabled: sinusoidal_embeddings, interleaved: false}\n"),
    ("default: lang_id}", "default: 0}"),
    ("  hidden_act: {expr: \"gelu if gelu_activation else relu\"}\n",
     "  hidden_act: {expr: \"relu if gelu_activation else gelu\"}\n"),
], ids=["sinusoid in halves", "language 0 by default", "relu for gelu"])
def test_xlm_with_another_option_fails_against_the_golden(tmp_path, old, new):
    # The toy's XLMModel: create_sinusoidal_embeddings (sines at even columns), langs filled
    # with lang_id 2 as the golden was recorded, activations.gelu.
    _fails_edited(tmp_path, "xlm", old, new)


def test_xlm_language_is_the_golden_only_in_its_recorded_language():
    # transformers was fed langs = 2 (the toy's lang_id) for every token: named as one id
    # or per token it matches, in another language it does not.
    loaded, golden, states = _states("xlm")
    assert golden.meta["langs"] == 2 and loaded.model.config.languages == 3
    for (ids, _), want in zip(golden.probes, golden.hidden):
        assert np.abs(states(ids, langs=2) - want).max() <= ENCODER_ATOL
        assert np.abs(states(ids, langs=np.full(len(ids), 2)) - want).max() <= ENCODER_ATOL
        assert np.abs(states(ids, langs=1) - want).max() > 1e-2
    ids = golden.probes[0][0]
    mixed = np.where(np.arange(len(ids)) < 4, 2, 0)
    got = states(ids, langs=mixed)
    # Attention mixes the rows, so every row moves once some tokens change language.
    assert np.abs(got - golden.hidden[0]).max() > 1e-2


@pytest.mark.parametrize("langs, match", [(3, "outside the language table's 0..2"),
                                           (-1, "outside"), ([2, 2], "for 11 ids"),
                                           (1.0, "whole number")])
def test_xlm_refuses_a_language_outside_its_table(langs, match):
    loaded, golden, states = _states("xlm")
    with pytest.raises(ValueError, match=match):
        states(golden.probes[0][0], langs=langs)


def test_a_model_without_a_language_table_refuses_languages():
    loaded = load_encoder(SPECS / "bert.yaml", random_weights=0, toy=True)
    with pytest.raises(ValueError, match="without a language table"):
        loaded.model.version()(np.array([1, 2, 3]), langs=0)


def test_xlm_drawn_weights_carry_xlms_own_names():
    # XLMModel's state dict (transformers 5.24) with sinusoidal_embeddings: no
    # position_embeddings.weight is drawn (transformers initializes it with the sinusoid).
    shapes = {n: t.shape for n, t in load_encoder(SPECS / "xlm.yaml", random_weights=0,
                                                  toy=True).checkpoint_tensors().items()}
    assert shapes["lang_embeddings.weight"] == (3, 32)
    assert shapes["embeddings.weight"] == (128, 32)
    assert shapes["ffns.1.lin1.weight"] == (128, 32)
    assert "position_embeddings.weight" not in shapes
    per_layer = {f"{m}.{i}.{p}" for m in ("layer_norm1", "layer_norm2") for i in range(2)
                 for p in ("weight", "bias")}
    per_layer |= {f"attentions.{i}.{lin}.{p}" for i in range(2)
                  for lin in ("q_lin", "k_lin", "v_lin", "out_lin") for p in ("weight", "bias")}
    per_layer |= {f"ffns.{i}.{lin}.{p}" for i in range(2) for lin in ("lin1", "lin2")
                  for p in ("weight", "bias")}
    assert set(shapes) == per_layer | {"lang_embeddings.weight", "embeddings.weight",
                                       "layer_norm_emb.weight", "layer_norm_emb.bias"}


@pytest.mark.parametrize("old, new", [
    ("default: lang_id}", "default: 0}"),
    ("  hidden_act: {expr: \"gelu if gelu_activation else relu\"}\n",
     "  hidden_act: {expr: \"relu if gelu_activation else gelu\"}\n"),
], ids=["language 0 by default", "gelu for relu"])
def test_flaubert_with_another_option_fails_against_the_golden(tmp_path, old, new):
    # The toy's FlaubertModel: langs filled with lang_id 1, nn.functional.relu
    # (gelu_activation false), every layer run (layerdrop 0.3 is training's only).
    _fails_edited(tmp_path, "flaubert", old, new)


def test_flaubert_pre_norm_is_refused_naming_why(tmp_path):
    import json

    from iron_spec.spec.errors import SpecError
    from iron_spec.spec.loader import load_spec
    spec = load_spec(SPECS / "flaubert.yaml")
    config = dict(spec.get("toy", "config"), pre_norm=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecError, match="pre_norm.*TypeError"):
        load_encoder(spec, checkpoint=tmp_path)
