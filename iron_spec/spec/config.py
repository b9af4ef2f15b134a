"""Mapping a checkpoint's ``config.json`` to a spec's config fields.

Each field of a spec's ``config:`` section is one of:

- ``KEY``: config.json's value at ``KEY`` (dotted for nested, ``text_config.hidden_size``);
- ``{json: KEY, default: VALUE}``: that value, else the literal ``VALUE`` (null allowed);
- ``{json: KEY, expr: EXPR}``: that value, else the expression over other fields;
- ``{expr: EXPR}``: always the expression; ``{value: VALUE}``: always the literal.

A value config.json holds as null is the value None, as transformers passes it to the config
class. Where the config class turns None into something, ``if_null`` beside ``json`` says
what: ``if_null: fallback`` has a null take the field's fallback as an absent key does
(LlamaConfig: ``num_key_value_heads`` None is ``num_attention_heads``, as absent),
``if_null: {expr: EXPR}`` or ``if_null: {value: VALUE}`` its own (Qwen2Config: absent is
32, None is ``num_attention_heads``).

Every config.json is read in transformers 5's spelling (``standard``): transformers 4's RoPE
keys are moved into ``rope_parameters`` first, so a spec maps that alone.

A ``default`` is always a literal and an ``expr`` always an expression, so ``silu`` is never
mistaken for a field name.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Mapping

from . import expr, keys
from .loader import Spec

MISSING = object()  # what lookup gives for a key config.json lacks
ALLOW_UNREAD = "--allow-unread-config"  # the flag every loading command takes
ALLOW_UNREAD_HELP = ("load although config.json holds keys the spec neither reads nor "
                     "ignores (their values then go unread: you vouch that the model does "
                     "not depend on them)")


# transformers 4's RoPE keys, each to its place in transformers 5's rope_parameters ("" the
# mapping itself), as RotaryEmbeddingConfigMixin.convert_rope_params_to_dict moves them; a
# spec's rope_parameters_from adds or overrides places (a layer type's, as Gemma3TextConfig's
# rope_local_base_freq -> sliding_attention.rope_theta).
ROPE_PARAMETERS_FROM = {"rope_scaling": "", "rope_theta": "rope_theta",
                        "partial_rotary_factor": "partial_rotary_factor"}


def rope_moves(spec: Spec) -> dict[str, str]:
    """Each transformers-4 key this spec's configs fold into ``rope_parameters``, to its
    place there (``ROPE_PARAMETERS_FROM`` under the spec's ``rope_parameters_from``; a key
    mapped to null is not moved)."""
    own = spec.get("rope_parameters_from")
    table = {**ROPE_PARAMETERS_FROM, **(own if isinstance(own, dict) else {})}
    return {k: v for k, v in table.items() if isinstance(v, str)}


def rope_misfits(spec: Spec, config_json: Mapping[str, Any], source: str) -> dict[str, str]:
    """The RoPE keys of ``config_json`` whose type keeps them from transformers 5's
    spelling (``standard``), each with the refusal that says so: ``rope_parameters`` that is
    neither a mapping nor null (every key moved into it then moves nowhere), a key moved
    whole (``rope_scaling``) that is neither. Such a key is read, its value wrong: said as
    that, never as a key nothing reads (whose advice, ``--allow-unread-config``, would run
    another model)."""
    out = {}
    params = config_json.get("rope_parameters")
    if params is not None and not isinstance(params, Mapping):
        out["rope_parameters"] = (f"{source}: rope_parameters is {shown(params)}, not a mapping "
                                  "of RoPE parameters (rope_type, rope_theta, ...) or null")
        for key in rope_moves(spec):
            if key in config_json:
                out[key] = out["rope_parameters"]
    for key, place in rope_moves(spec).items():
        held = config_json.get(key)
        if not place and held is not None and not isinstance(held, Mapping):
            out[key] = f"{source}: {key} is {shown(held)}, not a mapping of RoPE parameters or null"
    return out


def standard(spec: Spec, config_json: Mapping[str, Any]) -> tuple[dict, dict[str, str]]:
    """``config_json`` in transformers 5's spelling, so a spec reads one: each of
    ``rope_moves(spec)``'s keys moved into ``rope_parameters`` at its place, as
    transformers' ``convert_rope_params_to_dict`` and ``standardize_rope_params`` do. A
    mapping (``rope_scaling``) updates the mapping at its place (its values win, as
    transformers lets ``rope_scaling`` replace ``rope_parameters``); a single value goes
    where ``rope_parameters`` holds none (``rope_parameters``' own win). A null moves
    nothing. Then each table (the mapping, or each of its mappings by layer type) of
    rope_type llama3, yarn or longrope gets its ``original_max_position_embeddings``: the
    config's top-level one in a single table (as transformers gives it priority), else
    ``max_position_embeddings``. Also returns each moved key's place (``rope_theta`` ->
    ``rope_parameters.rope_theta``). ``config_json`` is not changed.
    """
    moves = {k: place for k, place in rope_moves(spec).items() if k in config_json
             and (place or isinstance(config_json[k], (Mapping, type(None))))}
    params = config_json.get("rope_parameters")
    if not isinstance(params, (dict, type(None))) or (params is None and not moves):
        return dict(config_json), {}
    data = {k: v for k, v in config_json.items() if k not in moves}
    params = copy.deepcopy(params) if params is not None else {}
    for key, place in moves.items():
        value, parts = config_json[key], place.split(".") if place else []
        if value is None:
            continue
        node = params
        for part in parts if isinstance(value, Mapping) else parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        if isinstance(value, Mapping):
            node.update(copy.deepcopy(dict(value)))
        else:
            node.setdefault(parts[-1], value)
    nested = [t for t in params.values() if isinstance(t, dict)]
    for table in nested or [params]:
        kind = table.get("rope_type", table.get("type"))
        if kind in ("llama3", "yarn", "longrope"):
            top = config_json.get("original_max_position_embeddings")
            if top is not None and not nested:
                table["original_max_position_embeddings"] = top
            elif "max_position_embeddings" in config_json:
                table.setdefault("original_max_position_embeddings",
                                 config_json["max_position_embeddings"])
    if params or moves:
        data["rope_parameters"] = params
    return data, {k: ".".join(["rope_parameters", *filter(None, [place])])
                  for k, place in moves.items()}


def aliased(data: Mapping[str, Any]) -> dict:
    """``data`` (a config.json) with each value under every name transformers reads it by:
    where the config class of its ``model_type`` maps an alias to a field (its
    ``attribute_map``, as recorded in ``keys``: ExaoneConfig's ``num_layers`` for
    ``num_hidden_layers``, InternLM3Config's ``qkv_bias`` for ``attention_bias``), a file
    holding either holds both; holding both, the alias's value is the field's, as
    transformers sets it last. ``data`` itself where its model type is not recorded."""
    reads = keys.recorded(data.get("model_type"))
    if reads is None or not reads.aliases:
        return dict(data)
    out = dict(data)
    for alias, name in reads.aliases.items():
        if alias in data:
            out[name] = data[alias]
        elif name in data:
            out[alias] = data[name]
    return out


@dataclass
class Resolved:
    """Field values and, for each, where it came from (``config.json: KEY``, ``default``,
    ``expr: EXPR`` or ``value``); ``read``: the fields options evaluated so far name (what
    lint's unread-field rule counts)."""

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    read: set[str] = field(default_factory=set)


def entry(raw: Any) -> dict:
    """A config field's declaration in its long form (``{json, default, expr, value}``)."""
    return {"json": raw} if isinstance(raw, str) else dict(raw) if isinstance(raw, dict) else {}


def lookup(data: Mapping[str, Any], key: str) -> Any:
    """config.json's value at dotted ``key`` (None where it holds null), MISSING where it has
    no such key (a part of the way null or no mapping counts as no key). A part that is a
    whole number indexes a list (``layer_rope_theta.{layer}``: a per-layer list's entry);
    past its end counts as no key."""
    node: Any = data
    for part in key.split("."):
        if isinstance(node, list) and part.isdigit():
            if int(part) >= len(node):
                return MISSING
            node = node[int(part)]
            continue
        if not isinstance(node, Mapping) or part not in node:
            return MISSING
        node = node[part]
    return node


LAYER = "{layer}"  # in a json key: the layer index, for a field resolved per layer


def per_layer_fields(spec: Spec) -> list[str]:
    """The fields whose json key holds ``{layer}`` (``per_layer_config.{layer}.head_dim``,
    transformers' per-layer overrides): resolved for each layer, one at a time."""
    fields = spec.get("config", default={}) or {}
    return [n for n, raw in fields.items() if LAYER in str(entry(raw).get("json", ""))]


def resolve(spec: Spec, config_json: Mapping[str, Any], source: str = "config.json",
            layer: int | None = None) -> Resolved:
    """Every field of ``spec``'s ``config`` section, from ``config_json``; a json key's
    ``{layer}`` is ``layer`` (without one, such a key is absent: the field's fallback).

    Raises:
        SpecError: at the field's line: config.json lacks a key that has no fallback, an
            expression is refused or names an unknown field, or fields depend on each other
            in a cycle.
    """
    fields = spec.get("config", default={}) or {}
    _declared(spec, fields)
    misfit = rope_misfits(spec, config_json, source)
    if misfit:
        raise spec.error(("config",), next(iter(misfit.values())))
    config_json, moved = standard(spec, config_json)
    config_json = aliased(config_json)
    out = Resolved()
    busy: list[str] = []

    def origin(key: str) -> str:
        froms = [k for k, place in moved.items()
                 if place == key or place.startswith(key + ".") or key.startswith(place + ".")]
        return f"{source}: {key}" + (f" (from {', '.join(froms)})" if froms else "")

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
            key = str(e["json"])
            if LAYER in key:
                key = None if layer is None else key.replace(LAYER, str(layer))
            got = MISSING if key is None else lookup(config_json, key)
            null = e.get("if_null", "none")
            if got is None and isinstance(null, dict) and "value" in null:
                got, out.sources[name] = null["value"], f"{origin(e['json'])} if_null: value"
            elif got is None and isinstance(null, dict) and "expr" in null:
                got = _expression(spec, ("config", name, "if_null", "expr"), null["expr"], value,
                                  fields)
                out.sources[name] = f"{origin(e['json'])} if_null: expr: {null['expr']}"
            elif got is None and null == "fallback":
                got = MISSING
            elif got is not MISSING:
                out.sources[name] = origin(e["json"])
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
        if "map" in e:
            got = _mapped(spec, name, e, got, out.sources[name])
        busy.pop()
        out.values[name] = got
        return got

    for name in fields:
        value(name)
    return out


def _mapped(spec: Spec, name: str, e: Mapping[str, Any], got: Any, where: str) -> Any:
    """``got`` through the field's ``map``, ``[[value, result], ...]``: a config value that
    names a behaviour in a word (GraniteMoeHybridConfig's ``position_embedding_type`` rope or
    null) as the number or boolean an expression reads.

    Raises:
        SpecError: at the field, a value the map does not list (naming it and those it does).
    """
    pairs = e["map"]
    for value, result in pairs:
        if same(got, value):
            return result
    raise spec.error(("config", name), f"{name} is {shown(got)} ({where}), which the spec does "
                     f"not serve: it serves {', '.join(shown(v) for v, _ in pairs)}")


def _declared(spec: Spec, fields: Mapping[str, Any]) -> None:
    """Every field's ``expr`` and ``if_null: {expr}`` well formed and naming fields, whether
    or not config.json's key shadows it (a run refuses what lint does).

    Raises:
        SpecError: at the first expression refused.
    """
    for name, raw in fields.items():
        e = entry(raw)
        null = e.get("if_null")
        for path, text in ((("config", name, "expr"), e.get("expr")),
                           (("config", name, "if_null", "expr"),
                            null.get("expr") if isinstance(null, dict) else None)):
            if isinstance(text, str):
                _names(spec, path, text, fields)


def _names(spec: Spec, path: tuple, text: Any, fields: Mapping[str, Any]) -> set[str]:
    try:
        needed = expr.names(text)
    except expr.ExprError as e:
        raise spec.error(path, str(e)) from None
    unknown = sorted(needed - set(fields))
    if unknown:
        raise spec.error(path, f"expression {text!r} names {', '.join(unknown)}, not a config "
                               f"field (fields: {', '.join(fields)})")
    return needed


def _expression(spec: Spec, path: tuple, text: Any, value, fields: Mapping[str, Any]) -> Any:
    needed = _names(spec, path, text, fields)
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
    return [k for k in ignore if isinstance(k, str)] if isinstance(ignore, list) else []


def shown(value: Any) -> str:
    """A config.json value as a message quotes it: its repr, cut to 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def refused_keys(spec: Spec) -> set[str]:
    """The top-level config.json keys ``refuse:`` entries name (``a`` of ``a.b``): read by the
    spec, which serves their other values."""
    entries = spec.get("refuse")
    return {e["key"].split(".")[0] for e in (entries if isinstance(entries, list) else [])
            if isinstance(e, dict) and isinstance(e.get("key"), str)}


def same(a: Any, b: Any) -> bool:
    """JSON equality: a boolean equals only a boolean (``True == 1`` in Python, not here)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def refusals(spec: Spec, config_json: Mapping[str, Any], source: str
             ) -> list[tuple[int, str]]:
    """The ``refuse:`` entries ``config_json`` meets, each as (its index, what to say): an
    entry ``{key, value, why}`` where config.json holds ``value`` at ``key`` (an absent key
    is never refused), ``{when, why}`` where the expression over the config fields is true.

    Raises:
        SpecError: a ``when`` that is refused, names no field or is not a boolean.
    """
    entries = spec.get("refuse")
    data = aliased(standard(spec, config_json)[0])
    out, resolved = [], None
    for i, e in enumerate(entries if isinstance(entries, list) else []):
        if not isinstance(e, dict):
            continue
        why = e.get("why", "")
        if isinstance(e.get("key"), str) and "value" in e:
            got = lookup(data, e["key"])
            if got is not MISSING and same(got, e["value"]):
                out.append((i, f"{source}: {e['key']} is {shown(got)}, which this spec cannot "
                               f"serve: {why}"))
        elif isinstance(e.get("when"), str):
            resolved = resolved or resolve(spec, config_json, source)
            path = ("refuse", i, "when")
            held = evaluate_option(spec, path, e["when"], resolved)
            if not isinstance(held, bool):
                raise spec.error(path, f"refuse[{i}].when {e['when']!r} is {shown(held)}, not "
                                       "true or false")
            if held:
                named = ", ".join(f"{n} = {shown(resolved.values[n])}"
                                  for n in sorted(expr.names(e["when"])))
                out.append((i, f"{source}: {e['when']} ({named}), which this spec cannot "
                               f"serve: {why}"))
    return out


CHOICE_KEYS = {"when", "then", "else"}


def chosen(spec: Spec, path: tuple, raw: Any, resolved: Resolved) -> tuple[Any, tuple]:
    """An option's raw value with its choice taken: ``{when: EXPR, then: A, else: B}`` is
    ``A`` where the boolean expression ``EXPR`` over the resolved fields holds, else ``B``
    (choices nest), and the path of the branch taken; any other value as it is. It lets a
    config value choose a word where expressions give numbers and booleans only
    (HyperCLOVAXDecoderLayer's ``use_post_norm``: a sandwich layer or a pre-norm one).

    Raises:
        SpecError: at ``when``, an expression that is not true or false.
    """
    while isinstance(raw, Mapping) and set(raw) == CHOICE_KEYS:
        cond = evaluate_option(spec, path + ("when",), raw["when"], resolved)
        if not isinstance(cond, bool):
            raise spec.error(path + ("when",), f"a choice's when is {cond!r} (from "
                                               f"{raw['when']!r}), not true or false")
        branch = "then" if cond else "else"
        path, raw = path + (branch,), raw[branch]
    return raw, path


def evaluate_option(spec: Spec, path: tuple, raw: Any, resolved: Resolved,
                    expects: str | None = None) -> Any:
    """A layer option's value: a literal (number, bool, null) as it is, text as an expression
    over the resolved fields. Raises SpecError at ``path``; where the text names no field
    and ``expects`` says what the option takes (``true or false``), the message says that
    (a quoted ``"yes"`` is read as a field's name)."""
    if not isinstance(raw, str):
        return raw
    try:
        needed = expr.names(raw)
    except expr.ExprError as e:
        raise spec.error(path, str(e)) from None
    resolved.read |= needed
    unknown = sorted(needed - set(resolved.values))
    if unknown and expects is not None:
        raise spec.error(path, f"{path[-1]} is {raw!r}, not {expects}: text is an expression "
                               f"over the config fields, and {', '.join(unknown)} is none of "
                               f"them (fields: {', '.join(resolved.values)}); write "
                               f"{expects} unquoted, or an expression giving it")
    if unknown:
        raise spec.error(path, f"{raw!r} names {', '.join(unknown)}, not a config field "
                               f"(fields: {', '.join(resolved.values)})")
    try:
        return expr.evaluate(raw, resolved.values)
    except expr.ExprError as e:
        raise spec.error(path, str(e)) from None


def whole_option(spec: Spec, r: Resolved, path: tuple, raw: Any, lo: int, hi: int) -> int:
    """A layer option that is a whole number within ``lo..hi``: ``raw`` a literal or an
    expression over ``r``'s fields (``evaluate_option``); an integral float counts.

    Raises:
        SpecError: at ``path``, a value that is no whole number or out of the range, naming
            the option and the expression that gave it.
    """
    value = evaluate_option(spec, path, raw, r, "a whole number")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        given = f" (from {raw!r})" if isinstance(raw, str) else ""
        raise spec.error(path, f"{'.'.join(map(str, path))} is {value!r}{given}, not a whole "
                               f"number within {lo}..{hi}")
    return value
