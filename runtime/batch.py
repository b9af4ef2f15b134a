"""A decode step over several sessions at once (placeholder: not built yet)."""

from __future__ import annotations


def unbatchable(lm) -> str | None:
    """Why ``lm`` has no batched decode step (None: it has one)."""
    return "the batched decode step is not built yet"


class BatchDecode:  # pragma: no cover - replaced
    def __init__(self, lm, capacity: int):
        raise NotImplementedError
