"""Expanding a spec into a runtime model: config fields resolved, layer options evaluated,
the module tree built (``runtime.causal.CausalLM``).

The code reads behaviours (a layer kind, a norm, an activation), never a family's name.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np

from iron_spec.operators.activation import ACTIVATION_PARAMS, ACTIVATIONS
from iron_spec.operators.attention import alibi_slopes
from iron_spec.operators.rope import ntk_alpha_theta, rope_inv_freq
from iron_spec.runtime.altup import AltUpOptions
from iron_spec.runtime.blocks.attention import (PER_HEAD_QK_NORMS, AttentionOptions,
                                                DifferentialOptions)
from iron_spec.runtime.blocks.embedding import Sinusoidal
from iron_spec.runtime.blocks.mlp import MLPOptions
from iron_spec.runtime.blocks.norms import NORM_KINDS, NormOptions
from iron_spec.runtime.blocks.rope import RopeOptions
from iron_spec.runtime.layers import LayerOptions, PerLayerInputOptions
from iron_spec.runtime.causal import CausalOptions, HeadTransformOptions
from iron_spec.runtime.gguf import Layout as GGUFLayout
from iron_spec.runtime.latent import LatentOptions
from iron_spec.runtime.renames import Pattern, RenameError, compile_table
from iron_spec.runtime.values import MAX_INT, rope_scaling

from . import expr
from .errors import SpecError

from .config import Resolved, chosen, evaluate_option, per_layer_fields, resolve
from .loader import Spec
from .causal_parts import position_parts
from .recurrence import recurrence
from .schema import validate

REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings")
DEFAULT_PREFILL_CHUNK = 256
MAX_LAYERS = 2**16  # layers a model may have: each is a Python object tree of ~200 KB
MAX_PREFILL_CHUNK = 2**16  # ids a prompt call holds: 64 Ki rows of every activation
_ABSENT = object()


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


FLAG = "true or false"  # what a flag option takes, as its refusals say


def _option(spec: Spec, resolved: Resolved, path: tuple, default: Any,
            expects: str | None = None) -> Any:
    raw = spec.get(*path, default=default)
    return evaluate_option(spec, path, raw, resolved, expects)


def _typed(spec: Spec, path: tuple, value: Any, kind: type | tuple, what: str) -> Any:
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise spec.error(path, f"{'.'.join(map(str, path))} is {value!r}, not {what}")
    if value is not None and not isinstance(value, kind):
        raise spec.error(path, f"{'.'.join(map(str, path))} is {value!r}, not {what}")
    return value


def _flag(spec: Spec, path: tuple, value: Any) -> bool:
    """A YAML or JSON boolean (null: false). A string such as ``"false"`` is refused rather
    than read as true, as Python's ``bool`` would."""
    return bool(_typed(spec, path, value, bool, "true or false"))


def _flag_option(spec: Spec, resolved: Resolved, path: tuple, default: bool) -> bool:
    """The boolean option at ``path`` (``_flag``), evaluated as any option."""
    return _flag(spec, path, _option(spec, resolved, path, default, FLAG))


def _number(spec: Spec, path: tuple, value: Any) -> float | None:
    """A finite number (NaN and infinities are refused where config.json smuggles them in)."""
    if value is None:
        return None
    value = float(_typed(spec, path, value, (int, float), "a number"))
    if not math.isfinite(value):
        raise spec.error(path, f"{'.'.join(map(str, path))} is {value}, not a finite number")
    return value


def _positive(spec: Spec, path: tuple, value: Any) -> float:
    """A finite number above zero (an eps, a rope theta)."""
    value = _number(spec, path, value)
    if value is None or value <= 0:
        raise spec.error(path, f"{'.'.join(map(str, path))} is {value}, not a number above 0")
    return value


