"""A causal text model whose placeholder tokens take its towers' soft tokens.

The seeds' ``Multimodal``: as transformers' ``masked_scatter`` places them, the j-th of a
token's placeholders in a history takes the j-th soft token of that token's inputs (its
images, in order). ``Placement`` is what a ``runtime.session.Session`` reads to run such a
history: where each prompt chunk starts (an image's rows never split across two chunks
where they attend to each other both ways, Gemma 3's), and each chunk's inputs beside its
ids: the soft rows at their placeholders (``soft``, ``mask``) and, where an image's rows see
each other, the last key each row sees (``reach``). ``Multimodal.place`` runs each tower once
per image (a later turn holding the same image reuses its soft tokens) and, where an image
changed, makes the session forget its caches from that image's first placeholder (the
seeds' ``place``).

Not for: a tower's numbers (``tower``), an image's pixels (``images``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..causal import CausalLM, Version
from ..files import named
from .mrope import rope_positions


@dataclass
class TowerRun:
    """A tower as the text model meets it: ``soft_tokens(raw)`` gives an input's soft
    tokens ``(soft, hidden)`` float32 (the front end and the compiled tower), ``count(raw)``
    how many it gives (an image's are fixed, a sound's follow its length),
    ``bidirectional`` whether one input's rows attend to each other both ways in the text
    model; ``grid(raw)``, where the text model turns its rows by M-RoPE, the (time, height,
    width) grid of an input's soft tokens (``mrope``; None: none)."""

    soft_tokens: Callable[[object], np.ndarray]
    count: Callable[[object], int]
    bidirectional: bool = False
    grid: Callable[[object], tuple[int, int, int]] | None = None
    # The id the text model's embeddings read at a placeholder (None: the placeholder, or 0
    # past the vocabulary): Gemma 4's per-layer inputs read pad_token_id's rows there.
    read_as: int | None = None


@contextlib.contextmanager
def naming(raw):
    """Where ``raw`` (an input as given) is a path, a ValueError raised inside names its file
    before its message, unless the message already does: the front ends see pixels and
    samples, not where they came from (an image's aspect ratio, an empty sound)."""
    try:
        yield
    except ValueError as e:
        if not isinstance(raw, (str, os.PathLike)):
            raise
        name = str(Path(raw).expanduser())
        if name in str(e):
            raise
        raise named(e, name) from None


def runs(where: np.ndarray) -> list[tuple[int, int]]:
    """The runs ``[begin, end)`` of consecutive positions in sorted ``where``."""
    if where.size == 0:
        return []
    cut = np.flatnonzero(np.diff(where) != 1) + 1
    return [(int(a[0]), int(a[-1]) + 1) for a in np.split(where, cut)]


