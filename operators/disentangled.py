"""Disentangled self-attention: content-to-content scores plus content-to-position and
position-to-content terms read from a relative position table, over a call's own rows.

As transformers' DisentangledSelfAttention (DeBERTa): row ``i``'s score of row ``j`` is
``q_i . k_j`` plus, by the relative distance ``i - j``, ``q_i . pos_key[d]`` (c2p) and
``k_j . pos_query[d]`` (p2c), all scaled by ``1 / sqrt(head_dim * scale_factor)``, where
``d = clamp(span + i - j, 0, 2 * span - 1)`` indexes the projected table of ``2 * span`` rows
(``max_relative_positions`` each side). DeBERTa-v2's log buckets (``position_buckets``)
map a distance past half the buckets onto a log scale first (``log_buckets``).

Not for: a learned bias by bucket (``relative``), decoding over a cache (``attention``).
"""

from __future__ import annotations

import numpy as np

from .base import EPS32, Operator, Tolerance, as64


def log_buckets(distance: np.ndarray, buckets: int, max_position: int) -> np.ndarray:
    """Relative distances (int) mapped onto ``buckets`` log buckets, as DeBERTa-v2's
    ``make_log_bucket_position``: a distance of at most ``mid = buckets // 2`` stays as it
    is; a farther one becomes ``sign * (mid + ceil(log(|d| / mid) / log((max_position - 1) /
    mid) * (mid - 1)))`` (computed in float64)."""
    mid = buckets // 2
    far = np.abs(distance) > mid
    a = np.where(far, np.abs(distance), mid).astype(np.float64)
    log = np.ceil(np.log(a / mid) / np.log((max_position - 1) / mid) * (mid - 1)) + mid
    return np.where(far, np.sign(distance) * log, distance).astype(np.int64)


def relative_rows(n: int, span: int, buckets: int = 0, max_position: int = 0) -> np.ndarray:
    """``(n, n)`` int64: the row of a ``2 * span``-row relative table that query ``i`` and key
    ``j`` read, ``clamp(span + d, 0, 2 * span - 1)`` for ``d = i - j`` (its log bucket where
    ``buckets`` > 0, ``log_buckets``). transformers' DeBERTa slices its table to the ``2 *
    min(n, span)`` rows around the middle and clamps into those; within a call of ``n`` rows
    both pick the same row of the whole table."""
    i = np.arange(n)
    d = i[:, None] - i[None, :]
    if buckets > 0:
        d = log_buckets(d, buckets, max_position)
    return np.clip(span + d, 0, 2 * span - 1)


def disentangled_scores(q, k, pos_key, pos_query, scale: float, span: int, buckets: int = 0,
                        max_position: int = 0):
    """The scores ``(heads, n, n)`` in ``q``'s dtype: ``q`` (its bias added) and ``k`` ``(n,
    heads, head_dim)``, ``pos_key`` and ``pos_query`` ``(2 * span, heads, head_dim)`` or None
    (no c2p, no p2c term)."""
    n = q.shape[0]
    qs = q * q.dtype.type(scale)
    s = np.einsum("nhd,thd->hnt", qs, k)
    rows = relative_rows(n, span, buckets, max_position)
    if pos_key is not None:
        c2p = np.einsum("nhd,rhd->hnr", qs, pos_key)  # (H, n, 2 span)
        s += np.take_along_axis(c2p, np.broadcast_to(rows, (q.shape[1], n, n)), axis=2)
    if pos_query is not None:
        p2c = np.einsum("nhd,rhd->hnr", k, pos_query * q.dtype.type(scale))  # by key row
        # Key j's term for query i reads p2c[j, rows[i, j]]: gather by key row, transposed.
        s += np.take_along_axis(p2c, np.broadcast_to(rows.T, (q.shape[1], n, n)),
                                axis=2).transpose(0, 2, 1)
    return s


