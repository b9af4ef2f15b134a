"""Lint's semantic rules: what a spec means that its schema cannot see. Each rule reads a
spec as far as its shape allows (parts the schema refuses are skipped, not crashed on) and
returns every problem it finds as a SpecError at the node to fix.

Not for: the schema's own checks (``schema``), running lint over files (``lint``).
"""

from __future__ import annotations

import difflib
from typing import Any, Iterable, Mapping

from iron_spec.runtime.renames import Pattern, RenameError, compile_table, sources
from iron_spec.runtime.module import Module

from . import expr
from .accounting import split, unread_message
from .build import other_architecture
from .config import (MISSING, aliased, entry, ignored_keys, lookup, mapped, refusals,
                     rope_moves, standard)
from .encoder import REQUIRED as ENCODER, expand_encoder
from .errors import SpecError
from .gates import DEFAULT_KL
from .interpreter import REQUIRED, SIZES, expand
from .kinds import KINDS
from .loader import Spec
from .options.experts import LAYER_INDEX
from .schema import at, slots, where
from .tree import build_tree

EXPRESSION = "#/$defs/value"  # the schema's option value: a literal, or text as an expression
ORDER = ("json", "value", "expr", "default")  # config.resolve tries a field's sources so


def _fields(spec: Spec) -> dict:
    fields = spec.get("config")
    return fields if isinstance(fields, dict) else {}


def _near(word: str, valid: Iterable[str]) -> str:
    near = difflib.get_close_matches(word, list(valid), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(map(repr, near))}?" if near else ""


def _names_fields(spec: Spec, path: tuple, text: str, fields: Iterable[str],
                  expects: str | None = None) -> list[SpecError]:
    """An expression refused by the language, or naming what is not a field; a bare word
    where the option takes ``expects`` (``true or false``: its schema default's kind) says
    to write that unquoted, not to map a literal text."""
    try:
        needed = expr.names(text)
    except expr.ExprError as e:
        return [spec.error(path, f"{where(path)}: {e}", value=True)]
    fields = list(fields)
    out = []
    for name in sorted(needed - set(fields)):
        bare = text.strip() == name
        hint = _near(name, fields) or (
            f" ({path[-1]} takes {expects}: write it unquoted, or an expression over the "
            f"config fields giving it)" if bare and expects is not None else
            f" (text here is an expression; for the literal {name!r} map a field: "
            f"{{value: {name}}})" if bare else "")
        out.append(spec.error(path, f"{where(path)}: expression {text!r} names {name!r}, not "
                                    f"a config field{hint}", value=True))
    return out


EXPERTS_LAYERS = ("layer", "experts", "layers")


def expressions(spec: Spec) -> list[SpecError]:
    """Every expression (a config field's ``expr``, an option's text) that the language
    refuses or that names no config field."""
    fields = _fields(spec)
    out = []
    entries = spec.get("refuse")
    for i, e in enumerate(entries if isinstance(entries, list) else []):
        if isinstance(e, dict) and isinstance(e.get("when"), str):
            out += _names_fields(spec, ("refuse", i, "when"), e["when"], fields)
    for name, raw in fields.items():
        e = entry(raw)
        if isinstance(e.get("expr"), str):
            out += _names_fields(spec, ("config", name, "expr"), e["expr"], fields)
        null = e.get("if_null")
        if isinstance(null, dict) and isinstance(null.get("expr"), str):
            out += _names_fields(spec, ("config", name, "if_null", "expr"), null["expr"], fields)
    seen = set()
    for path, node in slots(spec.data):
        value = spec.get(*path)
        if node.get("$ref") == EXPRESSION and isinstance(value, str) and path not in seen:
            seen.add(path)
            # A mixture's layer choice reads each layer's index beside the fields.
            known = {**fields, LAYER_INDEX: None} if path == EXPERTS_LAYERS else fields
            out += _names_fields(spec, path, value, known, _expects(node.get("default")))
    return out


def _expects(default: Any) -> str | None:
    """What an option takes, by its schema default's kind (None where text may be meant)."""
    if isinstance(default, bool):
        return "true or false"
    return "a number" if isinstance(default, (int, float)) else None