def _whole(spec: Spec, path: tuple, value: Any) -> int | None:
    """A whole number; an integral float (``head_dim * 0.5``) counts. A fraction an
    expression gave is refused naming the expression, and how to truncate it as a config
    class's ``int()`` does."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    raw = spec.get(*path, default=None)
    if isinstance(value, float) and math.isfinite(value) and isinstance(raw, str):
        raise spec.error(path, f"{'.'.join(map(str, path))} is {value!r}, not a whole number: "
                               f"the expression {raw!r} gives it; where the config class "
                               f"truncates (int(...)), say so: \"({raw}) // 1\"")
    return _typed(spec, path, value, int, "a whole number")


def _type_text(t: Any) -> str:
    return {True: "true", False: "false"}[t] if isinstance(t, bool) else str(t)


def _layer_types(spec: Spec, r: Resolved, n: int) -> list[Any]:
    """Each layer's type under ``layer/pattern``: config's list (``types``), else every
    ``every``-th layer (layer ``i`` where ``(i + offset) % every == 0``, ``offset`` 1 unless
    given) and every layer from index ``from`` on ``nth``, the others ``other``;
    the last layer ``last`` where that is given; ``[None] * n`` without a pattern.

    A type is a name (``layer_types``' ``"sliding_attention"``), an integer or a boolean (a
    per-layer flag list such as SmolLM3's ``no_rope_layers``, 1 = RoPE): ``options`` is keyed
    by those very values (YAML ``0:``, ``1:``, ``true:``).
    """
    p = ("layer", "pattern")
    if spec.get(*p) is None:
        return [None] * n
    types = _option(spec, r, p + ("types",), None)
    options = spec.get(*p, "options", default={}) or {}
    if types is not None:
        if not isinstance(types, list) or len(types) != n or not all(
                isinstance(t, (str, int)) for t in types):
            raise spec.error(p + ("types",), f"layer types {types!r} are not {n} names, "
                             "integers or booleans, one per layer")
        where = p + ("types",)
    else:
        every = _whole(spec, p + ("every",), _option(spec, r, p + ("every",), None))
        start = _whole(spec, p + ("from",), _option(spec, r, p + ("from",), None))
        offset = _whole(spec, p + ("offset",), _option(spec, r, p + ("offset",), 1))
        offset = 1 if offset is None else offset
        nth, other = spec.get(*p, "nth"), spec.get(*p, "other")
        if other is None or (every is not None and (nth is None or every < 1)) or (
                start is not None and nth is None):
            raise spec.error(p, "without layer types, a pattern needs other (and nth with every "
                                ">= 1 or from)")
        types = [nth if (every and (i + offset) % every == 0) or (start is not None and i >= start)
                 else other for i in range(n)]
        where = p
    last = spec.get(*p, "last")
    if last is not None and types:
        types = types[:-1] + [last]
    unknown = sorted({_type_text(t) for t in types if t not in options})
    if unknown:
        raise spec.error(where, f"layer types {', '.join(unknown)} have no entry under "
                                f"layer/pattern/options (entries: "
                                f"{', '.join(map(_type_text, options)) or 'none'})")
    return types


def norm_options(spec: Spec, r: Resolved, path: tuple) -> NormOptions:
    """The norm at ``path`` (``layer/norm``): its ``kind``, ``eps``, ``plus_one``, ``weight``
    and ``bias`` evaluated, each error naming the option's own line.

    Raises:
        SpecError: a kind other than ``rms``, ``layer`` or ``no_norm``, an eps not above 0,
            a flag that is not a boolean.
    """
    kind = spec.get(*path, "kind", default="rms")
    if kind not in NORM_KINDS:
        raise spec.error(path + ("kind",), f"norm kind {kind!r} is not one of "
                                           f"{', '.join(NORM_KINDS)}")
    return NormOptions(
        kind=kind, eps=_positive(spec, path + ("eps",), _option(spec, r, path + ("eps",), 1e-6)),
        plus_one=_flag_option(spec, r, path + ("plus_one",), False),
        weight=_flag_option(spec, r, path + ("weight",), True),
        bias=_flag_option(spec, r, path + ("bias",), True))


def _heads_group(spec: Spec, r: Resolved, a: AttentionOptions, heads: tuple,
                 kv_heads: tuple) -> None:
    """Refuse heads that are no multiple of the kv heads (each kv head serves as many query
    heads as every other, transformers' repeat_kv), naming the config fields or expressions
    each came from and the file that gave them; at the kv heads' own line (the option's, else
    the config field's)."""
    if not a.heads or not a.kv_heads or a.heads % a.kv_heads == 0:
        return

    def told(raw: Any) -> str:
        if isinstance(raw, str) and raw in r.sources:
            return f"{raw}, from {r.sources[raw]}"
        return f"{raw!r}" if isinstance(raw, str) else "a literal"

    (raw_h, _), (raw_kv, at) = heads, kv_heads
    if spec.get(*at, default=_ABSENT) is _ABSENT and isinstance(raw_kv, str) and \
            raw_kv in (spec.get("config") or {}):
        at = ("config", raw_kv)
    raise spec.error(at, f"{a.heads} attention heads ({told(raw_h)}) do not group into "
                         f"{a.kv_heads} kv heads ({told(raw_kv)}): the heads must be a "
                         "multiple of the kv heads (each kv head serves heads // kv_heads "
                         "query heads)")


def _layer(spec: Spec, r: Resolved, t: Any, per_type: set | None = None) -> LayerOptions:
    """The options of a layer of type ``t``: ``layer/pattern/options/t``'s entries over
    ``layer``'s own; each option path read so (and so settable per type) is added to
    ``per_type``."""

    def _maybe_flag(value, at):
        return None if value is None else _flag(spec, at, value)

    def _clip(value, at):
        return None if value is None else _positive(spec, at, value)

    def word(*path, default=None):
        """The raw value at ``path`` under ``layer`` (or its override) and where it is."""
        at = ("layer",) + path
        if per_type is not None:
            per_type.add(path)
        over = ("layer", "pattern", "options", t) + path
        if t is not None and spec.get(*over, default=_ABSENT) is not _ABSENT:
            at = over
        return chosen(spec, at, spec.get(*at, default=default), r)

    def opt(*path, default=None, expects=None):
        raw, at = word(*path, default=default)
        return evaluate_option(spec, at, raw, r, expects), at

    def number(*path, default=None):
        value, at = opt(*path, default=default, expects="a number")
        return _number(spec, at, value)

    def whole(*path, default=None):
        value, at = opt(*path, default=default, expects="a whole number")
        return None if value is None else _whole(spec, at, value)

    def flag(*path):
        value, at = opt(*path, default=False, expects=FLAG)
        return _flag(spec, at, value)

    norm = norm_options(spec, r, ("layer", "norm"))
    rope, at = word("attention", "rope", default="default")
    ropes_spec = spec.get("rope", default={}) or {}
    if rope is not None and rope not in ropes_spec:
        raise spec.error(at, f"rope table {rope!r} is not under rope: (tables: "
                             f"{', '.join(ropes_spec) or 'none'})")
    rope_on, at = opt("attention", "rope_on", default=True)
    if not _flag(spec, at, rope_on):
        rope = None
    qk_norm, at = word("attention", "qk_norm", default=None)
    qk_norm_on, at = opt("attention", "qk_norm_on", default=True)
    if not _flag(spec, at, qk_norm_on):
        qk_norm = None
    a = ("attention",)
    attention = AttentionOptions(
        heads=whole(*a, "heads", default="num_attention_heads"),
        kv_heads=whole(*a, "kv_heads", default="num_key_value_heads"),
        head_dim=whole(*a, "head_dim", default="head_dim"),
        bias=flag(*a, "bias"), o_bias=flag(*a, "o_bias"), rope=rope,
        scale=number(*a, "scale"), window=_window(spec, *opt(*a, "window")),
        softcap=number(*a, "softcap"),
        qk_norm=qk_norm, fused_qkv=flag(*a, "fused_qkv"), v_norm=flag(*a, "v_norm"),
        qkv_layout=word(*a, "qkv_layout", default="blocks")[0],
        qkv_shards=whole(*a, "qkv_shards", default=1), qkv_order=word(*a, "qkv_order", default="qkv")[0],
        values_from_keys=flag(*a, "values_from_keys"), clip_qkv=_clip(*opt(*a, "clip_qkv")),
        qk_norm_bias=_maybe_flag(*opt(*a, "qk_norm_bias")),
        qk_norm_after_rope=flag(*a, "qk_norm_after_rope"), sinks=flag(*a, "sinks"),
        sub_norm=flag(*a, "sub_norm"), dynamic_mask=flag(*a, "dynamic_mask"),
        output_gate=flag(*a, "output_gate"),
        sees=_sees(spec, *word(*a, "sees", default="own")),
        latent=_latent(spec, r))
    _qkv_shards(spec, attention, word(*a, "qkv_shards")[1], word(*a, "qkv_order")[1])
    _heads_group(spec, r, attention, word(*a, "heads", default="num_attention_heads"),
                 word(*a, "kv_heads", default="num_key_value_heads"))
    attention = _alibi(spec, attention, *opt(*a, "alibi"), *opt(*a, "alibi_scaled", default=False),
                       *opt(*a, "alibi_bfloat16", default=False))
    if attention.qk_norm_after_rope and attention.qk_norm not in PER_HEAD_QK_NORMS:
        raise spec.error(opt(*a, "qk_norm_after_rope")[1], "qk_norm_after_rope norms each "
                         f"turned head: it needs qk_norm one of {', '.join(PER_HEAD_QK_NORMS)} "
                         f"(not {attention.qk_norm!r})")
    act, at = opt("mlp", "act", default="hidden_act")
    if act not in ACTIVATIONS:
        raise spec.error(at, f"activation {act!r} is not one of {', '.join(ACTIVATIONS)}")
    mlp = MLPOptions(intermediate_size=whole("mlp", "intermediate_size", default="intermediate_size"),
                     kind=word("mlp", "kind", default="gated")[0], act=act,
                     bias=flag("mlp", "bias"), fused=flag("mlp", "fused"),
                     sub_norm=norm if flag("mlp", "sub_norm") else None,
                     activation_sparsity=_sparsity(
                         spec, *opt("mlp", "activation_sparsity", default=0.0)))
    if mlp.activation_sparsity and (mlp.kind != "gated" or mlp.fused):
        raise spec.error(opt("mlp", "activation_sparsity")[1], "activation_sparsity cuts a "
                         f"gated MLP's own gate_proj, not a {'fused ' if mlp.fused else ''}"
                         f"{mlp.kind} MLP's")
    parallel = flag("parallel")
    placement = word("placement", default="pre")[0]
    if parallel and (spec.get("layer", "kind") != "decoder" or placement != "pre"):
        raise spec.error(("layer", "parallel"), "a parallel layer is kind decoder, placement pre "
                         f"(not {spec.get('layer', 'kind')}, {placement})")
    shared_norm, at = opt("shared_norm", default=True)
    return LayerOptions(attention, mlp, norm, kind=spec.get("layer", "kind"),
                        residual_scale=number("residual_scale", default=1.0),
                        placement=placement, per_layer_input=_per_layer_input(spec, r),
                        parallel=parallel, shared_norm=_flag(spec, at, shared_norm),
                        residual_weights=flag("residual_weights"),
                        laurel_rank=_laurel_rank(spec, *opt("laurel", "rank", default=0)),
                        altup=_altup(spec, r))


def _qkv_shards(spec: Spec, a: AttentionOptions, shards_at: tuple, order_at: tuple) -> None:
    """``attention.qkv_shards`` and ``qkv_order``: the fused rows' model-parallel blocks
    (``runtime.blocks.qkv_rows``, layout ``shards``).

    Raises:
        SpecError: at the option, an order that is not a permutation of ``qkv``, shards
            below 1 or not dividing q's and k/v's rows, or either set on another layout or
            without ``fused_qkv``.
    """
    if a.qkv_layout != "shards":
        if a.qkv_shards != 1 or a.qkv_order != "qkv":
            at = shards_at if a.qkv_shards != 1 else order_at
            raise spec.error(at, "qkv_shards and qkv_order place a fused projection's rows "
                                 f"under qkv_layout shards (not {a.qkv_layout!r})")
        return
    if not a.fused_qkv:
        raise spec.error(shards_at, "qkv_layout shards orders a fused qkv_proj's rows: only "
                                    "with attention.fused_qkv")
    if not isinstance(a.qkv_order, str) or sorted(a.qkv_order) != ["k", "q", "v"]:
        raise spec.error(order_at, f"qkv_order {a.qkv_order!r} is not a permutation of qkv "
                                   "(the order of q, k and v in each shard)")
    q, kv, n = a.heads * a.head_dim, a.kv_heads * a.head_dim, a.qkv_shards
    if n < 1 or q % n or kv % n:
        raise spec.error(shards_at, f"{n} qkv shards do not split q ({q} rows) and k, v "
                                    f"({kv} rows each) into equal pieces")


def _alibi(spec: Spec, a: AttentionOptions, max_bias: Any, at: tuple, scaled: Any,
           scaled_at: tuple, bf16: Any, bf16_at: tuple) -> AttentionOptions:
    """``a`` with its ALiBi slopes (``attention.alibi``: the slopes' max_bias, null for
    none), times the attention scale where ``attention.alibi_scaled`` (FalconAttention adds
    the alibi tensor to the raw scores, then scales both); with ``attention.alibi_bfloat16``
    in FalconModel's bfloat16 form (``operators.attention.alibi_bias``), scaled so.

    Raises:
        SpecError: at the option's line, a max_bias not above 0, alibi_scaled without alibi,
            or alibi beside RoPE or a softcap (no family has both: their order is unread).
    """
    scaled, bf16 = _flag(spec, scaled_at, scaled), _flag(spec, bf16_at, bf16)
    if max_bias is None:
        if scaled or bf16:
            raise spec.error(scaled_at if scaled else bf16_at, "alibi_scaled and alibi_bfloat16 "
                             "shape ALiBi slopes: only with attention.alibi")
        return a
    max_bias = _positive(spec, at, max_bias)
    if a.rope is not None or a.softcap is not None:
        raise spec.error(at, "ALiBi stands in for RoPE and is built without a softcap: "
                             "attention.rope null and no softcap beside attention.alibi")
    slopes = alibi_slopes(a.heads, max_bias)
    scale = a.head_dim ** -0.5 if a.scale is None else a.scale
    if bf16:
        return replace(a, alibi=slopes, alibi_bf16=scale if scaled else 1.0)
    if scaled:
        slopes = tuple(float(np.float32(x * scale)) for x in slopes)
    return replace(a, alibi=slopes)


def _latent(spec: Spec, r: Resolved) -> LatentOptions | None:
    """``layer/attention/latent``: multi-head latent attention's widths
    (``runtime.latent.LatentOptions``), None without it.

    Raises:
        SpecError: at the option, a width that is not a whole number >= 1 (q_lora_rank may
            be null: one q_proj), or an eps not above 0.
    """
    p = ("layer", "attention", "latent")
    if spec.get(*p) is None:
        return None
    widths = {}
    for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                 "q_lora_rank"):
        value = _whole(spec, p + (name,), _option(spec, r, p + (name,), name))
        if (value is None and name != "q_lora_rank") or (value is not None and value < 1):
            raise spec.error(p + (name,), f"latent {name} is {value}, not a whole number >= 1"
                             + (" (null: one q_proj)" if name == "q_lora_rank" else ""))
        widths[name] = value
    if widths["qk_rope_head_dim"] % 2:
        raise spec.error(p + ("qk_rope_head_dim",), f"latent qk_rope_head_dim is "
                         f"{widths['qk_rope_head_dim']}: RoPE turns pairs, an even number")
    eps = _positive(spec, p + ("eps",), _option(spec, r, p + ("eps",), 1e-6))
    return LatentOptions(eps=eps, **widths)


def _sees(spec: Spec, value: Any, at: tuple) -> str:
    """``attention.sees``: ``own`` (causal) or ``call`` (every row of a call), never beside
    a sliding window (the attention operator's)."""
    if value not in ("own", "call"):
        raise spec.error(at, f"attention.sees is {value!r}, not own (each query sees the keys "
                             "up to its own position) or call (up to its call's last row)")
    if value == "call" and spec.get("layer", "attention", "window") is not None:
        raise spec.error(at, "attention.sees call is not built beside a sliding window")
    return value


def _with_relative(spec: Spec, layers: list[LayerOptions], relative) -> list[LayerOptions]:
    """Every layer reading the one relative bias table (``relative``: the operator's
    options; None: the layers as they are).

    Raises:
        SpecError: at the option, layers of different head counts, or latent or
            differential attention (which take no bias input).
    """
    if relative is None:
        return layers
    p = ("layer", "attention", "relative_bias")
    if len({lo.attention.heads for lo in layers}) != 1:
        raise spec.error(p, "one relative bias table serves every layer: their head counts differ")
    if any(lo.attention.latent is not None or lo.attention.differential is not None
           for lo in layers):
        raise spec.error(p, "a relative bias is added by the attention operator: not with "
                            "latent or differential attention")
    return [replace(lo, attention=replace(lo.attention, relative=relative)) for lo in layers]


def _window(spec: Spec, value: Any, at: tuple) -> int | None:
    """A sliding window: None (full attention), or a whole number of positions from 1 to
    ``MAX_INT`` (the attention kernel's int; a window past the context masks nothing)."""
    if value is None:
        return None
    value = _whole(spec, at, value)
    if not 1 <= value <= MAX_INT:
        raise spec.error(at, f"{'.'.join(map(str, at))} is {value}, not a whole number within "
                             f"1..{MAX_INT} (null: full attention)")
    return value


def _laurel_rank(spec: Spec, value: Any, at: tuple) -> int:
    """``layer/laurel/rank``: a whole number, 0 (or null) for no branch."""
    rank = _whole(spec, at, value) or 0
    if rank < 0:
        raise spec.error(at, f"laurel rank {rank} is not a whole number of 0 or more "
                             "(0: no branch)")
    return rank


def _altup(spec: Spec, r: Resolved) -> AltUpOptions | None:
    """``layer/altup`` evaluated: ``inputs`` streams (1 or more), the ``active`` one among
    them, ``correct_scale``; None without it."""
    p = ("layer", "altup")
    if spec.get(*p) is None:
        return None
    inputs = _whole(spec, p + ("inputs",), _option(spec, r, p + ("inputs",), "altup_num_inputs"))
    if inputs is None or inputs < 1:
        raise spec.error(p + ("inputs",), f"altup inputs is {inputs}, not a whole number of "
                                          "streams of 1 or more")
    active = _whole(spec, p + ("active",), _option(spec, r, p + ("active",), 0))
    if active is None or not 0 <= active < inputs:
        raise spec.error(p + ("active",), f"altup active stream {active} is not one of the "
                                          f"{inputs} streams 0..{inputs - 1}")
    return AltUpOptions(inputs=inputs, active=active,
                        correct_scale=_flag_option(spec, r, p + ("correct_scale",), True))


def _sparsity(spec: Spec, value: Any, at: tuple) -> float:
    """``layer/mlp/activation_sparsity``: a share within [0, 1) (0 or null: no cut)."""
    share = _number(spec, at, value)
    if share is None:
        return 0.0
    if not 0.0 <= share < 1.0:
        raise spec.error(at, f"activation_sparsity is {share}, not a share within [0, 1) "
                             "(0: no cut; 0.95 cuts 95% of a normal row)")
    return share


def _per_layer_input(spec: Spec, r: Resolved) -> PerLayerInputOptions | None:
    """``layer/per_layer_input`` evaluated; None without it or where its size is 0."""
    p = ("layer", "per_layer_input")
    if spec.get(*p) is None:
        return None
    size = _whole(spec, p + ("size",), _option(spec, r, p + ("size",), "hidden_size_per_layer_input"))
    if not size:
        return None
    act = _option(spec, r, p + ("act",), "hidden_act")
    if act not in ACTIVATIONS or act in ACTIVATION_PARAMS:
        raise spec.error(p + ("act",), f"activation {act!r} is not one of {', '.join(ACTIVATIONS)} "
                                       "without parameters")

    def number(name: str) -> float:
        return _number(spec, p + (name,), _option(spec, r, p + (name,), 1.0))

    vocab = _whole(spec, p + ("vocab_size",), _option(spec, r, p + ("vocab_size",),
                                                      "vocab_size_per_layer_input"))
    outside = _whole(spec, p + ("outside_row",), _option(spec, r, p + ("outside_row",), None))
    if outside is not None and not 0 <= outside < (vocab or 0):
        raise spec.error(p + ("outside_row",), f"outside_row {outside} is not a row of "
                                               f"embed_tokens_per_layer's {vocab} (0..{vocab - 1})")
    return PerLayerInputOptions(
        size=size, act=act,
        vocab_size=vocab,
        embedding_scale=number("embedding_scale"), projection_scale=number("projection_scale"),
        mix_scale=number("mix_scale"), outside_row=outside)


def _share_kv(spec: Spec, r: Resolved, layers: list[LayerOptions],
              types: list[Any]) -> list[LayerOptions]:
    """``layer/kv_sharing``: the last ``last`` layers read the KV cache of the last layer
    before them of their own type (``layer/pattern``), as transformers' ``kv_sharing_modes``;
    with ``double_mlp``, their MLPs are twice as wide."""
    p = ("layer", "kv_sharing")
    if spec.get(*p) is None:
        return layers
    n = len(layers)
    last = _whole(spec, p + ("last",), _option(spec, r, p + ("last",), 0)) or 0
    if not 0 <= last < n:
        raise spec.error(p + ("last",), f"{last} layers sharing KV caches is not within 0..{n - 1} "
                                        f"(at least the first layer holds its own)")
    double = _flag_option(spec, r, p + ("double_mlp",), False)
    first = n - last
    out = list(layers)
    for i in range(first, n):
        source = max((j for j in range(first) if types[j] == types[i]), default=None)
        if source is None:
            raise spec.error(p + ("last",), f"layer {i} (type {types[i]}) shares a KV cache, but "
                                            f"none of layers 0..{first - 1} is of its type")
        lo = layers[i]
        mlp = replace(lo.mlp, intermediate_size=2 * lo.mlp.intermediate_size) if double else lo.mlp
        out[i] = replace(lo, attention=replace(lo.attention, kv_from=source), mlp=mlp)
    return out


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


def _expand(spec: Spec, config_json: Mapping[str, Any], r: Resolved, max_seq_len: int | None,
            prefill_chunk: int | None, source: str) -> Expanded:
    v = r.values
    for name in REQUIRED:
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
        name = lo.attention.rope
        if name is None or name not in ropes:
            continue
        built[t] = replace(lo, attention=replace(lo.attention, rope_interleaved=ropes[name].interleaved))
        width = ropes[name].rotary_dim
        if width < 2 or width % 2 or width > lo.attention.head_dim:
            raise spec.error(("rope", name), f"rope table {name!r} rotates {width} columns: an even "
                             f"number from 2 to the head_dim ({lo.attention.head_dim}) of the "
                             "layers reading it")
        scaling = ropes[name].scaling or {}
        if width == 2 and scaling.get("rope_type", scaling.get("type")) == "dynamic":
            raise spec.error(("rope", name, "scaling"), f"rope table {name!r} rotates 2 columns "
                             "with dynamic scaling, whose base grows by a power dim / (dim - 2) "
                             "(transformers' _compute_dynamic_ntk_parameters): at least 4")
    layers = _first_attention_norm(spec, r, [built[k] for k in keys])
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
        head_rows=_head_rows(spec, r, v["vocab_size"]),
        head_transform=_head_transform(spec, r), altup=layers[0].altup,
        recurrence=recurrence(spec, r, v["num_hidden_layers"]),
        max_seq_len=L, prefill_chunk=min(C, L), relative_rows=parts.relative_rows,
        prefix=parts.prefix, segments=parts.segments, padding_id=parts.padding_id)
    return Expanded(spec, r, options, *checkpoint_layout(spec, r), per_type=frozenset(per_type))


