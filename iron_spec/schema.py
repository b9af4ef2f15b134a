"""Checking a spec against ``spec.schema.json`` (JSON Schema 2020-12, via jsonschema),
each violation placed at its YAML node with what would be valid."""

from __future__ import annotations

import difflib
import json
from functools import lru_cache
from pathlib import Path

import jsonschema

from .errors import SpecError
from .loader import Spec

SCHEMA_PATH = Path(__file__).with_name("spec.schema.json")


@lru_cache(maxsize=1)
def schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


def _subschema(path) -> dict:
    """The schema node that validates the instance at ``path`` (objects' properties only)."""
    node = schema()
    for key in path:
        props = node.get("properties", {})
        if key in props:
            node = props[key]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return {}
        if "$ref" in node:
            node = schema()["$defs"][node["$ref"].split("/")[-1]]
    return node


def _message(spec: Spec, error: jsonschema.ValidationError) -> tuple[tuple, str]:
    path = tuple(error.absolute_path)
    if error.validator == "additionalProperties":
        known = list(_subschema(path).get("properties", {}))
        extra = [k for k in error.instance if k not in known] if isinstance(error.instance, dict) else []
        if extra:
            key = extra[0]
            near = difflib.get_close_matches(str(key), known, n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(map(repr, near))}?" if near else \
                f"; valid keys: {', '.join(known)}"
            where = "the top level" if not path else "/".join(map(str, path))
            return path + (key,), f"unknown key {key!r} in {where}{hint}"
    if error.validator == "enum":
        near = difflib.get_close_matches(str(error.instance), [str(v) for v in error.validator_value],
                                         n=1, cutoff=0.6)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        return path, (f"{error.instance!r} is not one of "
                      f"{', '.join(map(repr, error.validator_value))}{hint}")
    if error.validator == "required":
        return path, f"{error.message} ({'/'.join(map(str, path)) or 'top level'})"
    name = "/".join(map(str, path)) or "the spec"
    return path, f"{name}: {error.message}"


def validate(spec: Spec) -> list[SpecError]:
    """Every schema violation of ``spec``, in file order, each at its node."""
    validator = jsonschema.Draft202012Validator(schema())
    errors = []
    for e in validator.iter_errors(spec.data):
        path, message = _message(spec, e)
        errors.append(spec.error(path, message))
    return sorted(errors, key=lambda e: (e.line, e.col, e.message))
