"""The ConvBERT toy against transformers' own ConvBertModel (a committed golden): attention
heads beside span-based dynamic convolution heads; the convolution's taps reversed, its
depthwise taps reversed, its heads silenced, or the two halves swapped fails against the
golden."""

from __future__ import annotations

import dataclasses

import numpy as np
from iron_spec.cli.check import ENCODER_ATOL
from iron_spec.spec.encoder import load_encoder
from iron_spec.operators import span_conv
from iron_spec.operators.elementwise import JoinHeads
from tests.conftest import SPECS, encoder_toy, hidden_errors


def test_convbert_toy_matches_the_golden():
    loaded, golden = encoder_toy("convbert")
    lo = loaded.model.config.layers[0]
    assert (lo.heads, lo.head_dim, lo.span_conv) == (2, 8, 5)
    assert max(hidden_errors(loaded.model, golden)) <= ENCODER_ATOL


def test_convbert_with_the_windows_reversed_fails_against_the_golden(monkeypatch):
    # Row i's taps over rows i + 2 .. i - 2 for i - 2 .. i + 2 (both convolutions' windows).
    windows = span_conv._windows
    monkeypatch.setattr(span_conv, "_windows", lambda x, k: windows(x, k)[..., ::-1])
    loaded, golden = encoder_toy("convbert")
    states = loaded.model.version(dataclasses.replace(loaded.model.config.pooling, kind="none"))
    errors = [float(np.abs(states.reference(ids, types) - want).max())
              for (ids, types), want in zip(golden.probes, golden.hidden64)]
    assert max(errors) > 1e-2


def test_convbert_with_its_depthwise_taps_reversed_fails_against_the_golden():
    # A convolution for torch's cross-correlation.
    loaded, golden = encoder_toy("convbert")
    for layer in loaded.model.encoder.layer:
        w = layer.attention.self.key_conv_attn_layer.depthwise.weight
        w.array = w.array[:, ::-1].copy()
    assert max(hidden_errors(loaded.model, golden)) > 1e-3


def test_convbert_without_its_convolution_heads_fails_against_the_golden():
    loaded, golden = encoder_toy("convbert")
    for layer in loaded.model.encoder.layer:
        for p in (layer.attention.self.conv_out_layer.weight, layer.attention.self.conv_out_layer.bias):
            p.array = np.zeros_like(p.array)
    assert max(hidden_errors(loaded.model, golden)) > 1e-2


def test_convbert_with_the_halves_swapped_fails_against_the_golden(monkeypatch):
    # The convolution's heads before the attention's.
    kernel = JoinHeads.kernel
    monkeypatch.setattr(JoinHeads, "kernel", lambda self, out, a, b, scratch=None:
                        kernel(self, out, b, a, scratch=scratch))
    loaded, golden = encoder_toy("convbert")
    assert max(hidden_errors(loaded.model, golden)) > 1e-2


def test_convbert_drawn_weights_carry_convberts_own_names():
    shapes = {n: t.shape for n, t in load_encoder(SPECS / "convbert.yaml", random_weights=0,
                                                  toy=True).checkpoint_tensors().items()}
    s = "encoder.layer.0.attention.self."
    assert shapes[s + "query.weight"] == (16, 32)
    assert shapes[s + "key_conv_attn_layer.depthwise.weight"] == (32, 1, 5)
    assert shapes[s + "key_conv_attn_layer.pointwise.weight"] == (16, 32, 1)
    assert shapes[s + "key_conv_attn_layer.bias"] == (16, 1)
    assert shapes[s + "conv_kernel_layer.weight"] == (10, 16)
    assert shapes[s + "conv_out_layer.weight"] == (16, 32)
    assert shapes["encoder.layer.0.attention.output.dense.weight"] == (32, 32)
    assert shapes["embeddings_project.weight"] == (32, 16)
