"""Checking a spec against ``spec.schema.json`` (JSON Schema 2020-12, via jsonschema): every
violation placed at its YAML node, named by its field, with what would be valid; and
``slots``, which schema nodes apply to each part of a spec (how lint finds expressions).

Not for: what the schema cannot see (``rules``).
"""

from __future__ import annotations

import difflib
import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import jsonschema

from .errors import SpecError
from .loader import Spec

SCHEMA_PATH = Path(__file__).with_name("spec.schema.json")
TYPES = {"number": "a number", "integer": "a whole number", "string": "text",
         "boolean": "a boolean", "null": "null", "object": "a mapping", "array": "a list"}


@lru_cache(maxsize=1)
def schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


def where(path: tuple) -> str:
    """``path`` as a reader names the field: ``layer.attention.bias``, ``architectures[0]``."""
    out = ""
    for key in path:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out or "the top level"


def describe(value: Any) -> str:
    """``value`` as a message names it: ``text 'silu'``, ``the number 3``, ``a list``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"text {value!r}"
    return "a mapping" if isinstance(value, dict) else "a list"


def resolve(node: Any) -> Any:
    """``node`` with a local ``$ref`` (``#/$defs/NAME``) followed, repeatedly."""
    while isinstance(node, dict) and "$ref" in node:
        target: Any = schema()
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part]
        node = target
    return node


def known_keys(node: Any) -> list[str]:
    """Every key an object schema names, through ``$ref``, ``allOf``, ``anyOf``, ``oneOf``,
    ``if``/``then``/``else``."""
    node = resolve(node)
    if not isinstance(node, dict):
        return []
    keys = list(node.get("properties", {}))
    for k in ("allOf", "anyOf", "oneOf"):
        for sub in node.get(k, []):
            keys += [x for x in known_keys(sub) if x not in keys]
    for k in ("then", "else"):
        keys += [x for x in known_keys(node.get(k)) if x not in keys]
    return keys


def _hint(word: str, valid: list[str], everything: bool = True) -> str:
    near = difflib.get_close_matches(word, valid, n=3, cutoff=0.6)
    if near:
        return f"; did you mean {' or '.join(map(repr, near))}?"
    return f"; valid: {', '.join(valid)}" if everything and valid else ""


def _number_text(value: Any) -> str:
    """A hint for text YAML 1.1 reads where a number was meant (``1e-5`` wants a dot)."""
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return ""
        mantissa, e, exponent = value.lower().partition("e")
        if e and "." not in mantissa:
            return f" (YAML reads {value} as text; write {mantissa}.0e{exponent})"
        return f" (quoted, so text; write {value} unquoted)"
    return ""


def _branch_errors(error: jsonschema.ValidationError) -> list[jsonschema.ValidationError] | None:
    """For a failed ``oneOf``/``anyOf``: the errors of the one branch the instance's type
    fits, or None where no single branch does."""
    fits = []
    for i, branch in enumerate(error.validator_value):
        errs = [e for e in error.context if e.schema_path and e.schema_path[0] == i]
        if not any(e.validator == "type" and not e.relative_path for e in errs):
            fits.append(errs)
    return fits[0] if len(fits) == 1 else None


