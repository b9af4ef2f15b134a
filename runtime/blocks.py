"""The building blocks a model's tree is made of, each recording its steps.

Every block is generic: options (dataclasses) say what it does, never which family it
serves. Semantics follow transformers' ``modeling_llama.py`` (pre-norm decoder layer,
GQA attention, gated MLP) unless an option says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from operators import rope_inv_freq, rope_tables

from .graph import Handle, Recorder
from .module import Module, Param, State


@dataclass(frozen=True)
class NormOptions:
    """``kind``: ``rms`` (RMSNorm); ``plus_one`` scales by ``1 + weight`` (Gemma's)."""

    kind: str = "rms"
    eps: float = 1e-6
    plus_one: bool = False


@dataclass(frozen=True)
class RopeOptions:
    """One RoPE table: ``theta``, transformers' ``rope_scaling`` dict (or None), and the
    rotated width ``rotary_dim`` (head_dim, or less under partial rotary)."""

    theta: float
    rotary_dim: int
    scaling: dict | None = None


@dataclass(frozen=True)
class AttentionOptions:
    """Self-attention of one layer.

    ``heads``/``kv_heads``/``head_dim``: transformers' ``num_attention_heads``,
    ``num_key_value_heads``, ``head_dim``. ``bias``: q/k/v biases; ``o_bias``: the output
    projection's. ``rope``: the name of the RoPE table this layer reads (None: no RoPE).
    ``scale``: the logit scale (None: ``head_dim ** -0.5``). ``window``: transformers'
    ``sliding_window`` (None: full). ``softcap``: attention logit softcap (None: none).
    """

    heads: int
    kv_heads: int
    head_dim: int
    bias: bool = False
    o_bias: bool = False
    rope: str | None = "default"
    scale: float | None = None
    window: int | None = None
    softcap: float | None = None


@dataclass(frozen=True)
class MLPOptions:
    """``kind``: ``gated`` (``down(act(gate(x)) * up(x))``, LlamaMLP); ``act``: a
    ``hidden_act`` name; ``bias`` on every projection."""

    intermediate_size: int
    kind: str = "gated"
    act: str = "silu"
    bias: bool = False


@dataclass(frozen=True)
class LayerOptions:
    """One layer. ``kind``: ``decoder`` (pre-norm: ``x + attn(norm(x))``, then
    ``x + mlp(norm(x))``). ``residual_scale`` multiplies each block's output before its
    residual add (1.0: none)."""

    attention: AttentionOptions
    mlp: MLPOptions
    norm: NormOptions
    kind: str = "decoder"
    residual_scale: float = 1.0


class Linear(Module):
    """torch.nn.Linear: ``weight`` ``(out, in)``, optional ``bias`` ``(out,)``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        self.weight = Param(out_features, in_features)
        self.bias = Param(out_features) if bias else None

    def __call__(self, rec: Recorder, x: Handle) -> Handle:
        w = rec.hold("param", self.where("weight"), self.weight.array)
        b = None if self.bias is None else rec.hold("param", self.where("bias"), self.bias.array)
        return rec.step("linear", x, w, b, where=self.path)


class Embedding(Module):
    """torch.nn.Embedding: ``weight`` ``(vocab, hidden)``, rows times ``scale``."""

    def __init__(self, vocab_size: int, hidden_size: int, scale: float = 1.0):
        self.weight = Param(vocab_size, hidden_size)
        self.scale = scale

    def __call__(self, rec: Recorder, ids: Handle) -> Handle:
        w = rec.hold("param", self.where("weight"), self.weight.array)
        return rec.step("embedding", ids, w, where=self.path, scale=self.scale)


class RMSNorm(Module):
    """RMSNorm over the last axis with ``weight`` ``(hidden,)`` (operators.RMSNorm)."""

    def __init__(self, size: int, options: NormOptions):
        if options.kind != "rms":
            raise ValueError(f"norm kind {options.kind!r}: only 'rms' is built")
        self.weight = Param(size)
        self.options = options

    def __call__(self, rec: Recorder, x: Handle) -> Handle:
        w = rec.hold("param", self.where("weight"), self.weight.array)
        return rec.step("rms_norm", x, w, where=self.path, eps=self.options.eps,
                        plus_one=self.options.plus_one)


class Attention(Module):
    """q/k/v/o projections, RoPE, a KV cache ``(kv_heads, max_seq_len, head_dim)`` each
    for keys and values, and causal attention over it up to the call's last position."""

    def __init__(self, hidden_size: int, o: AttentionOptions, max_seq_len: int):
        if o.heads % o.kv_heads:
            raise ValueError(f"{o.heads} attention heads do not group into {o.kv_heads} kv heads")
        H, G, D = o.heads, o.kv_heads, o.head_dim
        self.q_proj = Linear(hidden_size, H * D, o.bias)
        self.k_proj = Linear(hidden_size, G * D, o.bias)
        self.v_proj = Linear(hidden_size, G * D, o.bias)
        self.o_proj = Linear(H * D, hidden_size, o.o_bias)
        self.options = o
        self.keys = State(G, max_seq_len, D)
        self.values = State(G, max_seq_len, D)

    def __call__(self, rec: Recorder, x: Handle, ropes: dict[str, tuple[Handle, Handle]]) -> Handle:
        o, n = self.options, x.shape[0]
        H, G, D = o.heads, o.kv_heads, o.head_dim
        start = rec.call.start
        q = rec.view(self.q_proj(rec, x), (n, H, D))
        k = rec.view(self.k_proj(rec, x), (n, G, D))
        v = rec.view(self.v_proj(rec, x), (n, G, D))
        if o.rope is not None:
            cos, sin = ropes[o.rope]
            q = rec.step("rope", q, cos, sin, where=self.where("q"), start=start)
            k = rec.step("rope", k, cos, sin, where=self.where("k"), start=start)
        keys = rec.hold("state", self.where("keys"), self.keys.array)
        values = rec.hold("state", self.where("values"), self.values.array)
        rec.step("kv_write", k, keys, where=self.where("keys"), start=start)
        rec.step("kv_write", v, values, where=self.where("values"), start=start)
        a = rec.step("attention", q, keys, values, where=self.path, start=start,
                     scale=o.scale, window=o.window, softcap=o.softcap)
        return self.o_proj(rec, a)


class MLP(Module):
    """The feed-forward block: ``down_proj(act(gate_proj(x)) * up_proj(x))`` (gated)."""

    def __init__(self, hidden_size: int, o: MLPOptions):
        if o.kind != "gated":
            raise ValueError(f"mlp kind {o.kind!r}: only 'gated' is built")
        M = o.intermediate_size
        self.gate_proj = Linear(hidden_size, M, o.bias)
        self.up_proj = Linear(hidden_size, M, o.bias)
        self.down_proj = Linear(M, hidden_size, o.bias)
        self.options = o

    def __call__(self, rec: Recorder, x: Handle) -> Handle:
        g = self.gate_proj(rec, x)
        u = self.up_proj(rec, x)
        h = rec.step("gated_activation", g, u, where=self.path, act=self.options.act)
        return self.down_proj(rec, h)


class DecoderLayer(Module):
    """A pre-norm decoder layer, as transformers' LlamaDecoderLayer."""

    def __init__(self, hidden_size: int, o: LayerOptions, max_seq_len: int):
        if o.kind != "decoder":
            raise ValueError(f"layer kind {o.kind!r}: only 'decoder' is built")
        self.input_layernorm = RMSNorm(hidden_size, o.norm)
        self.self_attn = Attention(hidden_size, o.attention, max_seq_len)
        self.post_attention_layernorm = RMSNorm(hidden_size, o.norm)
        self.mlp = MLP(hidden_size, o.mlp)
        self.options = o

    def __call__(self, rec: Recorder, x: Handle, ropes) -> Handle:
        scale = self.options.residual_scale
        a = self.self_attn(rec, self.input_layernorm(rec, x), ropes)
        x = rec.step("add", x, a, where=self.path, scale=scale)
        m = self.mlp(rec, self.post_attention_layernorm(rec, x))
        return rec.step("add", x, m, where=self.path, scale=scale)


def rope_table(o: RopeOptions, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """The cos and sin tables ``(positions, rotary_dim // 2)`` of ``o``."""
    inv, factor = rope_inv_freq(o.rotary_dim, o.theta, o.scaling)
    return rope_tables(inv, positions, factor)
