"""Reading a causal spec's position-and-segment options into their runtime options: the
layers' relative position bias (``layer.attention.relative_bias``, T5-style buckets over the
cache's positions, with CPM-Ant's segment pairs), the ids prepended to every sequence
(``embedding.prefix``), the segment table (``embedding.segments``) and the padding id a
history may not hold (``embedding.padding_id``), each error at the option's own line.

Not for: the layer's other options (``layer``), the whole expansion (``interpreter``); an
encoder's relative bias (``encoder``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from iron_spec.runtime.values import MAX_INT

from ..config import Resolved, evaluate_option, whole_option
from ..loader import Spec


@dataclass(frozen=True)
class PositionParts:
    """What the options read: ``relative_rows`` (0: no table) and ``relative`` (the
    attention operator's ``(buckets, max_distance, bidirectional, segments)``; None: none),
    ``prefix`` ids, ``segments`` ``(rows, first, rest)`` (None: none), ``padding_id``."""

    relative_rows: int = 0
    relative: tuple | None = None
    prefix: tuple[int, ...] = ()
    segments: tuple[int, int, int] | None = None
    padding_id: int | None = None


def _value(spec: Spec, r: Resolved, path: tuple, default: Any) -> Any:
    return evaluate_option(spec, path, spec.get(*path, default=default), r)


def _count(spec: Spec, r: Resolved, path: tuple, default: Any, least: int = 0) -> int:
    return whole_option(spec, r, path, spec.get(*path, default=default), least, MAX_INT)


def _bool(spec: Spec, r: Resolved, path: tuple, default: bool) -> bool:
    v = _value(spec, r, path, default)
    if not isinstance(v, bool):
        raise spec.error(path, f"{'.'.join(map(str, path))} is {v!r}, not true or false")
    return v


def position_parts(spec: Spec, r: Resolved, vocab_size: int) -> PositionParts:
    """The options above, over ``r``'s fields; ``vocab_size``: the embedding's rows, which
    the prefix's ids and the padding id lie within.

    Raises:
        SpecError: at the option's line, a count that is no whole number, a prefix or
            padding id past the embedding, a segment row past the segment table, too few
            buckets for the table (or below 4 bidirectional, 2 not), a max_distance not past
            the exact buckets, or segment_pairs without embedding.segments.
    """
    prefix = _prefix(spec, r, vocab_size)
    segments = _segments(spec, r)
    pad = None
    if spec.get("embedding", "padding_id") is not None:
        pad = _count(spec, r, ("embedding", "padding_id"), None)
        if pad >= vocab_size:
            raise spec.error(("embedding", "padding_id"), f"padding id {pad} is past the "
                             f"embedding's {vocab_size} rows")
    rows, relative = _relative(spec, r, len(prefix), segments)
    return PositionParts(rows, relative, prefix, segments, pad)


def _prefix(spec: Spec, r: Resolved, vocab_size: int) -> tuple[int, ...]:
    """``embedding.prefix``: ``length`` ids from ``first`` (CpmAntModel's ``prompt_length``
    ids from ``vocab_size + 2 * prompt_length``); none where absent or of length 0."""
    p = ("embedding", "prefix")
    if spec.get(*p) is None:
        return ()
    length = _count(spec, r, p + ("length",), None)
    first = _count(spec, r, p + ("first",), None)
    if first + length > vocab_size:
        raise spec.error(p + ("first",), f"prefix ids {first}..{first + length - 1} are past "
                                         f"the embedding's {vocab_size} rows")
    return tuple(range(first, first + length))


def _segments(spec: Spec, r: Resolved) -> tuple[int, int, int] | None:
    """``embedding.segments``: the table's ``rows``, the prefix's row and the text's."""
    p = ("embedding", "segments")
    if spec.get(*p) is None:
        return None
    rows = _count(spec, r, p + ("rows",), None, least=1)
    picked = []
    for name in ("prefix", "tokens"):
        row = _count(spec, r, p + (name,), 0)
        if row >= rows:
            raise spec.error(p + (name,), f"segment row {row} is past the segment table's "
                                          f"{rows} rows")
        picked.append(row)
    return rows, picked[0], picked[1]


def _relative(spec: Spec, r: Resolved, prefix: int, segments) -> tuple[int, tuple | None]:
    """``layer.attention.relative_bias``: the table's rows and the operator's options."""
    p = ("layer", "attention", "relative_bias")
    if spec.get(*p) is None:
        return 0, None
    rows = _count(spec, r, p + ("rows",), None, least=1)
    buckets = _count(spec, r, p + ("buckets",), 32)
    distance = _count(spec, r, p + ("max_distance",), 128)
    both = _bool(spec, r, p + ("bidirectional",), True)
    least = 4 if both else 2
    pairs = _bool(spec, r, p + ("segment_pairs",), False)
    if pairs and segments is None:
        raise spec.error(p + ("segment_pairs",), "segment_pairs reads the pair of segments "
                                                 "each query and key lie in: it needs "
                                                 "embedding.segments")
    needed = buckets + (segments[0] ** 2 if pairs else 0)
    if buckets < least or needed > rows:
        raise spec.error(p + ("buckets",), f"{buckets} relative buckets"
                         f"{f' and {segments[0]} ** 2 segment pairs' if pairs else ''}: at "
                         f"least {least} buckets, and no more rows than the table's {rows}")
    exact = (buckets // 2 if both else buckets) // 2
    if distance <= exact:
        raise spec.error(p + ("max_distance",), f"max_distance {distance} is not past the "
                                                f"{exact} exact buckets")
    seg = (segments[0], prefix, segments[1], segments[2]) if pairs else None
    return rows, (buckets, distance, both, seg)
