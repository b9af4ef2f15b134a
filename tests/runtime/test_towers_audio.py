"""The log-mel front end against transformers' WhisperFeatureExtractor (its torch path, the
one it takes where torch is installed) on a recorded sound shipped in a registry package
(pygame's examples/data/boom.wav, 11025 Hz, resampled to 16 kHz by soxr), its features
recorded by transformers with the toy's golden (tests/checkpoints/make_towers.py); and the
audio tower's operators by hand."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from iron_spec.operators import CallRows, Conv1d, PairMean
from iron_spec.runtime.towers.audio import LogMel, mel_filters, read_audio

GOLDEN = Path(__file__).resolve().parents[1] / "goldens" / "towers" / "qwen2" / "qwen2-audio-toy.npz"


def boom() -> Path:
    spec = importlib.util.find_spec("pygame")
    if spec is None:
        pytest.skip("pygame (the test extra) ships the recorded sound")
    return Path(spec.origin).parent / "examples" / "data" / "boom.wav"


def test_features_equal_whisper_feature_extractor_within_1e5():
    golden = np.load(GOLDEN)
    features, frames = LogMel(feature_size=128)(golden["audio"])
    assert features.shape == golden["input_features"][0].shape == (128, 3000)
    assert np.abs(features - golden["input_features"][0]).max() < 1e-5
    assert frames == int(golden["feature_frames"])


def test_a_recorded_sound_reads_as_the_golden_was_recorded():
    pytest.importorskip("soundfile")
    pytest.importorskip("soxr")
    samples = read_audio(boom(), 16000)
    golden = np.load(GOLDEN)
    assert samples.dtype == np.float32 and samples.shape == golden["audio"].shape
    np.testing.assert_array_equal(samples, golden["audio"])


def test_mel_filters_are_slaney_normalized_triangles():
    from iron_spec.runtime.towers.audio import hertz_to_mel, mel_to_hertz

    # Slaney's scale: linear to 1 kHz (15 mels), then 27 mels per factor 6.4.
    assert hertz_to_mel(np.array([500.0, 1000.0, 6400.0])).tolist() == pytest.approx([7.5, 15, 42])
    assert mel_to_hertz(np.array([42.0])).tolist() == pytest.approx([6400.0])
    f = mel_filters(201, 80, 16000)
    assert f.shape == (201, 80) and (f >= 0).all()
    # A triangle of height 2 / width has unit area (Slaney's normalization): the wide
    # filters, many bins across, sum to it.
    area = f.sum(axis=0) * 40.0  # bins 40 Hz apart
    assert np.abs(area[45:] - 1).max() < 0.02  # sampled every 40 Hz: a percent or two


def test_a_dither_is_refused():
    with pytest.raises(ValueError, match="dither"):
        LogMel(dither=1e-5)


def test_conv1d_is_torch_conv1d_by_hand():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((9, 4)).astype(np.float32)
    w = rng.standard_normal((5, 4, 3)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    op = Conv1d()
    for stride, padding in ((1, 1), (2, 1), (2, 0)):
        n_out = op.shape(x.shape, w.shape, b.shape, stride=stride, padding=padding)[0]
        padded = np.pad(x.astype(np.float64), ((padding, padding), (0, 0)))
        want = np.array([[np.sum(w[o].T * padded[t * stride: t * stride + 3]) + b[o]
                          for o in range(5)] for t in range(n_out)])
        out = np.empty((n_out, 5), np.float32)
        op.kernel(out, x, op.pack(1, w), b, stride=stride, padding=padding)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(op.reference(x, w, b, stride=stride, padding=padding), want,
                                   rtol=1e-12, atol=1e-12)


def test_pair_mean_and_call_rows():
    x = np.arange(14, dtype=np.float32).reshape(7, 2)
    out = np.empty_like(x)
    PairMean().kernel(out, x)
    np.testing.assert_array_equal(out[:3], [[1, 2], [5, 6], [9, 10]])
    np.testing.assert_array_equal(out[3:], 0)
    np.testing.assert_array_equal(PairMean().reference(x), out)
    full = np.arange(20, dtype=np.float32).reshape(10, 2)
    got = np.empty((4, 2), np.float32)
    CallRows().kernel(got, full, np.zeros(4, np.int32))
    np.testing.assert_array_equal(got, full[:4])


def test_an_empty_sound_file_is_refused_naming_it(tmp_path):
    # Found by a new user's trial: a .wav of no samples was refused with no word of which file.
    soundfile = pytest.importorskip("soundfile")
    pytest.importorskip("soxr")
    path = tmp_path / "silence.wav"
    soundfile.write(str(path), np.zeros(0, np.float32), 16000)
    with pytest.raises(ValueError, match=f"^{path}: holds no samples"):
        read_audio(path, 16000)
