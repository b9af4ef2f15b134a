"""Mapping a checkpoint's ``config.json`` to a spec's config fields.

Each field of a spec's ``config:`` section is one of:

- ``KEY``: config.json's value at ``KEY`` (dotted for nested, ``text_config.hidden_size``);
- ``{json: KEY, default: VALUE}``: that value, else the literal ``VALUE`` (null allowed);
- ``{json: KEY, expr: EXPR}``: that value, else the expression over other fields;
- ``{expr: EXPR}``: always the expression; ``{value: VALUE}``: always the literal.

A value config.json holds as null counts as absent, as transformers writes unset options.
A ``default`` is always a literal and an ``expr`` always an expression, so ``silu`` is never
mistaken for a field name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from . import expr
from .loader import Spec

MISSING = object()  # what lookup gives for a key config.json lacks (or holds as null)
ALLOW_UNREAD = "--allow-unread-config"  # the flag every loading command takes
ALLOW_UNREAD_HELP = ("load although config.json holds keys the spec neither reads nor "
                     "ignores (their values then go unread: you vouch that the model does "
                     "not depend on them)")


@dataclass
class Resolved:
    """Field values and, for each, where it came from (``config.json: KEY``, ``default``,
    ``expr: EXPR`` or ``value``)."""

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)


def entry(raw: Any) -> dict:
    """A config field's declaration in its long form (``{json, default, expr, value}``)."""
    return {"json": raw} if isinstance(raw, str) else dict(raw) if isinstance(raw, dict) else {}


def lookup(data: Mapping[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return MISSING
        node = node[part]
    return MISSING if node is None else node


def resolve(spec: Spec, config_json: Mapping[str, Any], source: str = "config.json") -> Resolved:
    """Every field of ``spec``'s ``config`` section, from ``config_json``.

    Raises:
        SpecError: at the field's line: config.json lacks a key that has no fallback, an
            expression is refused or names an unknown field, or fields depend on each other
            in a cycle.
    """
    fields = spec.get("config", default={}) or {}
    out = Resolved()
    busy: list[str] = []

    def value(name: str) -> Any:
        if name in out.values:
            return out.values[name]
        if name in busy:
            raise spec.error(("config", name), "config fields depend on each other in a cycle: "
                             + " -> ".join(busy[busy.index(name):] + [name]))
        busy.append(name)
        e = entry(fields[name])
        got = MISSING
        if "json" in e:
            got = lookup(config_json, e["json"])
            if got is not MISSING:
                out.sources[name] = f"{source}: {e['json']}"
        if got is MISSING and "value" in e:
            got, out.sources[name] = e["value"], "value"
        if got is MISSING and "expr" in e:
            got = _expression(spec, ("config", name, "expr"), e["expr"], value, fields)
            out.sources[name] = f"expr: {e['expr']}"
        if got is MISSING and "default" in e:
            got, out.sources[name] = e["default"], "default"
        if got is MISSING:
            raise spec.error(("config", name), f"{source} has no {e.get('json', name)!r} and "
                             f"field {name!r} declares no default or expr")
        busy.pop()
        out.values[name] = got
        return got

    for name in fields:
        value(name)
    return out


def _expression(spec: Spec, path: tuple, text: Any, value, fields: Mapping[str, Any]) -> Any:
    try:
        needed = expr.names(text)
    except expr.ExprError as e:
        raise spec.error(path, str(e)) from None
    unknown = sorted(needed - set(fields))
    if unknown:
        raise spec.error(path, f"expression {text!r} names {', '.join(unknown)}, not a config "
                               f"field (fields: {', '.join(fields)})")
    try:
        return expr.evaluate(text, {n: value(n) for n in needed})
    except expr.ExprError as e:
        raise spec.error(path, str(e)) from None


def mapped(spec: Spec) -> dict[str, str]:
    """Each top-level config.json key a field reads (``a`` of ``a.b``), to the field."""
    fields = spec.get("config")
    out: dict[str, str] = {}
    for name, raw in (fields if isinstance(fields, dict) else {}).items():
        key = entry(raw).get("json")
        if isinstance(key, str):
            out.setdefault(key.split(".")[0], name)
    return out


def ignored_keys(spec: Spec) -> list:
    """The spec's ``ignore:`` list (empty where it is none)."""
    ignore = spec.get("ignore")
    return ignore if isinstance(ignore, list) else []


def shown(value: Any) -> str:
    """A config.json value as a message quotes it: its repr, cut to 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def unread(spec: Spec, config_json: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The keys of ``config_json`` (with their values) the spec neither maps (the top-level
    part of a dotted key counts) nor lists in ``ignore:``, in the file's order."""
    read, ignore = mapped(spec), ignored_keys(spec)
    return [(k, v) for k, v in config_json.items() if k not in read and k not in ignore]


def unread_message(source: str, key: str, value: Any) -> str:
    """What lint and every load say of one unread key."""
    return (f"{source}: key {key!r} (= {shown(value)}) is neither mapped under config: nor "
            "listed in ignore: (a key read by nothing is a silent default)")


def account(spec: Spec, config_json: Mapping[str, Any], source: str,
            allow_unread: bool = False) -> None:
    """Refuse a config.json the spec does not account for: every key read by a field or
    listed in ``ignore:``, as ``lint --config`` checks it. ``allow_unread`` lets unread keys
    pass (the user's word that their defaults are right).

    Raises:
        SpecError: at the spec's ``ignore:`` (else ``config:``), naming ``source`` and every
            unread key with its value, in one error.
    """
    keys = [] if allow_unread else unread(spec, config_json)
    if keys:
        place = ("ignore",) if "ignore" in spec.data else ("config",)
        lines = [unread_message(source, k, v) for k, v in keys]
        raise spec.error(place, "\n  ".join(lines) + f"\n  (map or ignore each in the spec; "
                         f"{ALLOW_UNREAD} loads it anyway)")


def evaluate_option(spec: Spec, path: tuple, raw: Any, resolved: Resolved) -> Any:
    """A layer option's value: a literal (number, bool, null) as it is, text as an expression
    over the resolved fields. Raises SpecError at ``path``."""
    if not isinstance(raw, str):
        return raw
    try:
        needed = expr.names(raw)
    except expr.ExprError as e:
        raise spec.error(path, str(e)) from None
    unknown = sorted(needed - set(resolved.values))
    if unknown:
        raise spec.error(path, f"{raw!r} names {', '.join(unknown)}, not a config field "
                               f"(fields: {', '.join(resolved.values)})")
    try:
        return expr.evaluate(raw, resolved.values)
    except expr.ExprError as e:
        raise spec.error(path, str(e)) from None
