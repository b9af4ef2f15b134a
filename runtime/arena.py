"""Placing a plan's intermediates in one float32 buffer by lifetime.

Two values may share bytes when no step needs both; each is placed at the lowest offset
free over its whole lifetime, largest first (the greedy-by-size rule of TFLite's arena
planner).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Span:
    """A buffer of ``size`` float32 elements live from step ``first`` to ``last``, inclusive."""

    key: object
    size: int
    first: int
    last: int
    offset: int = -1


ALIGN = 16  # elements: 64 bytes, a cache line, so no two buffers share one


def place(spans: list[Span]) -> int:
    """Set each span's ``offset``; return the arena's size in elements."""
    placed: list[Span] = []
    total = 0
    for s in sorted(spans, key=lambda s: (-s.size, s.first)):
        live = sorted((p for p in placed if p.first <= s.last and s.first <= p.last),
                      key=lambda p: p.offset)
        offset = 0
        for p in live:
            if offset + s.size <= p.offset:
                break
            offset = max(offset, p.offset + p.size)
        s.offset = offset
        placed.append(s)
        total = max(total, offset + s.size)
    return total


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN
