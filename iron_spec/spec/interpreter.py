"""Expanding a spec into a runtime model: config fields resolved, each section's options read
(``options``: one module per part), the model's options assembled
(``runtime.causal.CausalOptions``, built into ``runtime.causal.CausalLM``).

The code reads behaviours (a layer kind, a norm, an activation), never a family's name.

Not for: reading any one option (``options``), an encoder spec (``encoder``), loading
weights (``build``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from iron_spec.runtime.causal import CausalOptions
from iron_spec.runtime.layers import LayerOptions
from iron_spec.runtime.values import MAX_INT

from . import expr
from .config import Resolved, per_layer_fields, resolve
from .errors import SpecError
from .loader import Spec
from .options.attention import _differential, _with_relative
from .options.checkpoint import checkpoint_layout
from .options.embedding import _positions, _sinusoidal
from .options.head import _final_eps, _head_rows, _head_transform
from .options.experts import experts_layers
from .options.layer import _first_attention_norm, _layer, _layer_types, _share_kv
from .options.positions import position_parts
from .options.reading import _flag_option, _number, _option, _typed
from .options.recurrence import recurrence
from .options.rope import _own_tables, rope_options
from .schema import validate


REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "max_position_embeddings")
# Read by the attention's and the MLP's defaults, and checked as sizes where a spec declares
# them: a model whose layers hold another token mixer or no MLP needs none.
SIZES = ("intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")
DEFAULT_PREFILL_CHUNK = 256
MAX_LAYERS = 2**16  # layers a model may have: each is a Python object tree of ~200 KB
MAX_PREFILL_CHUNK = 2**16  # ids a prompt call holds: 64 Ki rows of every activation


@dataclass
class Expanded:
    """A spec over one config.json: the resolved fields, the model's options and how the
    checkpoint's tensors meet its params (``checkpoint_layout``)."""

    spec: Spec
    resolved: Resolved
    options: CausalOptions
    renames: dict[str, str]
    transposed: tuple[str, ...] = ()
    unused: tuple[str, ...] = ()
    # The option paths under ``layer`` a pattern's entry may set per type (each read through
    # ``_layer``'s ``word``): any other an entry gives is never read (lint refuses it).
    per_type: frozenset = frozenset()


def expand(spec: Spec, config_json: Mapping[str, Any], *, max_seq_len: int | None = None,
           prefill_chunk: int | None = None, source: str = "config.json") -> Expanded:
    """The model ``spec`` describes on ``config_json``'s shape.

    ``max_seq_len`` defaults to the config's ``max_position_embeddings``; ``prefill_chunk``
    to the spec's ``runtime.prefill_chunk`` (at most ``max_seq_len``).

    Raises:
        SpecError: a schema violation (the first), a config field that cannot be resolved,
            an option of the wrong type or naming an unknown field, or a required field
            missing from ``config``.
    """
    problems = validate(spec)
    if problems:
        raise problems[0]
    missing = [f for f in REQUIRED if f not in (spec.get("config") or {})]
    if missing:
        raise spec.error(("config",), f"config lacks the required fields {', '.join(missing)}")
    r = resolve(spec, config_json, source)
    try:
        return _expand(spec, config_json, r, max_seq_len, prefill_chunk, source)
    except SpecError as e:
        raise traced(spec, r, e, source) from None


def traced(spec: Spec, r: Resolved, e: SpecError, source: str) -> SpecError:
    """``e`` with the config.json keys the option it names was computed from (``(from
    config.json: rope_parameters.rope_theta)``), where the message does not say them."""
    raw = spec.get(*e.path) if e.path is not None else None
    try:
        names = sorted(expr.names(raw)) if isinstance(raw, str) else []
    except expr.ExprError:
        names = []
    froms = [r.sources[n] for n in names if r.sources.get(n, "").startswith(f"{source}: ")]
    froms = [f for f in froms if f.split(" (from ")[0] not in e.message]
    if not froms:
        return e
    traced = SpecError(e.file, e.line, e.col, f"{e.message} (from {'; '.join(froms)})")
    traced.path = e.path
    return traced


def _turned(spec: Spec, ropes: dict, a):
    """Attention options ``a`` with its RoPE table's layout (``rope_interleaved``); the
    table checked to rotate an even number of columns within ``a``'s head_dim (and at least
    4 under dynamic scaling)."""
    name = a.rope
    if name is None or name not in ropes:
        return a
    width = ropes[name].rotary_dim
    if width < 2 or width % 2 or width > a.head_dim:
        raise spec.error(("rope", name), f"rope table {name!r} rotates {width} columns: an even "
                         f"number from 2 to the head_dim ({a.head_dim}) of the "
                         "layers reading it")
    scaling = ropes[name].scaling or {}
    if width == 2 and scaling.get("rope_type", scaling.get("type")) == "dynamic":
        raise spec.error(("rope", name, "scaling"), f"rope table {name!r} rotates 2 columns "
                         "with dynamic scaling, whose base grows by a power dim / (dim - 2) "
                         "(transformers' _compute_dynamic_ntk_parameters): at least 4")
    return replace(a, rope_interleaved=ropes[name].interleaved)


