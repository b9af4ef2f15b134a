"""The Nystromformer toys against transformers' own NystromformerModel (committed goldens):
landmark attention approximated (4 landmarks over 16 rows) and exact (landmarks equal to the
segment), each with its value convolution; fewer iterations, other landmarks, the inverse's
start taken per head, the convolution's taps reversed or silenced each fail against the
golden; the config values transformers cannot run are refused naming their key."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from iron_spec.cli.check import ENCODER_ATOL
from iron_spec.spec.encoder import load_encoder
from iron_spec.spec.errors import SpecError
from iron_spec.operators import landmark, span_conv
from iron_spec.runtime.encoder_golden import EncoderGolden
from tests.conftest import SPECS, edited_spec, encoder_toy, hidden_errors, toy_config
from tests.specs.test_encoder_goldens import _fails_edited

GOLDENS = SPECS.parent / "tests" / "goldens" / "nystromformer"


def _exact(tmp_path):
    tmp_path.mkdir(exist_ok=True)
    # The golden's config: 16 landmarks over 16 rows (exact attention), 3 taps.
    loaded = load_encoder(SPECS / "nystromformer.yaml", random_weights=0,
                          checkpoint=toy_config(tmp_path, "nystromformer", num_landmarks=16,
                                                conv_kernel_size=3))
    return loaded, EncoderGolden.read(GOLDENS / "exact-seed0.npz", loaded.fingerprint())


def test_nystromformer_toy_matches_the_golden_in_float32_and_float64():
    loaded, golden = encoder_toy("nystromformer")
    lo = loaded.model.config.layers[0]
    lm = lo.landmarks
    assert (lm.landmarks, lm.segment, lm.iterations, lo.value_conv) == (4, 16, 6, 5)
    assert [len(ids) for ids, _ in golden.probes] == [16, 16, 16]
    assert max(hidden_errors(loaded.model, golden)) <= ENCODER_ATOL
    assert max(hidden_errors(loaded.model, golden, float64=True)) <= 1e-13


def test_exact_landmark_attention_matches_its_golden_at_any_length(tmp_path):
    loaded, golden = _exact(tmp_path)
    assert loaded.model.call_rows is None
    assert sorted(len(ids) for ids, _ in golden.probes) == [1, 11, 16]
    assert max(hidden_errors(loaded.model, golden)) <= ENCODER_ATOL
    assert max(hidden_errors(loaded.model, golden, float64=True)) <= 1e-13


def test_the_exact_golden_read_as_approximated_fails(tmp_path):
    # 8 landmarks over 16 rows on the exact golden's weights: the long probe alone runs.
    loaded, golden = _exact(tmp_path / "exact")
    approx = load_encoder(SPECS / "nystromformer.yaml", random_weights=0,
                          checkpoint=toy_config(tmp_path, "nystromformer", num_landmarks=8,
                                                conv_kernel_size=3))
    for (_, p), (_, q) in zip(approx.model.named_params(), loaded.model.named_params()):
        p.array = q.array
    states = approx.model.version(dataclasses.replace(approx.model.config.pooling, kind="none"))
    (ids, types), want = next((p, w) for p, w in zip(golden.probes, golden.hidden)
                              if len(p[0]) == 16)
    assert float(np.abs(states(ids, types) - want).max()) > 1e-2


def test_five_iterations_fail_against_the_golden(tmp_path):
    _fails_edited(tmp_path, "nystromformer", "segment: segment_means_seq_len}",
                  "segment: segment_means_seq_len, iterations: 5}")


def test_other_landmarks_fail_against_the_golden(tmp_path):
    _fails_edited(tmp_path, "nystromformer", "count: num_landmarks,", "count: 8,")


def test_the_inverses_start_taken_per_head_fails_against_the_golden(monkeypatch):
    # transformers divides by one max column sum over every head (torch.max of the whole
    # tensor): each head's own max is the exact init_option's, not the one it runs.
    def per_head(k, iterations):
        eye = np.eye(k.shape[-1], dtype=k.dtype)
        z = (1 / k.sum(axis=-2).max(axis=-1))[:, None, None] * k.transpose(0, 2, 1)
        for _ in range(iterations):
            kz = k @ z
            z = (0.25 * z) @ (13 * eye - kz @ (15 * eye - kz @ (7 * eye - kz)))
        return z
    monkeypatch.setattr(landmark, "_pinv", per_head)
    loaded, golden = encoder_toy("nystromformer")
    assert max(hidden_errors(loaded.model, golden, float64=True)) > 1e-2


def test_the_value_convolution_reversed_or_silenced_fails_against_the_golden():
    loaded, golden = encoder_toy("nystromformer")
    taps = [layer.attention.self.conv.weight for layer in loaded.model.encoder.layer]
    right = [w.array for w in taps]
    for w, a in zip(taps, right):
        w.array = a[:, ::-1].copy()
    assert max(hidden_errors(loaded.model, golden)) > 1e-1
    loaded, golden = encoder_toy("nystromformer")
    for layer in loaded.model.encoder.layer:
        w = layer.attention.self.conv.weight
        w.array = np.zeros_like(w.array)
    assert max(hidden_errors(loaded.model, golden, float64=True)) > 1e-1


def test_the_value_convolution_by_column_not_by_head_fails_against_the_golden(monkeypatch):
    # Each column by its own row of taps (group 1: the heads' taps spread over the columns).
    conv = span_conv.DepthwiseConv.reference
    monkeypatch.setattr(span_conv.DepthwiseConv, "reference", lambda self, x, w, group=1:
                        conv(self, x, np.resize(w, (w.shape[0] * group, w.shape[1]))))
    loaded, golden = encoder_toy("nystromformer")
    assert max(hidden_errors(loaded.model, golden, float64=True)) > 1e-2


def test_nystromformer_drawn_weights_carry_its_own_names():
    shapes = {n: t.shape for n, t in load_encoder(SPECS / "nystromformer.yaml",
                                                  random_weights=0, toy=True)
              .checkpoint_tensors().items()}
    assert shapes["encoder.layer.0.attention.self.conv.weight"] == (4, 1, 5, 1)
    assert shapes["embeddings.position_embeddings.weight"] == (18, 32)


def test_an_approximated_model_refuses_texts_of_another_length():
    loaded, _ = encoder_toy("nystromformer")
    with pytest.raises(ValueError, match="exactly 16 ids"):
        loaded.model.version()(np.arange(11))


@pytest.mark.parametrize("changes, key", [
    ({"inv_coeff_init_option": True}, "inv_coeff_init_option"),
    ({"num_landmarks": 5}, "segment_means_seq_len % num_landmarks"),
    ({"segment_means_seq_len": 32, "max_position_embeddings": 16}, "max_position_embeddings"),
    ({"conv_kernel_size": 4}, "conv_kernel_size % 2"),
    ({"conv_kernel_size": None}, "conv_kernel_size"),
])
def test_config_values_transformers_cannot_run_are_refused(tmp_path, changes, key):
    with pytest.raises(SpecError, match="cannot serve") as e:
        load_encoder(SPECS / "nystromformer.yaml", random_weights=0,
                     checkpoint=toy_config(tmp_path, "nystromformer", **changes))
    assert key in str(e.value)


@pytest.mark.parametrize("old, new, needle", [
    ("value_conv: conv_kernel_size\n", "value_conv: 4\n", "kernel is 4: an odd number"),
    ("    landmarks: {count: num_landmarks, segment: segment_means_seq_len}\n", "",
     "set attention/landmarks"),
    ("count: num_landmarks,", "count: 3,", "do not split into 3 landmark segments"),
    ("  attention:\n    bias: true\n", "  attention:\n    scale: 0.5\n    bias: true\n",
     "not with attention/scale"),
])
def test_lint_refuses_bad_landmark_options_at_their_line(tmp_path, old, new, needle):
    with pytest.raises(SpecError, match=needle):
        load_encoder(edited_spec(tmp_path, "nystromformer", old, new), random_weights=0,
                     toy=True)