def config_fields(spec: Spec) -> list[SpecError]:
    """Config fields whose sources cannot all be used (one always shadows another), an
    ``if_null`` with no ``json`` to be null or no fallback to fall back to, and fields whose
    expressions depend on each other in a cycle."""
    fields, out = _fields(spec), []
    for name, raw in fields.items():
        e = entry(raw)
        if "if_null" in e and "json" not in e:
            out.append(spec.error(("config", name, "if_null"), f"config.{name}.if_null is never "
                                  "used: the field reads no json key that could be null"))
        elif e.get("if_null") == "fallback" and not any(k in e for k in ORDER[1:]):
            out.append(spec.error(("config", name, "if_null"), f"config.{name}.if_null: fallback "
                                  "falls back to nothing: give the field a default, expr or "
                                  "value"))
        given = [k for k in ORDER if k in e]
        for i, k in enumerate(given[1:], 1):
            if given[i - 1] != "json":
                out.append(spec.error(("config", name, k), f"config.{name}.{k} is never used: "
                                      f"{given[i - 1]} comes first (a field tries "
                                      f"{', '.join(ORDER)}, in that order)"))
    deps = {}
    for name, raw in fields.items():
        deps[name] = set()
        e = entry(raw)
        null = e.get("if_null")
        for text in (e.get("expr"), null.get("expr") if isinstance(null, dict) else None):
            try:
                deps[name] |= expr.names(text) & set(fields) if isinstance(text, str) else set()
            except expr.ExprError:
                pass
    reported: set[frozenset] = set()
    for start in fields:
        stack = [(start, [start])]
        while stack:
            name, trail = stack.pop()
            for d in sorted(deps[name]):
                if d == start and frozenset(trail) not in reported:
                    reported.add(frozenset(trail))
                    out.append(spec.error(("config", start, "expr"), "config fields depend on "
                                          f"each other in a cycle: {' -> '.join(trail + [d])}"))
                elif d not in trail:
                    stack.append((d, trail + [d]))
    return out


def _named(text: Any) -> set[str]:
    try:
        return expr.names(text) if isinstance(text, str) else set()
    except expr.ExprError:
        return set()


def unread_fields(spec: Spec) -> list[SpecError]:
    """Fields nothing reads: no option's expression (given, or the interpreter's default
    for an option left out, as evaluated on the toy config), no other field's expression,
    no ``refuse`` condition, and no field the model needs (``interpreter.REQUIRED``). A
    config.json key mapped into such a field changes nothing: silently wrong."""
    fields = _fields(spec)
    encoder = spec.get("model") == "encoder"
    read = set(ENCODER + ("num_key_value_heads",) if encoder else REQUIRED + SIZES)
    for path, node in slots(spec.data):
        if node.get("$ref") == EXPRESSION:
            read |= _named(spec.get(*path))
    for raw in fields.values():
        e = entry(raw)
        null = e.get("if_null")
        read |= _named(e.get("expr")) | _named(null.get("expr") if isinstance(null, dict) else None)
    entries = spec.get("refuse")
    for e in entries if isinstance(entries, list) else []:
        read |= _named(e.get("when")) if isinstance(e, dict) else set()
    # A choice's condition reads its fields whichever way the toy goes: a choice nested in
    # another's branch is no schema slot of its own, and the toy may never take that branch.
    read |= {name for when in _whens(spec.data) for name in _named(when)}
    toy = spec.get("toy", "config")
    if isinstance(toy, dict):
        try:
            read |= (expand_encoder if encoder else expand)(spec, toy).resolved.read
        except (SpecError, ValueError, TypeError):
            return []  # a spec that does not expand: its own error, and nothing judged here
    return [spec.error(("config", name), f"config.{name} is read by nothing: no option, no "
                       "other field and no required field names it, so the config.json key "
                       "mapped here changes nothing (use it where it acts, or drop the field "
                       "and list the key under ignore:)")
            for name in fields if name not in read]


def _whens(node) -> list:
    """The ``when`` of every choice (``{when, then, else}``) anywhere under ``node``."""
    out = []
    if isinstance(node, dict):
        if {"when", "then", "else"} <= node.keys():
            out.append(node["when"])
        for value in node.values():
            out += _whens(value)
    elif isinstance(node, list):
        for value in node:
            out += _whens(value)
    return out


def kinds(spec: Spec) -> list[SpecError]:
    """Options only another kind takes than the one chosen (``kinds.KINDS``)."""
    out = []
    for row in KINDS:
        section = spec.get(*row.section)
        if not isinstance(section, dict):
            continue
        by, name = row.chosen_by[:-1], row.chosen_by[-1]
        choice = at(by).get("properties", {}).get(name, {})
        kind = spec.get(*row.chosen_by, default=choice.get("default"))
        if kind not in choice.get("enum", ()):
            continue  # no kind, or an unknown one: the schema's error
        for key in section:
            owners = [k for k, options in row.only.items() if key in options]
            if owners and kind not in owners:
                out.append(spec.error(row.section + (key,), f"{where(row.chosen_by)} {kind!r} "
                                      f"does not take {where(row.section + (key,))} (only "
                                      f"{' and '.join(owners)} take{'s' * (len(owners) == 1)} "
                                      "it)"))
    return out


