"""A spec's ``parts``: the published checkpoints that hold its model inside a bigger one.

Most releases publish a text model inside a ``*ForConditionalGeneration`` checkpoint (its
config under ``text_config``, its tensors under ``model.language_model.`` beside ``lm_head``
and the towers'), and an encoder inside a ``*ForMaskedLM``, ``*ForSequenceClassification`` or
``*ForTokenClassification`` one (its tensors under ``bert.``, ``roberta.``, ``model.``, a task
head beside). A spec lists each such kind under ``parts:``, chosen by config.json's
``architectures``; an entry says:

- ``config``: the key whose mapping is the model's config.json (absent: the whole file);
  ``outer``: keys of the whole file the composite's own code reads for the model, with the
  composite config class's default (they replace the part's own); ``ignore``: the whole
  file's other keys, which nothing the model computes reads (the towers' configs, image
  token ids); any other key is refused as an unread key (``account_outer``);
- ``tensors``: checkpoint prefix -> model prefix (``""`` the model's root), each a run of
  whole dotted parts at the start of a name (``runtime.parts``); every other tensor keeps its
  name and meets the spec's ``checkpoint`` section as it would alone; ``unused``: prefixes
  of tensors the model never reads (the towers'), reported as ignored;
- for an encoder, ``pooler`` (whether the checkpoint holds ``pooler.dense``) and ``head``,
  the task head it holds (``encoder.head_options``).

Which keys count as read is the spec's concern (``accounting.account``) once the part's config
is taken; the whole file's keys are accounted here, so the two meet in one place each.

Not for: reading tensors (``runtime.parts``), evaluating a head (``encoder``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from iron_spec.runtime.parts import check_prefixes, stored
from iron_spec.runtime.renames import RenameError

from .config import ALLOW_UNREAD, shown
from .loader import Spec


@dataclass(frozen=True)
class Part:
    """One entry of a spec's ``parts`` (module docstring), at ``index``."""

    index: int
    architectures: tuple[str, ...]
    config: str | None
    model_type: str | None
    outer: dict
    ignore: tuple[str, ...]
    tensors: dict
    unused: tuple[str, ...]
    pooler: Any = None
    head: dict | None = None

    @property
    def at(self) -> tuple:
        """The entry's path in the spec."""
        return ("parts", self.index)


@dataclass(frozen=True)
class PartOf:
    """What a load took: the ``part`` entry, and the ``whole`` config.json it came from (the
    inputs a golden is keyed by)."""

    part: Part
    whole: dict

    def stored_name(self, name: str) -> str:
        """The whole checkpoint's name of the part's tensor ``name`` (drawn weights are
        written so)."""
        return stored(name, self.part.tensors)


def parts(spec: Spec) -> list[Part]:
    """The spec's ``parts`` entries (the schema has checked their form).

    Raises:
        SpecError: at the entry, a prefix that is no run of whole dotted parts, a config key
            without ``ignore``-able outer keys accounted (``outer`` and ``ignore`` naming the
            same key), or an architecture the spec's own ``architectures`` serves.
    """
    out = []
    served = set(spec.get("architectures", default=[]) or [])
    for i, e in enumerate(spec.get("parts", default=[]) or []):
        if not isinstance(e, dict):
            continue
        p = Part(i, tuple(e.get("architectures") or ()), e.get("config"), e.get("model_type"),
                 dict(e.get("outer") or {}), tuple(e.get("ignore") or ()),
                 dict(e.get("tensors") or {}), tuple(e.get("unused") or ()), e.get("pooler"),
                 e.get("head"))
        try:
            check_prefixes(p.tensors, p.unused)
        except RenameError as err:
            raise spec.error(p.at + ("tensors",), f"parts[{i}]: {err}") from None
        both = set(p.outer) & set(p.ignore)
        if both:
            raise spec.error(p.at + ("ignore",), f"parts[{i}]: {', '.join(sorted(both))} is "
                             "both read (outer) and ignored")
        if p.config is None and (p.outer or p.ignore):
            raise spec.error(p.at, f"parts[{i}]: outer and ignore account the whole "
                             "config.json's keys around the part's (config: KEY); without "
                             "config the whole file is the model's, accounted by the spec")
        twice = served & set(p.architectures)
        if twice:
            raise spec.error(p.at + ("architectures",), f"parts[{i}]: {', '.join(sorted(twice))}"
                             " is the spec's own architecture, not a part of another")
        out.append(p)
    return out


