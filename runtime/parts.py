"""A part of a checkpoint read as a checkpoint of its own: the seeds' ``Checkpoint.subtree``.

A published checkpoint often holds the model a spec describes inside a bigger one: the text
model of a ``*ForConditionalGeneration`` under ``model.language_model.`` (or, as
transformers 4 saved it, ``language_model.model.``) beside ``lm_head`` and the towers'
tensors; the encoder of a ``*ForMaskedLM`` under ``bert.`` beside its head's. A
``CheckpointPart`` moves the part's tensors to the names the model reads (``moves``: each a
run of whole dotted parts at the start of a name, to another, ``""`` the model's root), keeps
every other tensor by its own name, and leaves out the tensors under ``unused`` prefixes (the
towers'), listing them (``left``) so a load reports them. Reading is the whole checkpoint's:
no tensor is copied or read by the view.

transformers' legacy names, which it renames at every load (``LEGACY``: BERT's TensorFlow
``LayerNorm.gamma``/``beta``), are read as it reads them.

Not for: a rename inside the model's names (``renames``, the spec's ``checkpoint.renames``),
reading files (``checkpoint``).
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from .checkpoint import CheckpointError, TensorInfo
from .renames import Pattern, RenameError, renamed

#: transformers' ``legacy`` conversion (conversion_mapping.py), applied to every checkpoint
#: it loads: TensorFlow BERT's norm names.
LEGACY = {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}


def _prefix(text: str) -> Pattern:
    """``text`` as a pattern of whole dotted parts (``*``, ``{layer}`` allowed)."""
    return Pattern(text)


def under(name: str, prefix: Pattern) -> list[str] | None:
    """The parts of ``name`` after ``prefix`` where the name begins with it (its whole dotted
    parts), else None; a name equal to the prefix has none after it."""
    parts = name.split(".")
    if len(parts) < len(prefix.parts) or prefix.at(parts, 0) is None:
        return None
    return parts[len(prefix.parts):]


def _longest_first(moves: Mapping[str, str], side: int) -> list[tuple[str, str]]:
    """``moves``' items, the longest prefix on ``side`` (0 the checkpoint's, 1 the model's)
    first, else in their order: ``cls.predictions.bias`` before ``""``."""
    return sorted(moves.items(), key=lambda kv: -len([p for p in kv[side].split(".") if p]))


def moved(name: str, moves: Mapping[str, str]) -> str | None:
    """``name`` under the longest of ``moves``' checkpoint prefixes that begins it, that
    prefix replaced by its model prefix; None where none begins it."""
    for old, new in _longest_first(moves, 0):
        rest = under(name, _prefix(old))
        if rest is not None:
            return ".".join([p for p in new.split(".") if p] + rest)
    return None


def stored(name: str, moves: Mapping[str, str]) -> str:
    """The checkpoint name a model name ``name`` is read from (``moved`` undone): by the
    longest of ``moves``' model prefixes that begins it (``""`` begins every name), the first
    declared of equals (the layout drawn weights are written in), else ``name``."""
    parts = name.split(".")
    for old, new in _longest_first(moves, 1):
        head = [p for p in new.split(".") if p]
        if parts[:len(head)] == head and not any(c in old for c in "{}*"):
            return ".".join(old.split(".") + parts[len(head):])
    return name


def check_prefixes(moves: Mapping[str, str], unused: Iterable[str]) -> None:
    """Raises RenameError naming the first move or unused prefix that is no run of whole
    dotted parts (``renames.Pattern``), or a move whose model prefix holds a hole."""
    for old, new in moves.items():
        _prefix(old)
        if new and ("{" in new or "*" in new):
            raise RenameError(f"{new!r}: a part's model prefix is a plain dotted name")
        if new:
            _prefix(new)
    for text in unused:
        _prefix(text)


class CheckpointPart:
    """``whole``'s tensors as the part's model reads them (module docstring).

    Attributes: ``tensors`` (name the model reads -> ``TensorInfo``), ``left`` (the whole
    checkpoint's tensors under an ``unused`` prefix, by their own names), ``whole`` (the
    checkpoint read), ``path`` (its file).

    Raises:
        CheckpointError: two of ``whole``'s tensors read under one name (naming both and
            the moves that gave it), or no tensor of the part at all (naming the moves).
    """

    def __init__(self, whole, moves: Mapping[str, str], unused: Iterable[str] = ()):
        self.whole, self.path = whole, whole.path
        self.moves = dict(moves)
        prefixes = [_prefix(p) for p in unused]
        self.tensors: dict[str, TensorInfo] = {}
        self.left: list[str] = []
        self._source: dict[str, str] = {}
        inside = 0
        for name, info in whole.tensors.items():
            if any(under(name, p) is not None for p in prefixes):
                self.left.append(name)
                continue
            legacy = renamed(name, LEGACY)  # as transformers reads the file's own names
            to = moved(legacy, self.moves)
            inside += to is not None
            to = legacy if to is None else to
            if to in self._source:
                raise CheckpointError(f"{whole.path}: tensors {self._source[to]} and {name} are "
                                      f"both read as {to} (the part's tensors: "
                                      f"{_said(self.moves)})")
            self._source[to] = name
            self.tensors[to] = info
        if self.moves and not inside:
            raise CheckpointError(f"{whole.path}: no tensor is under the part's prefixes "
                                  f"({', '.join(self.moves)}): not this kind of checkpoint?")

    mapped = True  # its tensors are the whole file's pages (``checkpoint._fill``)

    def source(self, name: str) -> str:
        """The whole checkpoint's name of tensor ``name``."""
        return self._source[name]

    def raw(self, name: str) -> np.ndarray:
        return self.whole.raw(self._source[name])

    def read(self, name: str) -> np.ndarray:
        return self.whole.read(self._source[name])

    def stored(self, name: str):
        """Tensor ``name`` as the whole checkpoint holds it (``Checkpoint.stored``: a held
        form, a view of the file), or None where it is read into float32 instead."""
        return self.whole.stored(self._source[name])

    def stored_form(self, name: str) -> str | None:
        """``stored(name)``'s form from the header alone (``Checkpoint.stored_form``)."""
        return self.whole.stored_form(self._source[name])

    def release(self, name: str, upto: int | None = None) -> None:
        self.whole.release(self._source[name], upto)

    def close(self) -> None:
        self.whole.close()

    @property
    def nbytes(self) -> int:
        return sum(t.end - t.begin for t in self.tensors.values())


def _said(moves: Mapping[str, str]) -> str:
    return ", ".join(f"{old} -> {new or '(the root)'}" for old, new in moves.items()) or "none"


def subtree(whole, moves: Mapping[str, str], unused: Iterable[str] = ()) -> CheckpointPart:
    """``whole`` (a ``Checkpoint``) as the part ``moves`` and ``unused`` say
    (``CheckpointPart``): ``subtree(ckpt, {"model.language_model": "model"}, ["model.vision_tower"])``
    reads ``model.language_model.layers.0.mlp.up_proj.weight`` as
    ``model.layers.0.mlp.up_proj.weight`` and leaves the tower out."""
    return CheckpointPart(whole, moves, unused)