def _biased(x: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """``x`` ``(n, heads, head_dim)`` plus ``bias`` ``(heads * head_dim,)`` on every row."""
    return x if bias is None else x + bias.reshape(1, x.shape[1], x.shape[2])


class DisentangledAttention(Operator):
    """Disentangled self-attention of ``q``, ``k``, ``v`` ``(n, heads, head_dim)``, all ``n``
    rows seeing all ``n``; output ``(n, heads * head_dim)``. Inputs ``q_bias`` and ``v_bias``
    ``(heads * head_dim,)`` (None: none) are added to every query and value row first, as
    DisentangledSelfAttention's ``q_bias``/``v_bias`` beside a bias-free ``in_proj``. Inputs
    ``pos_key`` and
    ``pos_query`` ``(2 * span, heads, head_dim)``: the relative table projected by
    ``pos_proj`` and ``pos_q_proj`` (None: no c2p term, no p2c term). Attributes ``scale``
    (``1 / sqrt(head_dim * (1 + len(pos_att_type)))``, DisentangledSelfAttention's
    ``scaled_size_sqrt``), ``span`` (``max_relative_positions``; DeBERTa-v2's
    ``position_buckets`` where set), ``buckets`` and ``max_position`` (log buckets, 0:
    none). Softmax in float32
    (float64 in the reference), as transformers' in the model's dtype.
    """

    name = "disentangled_attention"

    def shape(self, q, k, v, q_bias=None, v_bias=None, pos_key=None, pos_query=None,
              scale=1.0, span=1, buckets=0, max_position=0):
        if len(q) != 3 or q != k or k != v:
            raise ValueError(f"disentangled_attention: q {q}, k {k} and v {v} are not one "
                             "(n, heads, head_dim)")
        for name, b in (("q_bias", q_bias), ("v_bias", v_bias)):
            if b is not None and tuple(b) != (q[1] * q[2],):
                raise ValueError(f"disentangled_attention: {name} {b} is not ({q[1] * q[2]},)")
        for name, p in (("pos_key", pos_key), ("pos_query", pos_query)):
            if p is not None and tuple(p) != (2 * span, q[1], q[2]):
                raise ValueError(f"disentangled_attention: {name} {p} is not (2 * span = "
                                 f"{2 * span}, {q[1]}, {q[2]})")
        return (q[0], q[1] * q[2])

    def reference(self, q, k, v, q_bias=None, v_bias=None, pos_key=None, pos_query=None,
                  scale=1.0, span=1, buckets=0, max_position=0):
        n, H, D = q.shape
        q64 = _biased(as64(q), None if q_bias is None else as64(q_bias))
        v64 = _biased(as64(v), None if v_bias is None else as64(v_bias))
        s = disentangled_scores(q64, as64(k), None if pos_key is None else as64(pos_key),
                                None if pos_query is None else as64(pos_query), scale, span,
                                buckets, max_position)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        return np.einsum("hnt,thd->nhd", p, v64).reshape(n, H * D)

    def kernel(self, out, q, k, v, q_bias=None, v_bias=None, pos_key=None, pos_query=None,
               scratch=None, scale=1.0, span=1, buckets=0, max_position=0):
        n, H, D = q.shape
        q, v = _biased(q, q_bias), _biased(v, v_bias)
        s = disentangled_scores(q, k, pos_key, pos_query, scale, span, buckets, max_position)
        s -= s.max(-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(-1, keepdims=True)
        np.copyto(out.reshape(n, H, D), np.matmul(s, v.transpose(1, 0, 2)).transpose(1, 0, 2))

    def tolerance(self, q, k, v, q_bias=None, v_bias=None, pos_key=None, pos_query=None,
                  scale=1.0, span=1, buckets=0, max_position=0):
        return Tolerance(atol=1e-6, rtol=max(16.0, q[2] / 4) * EPS32)

    def scale(self, reference, q, k, v, q_bias=None, v_bias=None, pos_key=None,
              pos_query=None, scale=1.0, span=1, buckets=0, max_position=0):
        # A convex combination of values: bounded by the largest |value| of its head.
        n, H, D = q.shape
        vmax = np.abs(_biased(as64(v), None if v_bias is None else as64(v_bias))).max(axis=(0, 2))
        return np.broadcast_to(vmax[None, :, None], (n, H, D)).reshape(n, H * D) \
            + np.abs(reference)
