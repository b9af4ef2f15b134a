"""The MobileBERT toy against transformers' own MobileBertModel (a committed golden): the
layer run inside a bottleneck (queries and keys from a shared projection, values from the
wide input), stacked feedforwards, NoNorm and trigram word embeddings; each turned off or
altered fails against the golden, and the other bottleneck settings match transformers
recorded afresh where the golden extra is installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from iron_spec.cli.check import ENCODER_ATOL
from iron_spec.spec.encoder import load_encoder
from iron_spec.operators.trigram import Trigram
from tests.conftest import SPECS, golden_extra, encoder_toy, hidden_errors
from tests.specs.test_encoder_goldens import _copy, _fails_edited


def test_mobilebert_toy_matches_the_golden():
    loaded, golden = encoder_toy("mobilebert")
    o = loaded.model.config
    b = o.layers[0].bottleneck
    assert (b.size, b.shared_query_key, b.attention_input) == (16, True, False)
    assert (o.layers[0].feedforwards, o.word_size, o.trigram, o.norm.kind) == (3, 16, True,
                                                                               "no_norm")
    assert max(hidden_errors(loaded.model, golden)) <= ENCODER_ATOL


def test_mobilebert_with_layernorm_for_nonorm_fails_against_the_golden(tmp_path):
    # The same weight and bias, normalized first: NoNorm is x * w + b alone.
    _fails_edited(tmp_path, "mobilebert", "  norm: {kind: no_norm}\n",
                  "  norm: {kind: layer, eps: 1.0e-12}\n")


def test_mobilebert_with_the_trigram_reversed_fails_against_the_golden(monkeypatch):
    # [previous, own, next] for [next, own, previous]: the 1-id probe has neither.
    def reversed_trigram(self, out, x, scratch=None):
        d = x.shape[1]
        ref = Trigram().reference(x)
        np.copyto(out, np.concatenate([ref[:, 2 * d:], ref[:, d:2 * d], ref[:, :d]], axis=1))
    monkeypatch.setattr(Trigram, "kernel", reversed_trigram)
    loaded, golden = encoder_toy("mobilebert")
    assert max(hidden_errors(loaded.model, golden)) > 1e-2


def test_mobilebert_without_its_extra_feedforwards_fails_against_the_golden():
    loaded, golden = encoder_toy("mobilebert")
    for layer in loaded.model.encoder.layer:
        layer.ffn = None
    assert max(hidden_errors(loaded.model, golden)) > 1e-2


def test_mobilebert_with_the_bottleneck_projections_swapped_fails_against_the_golden():
    # bottleneck.input is the attention's residual, bottleneck.attention its queries' and
    # keys' input: the two (same shapes) exchanged.
    loaded, golden = encoder_toy("mobilebert")
    for layer in loaded.model.encoder.layer:
        b = layer.bottleneck
        for (_, p), (_, q) in zip(b.input.named_params(), b.attention.named_params()):
            p.array, q.array = q.array.copy(), p.array.copy()
    assert max(hidden_errors(loaded.model, golden)) > 1e-2


def test_mobilebert_drawn_weights_carry_mobileberts_own_names():
    shapes = {n: t.shape for n, t in load_encoder(SPECS / "mobilebert.yaml", random_weights=0,
                                                  toy=True).checkpoint_tensors().items()}
    assert shapes["embeddings.word_embeddings.weight"] == (128, 16)
    assert shapes["embeddings.embedding_transformation.weight"] == (32, 48)
    assert shapes["encoder.layer.0.bottleneck.input.dense.weight"] == (16, 32)
    assert shapes["encoder.layer.0.bottleneck.attention.LayerNorm.bias"] == (16,)
    assert shapes["encoder.layer.0.attention.self.value.weight"] == (16, 32)
    assert shapes["encoder.layer.1.ffn.1.output.LayerNorm.weight"] == (16,)
    assert "encoder.layer.1.ffn.2.output.dense.weight" not in shapes
    assert shapes["encoder.layer.1.output.bottleneck.dense.weight"] == (32, 16)
    assert shapes["encoder.layer.1.output.bottleneck.LayerNorm.weight"] == (32,)


@golden_extra
@pytest.mark.parametrize("toy", [
    {"use_bottleneck_attention": "true", "trigram_input": "false"},
    {"use_bottleneck": "false", "num_feedforward_networks": "1"},
    {"key_query_shared_bottleneck": "false", "intra_bottleneck_size": "32"},
], ids=["bottleneck attention, no trigram", "no bottleneck, one ffn",
        "unshared at the stream's width"])
def test_other_bottleneck_settings_match_transformers(tmp_path, toy):
    # Recorded afresh from transformers' MobileBertModel on the edited toy, in a subprocess
    # (this process never imports torch), then checked against it.
    def edit(text):
        for key, value in toy.items():
            lines = [l for l in text.splitlines() if l.startswith(f"    {key}: ")]
            assert len(lines) == 1, key
            text = text.replace(lines[0] + "\n", f"    {key}: {value}\n")
        return text
    path = _copy(tmp_path, "mobilebert", edit)
    shutil.rmtree(tmp_path / "tests" / "goldens" / "mobilebert")
    cli = [str(Path(sys.executable).with_name("iron-spec")), "check", str(path),
           "--random-weights", "0", "--toy"]
    first = subprocess.run(cli + ["--record-golden"], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr + first.stdout
    for line in ("PASS  hidden states vs golden", "PASS  float64 vs golden"):
        assert line in first.stdout, first.stdout