def _own_tables(spec: Spec, built: dict, fields: dict, ropes: dict[str, RopeOptions],
                source: str) -> None:
    """Give each layer whose own fields (read per layer, ``{layer}``) make its rope table's
    options differ from the table's (over its first reader's fields) a table of its own,
    ``NAME#i``, shared by the layers those options agree for: GraniteSWAModel's one rotary
    embedding per distinct ``layer_rope_theta``. ``built`` (layer key -> options) and
    ``ropes`` are updated in place; ``fields``: each key's resolved fields."""
    for key, lo in list(built.items()):
        name = lo.attention.rope
        if name is None or name not in ropes:
            continue
        mine = rope_options(spec, fields[key], name, source)
        if mine == ropes[name]:
            continue
        same = [n for n, ro in ropes.items() if n.startswith(name + "#") and ro == mine]
        table = same[0] if same else f"{name}#{sum(n.startswith(name + '#') for n in ropes) + 1}"
        ropes[table] = mine
        built[key] = replace(lo, attention=replace(lo.attention, rope=table))


def _differential(spec: Spec, r: Resolved, layers: list[LayerOptions]) -> list[LayerOptions]:
    """``layer.attention.differential``: each layer's differential attention
    (``runtime.blocks.DifferentialOptions``), its ``lambda_init`` ``lambda_base -
    lambda_amplitude * exp(-lambda_decay * i)`` at layer index ``i`` (DiffLlama's
    ``lambda_init_fn``: 0.8, 0.6, 0.3), its head norm's eps ``eps`` (default the layer
    norm's); the layers as they are without it.

    Raises:
        SpecError: at the option, a schedule value that is not a finite number or an eps
            not above 0.
    """
    p = ("layer", "attention", "differential")
    if spec.get(*p) is None:
        return layers
    base, amplitude, decay = (_number(spec, p + (k,), _option(spec, r, p + (k,), d))
                              for k, d in (("lambda_base", 0.8), ("lambda_amplitude", 0.6),
                                           ("lambda_decay", 0.3)))
    if None in (base, amplitude, decay):
        raise spec.error(p, "differential lambda_base, lambda_amplitude and lambda_decay are "
                            "numbers, not null")
    out = []
    for i, lo in enumerate(layers):
        eps = _option(spec, r, p + ("eps",), None)
        eps = lo.norm.eps if eps is None else _positive(spec, p + ("eps",), eps)
        d = DifferentialOptions(lambda_init=base - amplitude * math.exp(-decay * i), eps=eps)
        out.append(replace(lo, attention=replace(lo.attention, differential=d)))
    return out


