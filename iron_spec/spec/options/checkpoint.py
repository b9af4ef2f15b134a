"""Reading a spec's ``checkpoint`` section (renames, transposed and unused tensors) and its
``gguf`` section (llama.cpp's files of the family), each error at its own entry.

Not for: placing tensors (``runtime.checkpoint``), reading GGUF files (``runtime.gguf``,
``gguf_files``).
"""

from __future__ import annotations

from iron_spec.runtime.gguf import Layout as GGUFLayout
from iron_spec.runtime.renames import Pattern, RenameError, compile_table

from ..config import Resolved, chosen
from ..loader import Spec
from .reading import _flag, _number


def checkpoint_layout(spec: Spec, r: Resolved | None = None
                      ) -> tuple[dict[str, str], tuple[str, ...], tuple[str, ...]]:
    """``checkpoint``'s renames (checkpoint name -> model name, composed in order:
    ``runtime.renames``; a rename's target may be a choice by ``r``'s fields, ``config.chosen``,
    a null one renaming nothing), ``transposed`` (model-name patterns of matrices stored
    ``[in, out]``) and ``unused`` (checkpoint-name patterns of tensors read never).

    Raises:
        SpecError: a rename or pattern that is not well formed, at its own entry; a choice
            without the fields to choose by (``r`` None).
    """
    c = ("checkpoint",)
    renames = {}
    for old, new in (spec.get(*c, "renames", default={}) or {}).items():
        if isinstance(new, dict):
            if r is None:
                raise spec.error(c + ("renames", old), "a rename chosen by the config needs "
                                                       "the config's fields")
            new = chosen(spec, c + ("renames", old), new, r)[0]
        if new is not None:
            renames[old] = new
    for old, new in renames.items():
        try:
            compile_table({old: new})
        except RenameError as e:
            raise spec.error(c + ("renames", old), str(e)) from None
    lists = []
    for key in ("transposed", "unused"):
        patterns = tuple(spec.get(*c, key, default=[]) or [])
        for i, text in enumerate(patterns):
            try:
                Pattern(text)
            except RenameError as e:
                raise spec.error(c + (key, i), f"checkpoint.{key}[{i}]: {e}", value=True) from None
        lists.append(patterns)
    return renames, lists[0], lists[1]


def gguf_layout(spec: Spec) -> GGUFLayout | None:
    """``gguf``: the GGUF files of this spec's family and what llama.cpp's
    converter did to their tensors (``runtime.gguf.Layout``), serving the spec's first
    ``architectures``; None where the spec names none."""
    c = ("gguf",)
    if spec.get(*c) is None:
        return None
    archs = tuple(a for a in spec.get("architectures", default=[]) or [] if isinstance(a, str))
    return GGUFLayout(str(spec.get(*c, "architecture")), archs,
                      _flag(spec, c + ("rope_permuted",), spec.get(*c, "rope_permuted", default=False)),
                      float(_number(spec, c + ("norm_offset",), spec.get(*c, "norm_offset", default=0)) or 0))
