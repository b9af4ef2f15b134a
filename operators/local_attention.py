"""Local self-attention with relative position logits and a logit softcap, over a call's own
rows: each row sees the keys within a fixed reach behind and ahead of it.

As transformers' Gemma4AudioAttention (the Universal Speech Model's conformer attention,
models/gemma4/modeling_gemma4.py) computes it blockwise: queries in chunks of
``attention_chunk_size``, each chunk's keys the context around it, the relative logits
``matrix_bd`` shifted into place (Transformer-XL's ``_rel_shift``), the sum soft-capped, and
every key outside the sliding window (``sliding_window_mask_function``) or past the sequence
masked. The chunks shape how transformers computes, not what: every key a row's window holds
lies within its chunk's context, so a row's logits are its window's alone, written here by
distance.

Not for: attention over every row (``self_attention``), over a cache (``attention``), a
learned bias by bucket (``relative``).
"""

from __future__ import annotations

import numpy as np

from .base import EPS32, Operator, Tolerance, as64


def _window(n: int, behind: int, ahead: int) -> tuple[np.ndarray, np.ndarray]:
    """The distances ``d`` (query row minus key row) of the window, ``behind`` down to
    ``-ahead``, and ``(n, len(d))`` bool: the keys within the rows."""
    d = np.arange(behind, -ahead - 1, -1)
    j = np.arange(n)[:, None] - d[None, :]
    return d, (j >= 0) & (j < n)


class LocalAttention(Operator):
    """``q``, ``k``, ``v`` ``(n, heads, head_dim)`` and ``rel`` ``(P, heads, head_dim)`` give
    ``(n, heads * head_dim)``: row ``i`` of head ``h`` attends to the rows ``j`` with ``-ahead
    <= i - j <= behind`` (and ``0 <= j < n``) by the logits

        ``cap * tanh((q_i . k_j + q_i . rel[origin - (i - j)]) / cap)``

    the relative term 0 where ``origin - (i - j)`` lies outside ``0 .. P - 1``, the softcap
    none where ``cap`` is None; softmax over the window, then the values. No scale: the
    caller scales ``q`` and ``k`` (Gemma4AudioAttention's ``q_scale`` and per-dimension
    softplus, its ``k_scale``). Softmax in float32 (float64 in the reference).

    Gemma4AudioAttention's window: ``behind = attention_context_left - 2``, ``ahead =
    attention_context_right - 1`` (0 where it is 0: the row itself is ``behind``'s), ``origin
    = attention_context_left - 1``, ``rel`` its ``relative_k_proj`` of the sinusoidal table.

    Raises (``shape``):
        ValueError: shapes that do not meet, or a window holding no key (``-ahead > behind``).
    """

    name = "local_attention"

    def shape(self, q, k, v, rel, behind=0, ahead=0, origin=0, cap=None):
        if len(q) != 3 or q != k or k != v or len(rel) != 3 or tuple(rel[1:]) != tuple(q[1:]):
            raise ValueError(f"local_attention: q {q}, k {k}, v {v} (n, heads, head_dim) and "
                             f"rel {rel} (P, heads, head_dim) do not meet")
        if -ahead > behind:
            raise ValueError(f"local_attention: a window from {ahead} rows ahead to {behind} "
                             "behind holds no key")
        if cap is not None and not cap > 0:
            raise ValueError(f"local_attention: a softcap of {cap} is not above 0")
        return (q[0], q[1] * q[2])

    def reference(self, q, k, v, rel, behind=0, ahead=0, origin=0, cap=None):
        n, H, D = q.shape
        P = rel.shape[0]
        q, k, v, rel = as64(q), as64(k), as64(v), as64(rel)
        i = np.arange(n)
        dist = i[:, None] - i[None, :]  # (n, n): query minus key
        s = np.einsum("ihd,jhd->hij", q, k)
        row = origin - dist
        inside = (row >= 0) & (row < P)
        bd = np.einsum("ihd,phd->hip", q, rel)  # (H, n, P)
        s += np.where(inside[None], np.take_along_axis(
            bd, np.broadcast_to(np.clip(row, 0, P - 1)[None], (H, n, n)), axis=2), 0.0)
        if cap is not None:
            s = cap * np.tanh(s / cap)
        s[:, (dist > behind) | (dist < -ahead)] = -np.inf
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        return np.einsum("hij,jhd->ihd", p, v).reshape(n, H * D)

    def kernel(self, out, q, k, v, rel, scratch=None, behind=0, ahead=0, origin=0, cap=None):
        # By distance: the window's W keys of every row at once, each distance a shifted
        # product of the rows (a window of a dozen keys: W passes over q and k, no n x n).
        n, H, D = q.shape
        P = rel.shape[0]
        d, valid = _window(n, behind, ahead)
        W = d.size
        s = scratch[: H * n * W].reshape(H, n, W)
        # The relative logits of every row against every table row: one GEMM per head.
        bd = np.matmul(q.transpose(1, 0, 2), rel.transpose(1, 2, 0))  # (H, n, P)
        s[...] = -np.inf
        for w, dist in enumerate(d):
            a, b = max(0, int(dist)), min(n, n + int(dist))
            if a >= b:
                continue
            s[:, a:b, w] = np.einsum("ihd,ihd->hi", q[a:b], k[a - dist: b - dist])
            r = origin - dist
            if 0 <= r < P:
                s[:, a:b, w] += bd[:, a:b, r]
        if cap is not None:
            c = np.float32(cap)
            live = s[:, valid]
            s[:, valid] = np.tanh(live / c) * c
        s -= s.max(-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(-1, keepdims=True)
        o = out.reshape(n, H, D)
        o[...] = 0.0
        for w, dist in enumerate(d):
            a, b = max(0, int(dist)), min(n, n + int(dist))
            if a < b:
                o[a:b] += s[:, a:b, w].T[:, :, None] * v[a - dist: b - dist]

    def scratch(self, q, k, v, rel, behind=0, ahead=0, origin=0, cap=None):
        return q[1] * q[0] * (behind + ahead + 1)

    def tolerance(self, q, k, v, rel, behind=0, ahead=0, origin=0, cap=None):
        return Tolerance(atol=1e-6, rtol=max(16.0, q[2] / 4) * EPS32)

    def scale(self, reference, q, k, v, rel, behind=0, ahead=0, origin=0, cap=None):
        # A convex combination of values: bounded by the largest |value| of its head.
        n, H, D = q.shape
        vmax = np.abs(as64(v)).max(axis=(0, 2))  # (H,)
        return np.broadcast_to(vmax[None, :, None], (n, H, D)).reshape(n, H * D) \
            + np.abs(reference)
