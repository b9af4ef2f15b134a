"""Snapshots of a model's recurrent states, the positions a run may restart from.

A KV cache holds every position it wrote, so a run may start anywhere it holds; a recurrent
state (``State(recurrent=True)``: a convolution's last rows, an SSM's or a delta rule's
matrix) holds the sequence up to one position only, the last it ran. ``Snapshots`` keeps
copies of every recurrent state of a model at the prompt-chunk boundaries its prompt calls
end on (the last ``keep`` of them), and at the end of the last prompt (taken when a decode
step is about to move the states past it): the seeds' ``Checkpoints``, whose slot per
boundary becomes a ring of ``keep`` slots, so memory stays ``keep + 1`` copies of the states
however long the context.

Two sets of states are tracked apart (``kind``): the compiled versions' (``compiled``) and
the float64 ``reference()``'s (``reference``), which hold their own copies of every state.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

KINDS = ("compiled", "reference")


class StateError(ValueError):
    """A call asked the recurrent states for a position they do not hold."""


class Snapshots:
    """The recurrent states' snapshots of one model.

    Args:
        arrays: for a kind, the arrays its recurrent states are now (a state's array may be
            replaced; asked at each use).
        chunk: the prompt chunk's capacity: boundaries are its multiples.
        keep: how many of the last boundaries are kept (0: none, only the prompt's end).
    """

    def __init__(self, arrays: Callable[[str], list[np.ndarray]], chunk: int, keep: int):
        if keep < 0:
            raise ValueError(f"{keep} snapshots kept: 0 or more")
        self.arrays, self.chunk, self.keep = arrays, chunk, keep
        # Per kind: the position the live states hold (after how many tokens), each slot's
        # position and copies (a boundary's, newest last), and the prompt's end.
        self.at = {k: 0 for k in KINDS}
        self.slots: dict[str, list[tuple[int, list[np.ndarray]]]] = {k: [] for k in KINDS}
        self.end: dict[str, tuple[int, list[np.ndarray]] | None] = {k: None for k in KINDS}
        self._prompted = {k: False for k in KINDS}  # the last call was a prompt chunk's

    def before(self, kind: str, start: int, prompt: bool) -> None:
        """Refuse a call from ``start`` the states cannot run (before anything runs): a
        sequence's first (``start`` 0) always can, else only the position they hold. A decode
        step about to move the states past a prompt's end first keeps that end.

        Raises:
            StateError: ``start`` is neither 0 nor the position the states hold.
        """
        if start != 0 and start != self.at[kind]:
            raise StateError(
                f"the recurrent states hold position {self.at[kind]}, and a call from {start} "
                f"needs them at {start}: restore a snapshot there first (held: "
                f"{', '.join(map(str, self.positions(kind)))})")
        if not prompt and self._prompted[kind] and start % self.chunk:
            self.end[kind] = self._copy(kind, start, self.end[kind])

    def after(self, kind: str, start: int, rows: int, prompt: bool) -> None:
        """Record a call of ``rows`` from ``start`` that ran: the states now hold
        ``start + rows``; a prompt call ending on a boundary is snapshotted there."""
        if start == 0:
            self._forget(kind, 0)
        end = start + rows
        self.at[kind], self._prompted[kind] = end, prompt
        if prompt and end % self.chunk == 0 and self.keep:
            slots = self.slots[kind]
            reuse = slots.pop(0)[1] if len(slots) >= self.keep else None
            slots.append(self._copy(kind, end, (end, reuse) if reuse else None))

    def positions(self, kind: str) -> list[int]:
        """Every position a run may start from: 0, the snapshots', and the live states'."""
        held = {0, self.at[kind], *(p for p, _ in self.slots[kind])}
        if self.end[kind] is not None:
            held.add(self.end[kind][0])
        return sorted(held)

    def restart(self, kind: str, wanted: int, every: int = 1) -> int:
        """The latest position at or before ``wanted`` a run may start from, among the
        multiples of ``every`` (0 always is one)."""
        return max(p for p in self.positions(kind) if p <= wanted and p % every == 0)

    def restore(self, kind: str, position: int) -> None:
        """Make the live states those after ``position`` (one of ``positions``), and drop
        the snapshots past it (a run from there writes them anew).

        Raises:
            StateError: no snapshot of ``position``.
        """
        if position not in self.positions(kind):
            raise StateError(f"no snapshot of the recurrent states at {position} (held: "
                             f"{', '.join(map(str, self.positions(kind)))})")
        if position not in (0, self.at[kind]):
            slot = dict(self.slots[kind])
            copies = slot[position] if position in slot else self.end[kind][1]
            for live, copy in zip(self.arrays(kind), copies):
                np.copyto(live, copy)
        self.at[kind] = position
        self._prompted[kind] = False
        self._forget(kind, position)

    def place(self, kind: str, position: int) -> None:
        """Declare the live states those after ``position``, as set by hand (a check filling
        a deep context without running it); every snapshot is dropped."""
        self._forget(kind, 0)
        self.at[kind], self._prompted[kind] = position, False

    def nbytes(self) -> int:
        """Bytes the snapshots hold now."""
        return sum(a.nbytes for k in KINDS for _, copies in
                   self.slots[k] + ([self.end[k]] if self.end[k] else []) for a in copies)

    def _forget(self, kind: str, after: int) -> None:
        self.slots[kind] = [(p, c) for p, c in self.slots[kind] if p <= after]
        if self.end[kind] is not None and self.end[kind][0] > after:
            self.end[kind] = None

    def _copy(self, kind: str, position: int, into: tuple | None) -> tuple[int, list]:
        """The live states copied (into ``into``'s arrays where given, else new ones)."""
        live = self.arrays(kind)
        if into is None or len(into[1]) != len(live):
            return position, [np.array(a) for a in live]
        for dst, src in zip(into[1], live):
            np.copyto(dst, src)
        return position, into[1]
