"""The DeBERTa and DeBERTa-v2 toys against transformers' own DebertaModel and
DebertaV2Model (committed goldens): disentangled attention's c2p and p2c terms, their
clamped relative rows, their direction, scale and span, v2's log buckets and normed table;
each turned off or wrong fails against the golden."""

from __future__ import annotations

import dataclasses

import pytest

from iron_spec.cli.check import ENCODER_ATOL
from iron_spec.spec.encoder import load_encoder
from iron_spec.operators import disentangled
from iron_spec.runtime.encoder import Encoder
from tests.conftest import SPECS, encoder_toy, hidden_errors
from tests.specs.test_encoder_goldens import _fails_edited


def _rebuilt(model: Encoder, **change) -> Encoder:
    """``model`` with every layer's disentangled options changed, on the same weights."""
    o = model.config
    layers = tuple(dataclasses.replace(lo, disentangled=dataclasses.replace(lo.disentangled,
                                                                            **change))
                   for lo in o.layers)
    other = Encoder(dataclasses.replace(o, layers=layers))
    held = dict(model.named_params())
    for name, p in other.named_params():
        p.array = held[name].array
    return other


def test_deberta_toy_matches_and_its_relative_rows_clamp():
    loaded, golden = encoder_toy("deberta")
    d = loaded.model.config.layers[0].disentangled
    assert (d.span, d.c2p, d.p2c, d.scale_factor, d.qv_bias) == (6, True, True, 3, True)
    assert max(len(ids) for ids, _ in golden.probes) > 2 * d.span  # distances past the span
    assert max(hidden_errors(loaded.model, golden)) <= ENCODER_ATOL


@pytest.mark.parametrize("params", [("pos_proj.weight",),
                                    ("pos_q_proj.weight", "pos_q_proj.bias")],
                         ids=["no c2p", "no p2c"])
def test_deberta_without_a_position_term_fails_against_the_golden(params):
    loaded, golden = encoder_toy("deberta")
    for name, p in loaded.model.named_params():
        if name.endswith(params):
            p.array[...] = 0.0
    # The 1-id probe attends to itself alone, whatever its scores: the longer two fail.
    assert max(hidden_errors(loaded.model, golden)) > 1e-2


@pytest.mark.parametrize("change", [{"scale_factor": 1}, {"span": 5}], ids=["scale sqrt(D)", "span 5"])
def test_deberta_with_another_scale_or_span_fails_against_the_golden(change):
    loaded, golden = encoder_toy("deberta")
    if "span" in change:
        # The table's first 10 rows as a span of 5: the rows read move.
        loaded.model.encoder.rel_embeddings.weight.array = \
            loaded.model.encoder.rel_embeddings.weight.array[:10].copy()
    assert max(hidden_errors(_rebuilt(loaded.model, **change), golden)) > 1e-3


def test_deberta_with_relative_distances_reversed_fails_against_the_golden(monkeypatch):
    loaded, golden = encoder_toy("deberta")
    rows = disentangled.relative_rows
    monkeypatch.setattr(disentangled, "relative_rows", lambda *a: rows(*a).T)
    assert max(hidden_errors(loaded.model, golden)) > 1e-3


def test_deberta_drawn_weights_carry_debertas_own_names():
    shapes = {n: t.shape for n, t in load_encoder(SPECS / "deberta.yaml", random_weights=0,
                                                  toy=True).checkpoint_tensors().items()}
    assert shapes["encoder.rel_embeddings.weight"] == (12, 32)
    assert shapes["encoder.layer.1.attention.self.in_proj.weight"] == (96, 32)
    assert shapes["encoder.layer.0.attention.self.q_bias"] == (32,)
    assert shapes["encoder.layer.0.attention.self.pos_q_proj.bias"] == (32,)
    assert "encoder.layer.0.attention.self.pos_proj.bias" not in shapes
    assert "embeddings.position_embeddings.weight" not in shapes


@pytest.mark.parametrize("old, new", [
    ('      buckets: "position_buckets if position_buckets > 0 else 0"\n', "      buckets: 0\n"),
    ("      max_position: max_relative\n", "      max_position: max_position_embeddings\n"),
], ids=["no log buckets", "buckets up to 24"])
def test_deberta_v2_with_other_buckets_fails_against_the_golden(tmp_path, old, new):
    # The toy's DebertaV2Model: 8 log buckets up to distance 16 (max_relative_positions).
    _fails_edited(tmp_path, "deberta_v2", old, new)


def test_deberta_v2_without_its_table_norm_fails_against_the_golden():
    loaded, golden = encoder_toy("deberta_v2")
    d = loaded.model.config.layers[0].disentangled
    assert (d.span, d.buckets, d.max_position, d.share_att_key, d.norm_rel) == (8, 8, 16, True,
                                                                                True)
    assert max(hidden_errors(loaded.model, golden)) <= ENCODER_ATOL
    assert max(hidden_errors(_rebuilt(loaded.model, norm_rel=False), golden)) > 1e-2


def test_deberta_v2_drawn_weights_carry_deberta_v2s_own_names():
    # share_att_key: no pos_key_proj or pos_query_proj; norm_rel_ebd: encoder.LayerNorm.
    shapes = {n: t.shape for n, t in load_encoder(SPECS / "deberta_v2.yaml", random_weights=0,
                                                  toy=True).checkpoint_tensors().items()}
    assert shapes["encoder.rel_embeddings.weight"] == (16, 32)
    assert shapes["encoder.LayerNorm.weight"] == (32,)
    assert shapes["encoder.layer.0.attention.self.key_proj.bias"] == (32,)
    assert not [n for n in shapes if "pos_" in n or "in_proj" in n or "q_bias" in n]