def pattern_options(spec: Spec) -> list[SpecError]:
    """Options a causal spec's ``layer.pattern.options`` entry gives that no layer reads
    per type (``interpreter.Expanded.per_type``, as expanded on the toy config): an option
    built once for every layer (``attention.latent``, ``attention.differential``) set
    under a pattern is ignored, silently wrong. An encoder's pattern is held to its two
    options where it expands."""
    entries = spec.get("layer", "pattern", "options")
    toy = spec.get("toy", "config")
    if spec.get("model") == "encoder" or not isinstance(entries, dict) or \
            not isinstance(toy, dict):
        return []
    try:
        # a section's key read anywhere below it (experts.router.top_k) is read per type
        per_type = {path[:2] for path in expand(spec, toy).per_type}
    except (SpecError, ValueError, TypeError):
        return []  # a spec that does not expand: its own error, and nothing judged here
    out = []
    for t, entry in entries.items():
        for section, options in (entry.items() if isinstance(entry, dict) else ()):
            for key in (options if isinstance(options, dict) else ()):
                if (section, key) in per_type:
                    continue
                at = ("layer", "pattern", "options", t, section, key)
                out.append(spec.error(at, f"{where(at)} is never read: {section}.{key} is "
                                      "built once for every layer, whatever its type, so a "
                                      f"pattern cannot set it (set it under layer.{section}; "
                                      "a pattern sets the options read layer by layer, such "
                                      f"as attention.window or mlp.intermediate_size)"))
    return out


def validation(spec: Spec) -> list[SpecError]:
    """A ``validation.kl`` bound above float32's default (``gates.DEFAULT_KL``) with no
    ``why`` (a gate loosened for no reason hides the errors it lets through), and an
    encoder's ``validation.float64.gate`` giving ``mean`` (an encoder's float64 gate is one
    max |error|)."""
    out = []
    kl = spec.get("validation", "kl")
    if isinstance(kl, dict) and not kl.get("why"):
        for k, v in kl.items():
            if k in DEFAULT_KL and isinstance(v, (int, float)) and v > DEFAULT_KL[k]:
                out.append(spec.error(("validation", "kl", k), f"validation.kl.{k} {v:g} is "
                                      f"above the default {DEFAULT_KL[k]:g} with no reason: give "
                                      "validation.kl.why (what in this family lifts float32's "
                                      "spread against transformers'), or keep the default"))
    gate = spec.get("validation", "float64", "gate")
    if spec.get("model") == "encoder" and isinstance(gate, dict) and "mean" in gate:
        out.append(spec.error(("validation", "float64", "gate", "mean"), "an encoder's float64 "
                              "gate is max alone (the max |error| of hidden states and pooled "
                              "embeddings), not mean"))
    return out


def config_keys(spec: Spec, config_json: Mapping[str, Any], source: str) -> list[SpecError]:
    """Fields mapped from a key ``config_json`` lacks and declaring no fallback."""
    out = []
    for name, raw in _fields(spec).items():
        e = entry(raw)
        key = e.get("json")
        if not isinstance(key, str) or any(k in e for k in ORDER[1:]):
            continue
        if lookup(aliased(standard(spec, config_json)[0]), key) is MISSING:
            path = ("config", name) if isinstance(raw, str) else ("config", name, "json")
            out.append(spec.error(path, f"config.{name}: {source} has no key {key!r} and the "
                                  "field declares no default, expr or value"
                                  f"{_near(key, config_json)}", value=True))
    return out


def spellings(spec: Spec) -> list[SpecError]:
    """Fields reading a transformers-4 key that every config.json is read without
    (``config.standard`` moves it into ``rope_parameters``): such a field would always fall
    back."""
    moves, out = rope_moves(spec), []
    for name, raw in _fields(spec).items():
        key = entry(raw).get("json")
        if isinstance(key, str) and key.split(".")[0] in moves:
            top = key.split(".")[0]
            place = ".".join(["rope_parameters", *filter(None, [moves[top]])])
            path = ("config", name) if isinstance(raw, str) else ("config", name, "json")
            out.append(spec.error(path, f"config.{name} reads {key!r}, which every config.json "
                                  f"is read with in transformers 5's spelling, as {place!r} "
                                  "(config.standard, as transformers' "
                                  "convert_rope_params_to_dict): read that", value=True))
    return out


