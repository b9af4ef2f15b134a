"""Linear projections (``Linear``, torch.nn.Linear's parameters) and how a fused q/k/v
projection's checkpoint lays out its rows (``qkv_rows``, ``fused_qkv``): the layouts the causal
and the encoder attention share.

Not for: what reads the projections (``attention``, ``mlp``).
"""

from __future__ import annotations

import numpy as np

from ..graph import Handle, Recorder
from ..module import Module, Param


QKV_LAYOUTS = ("blocks", "heads", "groups", "shards")


def qkv_rows(layout: str, heads: int, kv_heads: int, head_dim: int, shards: int = 1,
             order: str = "qkv") -> np.ndarray | None:
    """Where a fused q/k/v projection's checkpoint stores each row of the model's ``[q; k;
    v]`` blocks (``Param.rows``: ``model = stored[rows]``), None where it stores them so.

    ``blocks``: ``[q (heads * head_dim); k; v]`` (Phi3Attention; GPT-BigCode's and Falcon's
    multi-query, one kv head). ``heads``: per head ``(heads, 3, head_dim)``, q, k and v of
    each head together (GPTNeoXAttention, PersimmonAttention, FalconAttention without
    multi-query; heads == kv_heads). ``groups``: per kv group ``(kv_heads, heads /
    kv_heads + 2, head_dim)``, the group's query heads then its key and value
    (FalconAttention's ``_split_heads`` under ``new_decoder_architecture``); it is
    ``heads`` with as many groups as heads and ``blocks`` with one. ``shards``: the rows in
    ``shards`` model-parallel blocks, block ``b`` holding the ``b``-th of ``shards`` equal
    pieces of q, k and v (each of its own width) in ``order`` (a permutation of ``qkv``), as
    CodeGenAttention's ``qkv.view(..., mp_num, 3 * local_dim).split(local_dim)`` (mp_num 4,
    order ``qvk``); one shard in order ``qkv`` is ``blocks``.

    Raises:
        ValueError: an unknown layout, ``heads`` with fewer kv heads than heads, or
            ``shards`` with an order other than a permutation of ``qkv`` or a q or k/v
            width that is not a multiple of the shards.
    """
    if layout not in QKV_LAYOUTS:
        raise ValueError(f"qkv_layout {layout!r} is not one of {', '.join(QKV_LAYOUTS)}")
    if layout == "blocks":
        return None
    if layout == "shards":
        return _shard_rows(heads * head_dim, kv_heads * head_dim, shards, order)
    if layout == "heads" and kv_heads != heads:
        raise ValueError(f"qkv_layout heads stores q, k and v of every head together: "
                         f"{heads} heads need as many kv heads, not {kv_heads} (groups "
                         "stores them per kv group)")
    G, R, D = kv_heads, heads // kv_heads, head_dim
    stored = np.arange(G * (R + 2) * D).reshape(G, R + 2, D)
    return np.concatenate([stored[:, :R].reshape(-1), stored[:, R].reshape(-1),
                           stored[:, R + 1].reshape(-1)])


def _shard_rows(q: int, kv: int, shards: int, order: str) -> np.ndarray:
    """``qkv_rows`` of layout ``shards``: q ``q`` rows wide, k and v ``kv`` each."""
    if sorted(order) != ["k", "q", "v"]:
        raise ValueError(f"qkv_order {order!r} is not a permutation of qkv")
    if shards < 1 or q % shards or kv % shards:
        raise ValueError(f"{shards} qkv shards do not split q ({q} rows) and k, v ({kv} rows "
                         "each) into equal pieces")
    width = {"q": q // shards, "k": kv // shards, "v": kv // shards}
    pieces, at = {}, 0
    for b in range(shards):
        for part in order:
            pieces[part, b] = np.arange(at, at + width[part])
            at += width[part]
    return np.concatenate([pieces[part, b] for part in "qkv" for b in range(shards)])


def fused_qkv(in_features: int, o) -> "Linear":
    """One fused q/k/v projection of ``o``'s heads, kv heads and head_dim (``o.bias``), its
    weight's (and bias's) rows read from the checkpoint as ``o.qkv_layout`` stores them
    (``qkv_rows``): the causal and the encoder attention's both."""
    H, G, D = o.heads, o.kv_heads or o.heads, o.head_dim
    proj = Linear(in_features, (H + 2 * G) * D, o.bias)
    rows = qkv_rows(o.qkv_layout, H, G, D, o.qkv_shards, o.qkv_order)
    proj.weight.rows = rows
    if proj.bias is not None:
        proj.bias.rows = rows
    return proj


class Linear(Module):
    """torch.nn.Linear: ``weight`` ``(out, in)``, optional ``bias`` ``(out,)``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        self.weight = Param(out_features, in_features)
        self.bias = Param(out_features) if bias else None

    def __call__(self, rec: Recorder, x: Handle) -> Handle:
        w = rec.hold("param", self.where("weight"), self.weight.array)
        b = None if self.bias is None else rec.hold("param", self.where("bias"), self.bias.array)
        return rec.step("linear", x, w, b, where=self.path)
