"""Checkpoint renames: tables of dotted-name patterns that map a checkpoint's tensor names
onto the model's, composed in order, and their inverse (for weights drawn here and written
as a checkpoint another library loads).

A pattern is a run of whole dotted parts; a part is a literal (``c_attn``), ``{layer}`` (a
layer index: digits), ``{expert}`` (an expert's index in a mixture of experts: digits) or
``*`` (any one part). A rename ``old -> new`` replaces the leftmost
run of a name that ``old`` matches with ``new``, the holes of ``new`` filled with what
``old``'s caught (``{layer}`` and ``{expert}`` with the indices, each ``*`` with the part the same-numbered
``*`` caught); ``new`` empty drops the run. A table applies every rename in turn, each to
the name the one before gave, so ``transformer.h -> model.layers`` then ``attn.c_attn ->
self_attn.qkv_proj`` maps ``transformer.h.7.attn.c_attn.weight`` at any depth, as
llama.cpp's ``tensor_mapping.py`` tables map ``{bid}``.

Not for: reading tensors (``checkpoint``).
"""

from __future__ import annotations

import functools
from typing import Iterable, Mapping

LAYER = "{layer}"
EXPERT = "{expert}"
ANY = "*"
INDICES = (LAYER, EXPERT)  # holes that catch digits, each at most once in a pattern


class RenameError(ValueError):
    """A pattern or rename that is not well formed, or a name the table cannot undo."""


class Pattern:
    """A dotted-name pattern (module docstring).

    Raises:
        RenameError: an empty part (``a..b``), a part holding ``{``, ``}`` or ``*`` beside
            other text, or ``{layer}`` or ``{expert}`` more than once.
    """

    def __init__(self, text: str):
        self.text = text
        self.parts = text.split(".") if text else []
        for part in self.parts:
            if part == "" or (part not in (*INDICES, ANY) and any(c in part for c in "{}*")):
                raise RenameError(f"{text!r} is no run of whole dotted parts (a part is a name, "
                                  f"{LAYER}, {EXPERT} or {ANY}: a.{LAYER}.{ANY}.b)")
        for index in INDICES:
            if self.parts.count(index) > 1:
                raise RenameError(f"{text!r} holds {index} more than once")
        self.holes = [p for p in self.parts if p in (*INDICES, ANY)]

    def _part(self, pattern: str, part: str) -> bool:
        if pattern in INDICES:
            return part.isdigit()
        return pattern == ANY or pattern == part

    def at(self, parts: list[str], i: int) -> list[str] | None:
        """What the holes catch where the pattern matches ``parts[i:]``'s first parts, in
        order (``[]`` for a literal match), else None."""
        k = len(self.parts)
        if i + k > len(parts) or not all(map(self._part, self.parts, parts[i:i + k])):
            return None
        return [s for p, s in zip(self.parts, parts[i:i + k]) if p in (*INDICES, ANY)]

    def find(self, parts: list[str]) -> Iterable[tuple[int, list[str]]]:
        """Every place ``(i, caught)`` the pattern matches a run of ``parts``, leftmost first."""
        for i in range(len(parts) - len(self.parts) + 1):
            caught = self.at(parts, i)
            if caught is not None:
                yield i, caught

    def matches(self, name: str) -> bool:
        """Whether the pattern matches the whole of ``name``."""
        parts = name.split(".")
        return len(parts) == len(self.parts) and self.at(parts, 0) is not None

    def fill(self, caught: list[str], holes: list[str]) -> list[str]:
        """The parts with the holes filled: ``caught`` lists what ``holes`` (another
        pattern's, of the same kinds) caught."""
        index = {h: c for h, c in zip(holes, caught) if h in INDICES}
        stars = iter([c for h, c in zip(holes, caught) if h == ANY])
        return [index[p] if p in INDICES else next(stars) if p == ANY else p for p in self.parts]


