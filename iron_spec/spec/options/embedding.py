"""Reading a causal spec's ``embedding`` position options: a learned position table's rows
and offset, and the sinusoidal table computed in its place; each error at the option's own
line.

Not for: the ids, segments and relative bias (``positions``).
"""

from __future__ import annotations

from iron_spec.runtime.blocks.embedding import Sinusoidal

from ..config import Resolved
from ..loader import Spec
from .reading import _flag_option, _option, _positive, _whole


def _positions(spec: Spec, r: Resolved, L: int) -> tuple[int, int]:
    """``embedding.positions`` (rows of a learned position table; 0: none) and
    ``embedding.position_offset`` (the row serving position 0).

    Raises:
        SpecError: a count or offset that is not a whole number >= 0, or a context of ``L``
            positions the table does not hold from its offset.
    """
    e = ("embedding",)
    rows = _whole(spec, e + ("positions",), _option(spec, r, e + ("positions",), 0)) or 0
    offset = _whole(spec, e + ("position_offset",), _option(spec, r, e + ("position_offset",), 0)) or 0
    for name, value in (("positions", rows), ("position_offset", offset)):
        if value < 0:
            raise spec.error(e + (name,), f"embedding.{name} is {value}, not a whole number >= 0")
    if rows and L > rows - offset:
        raise spec.error(e + ("positions",), f"a context of {L} positions does not fit the "
                         f"position table's {rows} rows from offset {offset} (at most "
                         f"{max(rows - offset, 0)})")
    return rows, offset


def _sinusoidal(spec: Spec, r: Resolved, rows: int, width: int) -> Sinusoidal | None:
    """``embedding.sinusoidal``: the position table of ``embedding.positions`` rows computed
    (``runtime.blocks.embedding.Sinusoidal``), None where the spec has none or its ``enabled`` is
    false (a learned table).

    Raises:
        SpecError: at the option's own line, a sinusoidal table without positions, of odd
            width, a theta or denominator not above 0, a zero_row outside the rows, or an
            ``enabled`` or ``interleaved`` that is not a boolean.
    """
    p = ("embedding", "sinusoidal")
    if spec.get(*p) is None or not _flag_option(spec, r, p + ("enabled",), True):
        return None
    if not rows:
        raise spec.error(p, "a sinusoidal position table needs its rows: embedding.positions")
    if width % 2:
        raise spec.error(p, f"a sinusoidal position table of odd width {width} is not built "
                            "(an even hidden_size)")
    theta = _positive(spec, p + ("theta",), _option(spec, r, p + ("theta",), 10000.0))
    denominator = _option(spec, r, p + ("denominator",), None)
    if denominator is not None:
        denominator = _positive(spec, p + ("denominator",), denominator)
    zero_row = _whole(spec, p + ("zero_row",), _option(spec, r, p + ("zero_row",), None))
    if zero_row is not None and not 0 <= zero_row < rows:
        raise spec.error(p + ("zero_row",), f"zero_row {zero_row} is outside the position "
                                            f"table's rows 0..{rows - 1}")
    return Sinusoidal(theta, denominator, zero_row,
                      _flag_option(spec, r, p + ("interleaved",), False))