def _first_attention_norm(spec: Spec, r: Resolved, layers: list[LayerOptions]) -> list[LayerOptions]:
    """``layer.first_attention_norm``: false, layer 0 holds no ``input_layernorm`` and its
    attention reads the embeddings as they are (ModernBertDecoderLayer's ``attn_norm``).

    Raises:
        SpecError: at the option, false on a layer other than a decoder placed pre that is
            not parallel.
    """
    at = ("layer", "first_attention_norm")
    if _flag_option(spec, r, at, True):
        return layers
    first = layers[0]
    if first.kind != "decoder" or first.placement != "pre" or first.parallel:
        raise spec.error(at, "a first layer without its attention norm is kind decoder, "
                             f"placement pre, not parallel (not {first.kind}, {first.placement}"
                             f"{', parallel' if first.parallel else ''})")
    return [replace(first, attention_norm=False)] + layers[1:]


def _head_transform(spec: Spec, r: Resolved) -> HeadTransformOptions | None:
    """``head.transform``: ``{act, bias}`` of the dense + activation + norm before lm_head
    (``runtime.causal.HeadTransformOptions``), None where the spec has none.

    Raises:
        SpecError: at the option's own line, an activation no operator has or a bias that
            is not a boolean.
    """
    p = ("head", "transform")
    if spec.get(*p) is None:
        return None
    act = _option(spec, r, p + ("act",), "hidden_act")
    if act not in ACTIVATIONS:
        raise spec.error(p + ("act",), f"activation {act!r} is not one of {', '.join(ACTIVATIONS)}")
    return HeadTransformOptions(act=act, bias=_flag_option(spec, r, p + ("bias",), False))


