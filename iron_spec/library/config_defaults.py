"""A spec's config defaults against transformers' config class defaults.

A golden cannot see a spec's ``default:``: transformers' ``save_pretrained`` writes every
field of its config class into config.json, so the default is never read on a golden's
inputs. What transformers does where config.json lacks a key is its config class's own
default, after the class's ``__post_init__`` (``type(config)()``); a golden records those
(meta ``config_defaults``: ``of``) and check compares every field the spec maps with a
``default`` against them (``compare``).

Compared: a field ``{json: KEY, default: VALUE}`` whose KEY the class holds (in
transformers 5's spelling, ``config.standard``), where its value there is a number, a
string, a boolean or null (a null read through the field's ``if_null``); VALUE matches
where it is that value or the default the class's field declares before ``__post_init__``
(which may change it by another field's default: a spec reads that other field itself). Not compared, and
named in the figure: a KEY the class has no field for (transformers' modeling code then
decides alone, and the golden's own run judges it), a mapping or list there (RoPE's
``rope_parameters``, whose null and ``{rope_type: default}`` mean one thing), a per-layer
KEY, an ``if_null`` expression.

Not for: resolving a config (``config``), reading goldens (``runtime.golden``).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from typing import Any, Mapping

from iron_spec.runtime.checks import Result

from iron_spec.spec.config import LAYER, MISSING, entry, lookup, same, shown, standard
from iron_spec.spec.loader import Spec

NAME = "config defaults vs transformers"
SCALARS = (bool, int, float, str, type(None))


def declared(config_class) -> dict[str, Any]:
    """The defaults ``config_class`` declares for its fields, before its ``__post_init__``
    (a dataclass field's default, or ``__init__``'s for a class written without fields),
    where they are numbers, strings, booleans or null."""
    try:
        pairs = [(f.name, f.default if f.default is not dataclasses.MISSING else
                  f.default_factory() if f.default_factory is not dataclasses.MISSING else
                  dataclasses.MISSING) for f in dataclasses.fields(config_class)]
    except TypeError:  # no dataclass
        pairs = [(n, p.default) for n, p in
                 inspect.signature(config_class.__init__).parameters.items()]
        pairs = [(n, dataclasses.MISSING if d is inspect.Parameter.empty else d)
                 for n, d in pairs]
    return {n: d for n, d in pairs if d is not dataclasses.MISSING and isinstance(d, SCALARS)}


def of(config_class) -> dict[str, Any]:
    """transformers' ``config_class``'s defaults as a golden's meta records them:
    ``{"class": NAME, "values": DICT, "fields": DECLARED}``, DICT the config.json
    ``type(config)()`` would be saved as in full (``to_json_string(use_diff=False)``: every
    field, after its ``__post_init__``), DECLARED the defaults its fields declare
    (``declared``: before ``__post_init__``, which may change one by another's default, as
    Qwen2Config nulls ``sliding_window`` where ``use_sliding_window`` is false);
    ``{"class": NAME, "error": WHY}`` where the class builds no config from its defaults
    alone."""
    try:
        values = json.loads(config_class().to_json_string(use_diff=False))
    except Exception as e:  # whatever a class raises that needs arguments to build
        return {"class": config_class.__name__, "error": f"{type(e).__name__}: {e}"}
    return {"class": config_class.__name__, "values": values, "fields": declared(config_class)}


def _spec_null(e: dict) -> tuple[bool, Any]:
    """What the field resolves a null config.json value to, where a literal says:
    (True, value), else (False, None) (an ``if_null`` expression)."""
    null = e.get("if_null", "none")
    if null == "fallback":
        return True, e.get("default")
    if isinstance(null, dict):
        return ("value" in null), null.get("value")
    return True, None


def compare(spec: Spec, record: Mapping[str, Any] | None, golden: str) -> Result:
    """Every field ``spec`` maps with a ``default`` against ``record`` (a golden's meta
    ``config_defaults``, as ``of`` wrote it), from ``golden`` (its path, for the figure).

    Returns a failed Result naming each field whose default differs (the spec's default,
    transformers' and its class); an unverified one (``verified`` False) where the golden
    records no defaults; else a passed one naming what was not compared.
    """
    if not record or "values" not in record:
        why = (f"transformers' {record.get('class')} builds no config from its defaults "
               f"({record.get('error')})" if record else
               "the golden records no transformers config class defaults (recorded before "
               "they were kept: re-record it with --record-golden, or for a checkout's "
               "goldens python -m tests.goldens.add_config_defaults)")
        return Result(NAME, True, f"not verified: {why}", {"golden": golden}, verified=False)
    cls = record["class"]
    theirs_all = standard(spec, record["values"])[0]
    fields_declared = record.get("fields") or {}
    fields = spec.get("config", default={}) or {}
    wrong, matched, absent, other = [], [], [], []
    for name, raw in fields.items():
        e = entry(raw)
        if "default" not in e or not isinstance(e.get("json"), str):
            continue
        key = e["json"]
        theirs = MISSING if LAYER in key else lookup(theirs_all, key)
        if LAYER in key:
            other.append(f"{name} (per layer)")
            continue
        if theirs is MISSING:
            absent.append(name)
            continue
        if not isinstance(theirs, SCALARS):
            other.append(f"{name} (a {'mapping' if isinstance(theirs, dict) else 'list'})")
            continue
        if theirs is None:
            known, theirs = _spec_null(e)
            if not known:
                other.append(f"{name} (null, read by an if_null expression)")
                continue
        ours, field_default = e["default"], fields_declared.get(key, MISSING)
        # 10000 is 10000.0, true is no 1 (same); the field's declared default, where
        # __post_init__ changed it by another field's default, is as good a reading.
        if same(ours, theirs) or (field_default is not MISSING and same(ours, field_default)):
            matched.append(name)
        else:
            also = "" if field_default is MISSING or same(field_default, theirs) else \
                f", its field declaring {shown(field_default)}"
            wrong.append(f"{name}: the spec's default {shown(ours)}, transformers' {cls}'s "
                         f"{shown(theirs)}{also} (config.json key {key})")
    numbers = {"class": cls, "matched": matched, "wrong": wrong, "not_in_class": absent,
               "not_compared": other}
    if wrong:
        return Result(NAME, False, f"{len(wrong)} of {len(wrong) + len(matched)} defaults "
                      "differ: " + "; ".join(wrong), numbers)
    figure = f"{len(matched)} defaults match {cls}'s"
    if absent:
        figure += f"; not in {cls}: {', '.join(absent)}"
    if other:
        figure += f"; not compared: {', '.join(other)}"
    return Result(NAME, True, figure, numbers)
