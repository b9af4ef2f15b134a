"""Adding learned absolute positions: rows of a position table, from a call's first
position, added to the hidden states."""

from __future__ import annotations

import numpy as np

from . import native
from .base import EPS32, Operator, Tolerance, as64


class AddRows(Operator):
    """``x + table[start .. start + n]``: ``x`` ``(n, hidden)`` float32, ``table``
    ``(positions, hidden)``; row ``start + i`` is added to row ``i`` (a learned position
    table read from the call's first position, its offset folded into ``start``, as
    transformers' OPTLearnedPositionalEmbedding ``position_ids + offset``). Attributes:
    ``start`` (often per call). A run past the table's rows is the caller's to refuse.
    """

    name = "add_rows"

    def shape(self, x, table, start=0):
        if len(x) != 2 or len(table) != 2 or x[1] != table[1]:
            raise ValueError(f"add_rows: x {x} (n, hidden) does not meet table {table}")
        return x

    def reference(self, x, table, start=0):
        n = x.shape[0]
        return as64(x) + as64(table)[start:start + n]

    def kernel(self, out, x, table, scratch=None, start=0):
        np.add(x, table[start:start + x.shape[0]], out=out)

    def lower(self, out, x, table, scratch=None):
        # Row r of x meets table row start + r, every row within the table (checked).
        if not native.contiguous(out, x, table):
            return None
        return native.Step(native.OP_ADD_ROWS, (out, x, table),
                           (x.shape[1], table.shape[0], x.shape[0]), rows=2)

    def tolerance(self, x, table, start=0):
        return Tolerance(atol=0.0, rtol=2 * EPS32)

    def scale(self, reference, x, table, start=0):
        return np.abs(as64(x)) + np.abs(as64(table)[start:start + x.shape[0]])