def architectures(spec: Spec) -> list[str]:
    """Every architecture the spec's ``parts`` read (a registry picks the spec by them)."""
    return [a for e in spec.get("parts", default=[]) or [] if isinstance(e, dict)
            for a in e.get("architectures") or [] if isinstance(a, str)]


def _model_type(part: Part, whole: Mapping[str, Any]) -> Any:
    """The ``model_type`` of the part's config (the whole file's without ``config``)."""
    inner = whole.get(part.config) if part.config is not None else whole
    return inner.get("model_type") if isinstance(inner, Mapping) else None


def find(spec: Spec, config_json: Mapping[str, Any]) -> Part | None:
    """The entry of ``spec``'s parts reading ``config_json``: the first whose architectures
    hold the first of config.json's ``architectures`` a part reads and, where it names one,
    whose ``model_type`` is the part's config's (Mistral3ForConditionalGeneration holds a
    mistral or a ministral3 text model); None where none does (the spec's own model, or
    another's)."""
    archs = config_json.get("architectures")
    if not isinstance(archs, list):
        return None
    entries = parts(spec)
    for arch in archs:
        for p in entries:
            if arch in p.architectures and (
                    p.model_type is None or p.model_type == _model_type(p, config_json)):
                return p
    return None


def config_of(spec: Spec, part: Part, whole: Mapping[str, Any], source: str,
              allow_unread: bool = False) -> tuple[dict, str]:
    """The part's config.json and where it came from: ``whole`` itself, or its ``config``
    key's mapping (``SOURCE: KEY``) with each ``outer`` key taken from ``whole`` (its
    default where absent); every other key of ``whole`` accounted (``account_outer``).

    Raises:
        SpecError: at the entry, ``whole`` lacks the key or holds no mapping there; a key
            neither taken, ignored nor the part's (``account_outer``).
    """
    if part.config is None:
        return dict(whole), source
    inner = whole.get(part.config)
    if not isinstance(inner, Mapping):
        raise spec.error(part.at + ("config",), f"{source}: {part.config} is "
                         f"{'absent' if inner is None else shown(inner)}, not a mapping: "
                         f"a {', '.join(part.architectures)} config.json holds its model's "
                         f"config there")
    account_outer(spec, part, whole, source, allow_unread)
    config = dict(inner)
    for key, default in part.outer.items():
        config[key] = whole.get(key, default)
    return config, f"{source}: {part.config}"


def account_outer(spec: Spec, part: Part, whole: Mapping[str, Any], source: str,
                  allow_unread: bool = False) -> None:
    """Refuse a key of the whole config.json that is neither the part's (``config``), taken
    (``outer``) nor ignored (``ignore``), as ``accounting.account`` refuses one of the model's
    own; ``allow_unread`` lets it pass.

    Raises:
        SpecError: at the entry's ``ignore``, naming every such key with its value.
    """
    if allow_unread:
        return
    known = {part.config, *part.outer, *part.ignore}
    keys = [(k, v) for k, v in whole.items() if k not in known]
    if keys:
        lines = [f"{source}: key {k!r} (= {shown(v)}) is neither the part's ({part.config}), "
                 f"taken (parts[{part.index}].outer) nor ignored (parts[{part.index}].ignore)"
                 for k, v in keys]
        raise spec.error(part.at + (("ignore",) if part.ignore else ()), "\n  ".join(lines)
                         + f"\n  (account each in the spec; {ALLOW_UNREAD} loads it anyway)")