def _head_rows(spec: Spec, r: Resolved, vocab: int) -> int | None:
    """``head.vocab_size``: lm_head's rows (null: the embedding's ``vocab_size``).

    Raises:
        SpecError: at the option, rows that are not a whole number within 1..vocab_size, or
            fewer than vocab_size under a tied head.
    """
    at = ("head", "vocab_size")
    rows = _whole(spec, at, _option(spec, r, at, None))
    if rows is None or rows == vocab:
        return None
    if not 1 <= rows <= vocab:
        raise spec.error(at, f"head.vocab_size is {rows}, not a whole number within 1..{vocab} "
                             "(the embedding's vocab_size)")
    if _flag_option(spec, r, ("head", "tied"), False):
        raise spec.error(at, f"head.vocab_size {rows} is narrower than the embedding "
                             f"({vocab}): a tied lm_head is the embedding, all its rows")
    return rows


def rope_options(spec: Spec, r: Resolved, name: str, source: str) -> RopeOptions:
    """The options of the RoPE table ``rope/name`` over ``r``'s fields.

    Raises:
        SpecError: at the option's own line, a value of the wrong type, an unknown or
            incomplete scaling, or frequencies float32 cannot hold.
    """
    p = ("rope", name)
    scaling = _option(spec, r, p + ("scaling",), None)
    _typed(spec, p + ("scaling",), scaling, dict, "a rope_scaling mapping or null")
    original = _option(spec, r, p + ("original_max_position_embeddings",), None)
    if scaling and original is not None and "original_max_position_embeddings" not in scaling:
        scaling = {**scaling, "original_max_position_embeddings": _whole(
            spec, p + ("original_max_position_embeddings",), original)}
    theta = _positive(spec, p + ("theta",), _option(spec, r, p + ("theta",), None))
    try:
        rope_scaling(scaling, _key(spec, r, p + ("scaling",), source), theta)
    except ValueError as e:
        raise spec.error(p + ("scaling",), str(e)) from None
    rotary_dim = _whole(spec, p + ("rotary_dim",), _option(spec, r, p + ("rotary_dim",), "head_dim"))
    theta, scaling = _ntk_alpha(spec, r, p, theta, scaling, rotary_dim)
    rope = RopeOptions(
        theta=theta,
        rotary_dim=rotary_dim,
        scaling=scaling,
        max_position_embeddings=_whole(spec, p + ("max_position_embeddings",), _option(
            spec, r, p + ("max_position_embeddings",), "max_position_embeddings")),
        interleaved=_flag_option(spec, r, p + ("interleaved",), False),
        negated=_flag_option(spec, r, p + ("negated",), False),
        query_scale=_query_scale(spec, r, p))
    _finite_frequencies(spec, p, rope, f"{_key(spec, r, p + ('theta',), source)} "
                        f"and {_key(spec, r, p + ('scaling',), source)}")
    return rope