def ignored(spec: Spec) -> list[SpecError]:
    """Keys listed in ``ignore:`` that a config field reads after all."""
    read = mapped(spec)
    return [spec.error(("ignore", i), f"ignore[{i}]: {key!r} is read by config.{read[key]}; "
                       "it is not ignored", value=True)
            for i, key in enumerate(spec.get("ignore") if isinstance(spec.get("ignore"), list)
                                    else []) if isinstance(key, str) and key in read]


def unmapped(spec: Spec, config_json: Mapping[str, Any], source: str) -> list[SpecError]:
    """Keys of ``config_json`` transformers reads that the spec neither maps (the top-level
    part of a dotted key counts) nor lists in ``ignore:`` (``accounting.split``: every key
    the spec does not read, where what transformers reads is not recorded for it)."""
    place = ("ignore",) if "ignore" in spec.data else ("config",)
    return [spec.error(place, unread_message(source, key, value, why))
            for key, value, why in split(spec, config_json)[0]]


def refused(spec: Spec, config_json: Mapping[str, Any], source: str) -> list[SpecError]:
    """The values of ``config_json`` the spec's ``refuse:`` says it cannot serve, each at its
    entry (a ``when`` that cannot be judged: at it)."""
    try:
        return [spec.error(("refuse", i), text) for i, text in refusals(spec, config_json, source)]
    except SpecError as e:
        return [e]


def architecture(spec: Spec, config_json: Mapping[str, Any], source: str) -> list[SpecError]:
    """A config.json naming architectures none of which this spec serves."""
    said = other_architecture(spec, config_json, source)
    return [] if said is None else [spec.error(("architectures",), said)]


def build(spec: Spec, config_json: Mapping[str, Any], source: str, place: tuple = ("config",),
          part=None) -> tuple[Module | None, list[SpecError]]:
    """The module tree ``spec`` expands to on ``config_json`` (``tree.build_tree``: a short
    context, so cheap; as ``part`` of a bigger checkpoint, ``parts.Part``, where given), or
    the problem that stops it (a tree that does not build: at ``place``)."""
    try:
        return build_tree(spec, config_json, source, part), []
    except SpecError as e:
        return None, [e]
    except ValueError as e:
        return None, [spec.error(place, f"the model on {source} does not build: {e}")]


def _runs(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[i:j]) for i in range(len(parts)) for j in range(i + 1, len(parts) + 1)}


def renames(spec: Spec, names: Iterable[str]) -> list[SpecError]:
    """Renames that could place no tensor, and tables that cannot be undone.

    A rename is checked against the model's parameter names (``names``): each name's
    checkpoint name is the one the table renames to it through the most renames
    (``runtime.renames.source``, as drawn weights are written for transformers); a rename
    that no name's goes through places no tensor, and is refused: its target is no run of
    any parameter (a typo), or the renames before it take every name it would rename. Two
    checkpoint names tying for one parameter are refused too (drawn weights could not be
    written). Whether a checkpoint holds tensors under a rename's source is the
    checkpoint's to say (``iron-spec show --checkpoint``)."""
    table = spec.get("checkpoint", "renames")
    if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
        return []  # the schema's error
    out = []
    for old, new in table.items():
        try:
            compile_table({old: new})
        except RenameError as e:
            out.append(spec.error(("checkpoint", "renames", old), str(e)))
    if out:
        return out
    items = list(table.items())
    for i, (old, new) in enumerate(items):
        later = next((o for o, _ in items[i + 1:] if new and o == new), None)
        if later is not None:
            out.append(spec.error(("checkpoint", "renames", old), (
                f"rename {old!r} -> {new!r} renames onto {new!r}, a name the checkpoint's own "
                f"tensors have (the later rename {later!r} -> {table[later]!r} reads them): a "
                f"checkpoint's {old!r} and {new!r} tensors would both become "
                f"{table[later]!r}; rename each checkpoint name straight to the model's")))
    names = sorted(set(names))
    used: set[int] = set()
    renames_ = compile_table(table)
    for name in names:
        found = sources(name, table)
        if not found:
            out.append(_renamed_away(spec, table, name, names))
            continue
        if len(found) > 1 and found[0][1] == found[1][1] and found[0][1] > 0:
            out.append(spec.error(("checkpoint", "renames"), f"the renames give {name} from both "
                                  f"{found[0][0]} and {found[1][0]}: which one a checkpoint "
                                  "holds is ambiguous (drawn weights could not be written)"))
        for source, applied in found:
            if applied < found[0][1]:
                break
            parts = source.split(".")
            for i, r in enumerate(renames_):
                step = r.apply(parts)
                if step is not None:
                    used.add(i)
                    parts = step
    runs = set().union(*map(_runs, names)) if names else set()
    for i, (old, new) in enumerate(table.items()):
        if i in used:
            continue
        path = ("checkpoint", "renames", old)
        target = Pattern(new)
        if new and not any(target.matches(run) for run in runs):
            out.append(spec.error(path, f"rename {old!r} -> {new!r}: no parameter of the model "
                                  f"holds the run {new!r}{_near(new, runs)} (the model's "
                                  f"names are like {names[len(names) // 2]})"))
        else:
            out.append(spec.error(path, f"rename {old!r} -> {new!r} places no tensor: every "
                                  "name it would rename, an earlier rename renames first (or a "
                                  "later one renames on past every parameter)"))
    return out


