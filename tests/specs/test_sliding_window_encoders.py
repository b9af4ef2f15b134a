"""The Longformer toy against transformers' own LongformerModel (a committed golden): its
sliding window of attention_window // 2 rows each side (the 11-id probe padded to a
multiple of the window by transformers, masked), as run without a global_attention_mask;
a window one row narrower or wider, or none, fails against the golden; windows that differ
between layers, or are odd, are refused naming attention_window."""

from __future__ import annotations

import pytest

from iron_spec.check import ENCODER_ATOL
from iron_spec.encoder import load_encoder
from iron_spec.errors import SpecError
from tests.conftest import SPECS, encoder_toy, hidden_errors, toy_config
from tests.specs.test_encoder_goldens import _fails_edited


def test_longformer_toy_matches_the_golden():
    loaded, golden = encoder_toy("longformer")
    assert {lo.window for lo in loaded.model.config.layers} == {2}
    assert sorted(len(ids) for ids, _ in golden.probes) == [1, 11, 24]
    assert max(hidden_errors(loaded.model, golden)) <= ENCODER_ATOL
    # transformers' float32 softmax inside its float64 run (the spec's validation.float64).
    assert max(hidden_errors(loaded.model, golden, float64=True)) <= 1e-6


@pytest.mark.parametrize("window", ['"max(attention_window) // 2 - 1"',
                                    '"max(attention_window) // 2 + 1"', "null"])
def test_another_window_fails_against_the_golden(tmp_path, window):
    _fails_edited(tmp_path, "longformer", 'window: "max(attention_window) // 2"',
                  f"window: {window}")


@pytest.mark.parametrize("windows, why", [([4, 8], "differ between layers"),
                                          ([3, 3], "even and positive"),
                                          (0, "even and positive")])
def test_windows_transformers_or_the_spec_cannot_run_are_refused(tmp_path, windows, why):
    with pytest.raises(SpecError, match=why) as e:
        load_encoder(SPECS / "longformer.yaml", random_weights=0,
                     checkpoint=toy_config(tmp_path, "longformer", attention_window=windows))
    assert "attention_window" in str(e.value)


def test_one_window_for_every_layer_reads_as_the_list(tmp_path):
    # LongformerModel turns attention_window 4 into [4, 4].
    loaded = load_encoder(SPECS / "longformer.yaml", random_weights=0,
                          checkpoint=toy_config(tmp_path, "longformer", attention_window=4))
    assert {lo.window for lo in loaded.model.config.layers} == {2}