def _expand(spec: Spec, config_json: Mapping[str, Any], r: Resolved, max_seq_len: int | None,
            prefill_chunk: int | None, source: str) -> Expanded:
    v = r.values
    for name in REQUIRED + tuple(f for f in SIZES if f in v):
        if isinstance(v[name], float) and v[name].is_integer():
            v[name] = int(v[name])  # an expression's whole float (Lfm2MLP's int(...) sizes)
        _typed(spec, ("config", name), v[name], int, f"a whole number (from {r.sources[name]})")
        if v[name] is None:
            raise spec.error(("config", name), f"{name} is null (from {r.sources[name]}), not a "
                                               "whole number")
        top = MAX_LAYERS if name == "num_hidden_layers" else MAX_INT
        if not 1 <= v[name] <= top:
            raise spec.error(("config", name), f"{name} is {v[name]} (from {r.sources[name]}), "
                                               f"not a whole number within 1..{top}")

    types = _layer_types(spec, r, v["num_hidden_layers"])
    # Fields read per layer (transformers' per_layer_config): each layer's own resolution,
    # and one set of options per type and values of those fields.
    own = per_layer_fields(spec)
    rs = [resolve(spec, config_json, source, layer=i) if own else r for i in range(len(types))]
    built: dict[Any, LayerOptions] = {}
    keys, per_type = [], set()
    for t, ri in zip(types, rs):
        key = (t,) + tuple(repr(ri.values[f]) for f in own)
        if key not in built:
            built[key] = _layer(spec, ri, t, per_type)
        keys.append(key)
    layers = [built[k] for k in keys]
    if spec.get("layer", "shared_block") is not None and \
            not any(lo.shared_block is not None for lo in layers):
        raise spec.error(("layer", "shared_block"), "layer.shared_block is run by no layer: "
                         "no layer type says runs_shared_block: true")
    model_fields = r
    ropes = {}
    for name in spec.get("rope", default={}) or {}:
        # A table's options over the fields of the first layer reading it, as transformers'
        # per_layer_config[layer_type] initialises a layer type's RoPE.
        r = next((ri for ri, lo in zip(rs, layers) if lo.attention.rope == name), model_fields)
        ropes[name] = rope_options(spec, r, name, source)
    if own:
        _own_tables(spec, built, dict(zip(keys, rs)), ropes, source)
    r = model_fields
    for t, lo in built.items():
        if lo.shared_block is not None:  # the shared block's attention turns by its table too
            sb = lo.shared_block
            lo = built[t] = replace(lo, shared_block=replace(sb, attention=_turned(
                spec, ropes, sb.attention)))
        name = lo.attention.rope
        if name is None or name not in ropes:
            continue
        built[t] = replace(lo, attention=_turned(spec, ropes, lo.attention))
    layers = _first_attention_norm(spec, r, [built[k] for k in keys])
    layers = experts_layers(spec, rs, layers)
    layers = _differential(spec, r, layers)
    native = v["max_position_embeddings"]
    L = native if max_seq_len is None else max_seq_len
    C = prefill_chunk or spec.get("runtime", "prefill_chunk", default=DEFAULT_PREFILL_CHUNK)
    if not isinstance(C, int) or isinstance(C, bool) or not 1 <= C <= MAX_PREFILL_CHUNK:
        what = (f"prefill_chunk {C!r} is not a whole number within 1..{MAX_PREFILL_CHUNK} "
                "(ids a prompt call holds; it is never cut silently)")
        if prefill_chunk:
            raise ValueError(what)
        raise spec.error(("runtime", "prefill_chunk"), f"runtime.{what}")
    positions, offset = _positions(spec, r, L)
    parts = position_parts(spec, r, v["vocab_size"])
    layers = _with_relative(spec, layers, parts.relative)
    options = CausalOptions(
        vocab_size=v["vocab_size"], hidden_size=v["hidden_size"],
        layers=tuple(_share_kv(spec, r, layers, types)),
        norm=layers[0].norm, ropes=ropes, per_layer_input=layers[0].per_layer_input,
        tied=_flag_option(spec, r, ("head", "tied"), False),
        embedding_scale=_number(spec, ("embedding", "scale"), _option(spec, r, ("embedding", "scale"), 1.0)),
        logit_scale=_number(spec, ("head", "scale"), _option(spec, r, ("head", "scale"), 1.0)),
        logit_softcap=_number(spec, ("head", "softcap"), _option(spec, r, ("head", "softcap"), None)),
        positions=positions, position_offset=offset,
        head_bias=_flag_option(spec, r, ("head", "bias"), False),
        embedding_norm=_flag_option(spec, r, ("embedding", "norm"), False),
        sinusoidal=_sinusoidal(spec, r, positions, v["hidden_size"]),
        final_norm=_flag_option(spec, r, ("head", "norm"), True),
        final_norm_eps=_final_eps(spec, r),
        head_rows=_head_rows(spec, r, v["vocab_size"]),
        head_transform=_head_transform(spec, r), altup=layers[0].altup,
        recurrence=recurrence(spec, r, v["num_hidden_layers"]),
        max_seq_len=L, prefill_chunk=min(C, L), relative_rows=parts.relative_rows,
        snapshots=spec.get("runtime", "snapshots", default=4),
        prefix=parts.prefix, segments=parts.segments, padding_id=parts.padding_id)
    return Expanded(spec, r, options, *checkpoint_layout(spec, r), per_type=frozenset(per_type))