def messages(error: jsonschema.ValidationError) -> Iterator[tuple[tuple, str, bool]]:
    """``(path, message, at the value node)`` for one jsonschema error (several for several
    unknown keys)."""
    path, instance, v = tuple(error.absolute_path), error.instance, error.validator
    name = where(path)
    if "propertyNames" in error.schema_path:  # a key's own name is refused
        yield path + (instance,), f"key {instance!r} in {name}: {error.message}", False
    elif v in ("additionalProperties", "unevaluatedProperties") and isinstance(instance, dict):
        known = known_keys(error.schema)
        patterns = error.schema.get("patternProperties", {})
        extra = [k for k in instance if k not in known
                 and not any(re.search(p, k) for p in patterns)]
        for key in extra:
            yield path + (key,), f"unknown key {key!r} in {name}{_hint(str(key), known)}", False
    elif v == "enum":
        valid = [str(x) for x in error.validator_value]
        yield path, (f"{name}: {describe(instance)} is not one of "
                     f"{', '.join(map(repr, error.validator_value))}"
                     f"{_hint(str(instance), valid, False)}"), True
    elif v == "const":
        yield path, f"{name} must be {error.validator_value!r}, not {describe(instance)}", True
    elif v == "type":
        types = error.validator_value if isinstance(error.validator_value, list) \
            else [error.validator_value]
        wanted = " or ".join(TYPES.get(t, t) for t in types)
        yield path, f"{name} is {describe(instance)}, not {wanted}{_number_text(instance)}", True
    elif v == "required":
        missing = [k for k in error.validator_value if k not in instance]
        for key in missing:
            yield path, f"{name} lacks the required key {key!r}", False
    elif v == "uniqueItems":
        seen: list = []
        for i, item in enumerate(instance):
            if item in seen:
                yield path + (i,), f"{name}: {describe(item)} is listed twice", True
            seen.append(item)
    elif v in ("oneOf", "anyOf"):
        errs = _branch_errors(error)
        if errs:
            for e in errs:
                yield from messages(e)
        else:
            kinds = []
            for b in map(resolve, error.validator_value):
                kind = TYPES.get(b.get("type"), "a value") if isinstance(b.get("type"), str) \
                    else "a value"
                about = b.get("description")
                kinds.append(f"{kind} ({about.rstrip('.')})" if about else kind)
            yield path, f"{name} is {describe(instance)}, not {' or '.join(kinds)}", True
    else:
        yield path, f"{name}: {error.message}", True


def validate(spec: Spec) -> list[SpecError]:
    """Every schema violation of ``spec``, in file order, each at its node."""
    validator = _validator()
    errors: dict[tuple, SpecError] = {}
    for e in validator.iter_errors(spec.data):
        for path, message, value in messages(e):
            err = spec.error(path, message, value)
            errors.setdefault((err.line, err.col, message), err)
    return sorted(errors.values(), key=lambda e: (e.line, e.col, e.message))


def slots(data: Any, node: Any = None, path: tuple = ()) -> Iterator[tuple[tuple, dict]]:
    """Every ``(path, schema node)`` pair where a schema node (before ``$ref`` is followed,
    so a ``{"$ref": ...}`` is seen as such) applies to the part of ``data`` at ``path``:
    through properties, additionalProperties, patternProperties, items, prefixItems, allOf,
    the branches of anyOf/oneOf that ``data`` fits, and if/then/else."""
    node = schema() if node is None else node
    if not isinstance(node, dict):
        return
    yield path, node
    if "$ref" in node:
        yield from slots(data, resolve(node), path)
        return
    for sub in node.get("allOf", []):
        yield from slots(data, sub, path)
    for k in ("anyOf", "oneOf"):
        for sub in node.get(k, []):
            if _fits(data, sub):
                yield from slots(data, sub, path)
    if "if" in node:
        branch = node.get("then") if _fits(data, node["if"]) else node.get("else")
        yield from slots(data, branch, path)
    if isinstance(data, dict):
        props, patterns = node.get("properties", {}), node.get("patternProperties", {})
        extra = node.get("additionalProperties")
        for key, value in data.items():
            matched = [s for p, s in patterns.items() if re.search(p, str(key))]
            if key in props:
                yield from slots(value, props[key], path + (key,))
            for s in matched:
                yield from slots(value, s, path + (key,))
            if key not in props and not matched and isinstance(extra, dict):
                yield from slots(value, extra, path + (key,))
    if isinstance(data, list):
        prefix = node.get("prefixItems", [])
        for i, value in enumerate(data):
            sub = prefix[i] if i < len(prefix) else node.get("items")
            yield from slots(value, sub, path + (i,))


@lru_cache(maxsize=1)
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema())


def _fits(data: Any, node: Any) -> bool:
    if not isinstance(node, dict):
        return bool(node)
    return _validator().evolve(schema=node).is_valid(data)


def at(path: tuple) -> dict:
    """The schema node of the mapping entries along ``path`` (through properties,
    additionalProperties and ``$ref``); ``{}`` where the schema names no such place."""
    node = resolve(schema())
    for key in path:
        props = node.get("properties", {})
        node = resolve(props[key] if key in props else node.get("additionalProperties"))
        if not isinstance(node, dict):
            return {}
    return node
