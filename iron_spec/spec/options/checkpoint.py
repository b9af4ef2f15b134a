"""Reading a spec's ``checkpoint`` section (renames, transposed and unused tensors) and its
``gguf`` section (llama.cpp's files of the family), each error at its own entry.

Not for: placing tensors (``runtime.checkpoint``), reading GGUF files (``runtime.gguf``,
``gguf_files``).
"""

from __future__ import annotations

from typing import Any

from iron_spec.runtime.gguf import COMPUTED as GGUF_COMPUTED, Layout as GGUFLayout
from iron_spec.runtime.gguf import Source as GGUFSource
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
    """``gguf``: the GGUF files of this spec's family, what llama.cpp's converter did to
    their tensors and where their metadata holds the config.json keys the spec reads
    (``runtime.gguf.Layout``), serving the spec's first ``architectures``; None where the
    spec names none."""
    c = ("gguf",)
    if spec.get(*c) is None:
        return None
    archs = tuple(a for a in spec.get("architectures", default=[]) or [] if isinstance(a, str))
    qkv = spec.get(*c, "qkv", default=None)
    if qkv not in (None, "heads", "groups"):
        raise spec.error(c + ("qkv",), f"gguf.qkv is {qkv!r}, not heads or groups", value=True)
    config = spec.get(*c, "config", default=None) or {}
    if not isinstance(config, dict):
        raise spec.error(c + ("config",), "gguf.config is not a mapping of config.json keys "
                         "to their GGUF sources")
    return GGUFLayout(str(spec.get(*c, "architecture")), archs,
                      _flag(spec, c + ("rope_permuted",), spec.get(*c, "rope_permuted", default=False)),
                      float(_number(spec, c + ("norm_offset",), spec.get(*c, "norm_offset", default=0)) or 0),
                      qkv, tuple((str(k), _gguf_source(spec, c + ("config", k), v))
                                 for k, v in config.items()))


def _gguf_source(spec: Spec, path: tuple, value: Any) -> GGUFSource | None:
    """One ``gguf.config`` entry (the schema's forms): a metadata key, ``{value: ...}``,
    ``{tensor: name, present: ..., absent: ...}``, ``{computed: name}``, or null (the common
    key of that name is not given)."""
    if value is None:
        return None
    if isinstance(value, str):
        return GGUFSource(metadata=value)
    if isinstance(value, dict) and "value" in value:
        return GGUFSource(value=value["value"])
    if isinstance(value, dict) and "tensor" in value:
        return GGUFSource(tensor=str(value["tensor"]), present=value.get("present", True),
                          absent=value.get("absent", False))
    if isinstance(value, dict) and value.get("computed") in GGUF_COMPUTED:
        return GGUFSource(computed=value["computed"])
    raise spec.error(path, f"{'.'.join(map(str, path))} is {value!r}: a GGUF metadata key, "
                     "{value: X}, {tensor: NAME, present: X, absent: Y}, {computed: "
                     f"{'|'.join(GGUF_COMPUTED)}}} or null", value=True)
