"""An audio tower: a sound's log-mel frames to soft tokens in a text model's space.

A Whisper-style encoder (Qwen2AudioEncoder's): ``conv1``, ``conv2``, ... (``nn.Conv1d``
over the frames, each followed by the activation), ``embed_positions`` (a learned position
per row), the encoder layers of ``runtime.encoder`` (pre-norm, in the encoder vocabulary),
average pooling over pairs of rows (``pool`` 2), the encoder's final norm after it, and the
projector (``tower.Projector``). The features are a fixed window (Whisper's 30 seconds:
3000 frames, 1500 rows after a stride-2 convolution); the encoder layers run on the rows
that hold the sound alone (the rest are keys transformers masks, and reach no soft token).

Not for: the features (``audio``), a vision tower (``tower``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..encoder import Stack
from ..encoder_options import EncoderOptions
from ..graph import CallSpec, Recorder
from ..module import Module, Param
from ..plan import Plan
from ..reference import Reference
from .tower import Projector, ProjectorOptions


@dataclass(frozen=True)
class AudioTowerOptions:
    """An audio tower's shape: ``encoder`` (layers, norm, width), ``mels`` and ``frames``
    (the features a call takes), ``convs`` (each ``(kernel, stride, padding)``), ``act`` (the
    activation after each), ``pool`` (rows averaged together: 2, or 1 for none),
    ``projector`` and ``text_hidden``."""

    encoder: EncoderOptions
    mels: int
    frames: int
    convs: tuple[tuple[int, int, int], ...]
    act: str
    pool: int
    projector: ProjectorOptions
    text_hidden: int

    def lengths(self, frames: int) -> int:
        """The rows ``frames`` frames give after the convolutions."""
        for k, s, p in self.convs:
            frames = (frames + 2 * p - k) // s + 1
        return frames

    @property
    def rows(self) -> int:
        """The encoder's rows for a whole window."""
        return self.lengths(self.frames)

    def soft(self, frames: int) -> int:
        """Soft tokens a sound of ``frames`` frames gives (Qwen2AudioProcessor's
        ``num_audio_tokens``)."""
        rows = self.lengths(frames)
        return rows if self.pool == 1 else (rows - 2) // 2 + 1


class AudioTower(Module):
    """``conv1`` .. ``convN``, ``embed_positions``, ``encoder`` and ``projector`` (module
    docstring).

    Raises:
        ValueError: a pool other than 1 or 2, or encoder layers that are not pre-norm.
    """

    def __init__(self, o: AudioTowerOptions):
        if o.pool not in (1, 2):
            raise ValueError(f"pool {o.pool}: rows averaged in pairs (2) or not (1)")
        if any(lo.placement != "pre" for lo in o.encoder.layers):
            raise ValueError("an audio tower's encoder layers are pre-norm: layer/placement pre")
        E, C = o.encoder.hidden_size, o.mels
        for i, (k, _, _) in enumerate(o.convs, 1):
            conv = Module()
            conv.weight = Param(E, C, k)
            conv.bias = Param(E)
            setattr(self, f"conv{i}", conv)
            C = E
        self.embed_positions = Module()
        self.embed_positions.weight = Param(o.rows, E)
        self.encoder = Stack(o.encoder)
        self.projector = Projector(o)
        self.options = o
        self.name_tree()
        self._version: AudioTowerVersion | None = None

    def body(self, rec: Recorder):
        """Record the tower: features ``(frames, mels)`` float32 and the call's rows to soft
        tokens ``(rows, text_hidden)``, the first ``soft`` of them the sound's."""
        o = self.options
        x = rec.input("features", (o.frames, o.mels), np.float32)
        bound = rec.input("rows", (o.rows,), np.int32, bounded=True)
        for i, (_, stride, padding) in enumerate(o.convs, 1):
            conv = getattr(self, f"conv{i}")
            w = rec.hold("param", conv.where("weight"), conv.weight.array)
            b = rec.hold("param", conv.where("bias"), conv.bias.array)
            x = rec.step("conv1d", x, w, b, where=conv.path, stride=stride, padding=padding)
            x = rec.step("activation", x, where=conv.path, act=o.act)
        x = rec.step("call_rows", x, bound, where=self.path)
        table = self.embed_positions
        w = rec.hold("param", table.where("weight"), table.weight.array)
        x = rec.step("add_rows", x, w, where=table.path, start=0)
        for layer in self.encoder.layer:
            x = layer(rec, x)
        if o.pool == 2:
            x = rec.step("pair_mean", x, where=self.path)
        if self.encoder.LayerNorm is not None:
            x = self.encoder.LayerNorm(rec, x)
        return self.projector(rec, x)

    @property
    def version(self) -> "AudioTowerVersion":
        if self._version is None:
            self._version = AudioTowerVersion(self)
        return self._version


class AudioTowerVersion:
    """The tower compiled over a whole window. ``version(features, frames)`` gives the soft
    tokens ``(soft, text_hidden)`` float32 (a copy) of features ``(mels, frames)`` whose first
    ``frames`` hold the sound; ``reference(...)`` runs the same recording in float64.

    Raises (both, before any work):
        ValueError: features of another shape, or frames outside 1..the window's.
    """

    def __init__(self, tower: AudioTower, check: bool = False):
        self.options = o = tower.options
        rec = Recorder(CallSpec(True, o.rows))
        out = tower.body(rec)
        self.plan = Plan(rec, out, check=check)
        self._reference = Reference(rec, out, {})
        self._rows = np.zeros(o.rows, np.int32)

    def _inputs(self, features, frames: int) -> tuple[dict, dict, int]:
        o = self.options
        features = np.asarray(features, np.float32)
        if features.shape != (o.mels, o.frames):
            raise ValueError(f"features {features.shape}: the tower takes ({o.mels}, "
                             f"{o.frames})")
        if not 1 <= frames <= o.frames:
            raise ValueError(f"{frames} frames of sound: 1..{o.frames}")
        rows = o.lengths(frames)
        return ({"features": np.ascontiguousarray(features.T), "rows": self._rows[:rows]},
                {"rows": rows}, o.soft(frames))

    def __call__(self, features, frames: int) -> np.ndarray:
        inputs, call, soft = self._inputs(features, frames)
        return np.array(self.plan.run(inputs, call)[:soft])

    def reference(self, features, frames: int) -> np.ndarray:
        inputs, call, soft = self._inputs(features, frames)
        return np.asarray(self._reference.run(inputs, call)[:soft])
