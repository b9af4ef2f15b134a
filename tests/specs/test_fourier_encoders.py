"""The FNet toy against transformers' own FNetModel (a committed golden): the real part of
the 2-D DFT over sequence and hidden in place of attention; the transform over one axis
only, its imaginary part, or no mixing at all fails against the golden; a Fourier layer
takes no attention option."""

from __future__ import annotations


import numpy as np
import pytest

from iron_spec.cli.check import ENCODER_ATOL
from iron_spec.spec.encoder import load_encoder
from iron_spec.spec.errors import SpecError
from iron_spec.spec.loader import load_spec
from iron_spec.spec.encoder import expand_encoder
from iron_spec.operators.fourier import FourierMix
from tests.conftest import SPECS, encoder_toy, hidden_errors


def test_fnet_toy_matches_the_golden_on_every_probe_length():
    loaded, golden = encoder_toy("fnet")
    assert all(lo.mixing == "fourier" for lo in loaded.model.config.layers)
    assert sorted(len(ids) for ids, _ in golden.probes) == [1, 11, 24]
    assert max(hidden_errors(loaded.model, golden)) <= ENCODER_ATOL


@pytest.mark.parametrize("transform", [
    lambda x: np.fft.fft(x, axis=0).real,
    lambda x: np.fft.fft(x, axis=1).real,
    lambda x: np.fft.fft2(x).imag,
    lambda x: x,
], ids=["sequence only", "hidden only", "imaginary part", "no mixing"])
def test_fnet_with_another_transform_fails_against_the_golden(monkeypatch, transform):
    monkeypatch.setattr(FourierMix, "kernel",
                        lambda self, out, x, scratch=None: np.copyto(out, transform(x)))
    loaded, golden = encoder_toy("fnet")
    # The 1-id probe's sequence transform is the identity: the longer two fail.
    assert max(hidden_errors(loaded.model, golden)) > 1e-2


def test_fnet_drawn_weights_carry_fnets_own_names():
    shapes = {n: t.shape for n, t in load_encoder(SPECS / "fnet.yaml", random_weights=0,
                                                  toy=True).checkpoint_tensors().items()}
    assert shapes["embeddings.projection.weight"] == (32, 32)
    assert shapes["encoder.layer.2.fourier.output.LayerNorm.weight"] == (32,)
    assert shapes["pooler.dense.weight"] == (32, 32)
    assert not [n for n in shapes if "attention" in n or "query" in n]


@pytest.mark.parametrize("extra, where", [
    ("  attention: {bias: true}\n", "layer/attention/bias"),
    ("rope:\n  default: {theta: 10000.0}\n", "leave rope: out"),
], ids=["attention option", "rope table"])
def test_a_fourier_layer_refuses_attention_options(tmp_path, extra, where):
    text = (SPECS / "fnet.yaml").read_text()
    anchor = "  mixing: fourier\n" if extra.startswith("  ") else "embedding:\n"
    path = tmp_path / "fnet.yaml"
    path.write_text(text.replace(anchor, anchor + extra if extra.startswith("  ")
                                 else extra + anchor))
    spec = load_spec(path)
    with pytest.raises(SpecError, match=where):
        expand_encoder(spec, spec.get("toy", "config"))