def _query_scale(spec: Spec, r: Resolved, path: tuple) -> tuple[float, int] | None:
    """``rope/NAME/query_scale``: ``(beta, period)`` (``RopeOptions.query_scale``); None where
    it or its beta is null.

    Raises:
        SpecError: at the option, a beta that is no finite number, or a period that is not a
            whole number >= 1.
    """
    at = path + ("query_scale",)
    if spec.get(*at) is None:
        return None
    beta = _number(spec, at + ("beta",), _option(spec, r, at + ("beta",), None))
    if beta is None:
        return None
    period = _whole(spec, at + ("period",), _option(spec, r, at + ("period",), None))
    if period is None or period < 1:
        raise spec.error(at + ("period",), f"query_scale.period is {period}, not a whole number "
                         ">= 1 (the context past which queries grow)")
    return beta, period


def _ntk_alpha(spec: Spec, r: Resolved, path: tuple, theta: float, scaling: dict | None,
               dim: int | None) -> tuple[float, dict | None]:
    """``rope/NAME/ntk_alpha`` applied: where it is set (not null, not 0) and ``scaling``'s
    rope_type is ``dynamic``, the table is static, at base ``theta * alpha ** (dim / (dim -
    2))`` and no scaling, as HunYuanDenseV1RotaryEmbedding (rope_type ``ntk_alpha``, which
    ``dynamic_rope_update`` leaves alone); with another rope_type ``alpha`` is not read, as
    there. Else ``theta`` and ``scaling`` as they are.

    Raises:
        SpecError: at the option, an alpha that is not a number above 0, or a table of 2
            columns (the power divides by ``dim - 2``).
    """
    at = path + ("ntk_alpha",)
    alpha = _number(spec, at, _option(spec, r, at, None))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type"))
    if not alpha or kind != "dynamic":
        return theta, scaling
    if alpha < 0:
        raise spec.error(at, f"ntk_alpha is {alpha:g}, not a number above 0")
    try:
        return ntk_alpha_theta(theta, alpha, dim), None
    except ValueError as e:
        raise spec.error(at, str(e)) from None


