"""Embedding gather: the rows of a table that token ids name, as torch.nn.Embedding."""

from __future__ import annotations

import numpy as np

from . import native
from .base import Operator, Tolerance


class Embedding(Operator):
    """``ids`` ``(n,)`` int32 and ``weight`` ``(vocab, hidden)`` give ``(n, hidden)``.

    Attributes: ``scale`` multiplies every row (Gemma's ``sqrt(hidden_size)``; 1.0 is none).
    An id outside ``[0, vocab)`` is the caller's to refuse before the call.
    """

    name = "embedding"

    def shape(self, ids, weight, scale=1.0):
        if len(ids) != 1 or len(weight) != 2:
            raise ValueError(f"embedding takes ids (n,) and weight (vocab, hidden), not {ids} and {weight}")
        return (ids[0], weight[1])

    def reference(self, ids, weight, scale=1.0):
        # The rows gathered, then widened: the whole table in float64 is 1.3 GB on a
        # 262144-token vocabulary.
        return np.asarray(np.asarray(weight)[np.asarray(ids)], np.float64) * scale

    def kernel(self, out, ids, weight, scratch=None, scale=1.0):
        np.take(weight, ids, axis=0, out=out)
        if scale != 1.0:
            out *= np.float32(scale)

    def lower(self, out, ids, weight, scratch=None, scale=1.0):
        # Each id's row, times the scale; every id checked within the vocabulary first (the
        # error names its row).
        if ids.ndim != 1 or ids.dtype != np.int32 or weight.dtype != np.float32 or \
                not native.contiguous(out, ids, weight):
            return None
        return native.Step(native.OP_EMBEDDING, (out, ids, weight), weight.shape + ids.shape,
                           (scale,), rows=2)

    def tolerance(self, ids, weight, scale=1.0):
        # A gather is exact; the scale is one float32 rounding.
        return Tolerance(atol=0.0, rtol=0.0 if scale == 1.0 else np.finfo(np.float32).eps)
