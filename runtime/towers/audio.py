"""A sound to an audio tower's input, as transformers' feature extractors compute it.

``read_audio`` decodes a file (soundfile: libsndfile's WAV, FLAC, OGG) to mono float32
samples and resamples them to the extractor's rate (soxr, the resampler librosa uses):
transformers' extractors take samples at their own rate and refuse others, so what a user
resamples with is theirs; these two are the well-kept libraries for it.

``LogMel`` is the seeds' ``LogMel``: the log-mel spectrogram transformers'
``WhisperFeatureExtractor`` gives (Qwen2-Audio's, Whisper's): samples padded with
``padding_value`` (or cut) to ``chunk_length`` seconds, a centred STFT of ``n_fft`` points
every ``hop_length`` samples (reflect-padded, a periodic Hann window, as ``torch.stft``),
its power through the Slaney mel filter bank from 0 to 8 kHz (``audio_utils.mel_filter_bank``),
``log10`` of it at least 1e-10, floored 8 below its maximum, then ``(x + 4) / 4``; the last
frame dropped. Computed in float64 and given as float32 (transformers' torch path computes
in float32: the two agree within 1e-5, tests/runtime/test_towers_audio.py).

Not for: the tower reading the features (``audio_tower``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


def read_audio(source, sampling_rate: int) -> np.ndarray:
    """``source`` as mono float32 samples at ``sampling_rate``: a file (any format
    libsndfile reads; its channels averaged, resampled by soxr where its rate differs), or
    an array of samples already at that rate.

    Raises:
        FileNotFoundError: a path that is not there.
        ValueError: a file that is no sound soundfile reads or holds no samples, an array
            that is not one channel of float or integer samples.
        ImportError: soundfile or soxr is not installed (the ``audio`` extra).
    """
    if isinstance(source, np.ndarray):
        if source.ndim != 1 or source.dtype.kind not in "fiu":
            raise ValueError(f"samples are one channel of numbers (n,), not {source.shape} "
                             f"{source.dtype}")
        return source.astype(np.float32)
    path = Path(source).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no sound file there")
    try:
        import soundfile
        import soxr
    except ImportError:
        raise ImportError("reading a sound file needs soundfile and soxr: pip install "
                          "'iron-spec[audio]'") from None
    check_sound(path)
    samples, rate = soundfile.read(str(path), dtype="float64", always_2d=True)
    mono = samples.mean(axis=1)
    if rate != sampling_rate:
        mono = soxr.resample(mono, rate, sampling_rate)
    return mono.astype(np.float32)


def check_sound(path: Path) -> None:
    """Refuse a file libsndfile does not read as a sound, or one of no samples (soundfile
    reads a header-only file as none, no error), from its header alone: ``read_audio``
    before it decodes, and ``iron-spec run --audio`` before the weights load.

    Raises:
        ValueError: naming ``path``.
        ImportError: soundfile is not installed (the ``audio`` extra).
    """
    import soundfile
    try:
        frames = soundfile.info(str(path)).frames
    except (RuntimeError, soundfile.LibsndfileError) as e:
        raise ValueError(f"{path}: not a sound soundfile can read ({e})") from None
    if frames == 0:
        raise ValueError(f"{path}: holds no samples (an empty sound)")


def hertz_to_mel(freq: np.ndarray) -> np.ndarray:
    """Hertz to Slaney's mels: linear below 1 kHz, logarithmic above."""
    freq = np.asarray(freq, np.float64)
    mels = 3.0 * freq / 200.0
    log = freq >= 1000.0
    return np.where(log, 15.0 + np.log(np.maximum(freq, 1e-300) / 1000.0) * (27.0 / np.log(6.4)),
                    mels)