def _finite_frequencies(spec: Spec, path: tuple, rope: RopeOptions, where: str) -> None:
    """Refuse a RoPE table whose parameters, each valid alone, give frequencies float32
    cannot hold (a theta of 1e-300 is 0 in float32, and every angle then NaN); ``where``
    names the keys they came from."""
    with np.errstate(all="ignore"):
        try:
            inv, attention = rope_inv_freq(rope.rotary_dim, rope.theta, rope.scaling)
        except (ValueError, OverflowError, ZeroDivisionError) as e:
            raise spec.error(path, f"rope table {path[-1]!r}: {e}") from None
    if not (np.isfinite(inv).all() and math.isfinite(attention)):
        raise spec.error(path, f"rope table {path[-1]!r}: theta {rope.theta:g} and scaling "
                               f"{rope.scaling} ({where}) give frequencies float32 cannot "
                               "hold (NaN or infinite)")


def _key(spec: Spec, r: Resolved, path: tuple, source: str) -> str:
    """Where the option at ``path`` comes from, as an error names it: ``FILE: KEY`` of the
    config.json key its one field reads, else the option itself."""
    raw = spec.get(*path)
    got = r.sources.get(raw, "") if isinstance(raw, str) else ""
    if got.startswith(f"{source}: "):
        return got.split(" (from ")[0].split(" if_null")[0]
    return ".".join(map(str, path))


