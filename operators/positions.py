"""Adding rows by position to the hidden states: a learned absolute position table's, from
a call's first position, and a segment table's row by each position's segment (a prefix's
or the text's)."""

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
    rows_alone = True

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


class SegmentRows(Operator):
    """``x`` plus each row's segment embedding: ``x`` ``(n, hidden)`` float32 at positions
    ``start .. start + n``, ``table`` ``(segments, hidden)``; a row at a position below
    ``prefix`` (a prefix prepended to every sequence) gains ``table[first]``, every other
    ``table[rest]``, as CpmAntModel's ``segment_embedding(segment)`` (0 for its prompt
    prefix, 2 for the text's ids). Attributes: ``start`` (often per call), ``prefix``,
    ``first``, ``rest``. No native step: numpy runs it.
    """

    name = "segment_rows"

    def shape(self, x, table, start=0, prefix=0, first=0, rest=0):
        if len(x) != 2 or len(table) != 2 or x[1] != table[1] or not (
                0 <= first < table[0] and 0 <= rest < table[0]):
            raise ValueError(f"segment_rows: x {x} (n, hidden) does not meet table {table} "
                             f"at rows {first} and {rest}")
        return x

    def _rows(self, n, start, prefix, first, rest):
        return np.where(np.arange(start, start + n) < prefix, first, rest)

    def reference(self, x, table, start=0, prefix=0, first=0, rest=0):
        return as64(x) + as64(table)[self._rows(x.shape[0], start, prefix, first, rest)]

    def kernel(self, out, x, table, scratch=None, start=0, prefix=0, first=0, rest=0):
        np.add(x, table[self._rows(x.shape[0], start, prefix, first, rest)], out=out)

    def tolerance(self, x, table, start=0, prefix=0, first=0, rest=0):
        return Tolerance(atol=0.0, rtol=2 * EPS32)

    def scale(self, reference, x, table, start=0, prefix=0, first=0, rest=0):
        return np.abs(as64(x)) + np.abs(as64(table)[self._rows(x.shape[0], start, prefix,
                                                                 first, rest)])


def sinusoidal_table(rows: int, width: int, theta: float = 10000.0,
                     denominator: float | None = None, zero_row: int | None = None,
                     interleaved: bool = False) -> np.ndarray:
    """A fixed sinusoidal position table ``(rows, width)`` float32, computed, not loaded:
    row ``p`` is ``[sin(p * r_0), .., sin(p * r_{h-1}), cos(p * r_0), .., cos(p * r_{h-1})]``
    with ``h = width / 2`` rates ``r_j = theta ** (-j / denominator)`` (``denominator``
    default ``h``: CTRL's ``positional_encoding``, ``1 / 10000 ** (2j / width)``; ``h - 1``:
    XGLMSinusoidalPositionalEmbedding's ``get_embedding``, tensor2tensor's). ``zero_row``:
    a row set to zeros (XGLM's ``padding_idx``; None: none). ``interleaved``: the same
    values with the sines in the even columns and the cosines in the odd ones, column ``2j``
    ``sin(p * r_j)`` and ``2j + 1`` ``cos(p * r_j)``, as XLM's
    ``create_sinusoidal_embeddings`` (``pos / 10000 ** (2 * (c // 2) / width)`` at column
    ``c``: denominator ``h``). Computed in float64, then rounded: transformers computes it in
    float32 (XLM's in float64, then rounded), within a few float32 ulps of this.

    Raises:
        ValueError: an odd ``width`` (no family's table of odd width is built), fewer than
            one row, a ``denominator`` not above 0, or a ``zero_row`` outside the rows.
    """
    if width < 2 or width % 2:
        raise ValueError(f"a sinusoidal table of width {width}: an even width of at least 2")
    if rows < 1:
        raise ValueError(f"a sinusoidal table of {rows} rows: at least 1")
    h = width // 2
    denominator = float(h if denominator is None else denominator)
    if not denominator > 0:
        raise ValueError(f"a sinusoidal table's denominator {denominator}: above 0")
    if zero_row is not None and not 0 <= zero_row < rows:
        raise ValueError(f"zero_row {zero_row} is outside the table's rows 0..{rows - 1}")
    rates = float(theta) ** (-np.arange(h, dtype=np.float64) / denominator)
    angles = np.arange(rows, dtype=np.float64)[:, None] * rates[None, :]
    if interleaved:
        table = np.stack([np.sin(angles), np.cos(angles)], axis=2).reshape(rows, width)
    else:
        table = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
    table = table.astype(np.float32)
    if zero_row is not None:
        table[zero_row] = 0.0
    return table
