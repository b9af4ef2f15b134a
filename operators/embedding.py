"""Embedding gather: the rows of a table that token ids name, as torch.nn.Embedding."""

from __future__ import annotations

import numpy as np

from . import held, native
from .base import Operator, Tolerance


class Embedding(Operator):
    """``ids`` ``(n,)`` int32 and ``weight`` ``(vocab, hidden)`` give ``(n, hidden)``.

    Attributes: ``scale`` multiplies every row (Gemma's ``sqrt(hidden_size)``; 1.0 is none).
    ``outside``: the row an id outside ``[0, vocab)`` reads, as Gemma3nTextModel's
    ``get_per_layer_inputs`` (``torch.where(in_table, input_ids, 0)``); numpy runs such a
    step (no native one). None: an id outside is the caller's to refuse before the call.
    """

    name = "embedding"
    rows_alone = True

    def shape(self, ids, weight, scale=1.0, outside=None):
        if len(ids) != 1 or len(weight) != 2:
            raise ValueError(f"embedding takes ids (n,) and weight (vocab, hidden), not {ids} and {weight}")
        if outside is not None and not 0 <= outside < weight[0]:
            raise ValueError(f"embedding: row {outside} for ids outside the table is not one "
                             f"of its {weight[0]} rows")
        return (ids[0], weight[1])

    @staticmethod
    def _ids(ids, rows, outside):
        ids = np.asarray(ids)
        return ids if outside is None else np.where((ids >= 0) & (ids < rows), ids, outside)

    def reference(self, ids, weight, scale=1.0, outside=None):
        # The rows gathered, then widened: the whole table in float64 is 1.3 GB on a
        # 262144-token vocabulary. A weight held in its stored form (operators.held) is
        # widened by numpy, its rows alone.
        if not held.is_held(weight):
            weight = np.asarray(weight)
        rows = held.gather(weight, self._ids(ids, len(weight), outside))
        return rows.astype(np.float64).reshape(np.shape(ids) + (weight.shape[1],)) * scale

    def pack(self, index, array, **attrs):
        """A table held in its stored form (``operators.held``) as it is."""
        if index == 1 and held.is_held(array):
            return array
        return super().pack(index, array, **attrs)

    def kernel(self, out, ids, weight, scratch=None, scale=1.0, outside=None):
        if held.is_held(weight):
            out[...] = held.gather(weight, self._ids(ids, len(weight), outside)).reshape(out.shape)
        else:
            np.take(weight, self._ids(ids, len(weight), outside), axis=0, out=out)
        if scale != 1.0:
            out *= np.float32(scale)

    def lower(self, out, ids, weight, scratch=None, scale=1.0, outside=None):
        # Each id's row (widened from a held form), times the scale; every id checked within
        # the vocabulary first (the error names its row).
        if outside is not None or ids.ndim != 1 or ids.dtype != np.int32 or \
                not native.contiguous(out, ids):
            return None
        if held.is_held(weight):
            w = held.raw(weight)
            if not w.flags.c_contiguous:
                return None
            return native.Step(native.OP_EMBEDDING, (out, ids, w),
                               tuple(weight.shape) + ids.shape + (held.code(weight),), (scale,),
                               rows=2)
        if weight.dtype != np.float32 or not native.contiguous(weight):
            return None
        return native.Step(native.OP_EMBEDDING, (out, ids, weight), weight.shape + ids.shape,
                           (scale,), rows=2)

    def tolerance(self, ids, weight, scale=1.0, outside=None):
        # A gather is exact; the scale is one float32 rounding.
        return Tolerance(atol=0.0, rtol=0.0 if scale == 1.0 else np.finfo(np.float32).eps)