@dataclass
class Placement:
    """Soft rows at a history's placeholder positions: ``positions`` ``(k,)`` (sorted),
    ``rows`` ``(k, hidden)`` float32, ``groups`` the runs ``[begin, end)`` whose rows see each
    other (empty where none do), ``digests`` each input's (first placeholder position,
    digest) in order: what ``Multimodal.place`` compares to find the first stale one."""

    positions: np.ndarray
    rows: np.ndarray
    groups: list[tuple[int, int]] = field(default_factory=list)
    digests: list[tuple[int, str]] = field(default_factory=list)
    reach: bool = False
    _version: Version | None = None
    # M-RoPE (``mrope``): each row's (time, height, width) positions over the history the
    # placement was made for, and the delta a row past it adds to its index; None: RoPE by
    # the row's index.
    rope: np.ndarray | None = None
    delta: int = 0

    def starts(self, tokens: np.ndarray, C: int) -> list[int]:
        """Each prompt chunk's first position for ``tokens`` from position 0: every ``C``
        positions, but a chunk ends before a group it cannot hold whole.

        Raises:
            ValueError: a group longer than a chunk (its rows could not see each other).
        """
        n, s, out = len(tokens), 0, []
        for a, b in self.groups:
            if b - a > C:
                raise ValueError(f"an image's {b - a} soft tokens (positions {a}..{b - 1}) do "
                                 f"not fit a prompt chunk of {C} ids: give a prefill_chunk "
                                 f"of at least {b - a}")
        while s < n:
            end = min(s + C, n)
            for a, b in self.groups:
                if a < end < b:
                    end = a if a > s else end
            out.append(s)
            s = end
        return out

    def inputs(self, tokens: np.ndarray, s: int, rows: int, C: int) -> dict | None:
        """A chunk's inputs beside its ids, for positions ``s .. s + rows - 1`` of a chunk
        of ``C``: ``soft`` ``(C, hidden)``, ``mask`` ``(C,)`` and, where rows see each other,
        ``reach`` ``(C,)``; None where the chunk holds no placeholder."""
        lo, hi = np.searchsorted(self.positions, [s, s + rows])
        if lo == hi:
            return None if self.rope is None else {"positions": self.rope_rows(s, C)}
        soft = np.zeros((C, self.rows.shape[1]), np.float32)
        mask = np.zeros(C, np.int32)
        at = self.positions[lo:hi] - s
        soft[at], mask[at] = self.rows[lo:hi], 1
        out = {"soft": soft, "mask": mask}
        if self.reach:
            reach = np.arange(s, s + C, dtype=np.int32)
            for a, b in self.groups:
                if a < s + rows and b > s:
                    reach[max(a, s) - s: min(b, s + rows) - s] = b - 1
            out["reach"] = reach
        if self.rope is not None:
            out["positions"] = self.rope_rows(s, C)
        return out

    def rope_rows(self, s: int, C: int) -> np.ndarray:
        """M-RoPE positions ``(C, 3)`` int32 of rows ``s .. s + C - 1``: the history's, and
        past it each row's index plus ``delta``."""
        n = len(self.rope)
        idx = np.arange(s, s + C)
        out = np.repeat((idx + self.delta)[:, None], 3, axis=1).astype(np.int32)
        inside = idx < n
        out[inside] = self.rope[idx[inside]]
        return out

    def decode_inputs(self, position: int) -> dict | None:
        """A decode step's inputs beside its token at ``position``: M-RoPE's positions
        (None where the model turns rows by their index)."""
        return None if self.rope is None else {"positions": self.rope_rows(position, 1)}

    def version(self, lm: CausalLM) -> Version:
        """The prompt chunk that takes these inputs, compiled once per model."""
        key = ("placed", self.reach)
        versions = lm._versions
        if key not in versions:
            versions[key] = Version(lm, True, False, soft=True, reach=self.reach)
        return versions[key]


def digest(raw) -> str:
    """A digest of an input as given (its bytes or its file's), so an input met again is
    known without running its tower."""
    h = hashlib.sha256()
    if isinstance(raw, np.ndarray):
        h.update(repr((raw.shape, raw.dtype.str)).encode())
        h.update(np.ascontiguousarray(raw).tobytes())
    elif isinstance(raw, (str, bytes)) or hasattr(raw, "__fspath__"):
        h.update(Path(raw).expanduser().read_bytes())
    else:  # a PIL image
        h.update(repr((raw.mode, raw.size)).encode())
        h.update(raw.tobytes())
    return h.hexdigest()