def _renamed_away(spec: Spec, table: dict, name: str, names: list[str]) -> SpecError:
    """The error for a parameter no checkpoint name renames to: its own name is renamed on
    to another (``q_proj -> k_proj``), so a checkpoint's tensor of that name lands on a
    name another tensor already has (two tensors become one, at load an unexpected tensor
    and a missing one); the rename that first moves it named, and the name it lands on."""
    parts, first = name.split("."), None
    for old, r in zip(table, compile_table(table)):
        step = r.apply(parts)
        if step is not None:
            first = first or (old, table[old])
            parts = step
    lands = ".".join(parts)
    old, new = first
    other = (f"the checkpoint's own {lands} and its {name} would both become {lands}"
             if lands in names else f"its {name} would become {lands}, which no parameter has")
    return spec.error(("checkpoint", "renames", old),
                      f"rename {old!r} -> {new!r} renames {name} onto {lands}: {other}, and no "
                      f"checkpoint name renames to {name} (rename the checkpoint's own names, "
                      "not the model's)")


def patterns(spec: Spec, names: Iterable[str]) -> list[SpecError]:
    """``checkpoint.transposed`` patterns that match no matrix of the model (``names``: its
    matrices' model names), and ``checkpoint.transposed`` or ``unused`` entries that are no
    pattern."""
    names, out = sorted(set(names)), []
    for key in ("transposed", "unused"):
        listed = spec.get("checkpoint", key)
        for i, text in enumerate(listed if isinstance(listed, list) else []):
            if not isinstance(text, str):
                continue  # the schema's error
            try:
                pattern = Pattern(text)
            except RenameError as e:
                out.append(spec.error(("checkpoint", key, i), f"checkpoint.{key}[{i}]: {e}",
                                      value=True))
                continue
            if key == "transposed" and not any(pattern.matches(n) for n in names):
                out.append(spec.error(("checkpoint", key, i), f"checkpoint.transposed[{i}]: "
                                      f"{text!r} matches no matrix of the model (a model name, "
                                      f"such as {names[len(names) // 2] if names else '?'})",
                                      value=True))
    return out


def duplicate_architectures(specs: Iterable[Spec]) -> list[SpecError]:
    """An architecture that more than one spec serves, at each later spec's entry; but for
    specs each named as the model type of its toy config (transformers builds one class for
    two model types of other defaults: a config.json's model_type picks the spec,
    ``registry.for_architectures``)."""
    first: dict[str, tuple[Spec, int]] = {}
    out = []

    def by_type(spec: Spec) -> bool:
        return spec.get("toy", "config", "model_type", default=None) == spec.get("name")

    for spec in specs:
        archs = spec.get("architectures")
        for i, arch in enumerate(archs if isinstance(archs, list) else []):
            if not isinstance(arch, str):
                continue
            if arch in first and first[arch][0] is not spec \
                    and not (by_type(spec) and by_type(first[arch][0])):
                other, j = first[arch]
                line, col = other.mark(("architectures", j), value=True)
                out.append(spec.error(("architectures", i), f"architectures[{i}]: {arch!r} is "
                                      f"also served by {other.file}:{line}:{col}; one spec per "
                                      "architecture", value=True))
            first.setdefault(arch, (spec, i))
    return out