class Rename:
    """``old -> new`` (module docstring).

    Raises:
        RenameError: a malformed pattern; ``old`` empty; ``new`` without ``old``'s holes
            (as many ``*``, ``{layer}`` and ``{expert}`` in both or neither), so the rename
            would not be
            undone.
    """

    def __init__(self, old: str, new: str):
        try:
            self.old, self.new = Pattern(old), Pattern(new)
        except RenameError as e:
            raise RenameError(f"rename {old!r} -> {new!r}: {e}") from None
        if not old:
            raise RenameError("a rename of the empty run renames nothing")
        if sorted(self.old.holes) != sorted(self.new.holes):
            raise RenameError(f"rename {old!r} -> {new!r}: both sides hold the same holes (as "
                              f"many {ANY}, {LAYER} and {EXPERT} in both or neither), so each "
                              "name maps one way and back")

    def apply(self, parts: list[str]) -> list[str] | None:
        """``parts`` with the leftmost run ``old`` matches replaced, else None."""
        for i, caught in self.old.find(parts):
            return parts[:i] + self.new.fill(caught, self.old.holes) + parts[i + len(self.old.parts):]
        return None

    def undo(self, parts: list[str]) -> Iterable[list[str]]:
        """Every name this rename could have turned into ``parts``: ``new``'s run at each
        place it matches, put back as ``old``. A dropped run (``new`` empty) is put back
        in front: dropped runs are prefixes (``language_model``), and anywhere else would
        be a guess."""
        if not self.new.parts:
            yield self.old.parts + parts
            return
        for i, caught in self.new.find(parts):
            yield parts[:i] + self.old.fill(caught, self.new.holes) + parts[i + len(self.new.parts):]


@functools.lru_cache(maxsize=64)
def _compiled(items: tuple[tuple[str, str], ...]) -> tuple[Rename, ...]:
    return tuple(Rename(old, new) for old, new in items)


def compile_table(table: Mapping[str, str]) -> tuple[Rename, ...]:
    """The table's renames, in order (RenameError at the first malformed one)."""
    return _compiled(tuple(table.items()))


def renamed(name: str, table: Mapping[str, str]) -> str:
    """``name`` with every rename of ``table`` that matches applied, in order, each to the
    name the previous one gave."""
    return ".".join(_forward(name.split("."), compile_table(table))[0])


def _forward(parts: list[str], renames: tuple[Rename, ...]) -> tuple[list[str], int]:
    """The renamed parts, and how many renames applied."""
    applied = 0
    for r in renames:
        out = r.apply(parts)
        if out is not None:
            parts, applied = out, applied + 1
    return parts, applied


def sources(name: str, table: Mapping[str, str]) -> list[tuple[str, int]]:
    """Every checkpoint name the table renames to ``name`` (found by undoing its renames
    last to first, each undone or not, and kept where renaming gives ``name`` back), with
    how many renames it goes through; most renames first, then by name."""
    renames = compile_table(table)
    found = {tuple(name.split("."))}
    for r in reversed(renames):
        found |= {tuple(p) for parts in found for p in r.undo(list(parts))}
    target = name.split(".")
    out = {}
    for parts in found:
        forward, applied = _forward(list(parts), renames)
        if forward == target:
            out[".".join(parts)] = applied
    return sorted(out.items(), key=lambda item: (-item[1], item[0]))


def source(name: str, table: Mapping[str, str]) -> str:
    """The checkpoint name a model name ``name`` is read from: of the names the table
    renames to it (``sources``), the one through the most renames, a checkpoint's own
    vocabulary being the one the table translates from.

    Raises:
        RenameError: two names tie for that, so which one a checkpoint holds is a guess.
    """
    found = sources(name, table)
    if not found:
        raise RenameError(f"no checkpoint name renames to {name}: the renames take every "
                          "name that would give it elsewhere")
    if len(found) > 1 and found[0][1] == found[1][1] and found[0][1] > 0:
        raise RenameError(f"the renames give {name} from both {found[0][0]} and {found[1][0]}: "
                          "which one a checkpoint holds is ambiguous")
    return found[0][0]


def matching(name: str, patterns: Iterable[str]) -> bool:
    """Whether any of ``patterns`` (whole-name patterns, module docstring) matches ``name``."""
    return any(Pattern(p).matches(name) for p in patterns)