class Multimodal:
    """``lm`` (a CausalLM) and its towers by placeholder token (``TowerRun``).

    ``place(session, tokens, inputs)`` readies ``session`` (a ``runtime.session.Session``
    over ``lm``) for ``tokens``: ``inputs`` maps each placeholder token to its inputs in
    order (image paths, PIL images or arrays). Each input's soft tokens are computed once
    and kept (``keep`` inputs, the least recently used dropped first).

    Raises (``place``, before anything changes):
        ValueError: a token's placeholders are not its inputs' soft tokens in number.
    """

    def __init__(self, lm: CausalLM, towers: dict[int, TowerRun], keep: int = 16):
        self.lm, self.towers, self.keep = lm, towers, keep
        # Whether any layer lets an input's rows see each other (an attention's reach): where
        # none does (Gemma 4 without use_bidirectional_attention vision), a bidirectional
        # tower's rows are placed as any others' (a chunk may split them).
        layers = getattr(lm.config, "layers", ())
        self._reaches = any(getattr(getattr(lo, "attention", None), "reach", True)
                            for lo in layers) if layers else True
        self._soft: OrderedDict[str, np.ndarray] = OrderedDict()
        # The towers' compiled versions (one arena each) and the kept soft tokens, shared by
        # every thread's calls: one input's tower run at a time.
        self._lock = threading.RLock()

    def lookup(self, tokens: Sequence[int]) -> list[int]:
        """``tokens`` as the text model's embedding reads them: a placeholder outside its
        vocabulary (Gemma 3's ``<image_soft_token>`` beside a 262144-row table) read as id 0,
        as Gemma3Model's ``llm_input_ids[special_image_mask] = 0`` (its row is replaced by a
        soft token anyway); a tower's ``read_as`` where it has one (Gemma4Model's
        ``pad_token_id``, which its per-layer inputs read); the others as they are."""
        V = self.lm.config.vocab_size
        read = {t: run.read_as for t, run in self.towers.items() if run.read_as is not None}
        read |= {t: 0 for t in self.towers if t >= V and t not in read}
        if not read:
            return list(tokens)
        return [read.get(t, t) for t in tokens]

    def soft_tokens(self, token: int, raw) -> tuple[np.ndarray, str]:
        """The soft tokens of one input of placeholder ``token``'s tower, and its digest."""
        key = f"{token}:{digest(raw)}"
        with self._lock:
            if key in self._soft:
                self._soft.move_to_end(key)
                return self._soft[key], key
            soft = np.array(self.towers[token].soft_tokens(raw))  # the caller's, not an arena's
            self._soft[key] = soft
            while len(self._soft) > self.keep:
                self._soft.popitem(last=False)
            return soft, key

    def placement(self, tokens: Sequence[int], inputs: dict[int, list]) -> Placement:
        """Where every input's soft tokens sit in ``tokens`` (module docstring)."""
        tokens = np.asarray(tokens)
        positions, rows, groups, digests, reach = [], [], [], [], False
        grids = []  # M-RoPE: each input's (first placeholder, grid)
        for token, tower in self.towers.items():
            where = np.flatnonzero(tokens == token)
            given = [self.soft_tokens(token, raw) for raw in inputs.get(token, [])]
            raw_of = {key: raw for (_, key), raw in zip(given, inputs.get(token, []))}
            total = sum(len(soft) for soft, _ in given)
            if where.size != total:
                raise ValueError(f"{where.size} placeholders {token} for {len(given)} "
                                 f"input{'s' * (len(given) != 1)} of {total} soft tokens")
            at0 = 0
            for soft, key in given:
                if not len(soft):  # a sound too short for a soft token
                    continue
                at = where[at0: at0 + len(soft)]
                at0 += len(soft)
                positions.append(at)
                rows.append(soft)
                digests.append((int(at[0]), key))
                if tower.grid is not None and self.lm.sections:
                    grids.append((int(at[0]), tower.grid(raw_of[key])))
                if tower.bidirectional and self._reaches:
                    groups += runs(at)
                    reach = True
        if not positions:
            return Placement(np.zeros(0, np.int64), np.zeros((0, self.lm.config.hidden_size),
                                                            np.float32))
        positions = np.concatenate(positions)
        order = np.argsort(positions, kind="stable")
        rope, delta = rope_positions(len(tokens), grids) if self.lm.sections else (None, 0)
        return Placement(positions[order], np.concatenate(rows)[order], sorted(groups),
                         sorted(digests), reach, rope=rope, delta=delta)

    def place(self, session, tokens: Sequence[int], inputs: dict[int, list]) -> None:
        """Ready ``session`` for ``tokens`` with ``inputs`` at their placeholders: its
        placement set, and its caches forgotten from the first input that differs from
        what it held (the seeds' ``Multimodal.place``)."""
        self.adopt(session, self.placement(tokens, inputs))

    def adopt(self, session, new: Placement) -> None:
        """``place``'s second half: ``session`` readied for the placement ``new`` (made by
        ``placement``, its towers run), its caches forgotten from the first input that
        differs from what it held. A stream does it once its session is claimed
        (``runtime.generation.Stream.prepare``), so a placement never lands on a session
        another generation is running on."""
        old = session.placement
        if old is not None:
            stale = [a for (a, x), (b, y) in zip(new.digests, old.digests) if a != b or x != y]
            extra = [a for a, _ in new.digests[len(old.digests):]] + \
                [a for a, _ in old.digests[len(new.digests):]]
            first = min(stale + extra, default=None)
            if first is not None:
                session.forget(first)
        elif new.digests:
            session.forget(new.digests[0][0])
        session.placement = new if new.digests else None
