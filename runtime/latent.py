"""Multi-head latent attention (MLA): queries from a low-rank projection (or a direct one),
keys and values expanded from one compressed latent, and a RoPE part of every head apart
from the rest, as transformers' DeepseekV2Attention and MiniCPM3Attention.

The KV cache holds the keys and values expanded per head (``(heads, capacity,
qk_head_dim)`` and ``(heads, capacity, v_head_dim)``), not the compressed latent: the
latent cache's saving (``kv_lora_rank + qk_rope_head_dim`` values a position) is not built.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .blocks.attention import Attention, AttentionOptions
from .blocks.norms import Norm, NormOptions
from .blocks.projections import Linear
from .blocks.rope import QUERIES
from .graph import Handle, Recorder
from .module import State


@dataclass(frozen=True)
class LatentOptions:
    """The latent projections' widths, transformers' config names: ``q_lora_rank`` (None:
    one ``q_proj``), ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim`` (the
    columns of each head RoPE turns; their table's ``rotary_dim``), ``v_head_dim``; ``eps``
    of the ``q_a_layernorm`` and ``kv_a_layernorm`` RMSNorms (DeepseekV2RMSNorm's default
    1e-6, whatever the layer norms' eps)."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    eps: float = 1e-6


def rope_first(heads: int, nope: int, rope: int) -> np.ndarray:
    """The stored row of each model row of a query projection: each head's ``[nope | rope]``
    columns as ``[rope | nope]``, so RoPE turns each head's first ``rope`` columns (the
    partial rotary the rope operator runs). Attention reads only q.k, and the keys are
    joined in that order too, so the scores are transformers' own."""
    D = nope + rope
    per = np.concatenate([np.arange(nope, D), np.arange(nope)])
    return (np.arange(heads)[:, None] * D + per[None, :]).reshape(-1)


def keys_then_values(heads: int, nope: int, v: int) -> np.ndarray:
    """The stored row of each model row of ``kv_b_proj``: stored per head ``[k_nope | v]``
    (DeepseekV2Attention's ``expand_kv`` view), held as every head's k_nope then every
    head's v, so each is one run of columns."""
    base = np.arange(heads)[:, None] * (nope + v)
    return np.concatenate([(base + np.arange(nope)).reshape(-1),
                           (base + nope + np.arange(v)).reshape(-1)])


class LatentAttention(Attention):
    """MLA over a KV cache of expanded keys and values (``o.latent``: ``LatentOptions``).

    Params (transformers' names): ``q_proj`` ``(heads * qk_head_dim, hidden)`` where
    ``q_lora_rank`` is None, else ``q_a_proj`` ``(q_lora_rank, hidden)`` (bias with
    ``o.bias``), ``q_a_layernorm``, ``q_b_proj`` ``(heads * qk_head_dim, q_lora_rank)``;
    ``kv_a_proj_with_mqa`` ``(kv_lora_rank + qk_rope_head_dim, hidden)`` (bias with
    ``o.bias``), ``kv_a_layernorm``, ``kv_b_proj`` ``(heads * (qk_nope_head_dim +
    v_head_dim), kv_lora_rank)``; ``o_proj`` ``(hidden, heads * v_head_dim)``. Scores with
    ``o.scale`` (None: ``qk_head_dim ** -0.5``), RoPE by table ``o.rope`` on the queries'
    and the shared key's RoPE part.

    Raises:
        ValueError: ``o.head_dim`` is not qk_nope_head_dim + qk_rope_head_dim, kv heads
            differ from heads, or an option MLA does not take (a window, a q/k norm, a
            fused q/k/v, KV sharing, sinks ...).
    """

    def __init__(self, hidden_size: int, o: AttentionOptions, max_seq_len: int,
                 norm: NormOptions = NormOptions()):
        la = o.latent
        H, Dn, Dr, Dv = o.heads, la.qk_nope_head_dim, la.qk_rope_head_dim, la.v_head_dim
        if o.head_dim != Dn + Dr or o.kv_heads != H:
            raise ValueError(f"latent attention's heads are qk_nope_head_dim + "
                             f"qk_rope_head_dim = {Dn + Dr} wide, {H} of them, and kv heads "
                             f"as many (not head_dim {o.head_dim}, {o.kv_heads} kv heads)")
        others = [name for name, on in (
            ("window", o.window is not None), ("softcap", o.softcap is not None),
            ("qk_norm", o.qk_norm is not None), ("fused_qkv", o.fused_qkv),
            ("v_norm", o.v_norm), ("values_from_keys", o.values_from_keys),
            ("kv_from", o.kv_from is not None), ("clip_qkv", o.clip_qkv is not None),
            ("alibi", o.alibi is not None), ("sinks", o.sinks)) if on]
        if others:
            raise ValueError(f"latent attention is built without {', '.join(others)}")
        D = Dn + Dr
        rms = NormOptions("rms", la.eps)
        if la.q_lora_rank is None:
            self.q_proj = Linear(hidden_size, H * D)
            self.q_proj.weight.rows = rope_first(H, Dn, Dr)
        else:
            self.q_a_proj = Linear(hidden_size, la.q_lora_rank, o.bias)
            self.q_a_layernorm = Norm(la.q_lora_rank, rms)
            self.q_b_proj = Linear(la.q_lora_rank, H * D)
            self.q_b_proj.weight.rows = rope_first(H, Dn, Dr)
        self.kv_a_proj_with_mqa = Linear(hidden_size, la.kv_lora_rank + Dr, o.bias)
        self.kv_a_layernorm = Norm(la.kv_lora_rank, rms)
        self.kv_b_proj = Linear(la.kv_lora_rank, H * (Dn + Dv))
        self.kv_b_proj.weight.rows = keys_then_values(H, Dn, Dv)
        self.o_proj = Linear(H * Dv, hidden_size, o.o_bias)
        self.options = o
        self.keys = State(H, max_seq_len, D, axis=1, initial=0, kv=True)
        self.values = State(H, max_seq_len, Dv, axis=1, initial=0, kv=True)

    def packs(self):
        return []

    def __call__(self, rec: Recorder, x: Handle, ropes: dict[str, tuple[Handle, Handle]]) -> Handle:
        o, la, n = self.options, self.options.latent, x.shape[0]
        H, Dn, Dr, Dv = o.heads, la.qk_nope_head_dim, la.qk_rope_head_dim, la.v_head_dim
        start = rec.call.start
        if la.q_lora_rank is None:
            q = self.q_proj(rec, x)
        else:
            q = self.q_b_proj(rec, self.q_a_layernorm(rec, self.q_a_proj(rec, x)))
        q = rec.view(q, (n, H, Dn + Dr))
        latent = self.kv_a_proj_with_mqa(rec, x)
        R = la.kv_lora_rank
        kv = rec.step("columns", latent, where=self.where("kv_a"), begin=0, end=R)
        k_rot = rec.view(rec.step("columns", latent, where=self.where("k_rot"), begin=R,
                                  end=R + Dr), (n, 1, Dr))
        kv = self.kv_b_proj(rec, self.kv_a_layernorm(rec, kv))
        k_nope = rec.view(rec.step("columns", kv, where=self.where("k_nope"), begin=0,
                                   end=H * Dn), (n, H, Dn))
        v = rec.view(rec.step("columns", kv, where=self.where("v"), begin=H * Dn,
                              end=H * (Dn + Dv)), (n, H, Dv))
        if o.rope is not None:
            cos, sin = ropes[o.rope]
            k_rot = rec.step("rope", k_rot, cos, sin, where=self.where("k"), start=start,
                             interleaved=o.rope_interleaved)
            qcos, qsin = ropes.get(o.rope + QUERIES, (cos, sin))
            q = rec.step("rope", q, qcos, qsin, where=self.where("q"), start=start,
                         interleaved=o.rope_interleaved)
        k = rec.step("join_heads", k_rot, k_nope, where=self.where("k"))
        keys = rec.state(self.where("keys"), self.keys)
        values = rec.state(self.where("values"), self.values)
        rec.step("kv_write", k, keys, where=self.where("keys"), start=start, ring=None)
        rec.step("kv_write", v, values, where=self.where("values"), start=start, ring=None)
        return self._attend(rec, q, self.keys, self.values)
