"""The YOSO toy against transformers' own YosoModel with use_expectation (a committed
golden): each key weighing a query by the expected collisions of hash_code_len hyperplane
hash bits, each head's output of unit length, and a value convolution; other bits, the
output left unnormalized, a softmax in place of the expectation, or the convolution
silenced each fail against the golden; the sampled path is refused naming its key."""

from __future__ import annotations

import numpy as np
import pytest

from iron_spec.cli.check import ENCODER_ATOL
from iron_spec.spec.encoder import load_encoder
from iron_spec.spec.errors import SpecError
from iron_spec.operators import lsh_expectation
from tests.conftest import SPECS, edited_spec, encoder_toy, hidden_errors, toy_config
from tests.specs.test_encoder_goldens import _fails_edited


def test_yoso_toy_matches_the_golden_in_float32_and_float64():
    loaded, golden = encoder_toy("yoso")
    lo = loaded.model.config.layers[0]
    assert (lo.lsh_expectation, lo.value_conv, loaded.model.call_rows) == (5, 3, None)
    assert max(hidden_errors(loaded.model, golden)) <= ENCODER_ATOL
    assert max(hidden_errors(loaded.model, golden, float64=True)) <= 1e-13


def test_other_hash_bits_fail_against_the_golden(tmp_path):
    _fails_edited(tmp_path, "yoso", "lsh_expectation: hash_code_len\n", "lsh_expectation: 9\n")


def test_the_output_left_unnormalized_fails_against_the_golden(monkeypatch):
    unit = lsh_expectation._unit
    calls = []

    def inputs_only(x):
        # The first two calls per attention normalize queries and keys; the third, skipped,
        # the output.
        calls.append(1)
        return unit(x) if len(calls) % 3 else x
    monkeypatch.setattr(lsh_expectation, "_unit", inputs_only)
    loaded, golden = encoder_toy("yoso")
    assert max(hidden_errors(loaded.model, golden, float64=True)) > 1e-1


def test_a_softmax_in_place_of_the_expectation_fails_against_the_golden(monkeypatch):
    def softmax_attention(q, k, v, bits, dtype):
        n, H, D = q.shape
        s = np.einsum("nhd,mhd->hnm", q, k).astype(dtype) / np.sqrt(D)
        p = np.exp(s - s.max(-1, keepdims=True))
        out = (p / p.sum(-1, keepdims=True)) @ np.asarray(v, dtype).transpose(1, 0, 2)
        return out.transpose(1, 0, 2).reshape(n, H * D)
    monkeypatch.setattr(lsh_expectation, "_attend", softmax_attention)
    loaded, golden = encoder_toy("yoso")
    assert max(hidden_errors(loaded.model, golden, float64=True)) > 1e-1


def test_the_value_convolution_silenced_fails_against_the_golden():
    loaded, golden = encoder_toy("yoso")
    for layer in loaded.model.encoder.layer:
        w = layer.attention.self.conv.weight
        w.array = np.zeros_like(w.array)
    assert max(hidden_errors(loaded.model, golden)) > 1e-1


@pytest.mark.parametrize("changes, key", [({"use_expectation": False}, "use_expectation"),
                                          ({"conv_window": 4}, "conv_window % 2")])
def test_the_sampled_path_and_an_even_window_are_refused(tmp_path, changes, key):
    with pytest.raises(SpecError, match="cannot serve") as e:
        load_encoder(SPECS / "yoso.yaml", random_weights=0,
                     checkpoint=toy_config(tmp_path, "yoso", **changes))
    assert key in str(e.value)


def test_no_window_builds_no_convolution(tmp_path):
    loaded = load_encoder(SPECS / "yoso.yaml", random_weights=0,
                          checkpoint=toy_config(tmp_path, "yoso", conv_window=None))
    assert loaded.model.config.layers[0].value_conv is None
    assert not any(".conv." in name for name in loaded.checkpoint_tensors())


@pytest.mark.parametrize("old, new, needle", [
    ("    lsh_expectation: hash_code_len\n", "    lsh_expectation: 0\n", "hash bits of 0"),
    ("    lsh_expectation: hash_code_len\n",
     "    lsh_expectation: hash_code_len\n    landmarks: {count: 2, segment: 4}\n", "each other"),
    ("    lsh_expectation: hash_code_len\n", "", "set attention/landmarks or lsh_expectation"),
])
def test_lint_refuses_bad_lsh_expectation_options_at_their_line(tmp_path, old, new, needle):
    with pytest.raises(SpecError, match=needle):
        load_encoder(edited_spec(tmp_path, "yoso", old, new), random_weights=0, toy=True)
