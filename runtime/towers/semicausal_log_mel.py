"""A sound to semicausal log-mel frames (Gemma 4's audio front end), as transformers'
``Gemma4AudioFeatureExtractor``
(models/gemma4/feature_extraction_gemma4.py, the Universal Speech Model's front end): the
seeds' ``LogMel`` with its defaults (frames of 320 samples every 160, a 512-point rfft, 128
mel bins to 8 kHz, mel floor 0.001).

The samples are padded with ``padding_value`` to a multiple of ``pad_to_multiple_of`` (cut at
``max_length``), ``frame_length // 2`` zeros put before them (semicausal: the first frame
centred on the first sample), cut into frames of ``frame_length + 1`` samples every
``hop_length`` (the last sample dropped; with ``preemphasis`` it feeds the filter), windowed
by a periodic Hann window, the rfft's magnitude (not its power) through an HTK mel filter bank
without normalization (``audio_utils.mel_filter_bank(norm=None, mel_scale="htk")``), its
natural log after adding ``mel_floor``, less ``per_bin_mean``, over ``per_bin_stddev``. A frame
whose last sample is padding is zeroed and not counted. The frames, window and rfft in
float32 and the filter bank's product and log in float64, as the extractor computes them
(numpy's own rfft): within 1e-5 of it (tests/runtime/test_towers_gemma4.py).

``soft(frames)`` is the soft tokens the tower gives them, as ``Gemma4Processor``
counts them (two stride-2 convolutions on the frames' mask).

Not for: the audio tower (``conformer``), Whisper's log-mel (``audio``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .audio import read_audio


def htk_mel_filters(bins: int, mels: int, sampling_rate: int, low: float,
                    high: float) -> np.ndarray:
    """The triangular mel filter bank ``(bins, mels)`` float64 on the HTK mel scale
    (``2595 * log10(1 + f / 700)``), unnormalized, over ``bins`` FFT bins from 0 to
    ``sampling_rate // 2``, as transformers' ``mel_filter_bank(norm=None, mel_scale="htk")``."""
    def mel(f):
        return 2595.0 * np.log10(1.0 + np.asarray(f, np.float64) / 700.0)

    points = 700.0 * (10.0 ** (np.linspace(mel(low), mel(high), mels + 2) / 2595.0) - 1.0)
    fft = np.linspace(0, sampling_rate // 2, bins)
    slopes = points[None, :] - fft[:, None]
    width = np.diff(points)
    down = -slopes[:, :-2] / width[:-1]
    up = slopes[:, 2:] / width[1:]
    return np.maximum(0.0, np.minimum(down, up))


@dataclass(frozen=True)
class SemicausalLogMel:
    """``Gemma4AudioFeatureExtractor``'s settings, as its preprocessor_config.json names them
    (module docstring). ``dither`` (random noise) and ``fft_overdrive`` are refused but at 0
    and false."""

    feature_size: int = 128
    sampling_rate: int = 16000
    padding_value: float = 0.0
    frame_length_ms: float = 20.0
    hop_length_ms: float = 10.0
    min_frequency: float = 0.0
    max_frequency: float = 8000.0
    preemphasis: float = 0.0
    preemphasis_htk_flavor: bool = True
    fft_overdrive: bool = False
    dither: float = 0.0
    input_scale_factor: float = 1.0
    mel_floor: float = 1e-3
    per_bin_mean: tuple | None = None
    per_bin_stddev: tuple | None = None
    max_length: int = 480_000
    pad_to_multiple_of: int = 128

    def __post_init__(self):
        if self.dither != 0.0:
            raise ValueError(f"dither {self.dither}: random noise added to the samples is not "
                             "built (0.0)")
        for name in ("per_bin_mean", "per_bin_stddev"):
            value = getattr(self, name)
            if value is not None and len(value) != self.feature_size:
                raise ValueError(f"{name} holds {len(value)} values for {self.feature_size} "
                                 "mel bins (feature_size)")

    @property
    def frame_length(self) -> int:
        return int(round(self.sampling_rate * self.frame_length_ms / 1000.0))

    @property
    def hop_length(self) -> int:
        return int(round(self.sampling_rate * self.hop_length_ms / 1000.0))

    @property
    def fft_length(self) -> int:
        n = 2 ** math.ceil(math.log2(self.frame_length))
        return 2 * n if self.fft_overdrive else n

    def __call__(self, source) -> tuple[np.ndarray, int]:
        """The features ``(frames, feature_size)`` float32 of ``source`` (a file, or samples
        at ``sampling_rate``: ``audio.read_audio``), frames past the sound zeroed, and how many
        frames hold the sound (the extractor's ``input_features_mask`` summed).

        Raises:
            as ``audio.read_audio``.
        """
        wave = read_audio(source, self.sampling_rate)[: self.max_length]
        n = len(wave)
        m = self.pad_to_multiple_of
        total = -(-n // m) * m if m else n
        signal = np.full(total, self.padding_value, np.float32)
        signal[:n] = wave
        valid = np.zeros(total, bool)
        valid[:n] = True
        if self.input_scale_factor != 1.0:
            signal = signal * np.float32(self.input_scale_factor)
        L, hop = self.frame_length, self.hop_length
        signal = np.concatenate([np.zeros(L // 2, np.float32), signal])
        valid = np.concatenate([np.zeros(L // 2, bool), valid])
        count = max(0, (len(signal) - (L + 1)) // hop + 1)
        frames = np.lib.stride_tricks.as_strided(
            signal, (count, L + 1), (signal.strides[0] * hop, signal.strides[0]))
        if self.preemphasis > 0.0:
            p = self.preemphasis
            if self.preemphasis_htk_flavor:
                frames = np.concatenate([frames[:, :1] * (1.0 - p),
                                         frames[:, 1:-1] - p * frames[:, :-2]], axis=1)
            else:
                frames = frames[:, 1:] - p * frames[:, :-1]
        else:
            frames = frames[:, :-1]
        window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(L) / L)).astype(np.float32)
        # float32 frames and window through numpy's float32 rfft, as the extractor's: the log
        # of a quiet bin magnifies any other rounding of its magnitude (float64 here differs
        # by up to 5e-4 on a recorded sound).
        magnitude = np.abs(np.fft.rfft(frames * window, n=self.fft_length, axis=1))
        filters = htk_mel_filters(self.fft_length // 2 + 1, self.feature_size,
                                  self.sampling_rate, self.min_frequency, self.max_frequency)
        log = np.log(magnitude @ filters + self.mel_floor)
        if self.per_bin_mean is not None:
            log = log - np.asarray(self.per_bin_mean, np.float64)
        if self.per_bin_stddev is not None:
            log = log / np.asarray(self.per_bin_stddev, np.float64)
        mask = valid[np.arange(count) * hop + L]
        features = (log * mask[:, None]).astype(np.float32)
        return features, int(mask.sum())

    @staticmethod
    def soft(frames: int, total: int) -> int:
        """Soft tokens ``frames`` frames of sound give among ``total`` (Gemma4Processor's
        ``replace_audio_token``: the mask through two stride-2 convolutions)."""
        mask = np.arange(total) < frames
        t = total
        for _ in range(2):
            t = (t + 2 - 3) // 2 + 1
            mask = mask[::2][:t]
        return int(mask.sum())