def mel_to_hertz(mels: np.ndarray) -> np.ndarray:
    """Slaney's mels to hertz (``hertz_to_mel`` undone)."""
    mels = np.asarray(mels, np.float64)
    freq = 200.0 * mels / 3.0
    return np.where(mels >= 15.0, 1000.0 * np.exp(np.log(6.4) / 27.0 * (mels - 15.0)), freq)


def mel_filters(bins: int, mels: int, sampling_rate: int, low: float = 0.0,
                high: float = 8000.0) -> np.ndarray:
    """The Slaney-normalized triangular mel filter bank ``(bins, mels)`` float64 over
    ``bins`` FFT bins from 0 to ``sampling_rate // 2``, as transformers'
    ``mel_filter_bank(norm="slaney", mel_scale="slaney")``."""
    points = mel_to_hertz(np.linspace(hertz_to_mel(low), hertz_to_mel(high), mels + 2))
    fft = np.linspace(0, sampling_rate // 2, bins)
    slopes = points[None, :] - fft[:, None]
    width = np.diff(points)
    down = -slopes[:, :-2] / width[:-1]
    up = slopes[:, 2:] / width[1:]
    filters = np.maximum(0.0, np.minimum(down, up))
    return filters * (2.0 / (points[2:mels + 2] - points[:mels]))[None, :]


@dataclass(frozen=True)
class LogMel:
    """A log-mel front end's settings, as a ``WhisperFeatureExtractor``'s
    preprocessor_config.json names them (module docstring): ``feature_size`` mel bins,
    ``sampling_rate`` Hz, ``hop_length`` and ``n_fft`` samples, ``chunk_length`` seconds,
    ``padding_value``, ``dither`` (0: none; a dither is random and not built)."""

    feature_size: int = 80
    sampling_rate: int = 16000
    hop_length: int = 160
    chunk_length: int = 30
    n_fft: int = 400
    padding_value: float = 0.0
    dither: float = 0.0

    def __post_init__(self):
        if self.dither != 0.0:
            raise ValueError(f"dither {self.dither}: random noise added to the samples is not "
                             "built (0.0)")
        if self.n_fft < 2 or self.hop_length < 1 or self.chunk_length < 1:
            raise ValueError(f"n_fft {self.n_fft}, hop_length {self.hop_length}, chunk_length "
                             f"{self.chunk_length}: at least 2, 1 and 1")

    @property
    def samples(self) -> int:
        """Samples a chunk holds."""
        return self.chunk_length * self.sampling_rate

    @property
    def frames(self) -> int:
        """Frames a chunk's features hold."""
        return self.samples // self.hop_length

    def __call__(self, source) -> tuple[np.ndarray, int]:
        """The features ``(feature_size, frames)`` float32 of ``source`` (a file or samples
        at ``sampling_rate``: ``read_audio``) and how many frames hold the sound (the
        extractor's ``attention_mask`` summed).

        Raises:
            as ``read_audio``.
        """
        wave = read_audio(source, self.sampling_rate)
        n = min(len(wave), self.samples)
        padded = np.full(self.samples, self.padding_value, np.float64)
        padded[:n] = wave[:n]
        half = self.n_fft // 2
        signal = np.pad(padded, half, mode="reflect")
        count = 1 + (len(signal) - self.n_fft) // self.hop_length
        frames = np.lib.stride_tricks.as_strided(
            signal, (count, self.n_fft), (signal.strides[0] * self.hop_length, signal.strides[0]))
        window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(self.n_fft) / self.n_fft)
        power = np.abs(np.fft.rfft(frames * window, axis=1)) ** 2  # (count, bins)
        filters = mel_filters(self.n_fft // 2 + 1, self.feature_size, self.sampling_rate)
        mel = (power[:-1] @ filters).T  # (mels, frames), the last frame dropped
        log = np.log10(np.maximum(mel, 1e-10))
        log = np.maximum(log, log.max() - 8.0)
        features = ((log + 4.0) / 4.0).astype(np.float32)
        valid = -(-n // self.hop_length)
        return features, min(valid, self.frames)
