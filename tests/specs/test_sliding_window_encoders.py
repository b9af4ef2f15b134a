"""The Longformer toy against transformers' own LongformerModel (a committed golden): its
sliding window of attention_window // 2 rows each side (the 11-id probe padded to a
multiple of the window by transformers, masked) and each probe's global tokens (two, three,
none); a window one row narrower or wider, the global tokens dropped, read through
the local projections, or counted twice inside the window each fail against the golden;
windows that differ between layers, or are odd, are refused naming attention_window."""

from __future__ import annotations

import numpy as np
import pytest

from iron_spec.cli.check import ENCODER_ATOL
from iron_spec.spec.encoder import load_encoder
from iron_spec.spec.errors import SpecError
from iron_spec.operators import global_attention
from tests.conftest import SPECS, edited_spec, encoder_toy, hidden_errors, toy_config
from tests.specs.test_encoder_goldens import _fails_edited


def test_longformer_toy_matches_the_golden():
    loaded, golden = encoder_toy("longformer")
    assert {lo.window for lo in loaded.model.config.layers} == {2}
    assert sorted(len(ids) for ids, _ in golden.probes) == [1, 11, 24]
    assert [int(m.sum()) for m in golden.global_masks] == [2, 3, 0]
    assert max(hidden_errors(loaded.model, golden)) <= ENCODER_ATOL
    # transformers' float32 softmax inside its float64 run (the spec's validation.float64).
    assert max(hidden_errors(loaded.model, golden, float64=True)) <= 1e-6


@pytest.mark.parametrize("window", ['"max(attention_window) // 2 - 1"',
                                    '"max(attention_window) // 2 + 1"'])
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


def test_the_global_tokens_dropped_fail_against_the_golden():
    loaded, golden = encoder_toy("longformer")
    golden.global_masks = [np.zeros_like(m) for m in golden.global_masks]
    assert max(hidden_errors(loaded.model, golden)) > 1e-2


def test_global_rows_through_the_local_projections_fail_against_the_golden():
    loaded, golden = encoder_toy("longformer")
    for layer in loaded.model.encoder.layer:
        a = layer.attention.self
        for local, glob in ((a.query, a.query_global), (a.key, a.key_global),
                            (a.value, a.value_global)):
            glob.weight.array, glob.bias.array = local.weight.array, local.bias.array
    assert max(hidden_errors(loaded.model, golden)) > 1e-2


def test_global_keys_counted_again_inside_the_window_fail_against_the_golden(monkeypatch):
    # The window's own copy of a global key kept beside the global one: its weight doubled.
    attend = global_attention._attend

    def twice(q, k, v, qg, kg, vg, marks, window, dtype):
        out = attend(q, k, v, qg, kg, vg, marks, window, dtype).reshape(q.shape)
        glob, i = np.asarray(marks) != 0, np.arange(len(marks))
        near = np.abs(i[:, None] - i[None, :]) <= window
        weight = (near & ~glob[None, :]) + 2 * glob[None, :]
        for h in range(q.shape[1]):
            s = (np.asarray(q[:, h], dtype) / np.sqrt(q.shape[2])) @ np.asarray(k[:, h], dtype).T
            p = weight * np.exp(s - s.max(-1, keepdims=True))
            local = (p / p.sum(-1, keepdims=True)) @ np.asarray(v[:, h], dtype)
            out[~glob, h] = local[~glob]
        return out.reshape(len(marks), -1)
    monkeypatch.setattr(global_attention, "_attend", twice)
    loaded, golden = encoder_toy("longformer")
    assert max(hidden_errors(loaded.model, golden, float64=True)) > 1e-3


def test_a_global_attention_mask_is_checked_and_refused_where_nothing_reads_it():
    loaded, _ = encoder_toy("longformer")
    version = loaded.model.version()
    with pytest.raises(ValueError, match="one 0 or 1 per id"):
        version(np.arange(5), global_attention_mask=np.array([0, 2, 0, 0, 0]))
    with pytest.raises(ValueError, match="one 0 or 1 per id"):
        version(np.arange(5), global_attention_mask=np.array([0, 1]))
    bert, _ = encoder_toy("bert")
    with pytest.raises(ValueError, match="reads no global tokens"):
        bert.model.version()(np.arange(5), global_attention_mask=np.ones(5, np.int32))


@pytest.mark.parametrize("new", ['window: null, global_tokens: true}',
                                 'window: "max(attention_window) // 2", global_tokens: true, '
                                 'fused_qkv: true}'])
def test_lint_refuses_global_tokens_without_a_window_or_with_fused_qkv(tmp_path, new):
    path = edited_spec(tmp_path, "longformer",
                       'window: "max(attention_window) // 2", global_tokens: true}', new)
    with pytest.raises(SpecError, match="global tokens sit beside a sliding window"):
        load_encoder(path, random_weights=0, toy=True)
