"""Reading a layer's attention options (``layer/attention``) into
``runtime.blocks.attention.AttentionOptions``: heads and their grouping, q/k norms, fused
q/k/v layouts, sliding windows, ALiBi, latent (MLA) and differential attention, a relative
bias shared by every layer; each error at the option's own line.

Not for: RoPE tables (``rope``), an encoder's attention variants (``encoder``); token mixers
with a recurrent state (convolutions, SSMs, the gated delta rule) each take a module of
their own beside this one.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from iron_spec.operators.attention import alibi_slopes
from iron_spec.runtime.blocks.attention import (PER_HEAD_QK_NORMS, AttentionExpertsOptions,
                                                AttentionOptions, DifferentialOptions)
from iron_spec.runtime.latent import LatentOptions
from iron_spec.runtime.layers import LayerOptions
from iron_spec.runtime.values import MAX_INT

from ..config import Resolved
from ..loader import Spec
from .reading import _ABSENT, LayerReader, _flag, _number, _option, _positive, _whole


# The options of a layer whose token mixer is not attention (``layer.mixer``): nothing of
# them is built or read.
NO_ATTENTION = AttentionOptions(heads=1, kv_heads=1, head_dim=1, rope=None)


def attention_options(spec: Spec, r: Resolved, read: LayerReader) -> AttentionOptions:
    """The attention of a layer (``layer/attention``, per type as ``read`` reads it): its
    RoPE table, q/k norms, heads and the variants' options, each error at the option's own
    line; the heads checked to group into the kv heads, ALiBi's slopes computed."""
    word, opt, number, whole, flag = read.word, read.opt, read.number, read.whole, read.flag

    def _maybe_flag(value, at):
        return None if value is None else _flag(spec, at, value)

    def _clip(value, at):
        return None if value is None else _positive(spec, at, value)

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
        clip_after_norm=flag(*a, "clip_after_norm"),
        qk_norm_bias=_maybe_flag(*opt(*a, "qk_norm_bias")),
        qk_norm_weight=_maybe_flag(*opt(*a, "qk_norm_weight")),
        chunk=_window(spec, *opt(*a, "chunk")), temperature=_temperature(spec, read),
        experts=_experts(spec, read),
        qk_norm_after_rope=flag(*a, "qk_norm_after_rope"), sinks=flag(*a, "sinks"),
        sub_norm=flag(*a, "sub_norm"), dynamic_mask=flag(*a, "dynamic_mask"),
        output_gate=flag(*a, "output_gate"), gate_in_query=flag(*a, "gate_in_query"),
        sees=_sees(spec, *word(*a, "sees", default="own")),
        reach=flag(*a, "reach", default=True),
        latent=_latent(spec, r))
    _qkv_shards(spec, attention, word(*a, "qkv_shards")[1], word(*a, "qkv_order")[1])
    _heads_group(spec, r, attention, word(*a, "heads", default="num_attention_heads"),
                 word(*a, "kv_heads", default="num_key_value_heads"))
    attention = _alibi(spec, attention, *opt(*a, "alibi"), *opt(*a, "alibi_scaled", default=False),
                       *opt(*a, "alibi_bfloat16", default=False))
    if attention.clip_after_norm and attention.qk_norm != "all":
        raise spec.error(opt(*a, "clip_after_norm")[1], "clip_after_norm clamps what the "
                         "whole projections' norms give: it needs qk_norm all (not "
                         f"{attention.qk_norm!r})")
    if (attention.chunk is not None or attention.temperature is not None) and (
            attention.sees != "own" or attention.latent is not None):
        raise spec.error(opt(*a, "chunk" if attention.chunk is not None else "temperature")[1],
                         "attention.chunk and attention.temperature are built for causal "
                         "attention (sees own), not latent attention")
    if attention.qk_norm_after_rope and attention.qk_norm not in PER_HEAD_QK_NORMS:
        raise spec.error(opt(*a, "qk_norm_after_rope")[1], "qk_norm_after_rope norms each "
                         f"turned head: it needs qk_norm one of {', '.join(PER_HEAD_QK_NORMS)} "
                         f"(not {attention.qk_norm!r})")
    return attention


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


def _qkv_shards(spec: Spec, a: AttentionOptions, shards_at: tuple, order_at: tuple) -> None:
    """``attention.qkv_shards`` and ``qkv_order``: the fused rows' model-parallel blocks
    (``runtime.blocks.projections.qkv_rows``, layout ``shards``).

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


def _temperature(spec: Spec, read: LayerReader) -> tuple[float, float] | None:
    """``attention.temperature``: ``(attn_scale, floor_scale)`` of Llama 4's query
    temperature (``runtime.blocks.attention.AttentionOptions``), None where absent or
    ``attention.temperature_on`` is false.

    Raises:
        SpecError: at the option, a mapping without a number for its scale, or a floor not
            above 0.
    """
    t = ("attention", "temperature")
    on = read.flag("attention", "temperature_on", default=True)
    raw, at = read.word(*t)
    if raw is None or not on:
        return None
    if not isinstance(raw, dict):
        raise spec.error(at, "attention.temperature is a mapping {scale, floor}")
    scale, floor = read.number(*t, "scale"), read.number(*t, "floor")
    if scale is None or floor is None or not floor > 0:
        raise spec.error(at, f"attention.temperature's scale {scale} and floor {floor}: "
                             "numbers, the floor above 0 (a config's attn_scale, floor_scale)")
    return (float(scale), float(floor))


def _experts(spec: Spec, read: LayerReader) -> AttentionExpertsOptions | None:
    """``attention.experts``: a mixture of attention heads' ``count`` and ``top_k``
    (``runtime.blocks.attention.AttentionExpertsOptions``, JetMoeMoA), None where absent.

    Raises:
        SpecError: at the option, a count or top_k that is not a whole number >= 1, or a
            top_k above the count.
    """
    t = ("attention", "experts")
    raw, at = read.word(*t)
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise spec.error(at, "attention.experts is a mapping {count, top_k}")
    count, top_k = read.whole(*t, "count"), read.whole(*t, "top_k")
    if count is None or top_k is None or not 1 <= top_k <= count:
        raise spec.error(at, f"attention.experts' count {count} and top_k {top_k}: whole "
                             "numbers, 1 <= top_k <= count")
    return AttentionExpertsOptions(count=count, top_k=top_k)


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


def _differential(spec: Spec, r: Resolved, layers: list[LayerOptions]) -> list[LayerOptions]:
    """``layer.attention.differential``: each layer's differential attention
    (``runtime.blocks.attention.DifferentialOptions``), its ``lambda_init`` ``lambda_base -
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
