"""Token embeddings (``Embedding``, torch.nn.Embedding's table) and the fixed sinusoidal
position table some models hold in place of a learned one (``Sinusoidal``).

Not for: RoPE (``rope``), where a model adds its positions (``runtime.causal``,
``runtime.encoder``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from iron_spec.operators import sinusoidal_table

from ..graph import Handle, Recorder
from ..module import Module, Param


@dataclass(frozen=True)
class Sinusoidal:
    """A fixed sinusoidal position table in place of a learned one, computed by
    ``operators.positions.sinusoidal_table`` with these ``theta``, ``denominator`` (None:
    half the width), ``zero_row`` (None: none) and ``interleaved`` (sines and cosines in
    alternate columns): CTRL's ``positional_encoding``, XGLMSinusoidalPositionalEmbedding,
    XLM's ``create_sinusoidal_embeddings`` (interleaved)."""

    theta: float = 10000.0
    denominator: float | None = None
    zero_row: int | None = None
    interleaved: bool = False

    def table(self, rows: int, width: int) -> np.ndarray:
        """The table ``(rows, width)`` float32 (``sinusoidal_table``'s errors)."""
        return sinusoidal_table(rows, width, self.theta, self.denominator, self.zero_row,
                                self.interleaved)


class Embedding(Module):
    """torch.nn.Embedding: ``weight`` ``(vocab, hidden)``, rows times ``scale``; an id
    outside the table reads row ``outside`` (None: refused before the call)."""

    def __init__(self, vocab_size: int, hidden_size: int, scale: float = 1.0,
                 outside: int | None = None):
        self.weight = Param(vocab_size, hidden_size)
        self.scale = scale
        self.outside = outside

    def __call__(self, rec: Recorder, ids: Handle) -> Handle:
        w = rec.hold("param", self.where("weight"), self.weight.array)
        if self.outside is None:
            return rec.step("embedding", ids, w, where=self.path, scale=self.scale)
        return rec.step("embedding", ids, w, where=self.path, scale=self.scale,
                        outside=self.outside)
