"""The SqueezeBERT toy against transformers' own SqueezeBertModel (a committed golden):
every projection a kernel-1 grouped convolution; the groups' channels taken interleaved, or
every projection dense over its blocks, fails against the golden."""

from __future__ import annotations


import numpy as np

from iron_spec.cli.check import ENCODER_ATOL
from iron_spec.spec.encoder import load_encoder
from iron_spec.operators.grouped import GroupedLinear
from tests.conftest import SPECS, encoder_toy, hidden_errors


def test_squeezebert_toy_matches_the_golden():
    loaded, golden = encoder_toy("squeezebert")
    g = loaded.model.config.layers[0].pointwise
    assert (g.query, g.key, g.value, g.attention_output, g.intermediate, g.output) == \
        (2, 4, 1, 2, 4, 2)
    assert max(hidden_errors(loaded.model, golden)) <= ENCODER_ATOL


def test_squeezebert_with_the_groups_interleaved_fails_against_the_golden(monkeypatch):
    # Output channel o in group o % groups (its inputs likewise strided), not o // (out / g).
    def interleaved(x, weight, groups):
        n, cin = x.shape
        cout, ci = weight.shape
        xs = x.reshape(n, ci, groups).transpose(2, 0, 1)
        ws = weight.reshape(cout // groups, groups, ci).transpose(1, 2, 0)
        return np.matmul(xs, ws).transpose(1, 2, 0).reshape(n, cout)
    monkeypatch.setattr(GroupedLinear, "_blocks", staticmethod(interleaved))
    loaded, golden = encoder_toy("squeezebert")
    assert max(hidden_errors(loaded.model, golden)) > 1e-2


def test_squeezebert_with_its_groups_read_as_one_fails_against_the_golden(monkeypatch):
    # Each grouped projection's blocks tiled into a dense weight: every output reads every
    # group's inputs.
    def dense(x, weight, groups):
        return x @ np.tile(weight, (1, groups)).T
    monkeypatch.setattr(GroupedLinear, "_blocks", staticmethod(dense))
    loaded, golden = encoder_toy("squeezebert")
    assert max(hidden_errors(loaded.model, golden)) > 1e-2


def test_squeezebert_drawn_weights_carry_squeezeberts_own_names():
    shapes = {n: t.shape for n, t in load_encoder(SPECS / "squeezebert.yaml", random_weights=0,
                                                  toy=True).checkpoint_tensors().items()}
    s = "encoder.layers.1."
    assert shapes[s + "attention.query.weight"] == (32, 16, 1)
    assert shapes[s + "attention.key.weight"] == (32, 8, 1)
    assert shapes[s + "attention.value.weight"] == (32, 32, 1)
    assert shapes[s + "post_attention.conv1d.weight"] == (32, 16, 1)
    assert shapes[s + "post_attention.layernorm.weight"] == (32,)
    assert shapes[s + "intermediate.conv1d.weight"] == (64, 8, 1)
    assert shapes[s + "output.conv1d.weight"] == (32, 32, 1)
    assert shapes[s + "output.layernorm.bias"] == (32,)
    assert shapes["pooler.dense.weight"] == (32, 32)
