"""Sliding-window attention with global tokens: each row sees the rows at most ``window``
away and every global token; a global token's row sees every row through projections of
its own.

As transformers' LongformerSelfAttention with a ``global_attention_mask``: a local row's
scores are its query (divided by ``sqrt(head_dim)`` first) against the keys of the global
tokens and of the non-global rows within the window (a global token inside the window
counts once: LongformerModel removes global tokens from the windowed part), one softmax over
both, over the same rows' values; a global token's row is overwritten by
``softmax(query_global / sqrt(head_dim) . key_global) value_global`` over every row
(``_compute_global_attn_output_from_hidden``). Without global tokens it is the window alone.

Not for: attention without a window (``self_attention``), decoding over a KV cache.
"""

from __future__ import annotations

import numpy as np

from .base import EPS32, Operator, Tolerance, as64


def _softmax_rows(s: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    s = np.where(allowed, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def _attend(q, k, v, qg, kg, vg, marks, window, dtype) -> np.ndarray:
    """``(n, heads * head_dim)`` in ``dtype``, one head at a time (an ``(n, n)`` score
    matrix each)."""
    n, H, D = q.shape
    root = dtype(np.sqrt(D))
    glob = np.asarray(marks) != 0
    i = np.arange(n)
    near = np.abs(i[:, None] - i[None, :]) <= window
    local = (near & ~glob[None, :]) | glob[None, :]
    out = np.empty((n, H, D), dtype)
    for h in range(H):
        qh = np.asarray(q[:, h], dtype) / root
        out[:, h] = _softmax_rows(qh @ np.asarray(k[:, h], dtype).T, local) \
            @ np.asarray(v[:, h], dtype)
        if glob.any():
            qgh = np.asarray(qg[glob, h], dtype) / root
            every = np.ones((qgh.shape[0], n), bool)
            out[glob, h] = _softmax_rows(qgh @ np.asarray(kg[:, h], dtype).T, every) \
                @ np.asarray(vg[:, h], dtype)
    return out.reshape(n, H * D)


class GlobalWindowAttention(Operator):
    """Sliding-window attention of ``q``, ``k``, ``v`` ``(n, heads, head_dim)`` with global
    tokens ``marks`` ``(n,)`` (nonzero: global), whose rows read ``qg``, ``kg``, ``vg``
    ``(n, heads, head_dim)`` (their ``query_global``, ``key_global``, ``value_global``);
    output ``(n, heads * head_dim)``. Attribute ``window``: the rows each side a local row
    sees. Softmax in float32 (float64 in the reference).

    Raises:
        ValueError: shapes that do not meet (one key head per query head, marks one per
            row), or a window below 1.
    """

    name = "global_window_attention"

    def shape(self, q, k, v, qg, kg, vg, marks, window=1):
        if len(q) != 3 or not q == k == v == qg == kg == vg or marks != (q[0],) or window < 1:
            raise ValueError(f"global_window_attention: q {q}, k {k}, v {v}, qg {qg}, kg {kg}, "
                             f"vg {vg} are not one (n, heads, head_dim), marks {marks} one per "
                             f"row, or the window {window} is below 1")
        return (q[0], q[1] * q[2])

    def reference(self, q, k, v, qg, kg, vg, marks, window=1):
        return _attend(q, k, v, qg, kg, vg, marks, window, np.float64)

    def kernel(self, out, q, k, v, qg, kg, vg, marks, scratch=None, window=1):
        np.copyto(out, _attend(q, k, v, qg, kg, vg, marks, window, np.float32))

    def tolerance(self, q, k, v, qg, kg, vg, marks, window=1):
        return Tolerance(atol=1e-6, rtol=max(16.0, q[2] / 4) * EPS32)

    def scale(self, reference, q, k, v, qg, kg, vg, marks, window=1):
        # A convex combination of values (a global row's, of the global values).
        n, H, D = q.shape
        vmax = np.maximum(np.abs(as64(v)).max(axis=(0, 2)), np.abs(as64(vg)).max(axis=(0, 2)))
        return np.broadcast_to(vmax[None, :, None], (n, H, D)).reshape(n, H * D) \
            + np.abs(reference)
