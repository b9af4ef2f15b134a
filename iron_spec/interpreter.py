"""Expanding a spec into a runtime model: config fields resolved, layer options evaluated,
the module tree built (``runtime.causal.CausalLM``).

The code reads behaviours (a layer kind, a norm, an activation), never a family's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from operators.activation import ACTIVATIONS
from runtime.blocks import AttentionOptions, LayerOptions, MLPOptions, NormOptions, RopeOptions
from runtime.causal import CausalOptions

from .config import Resolved, evaluate_option, resolve
from .loader import Spec
from .schema import validate

REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings")
DEFAULT_PREFILL_CHUNK = 256


@dataclass
class Expanded:
    """A spec over one config.json: the resolved fields and the model's options."""

    spec: Spec
    resolved: Resolved
    options: CausalOptions
    renames: dict[str, str]


def _option(spec: Spec, resolved: Resolved, path: tuple, default: Any) -> Any:
    raw = spec.get(*path, default=default)
    return evaluate_option(spec, path, raw, resolved)


def _typed(spec: Spec, path: tuple, value: Any, kind: type | tuple, what: str) -> Any:
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise spec.error(path, f"{'/'.join(map(str, path))} is {value!r}, not {what}")
    if value is not None and not isinstance(value, kind):
        raise spec.error(path, f"{'/'.join(map(str, path))} is {value!r}, not {what}")
    return value


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
    v = r.values
    for name in REQUIRED:
        _typed(spec, ("config", name), v[name], int, f"a whole number (from {r.sources[name]})")

    layer = ("layer",)
    norm = NormOptions(
        kind=spec.get("layer", "norm", "kind", default="rms"),
        eps=float(_typed(spec, layer + ("norm", "eps"),
                         _option(spec, r, layer + ("norm", "eps"), 1e-6), (int, float), "a number")),
        plus_one=bool(_option(spec, r, layer + ("norm", "plus_one"), False)))
    a = layer + ("attention",)
    window = _option(spec, r, a + ("window",), None)
    scale = _option(spec, r, a + ("scale",), None)
    softcap = _option(spec, r, a + ("softcap",), None)
    rope = spec.get("layer", "attention", "rope", default="default")
    ropes_spec = spec.get("rope", default={}) or {}
    if rope is not None and rope not in ropes_spec:
        raise spec.error(a + ("rope",), f"rope table {rope!r} is not under rope: (tables: "
                                        f"{', '.join(ropes_spec) or 'none'})")
    attention = AttentionOptions(
        heads=v["num_attention_heads"], kv_heads=v["num_key_value_heads"], head_dim=v["head_dim"],
        bias=bool(_option(spec, r, a + ("bias",), False)),
        o_bias=bool(_option(spec, r, a + ("o_bias",), False)),
        rope=rope,
        scale=None if scale is None else float(_typed(spec, a + ("scale",), scale, (int, float), "a number")),
        window=_typed(spec, a + ("window",), window, int, "a whole number"),
        softcap=None if softcap is None else float(_typed(spec, a + ("softcap",), softcap, (int, float), "a number")))
    m = layer + ("mlp",)
    act = _option(spec, r, m + ("act",), "hidden_act")
    if act not in ACTIVATIONS:
        raise spec.error(m + ("act",), f"activation {act!r} is not one of {', '.join(ACTIVATIONS)}")
    mlp = MLPOptions(intermediate_size=v["intermediate_size"],
                     kind=spec.get("layer", "mlp", "kind", default="gated"), act=act,
                     bias=bool(_option(spec, r, m + ("bias",), False)))
    residual = float(_option(spec, r, layer + ("residual_scale",), 1.0))
    one = LayerOptions(attention, mlp, norm, kind=spec.get("layer", "kind"), residual_scale=residual)
    ropes = {}
    for name in ropes_spec:
        p = ("rope", name)
        scaling = _option(spec, r, p + ("scaling",), None)
        _typed(spec, p + ("scaling",), scaling, dict, "a rope_scaling mapping or null")
        ropes[name] = RopeOptions(
            theta=float(_typed(spec, p + ("theta",), _option(spec, r, p + ("theta",), None),
                               (int, float), "a number")),
            rotary_dim=int(_option(spec, r, p + ("rotary_dim",), "head_dim")),
            scaling=scaling)
    native = v["max_position_embeddings"]
    L = native if max_seq_len is None else max_seq_len
    C = prefill_chunk or spec.get("runtime", "prefill_chunk", default=DEFAULT_PREFILL_CHUNK)
    options = CausalOptions(
        vocab_size=v["vocab_size"], hidden_size=v["hidden_size"],
        layers=tuple(one for _ in range(v["num_hidden_layers"])), norm=norm, ropes=ropes,
        tied=bool(_option(spec, r, ("head", "tied"), False)),
        embedding_scale=float(_option(spec, r, ("embedding", "scale"), 1.0)),
        max_seq_len=L, prefill_chunk=min(C, L))
    return Expanded(spec, r, options, dict(spec.get("checkpoint", "renames", default={}) or {}))
