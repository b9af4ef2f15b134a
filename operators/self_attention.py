"""Bidirectional self-attention over a call's own rows: no cache, no causal mask.

An encoder's attention: every row of the call attends to every row of the call, and to
nothing else. A compiled plan hands the kernel the call's first ``rows`` rows only, so rows
past them (the compiled capacity's unused tail) are never read.

Not for: decoding over a KV cache (``attention``).
"""

from __future__ import annotations

import numpy as np

from .base import EPS32, Operator, Tolerance, as64
from .relative import relative_bias


def _outside(n: int, window: int) -> np.ndarray:
    """``(n, n)`` bool: the pairs of rows farther apart than ``window``."""
    i = np.arange(n)
    return np.abs(i[:, None] - i[None, :]) > window


class SelfAttention(Operator):
    """Scaled dot-product attention of ``q`` ``(n, heads, head_dim)`` over ``k`` and ``v``
    ``(n, kv_heads, head_dim)``, all ``n`` rows seeing all ``n``; output ``(n, heads *
    head_dim)``.

    Query head ``h`` reads kv head ``h // (heads // kv_heads)``, as transformers'
    ``repeat_kv``. Attribute ``scale``: the logit scale (default ``head_dim ** -0.5``, as
    transformers' ``eager_attention_forward``); ``window``: row ``i`` sees only rows ``j``
    with ``|i - j| <= window`` (None: all), as transformers'
    ``sliding_window_bidirectional_overlay``; ``segments``: the rows cut at these boundaries
    (``(0, b1, ..., n)``, increasing; None: one segment), each row seeing the rows of its own
    segment alone, as transformers' packed attention over ``cu_seqlens`` (a vision tower's
    windows, Qwen2_5_VLVisionAttention's). Softmax in float32 (float64 in the reference).

    A fourth input ``table`` ``(rows, heads)`` (None: none) adds a relative position bias
    to the scaled scores: row ``i``'s score of row ``j`` in head ``h`` gains
    ``table[bucket(j - i), h]`` (``relative.relative_bias`` with attributes ``buckets``,
    ``max_distance``, ``bidirectional``), as MPNetSelfAttention's ``position_bias``.
    """

    name = "self_attention"

    def shape(self, q, k, v, table=None, scale=None, window=None, buckets=32, max_distance=128,
              bidirectional=True, segments=None):
        if len(q) != 3 or len(k) != 3 or k != v or q[0] != k[0] or q[2] != k[2] or q[1] % k[1]:
            raise ValueError(f"self_attention: q {q} (n, heads, head_dim) does not meet k {k} "
                             f"and v {v} (n, kv_heads, head_dim)")
        if table is not None and (len(table) != 2 or table[1] != q[1]):
            raise ValueError(f"self_attention: a relative bias table {table} is not (rows, "
                             f"{q[1]} heads)")
        if segments is not None and (
                table is not None or len(segments) < 2 or segments[0] != 0
                or segments[-1] != q[0] or any(b <= a for a, b in zip(segments, segments[1:]))):
            raise ValueError(f"self_attention: segments {segments} do not cut {q[0]} rows "
                             "from 0 (increasing; not beside a relative bias)")
        return (q[0], q[1] * q[2])

    def reference(self, q, k, v, table=None, scale=None, window=None, buckets=32,
                  max_distance=128, bidirectional=True, segments=None):
        n, H, D = q.shape
        G = k.shape[1]
        scale = D ** -0.5 if scale is None else scale
        kh = np.repeat(as64(k).transpose(1, 0, 2), H // G, axis=0)  # (H, n, D)
        vh = np.repeat(as64(v).transpose(1, 0, 2), H // G, axis=0)
        s = np.einsum("nhd,htd->hnt", as64(q), kh) * scale
        if table is not None:
            s = s + relative_bias(as64(table), n, buckets, max_distance, bidirectional)
        if window is not None:
            s[:, _outside(n, window)] = -np.inf
        if segments is not None:
            seg = np.searchsorted(np.asarray(segments), np.arange(n), side="right")
            s[:, seg[:, None] != seg[None, :]] = -np.inf
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        return np.einsum("hnt,htd->nhd", p, vh).reshape(n, H * D)

    def kernel(self, out, q, k, v, table=None, scratch=None, scale=None, window=None,
               buckets=32, max_distance=128, bidirectional=True, segments=None):
        if segments is not None:
            # Each segment on its own (transformers splits the rows so too), in the same
            # scratch: the work grows with the segments' squares, not the rows'.
            for a, b in zip(segments, segments[1:]):
                self.kernel(out[a:b], q[a:b], k[a:b], v[a:b], None, scratch, scale, window)
            return
        n, H, D = q.shape
        G = k.shape[1]
        R = H // G
        scale = D ** -0.5 if scale is None else scale
        # Head-major copies in scratch, so each kv group is one GEMM: queries (G, R * n, D).
        at = 0
        qg = scratch[at: at + H * n * D].reshape(G, R, n, D)
        np.copyto(qg, q.reshape(n, G, R, D).transpose(1, 2, 0, 3))
        qg = qg.reshape(G, R * n, D)
        at += H * n * D
        kg = scratch[at: at + G * n * D].reshape(G, n, D)
        np.copyto(kg, k.transpose(1, 0, 2))
        at += G * n * D
        vg = scratch[at: at + G * n * D].reshape(G, n, D)
        np.copyto(vg, v.transpose(1, 0, 2))
        at += G * n * D
        s = scratch[at: at + H * n * n].reshape(G, R * n, n)
        at += H * n * n
        m = scratch[at: at + H * n].reshape(G, R * n, 1)
        np.matmul(qg, kg.transpose(0, 2, 1), out=s)
        s *= np.float32(scale)
        if table is not None:
            # The bias (H, n, n) gathered per call: a call's rows are the text's positions.
            bias = relative_bias(table, n, buckets, max_distance, bidirectional)
            s.reshape(G, R, n, n)[...] += bias.reshape(G, R, n, n)
        if window is not None:
            # Row r * n + i of a group's (R * n, n) scores is query row i of its r-th head.
            s.reshape(G, R, n, n)[:, :, _outside(n, window)] = -np.inf
        np.max(s, axis=-1, keepdims=True, out=m)
        s -= m
        np.exp(s, out=s)
        np.sum(s, axis=-1, keepdims=True, out=m)
        s /= m
        o = qg  # the regrouped queries are spent; their room takes the output
        np.matmul(s, vg, out=o)
        np.copyto(out.reshape(n, G, R, D), o.reshape(G, R, n, D).transpose(2, 0, 1, 3))

    def scratch(self, q, k, v, table=None, scale=None, window=None, buckets=32,
              max_distance=128, bidirectional=True, segments=None):
        n, H, D = q
        G = k[1]
        if segments is not None:
            n = max(b - a for a, b in zip(segments, segments[1:]))
        return H * n * D + 2 * G * n * D + H * n * n + H * n

    def tolerance(self, q, k, v, table=None, scale=None, window=None, buckets=32,
                max_distance=128, bidirectional=True, segments=None):
        return Tolerance(atol=1e-6, rtol=max(16.0, q[2] / 4) * EPS32)

    def scale(self, reference, q, k, v, table=None, scale=None, window=None, buckets=32,
              max_distance=128, bidirectional=True, segments=None):
        # A convex combination of values: bounded by the largest |value| of its kv head.
        n, H, D = q.shape
        G = k.shape[1]
        vmax = np.abs(as64(v)).max(axis=(0, 2))  # (G,)
        return np.broadcast_to(np.repeat(vmax, H // G)[None, :, None], (n, H, D)).reshape(n, H * D) \
            + np.abs(reference)