def _positions(spec: Spec, r: Resolved, L: int) -> tuple[int, int]:
    """``embedding.positions`` (rows of a learned position table; 0: none) and
    ``embedding.position_offset`` (the row serving position 0).

    Raises:
        SpecError: a count or offset that is not a whole number >= 0, or a context of ``L``
            positions the table does not hold from its offset.
    """
    e = ("embedding",)
    rows = _whole(spec, e + ("positions",), _option(spec, r, e + ("positions",), 0)) or 0
    offset = _whole(spec, e + ("position_offset",), _option(spec, r, e + ("position_offset",), 0)) or 0
    for name, value in (("positions", rows), ("position_offset", offset)):
        if value < 0:
            raise spec.error(e + (name,), f"embedding.{name} is {value}, not a whole number >= 0")
    if rows and L > rows - offset:
        raise spec.error(e + ("positions",), f"a context of {L} positions does not fit the "
                         f"position table's {rows} rows from offset {offset} (at most "
                         f"{max(rows - offset, 0)})")
    return rows, offset


def _sinusoidal(spec: Spec, r: Resolved, rows: int, width: int) -> Sinusoidal | None:
    """``embedding.sinusoidal``: the position table of ``embedding.positions`` rows computed
    (``runtime.blocks.Sinusoidal``), None where the spec has none or its ``enabled`` is
    false (a learned table).

    Raises:
        SpecError: at the option's own line, a sinusoidal table without positions, of odd
            width, a theta or denominator not above 0, a zero_row outside the rows, or an
            ``enabled`` or ``interleaved`` that is not a boolean.
    """
    p = ("embedding", "sinusoidal")
    if spec.get(*p) is None or not _flag_option(spec, r, p + ("enabled",), True):
        return None
    if not rows:
        raise spec.error(p, "a sinusoidal position table needs its rows: embedding.positions")
    if width % 2:
        raise spec.error(p, f"a sinusoidal position table of odd width {width} is not built "
                            "(an even hidden_size)")
    theta = _positive(spec, p + ("theta",), _option(spec, r, p + ("theta",), 10000.0))
    denominator = _option(spec, r, p + ("denominator",), None)
    if denominator is not None:
        denominator = _positive(spec, p + ("denominator",), denominator)
    zero_row = _whole(spec, p + ("zero_row",), _option(spec, r, p + ("zero_row",), None))
    if zero_row is not None and not 0 <= zero_row < rows:
        raise spec.error(p + ("zero_row",), f"zero_row {zero_row} is outside the position "
                                            f"table's rows 0..{rows - 1}")
    return Sinusoidal(theta, denominator, zero_row,
                      _flag_option(spec, r, p + ("interleaved",), False))


def checkpoint_layout(spec: Spec, r: Resolved | None = None
                      ) -> tuple[dict[str, str], tuple[str, ...], tuple[str, ...]]:
    """``checkpoint``'s renames (checkpoint name -> model name, composed in order:
    ``runtime.renames``; a rename's target may be a choice by ``r``'s fields, ``config.chosen``,
    a null one renaming nothing), ``transposed`` (model-name patterns of matrices stored
    ``[in, out]``) and ``unused`` (checkpoint-name patterns of tensors read never).

    Raises:
        SpecError: a rename or pattern that is not well formed, at its own entry; a choice
            without the fields to choose by (``r`` None).
    """
    c = ("checkpoint",)
    renames = {}
    for old, new in (spec.get(*c, "renames", default={}) or {}).items():
        if isinstance(new, dict):
            if r is None:
                raise spec.error(c + ("renames", old), "a rename chosen by the config needs "
                                                       "the config's fields")
            new = chosen(spec, c + ("renames", old), new, r)[0]
        if new is not None:
            renames[old] = new
    for old, new in renames.items():
        try:
            compile_table({old: new})
        except RenameError as e:
            raise spec.error(c + ("renames", old), str(e)) from None
    lists = []
    for key in ("transposed", "unused"):
        patterns = tuple(spec.get(*c, key, default=[]) or [])
        for i, text in enumerate(patterns):
            try:
                Pattern(text)
            except RenameError as e:
                raise spec.error(c + (key, i), f"checkpoint.{key}[{i}]: {e}", value=True) from None
        lists.append(patterns)
    return renames, lists[0], lists[1]


def gguf_layout(spec: Spec) -> GGUFLayout | None:
    """``gguf``: the GGUF files of this spec's family and what llama.cpp's
    converter did to their tensors (``runtime.gguf.Layout``), serving the spec's first
    ``architectures``; None where the spec names none."""
    c = ("gguf",)
    if spec.get(*c) is None:
        return None
    archs = tuple(a for a in spec.get("architectures", default=[]) or [] if isinstance(a, str))
    return GGUFLayout(str(spec.get(*c, "architecture")), archs,
                      _flag(spec, c + ("rope_permuted",), spec.get(*c, "rope_permuted", default=False)),
                      float(_number(spec, c + ("norm_offset",), spec.get(*c, "norm_offset", default=0)) or 0))
