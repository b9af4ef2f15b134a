"""Config accounting: which keys of a checkpoint's config.json a spec must read, and which
load unread because transformers never reads them either.

Every key of config.json is one of:

- read by the spec: a field maps it (``config:``; the top-level part of a dotted key
  counts, and a field reading an alias's field reads the alias: ``keys.Reads.names``), a
  ``refuse:`` entry names it, or ``ignore:`` lists it;
- read by transformers and not by the spec: refused at every load (``--allow-unread-config``
  loads it anyway, on the user's word), as the model depends on it and the spec says nothing
  of it;
- read by neither: loaded as it is, and ``show`` lists it as unread. transformers stores such
  a key and no code of the family's reads it: metadata (``_name_or_path``, ``auto_map``),
  generation settings (``cache_implementation``, which PreTrainedConfig drops), legacy names
  no field holds (Falcon's ``apply_residual_connection_post_layernorm``).

What transformers reads of a model type is recorded beside the goldens (``keys``); a load
is accounted by it where config.json's ``model_type`` is recorded by a golden of the spec
loading it. Elsewhere (no model_type, a model type no golden recorded, a spec with no golden
of it) every key must be read by the spec, as before, and the refusal says why. Every key of
``rope_parameters`` is read by transformers' RoPE functions or the model's own code
(Ministral 3's ``llama_4_scaling_beta``), so none there loads unread: a key of it the
spec's RoPE table does not read is refused unless a field or ``ignore:`` reads it.

Not for: resolving a config (``config``), recording what transformers reads
(``transformers_keys``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from iron_spec.runtime.values import ROPE_KEYS, ROPE_TYPES

from . import keys
from .config import (ALLOW_UNREAD, entry, ignored_keys, mapped, refusals, refused_keys,
                     rope_misfits, shown, standard)
from .loader import Spec


@dataclass
class Accounted:
    """What a config.json's accounting found, for a load to say and ``show`` to list:
    ``unread``: (key, value, why) of each key transformers never reads that the spec does
    not read either, loaded as it is; ``allowed``: (key, value) of each key transformers
    reads that the spec does not, loaded only under ``--allow-unread-config``; ``reads``:
    the record of what transformers reads (None: none applies, every key must be read;
    ``why_strict`` says why)."""

    unread: list[tuple[str, Any, str]] = field(default_factory=list)
    allowed: list[tuple[str, Any]] = field(default_factory=list)
    reads: keys.Reads | None = None
    why_strict: str = ""


def unread(spec: Spec, config_json: Mapping[str, Any],
           reads: keys.Reads | None = None) -> list[tuple[str, Any]]:
    """The keys of ``config_json`` (with their values) the spec neither maps (the top-level
    part of a dotted key counts) nor lists in ``ignore:``, in the file's order; read in
    transformers 5's spelling (``standard``: ``rope_theta`` is read as
    ``rope_parameters.rope_theta``). Where a field reads ``rope_parameters``, each of its
    keys is accounted too (``unread_rope``). With ``reads``, a key the spec reads under
    another name transformers gives it (an ``attribute_map`` alias or its field) is read."""
    read, ignore = {**mapped(spec), **dict.fromkeys(refused_keys(spec))}, ignored_keys(spec)
    data, moved = standard(spec, config_json)
    # Read, of a wrong type: refused as that (rope_misfits), never counted unread here.
    misfit = rope_misfits(spec, config_json, "config.json")
    out = []

    def accounted(k: str) -> bool:
        names = reads.names(k) if reads is not None else {k}
        return any(n in read or n in ignore for n in names)

    for k, v in data.items():
        if k in misfit:
            continue
        if k == "rope_parameters" and k in read and k not in ignore:
            out += unread_rope(spec, v)
        if accounted(k):
            continue
        if k == "rope_parameters" and moved:  # as the file spells them
            out += [(m, config_json[m]) for m in moved]
            v = config_json.get(k, _ABSENT)
        if v is not _ABSENT:
            out.append((k, v))
    return out


_ABSENT = object()


# The keys of a rope_parameters table operators.rope reads, by its rope_type: transformers'
# _validate_<type>_rope_parameters' required and optional keys (runtime.values' table), less
# rope_theta and partial_rotary_factor, which a spec's fields read (a spec without partial
# rotary must not take one silently), save for proportional's own partial_rotary_factor.
ROPE_TABLE_KEYS = {kind: frozenset({"rope_type", "type"} | {k for k, _, _ in ROPE_KEYS.get(kind, [])})
                   for kind in ROPE_TYPES}


def unread_rope(spec: Spec, params: Any) -> list[tuple[str, Any]]:
    """The keys of ``rope_parameters`` (transformers 5's spelling, ``standard``) nothing reads,
    as ``rope_parameters.KEY`` (``rope_parameters.TYPE.KEY`` in a table by layer type, as
    Gemma 3's ``sliding_attention``), with their values.

    A table is ``params`` itself, or each mapping it holds (one per layer type). A key is
    read where its table's rope_type reads it (``ROPE_TABLE_KEYS``: ``factor``, yarn's
    ``beta_fast`` ...), where a config field reads it (``rope_parameters.llama_4_scaling_beta``,
    ``rope_parameters.rope_theta``), or where ``ignore:`` lists it (``rope_parameters.KEY``
    for it in any table, or its whole dotted name). A key of an unknown rope_type is left to
    the RoPE checks (``runtime.values.rope_scaling``), which refuse the type.
    """
    if not isinstance(params, Mapping):
        return []
    fields = spec.get("config")
    reads = {str(entry(raw).get("json")) for raw in (fields if isinstance(fields, dict) else {}).values()}
    ignore = set(ignored_keys(spec))
    tables = [(f"rope_parameters.{k}", v) for k, v in params.items() if isinstance(v, Mapping)]
    loose = {k: v for k, v in params.items() if not isinstance(v, Mapping)}
    out = []
    for where, table in [("rope_parameters", loose)] * bool(loose or not tables) + tables:
        kind = table.get("rope_type", table.get("type")) or "default"
        known = ROPE_TABLE_KEYS.get(kind) if isinstance(kind, str) else None  # else: RoPE's checks
        if known is None:
            continue
        for key, value in table.items():
            name = f"{where}.{key}"
            if key in known or name in reads or name in ignore or f"rope_parameters.{key}" in ignore:
                continue
            out.append((name, value))
    return out


def unread_message(source: str, key: str, value: Any, why: str = "") -> str:
    """What lint and every load say of one key the spec does not read: ``why``
    transformers reads it, where known (``keys.Reads.why``)."""
    said = f", {why}," if why else ""
    because = "transformers reads it: defaulted here, the model would be another" if why else \
        "a key read by nothing is a silent default"
    return (f"{source}: key {key!r} (= {shown(value)}){said} is neither mapped under config: "
            f"nor listed in ignore: ({because})")


def split(spec: Spec, config_json: Mapping[str, Any]
          ) -> tuple[list[tuple[str, Any, str]], list[tuple[str, Any, str]], keys.Reads | None, str]:
    """The keys the spec does not read (``unread``), split into those transformers reads
    (refused) and those it never reads (loaded unread), each as (key, value, why), with the
    record that told them apart (None, and why, where none applies: all are refused)."""
    reads, why_strict = keys.for_spec(spec.get("name"), config_json)
    refused, loaded = [], []
    top = set(config_json) | set(standard(spec, config_json)[0])
    for key, value in unread(spec, config_json, reads):
        if reads is None:
            refused.append((key, value, ""))
        elif key not in top:  # inside rope_parameters: read by transformers' RoPE or the model
            refused.append((key, value, "read by transformers' RoPE functions or the model"))
        elif reads.why(key) is not None:
            refused.append((key, value, reads.why(key)))
        else:
            loaded.append((key, value, f"no field, alias or code of {reads.config_class}'s "
                                       f"reads it (transformers {reads.transformers})"))
    return refused, loaded, reads, why_strict


def account(spec: Spec, config_json: Mapping[str, Any], source: str,
            allow_unread: bool = False) -> Accounted:
    """Refuse a config.json the spec does not account for, as ``lint --config`` checks it:
    a value the spec says it cannot serve (``refuse:``, whatever ``allow_unread``), or a key
    transformers reads (module docstring) that no field or refusal reads and ``ignore:``
    does not list. ``allow_unread`` lets those pass (the user's word that their defaults
    are right). Returns what was found (``Accounted``): the keys loaded unread.

    Raises:
        SpecError: at the first refusal met, naming each met (key, value, why); else at the
            spec's ``ignore:`` (else ``config:``), naming ``source`` and every key refused
            with its value and why transformers reads it, in one error.
    """
    met = refusals(spec, config_json, source)
    if met:
        raise spec.error(("refuse", met[0][0]), "\n  ".join(text for _, text in met))
    misfit = rope_misfits(spec, config_json, source)
    if misfit:  # a value of the wrong type, before any key is called unread
        raise spec.error(("config",), next(iter(misfit.values())))
    refused, loaded, reads, why_strict = split(spec, config_json)
    if refused and not allow_unread:
        place = ("ignore",) if "ignore" in spec.data else ("config",)
        lines = [unread_message(source, k, v, why) for k, v, why in refused]
        strict = f"; every key is read here: {why_strict}" if why_strict else ""
        raise spec.error(place, "\n  ".join(lines) + f"\n  (map or ignore each in the spec; "
                         f"{ALLOW_UNREAD} loads it anyway{strict})")
    return Accounted(loaded, [(k, v) for k, v, _ in refused], reads, why_strict)
