"""Landmark (Nystrom) attention: softmax attention approximated through a few landmark
queries and keys, the segment means of the call's rows, and an iterative pseudo-inverse.

As transformers' NystromformerSelfAttention (Xiong et al. 2021): queries and keys each
divided by ``head_dim ** 0.25``; ``landmarks`` landmark queries and keys, the means of
``segment // landmarks`` consecutive rows; ``softmax(q kl^T) pinv(softmax(ql kl^T))
(softmax(ql k^T) v)``, the pseudo-inverse by its ``iterative_inv`` (six steps of
``Z <- Z/4 (13 I - KZ (15 I - KZ (7 I - KZ)))`` from ``Z0 = K^T / max column sum``, that max
taken over every head at once, its ``init_option`` "original"). Where ``landmarks ==
segment`` (config values, not the call's length) it is exact softmax attention instead.
Its ``conv`` over the values is a step of its own (``span_conv.DepthwiseConv`` by head).

Not for: plain attention (``self_attention``), decoding over a KV cache (``attention``).
"""

from __future__ import annotations

import numpy as np

from .base import EPS32, Operator, Tolerance, as64


def _softmax(s: np.ndarray) -> np.ndarray:
    p = np.exp(s - s.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def _pinv(k: np.ndarray, iterations: int) -> np.ndarray:
    """NystromformerSelfAttention.iterative_inv of ``k`` ``(heads, L, L)`` (a softmax's rows:
    positive, summing to 1), in ``k``'s dtype."""
    eye = np.eye(k.shape[-1], dtype=k.dtype)
    # One scalar for every head: torch.max over the whole (batch, heads, L) of column sums.
    z = (1 / k.sum(axis=-2).max()) * k.transpose(0, 2, 1)
    for _ in range(iterations):
        kz = k @ z
        z = (0.25 * z) @ (13 * eye - kz @ (15 * eye - kz @ (7 * eye - kz)))
    return z


def _attend(q, k, v, landmarks, segment, iterations, dtype):
    """The attention of ``q``, ``k``, ``v`` ``(n, heads, head_dim)`` in ``dtype``, ``(n,
    heads * head_dim)``."""
    n, H, D = q.shape
    root = dtype(np.sqrt(np.sqrt(D)))
    qh = np.asarray(q, dtype).transpose(1, 0, 2) / root  # (H, n, D)
    kh = np.asarray(k, dtype).transpose(1, 0, 2) / root
    vh = np.asarray(v, dtype).transpose(1, 0, 2)
    if landmarks == segment:
        out = _softmax(qh @ kh.transpose(0, 2, 1)) @ vh
    else:
        ql = qh.reshape(H, landmarks, n // landmarks, D).mean(axis=2)
        kl = kh.reshape(H, landmarks, n // landmarks, D).mean(axis=2)
        k1 = _softmax(qh @ kl.transpose(0, 2, 1))
        k2 = _softmax(ql @ kl.transpose(0, 2, 1))
        k3 = _softmax(ql @ kh.transpose(0, 2, 1))
        out = (k1 @ _pinv(k2, iterations)) @ (k3 @ vh)
    return out.transpose(1, 0, 2).reshape(n, H * D)


def landmark_rows(landmarks: int, segment: int) -> int | None:
    """The rows every call must hold: ``segment`` where the attention is approximated
    (``landmarks != segment``: the segment means reshape exactly ``segment`` rows), else None
    (exact attention takes any)."""
    return None if landmarks == segment else segment


class LandmarkAttention(Operator):
    """Landmark attention of ``q``, ``k``, ``v`` ``(n, heads, head_dim)``, output ``(n, heads
    * head_dim)``. Attributes ``landmarks``, ``segment`` (NystromformerConfig's
    ``num_landmarks``, ``segment_means_seq_len``) and ``iterations`` (the pseudo-inverse's,
    6 in transformers). Softmaxes and products in float32 (float64 in the reference), in
    transformers' order.

    Raises:
        ValueError: shapes that do not meet, no kv head per query head, ``segment`` that
            does not split into ``landmarks`` segments, or (approximated) a call of other
            than ``segment`` rows.
    """

    name = "landmark_attention"

    def shape(self, q, k, v, landmarks=1, segment=1, iterations=6):
        if len(q) != 3 or q != k or k != v:
            raise ValueError(f"landmark_attention: q {q}, k {k} and v {v} are not one (n, "
                             "heads, head_dim), a key head per query head")
        if landmarks < 1 or segment % landmarks or iterations < 0:
            raise ValueError(f"landmark_attention: {segment} rows do not split into "
                             f"{landmarks} landmark segments (or {iterations} iterations)")
        return (q[0], q[1] * q[2])

    @staticmethod
    def _rows(n: int, landmarks: int, segment: int) -> None:
        need = landmark_rows(landmarks, segment)
        if need is not None and n != need:
            raise ValueError(f"landmark attention over {landmarks} segment means takes "
                             f"exactly {need} rows (segment_means_seq_len), not {n}")

    def reference(self, q, k, v, landmarks=1, segment=1, iterations=6):
        self._rows(q.shape[0], landmarks, segment)
        return _attend(q, k, v, landmarks, segment, iterations, np.float64)

    def kernel(self, out, q, k, v, scratch=None, landmarks=1, segment=1, iterations=6):
        self._rows(q.shape[0], landmarks, segment)
        np.copyto(out, _attend(q, k, v, landmarks, segment, iterations, np.float32))

    def tolerance(self, q, k, v, landmarks=1, segment=1, iterations=6):
        # The pseudo-inverse's iterations each multiply three products: float32's rounding
        # grows with them (measured on the toy: below 64 ulps of the values' scale).
        return Tolerance(atol=1e-6, rtol=(64 + 16 * iterations) * EPS32)

    def scale(self, reference, q, k, v, landmarks=1, segment=1, iterations=6):
        # The values' largest magnitude per head: the output mixes them (the weights of a
        # softmax times an approximate inverse: near a convex mix).
        n, H, D = q.shape
        vmax = np.abs(as64(v)).max(axis=(0, 2))
        return np.broadcast_to(vmax[None, :, None], (n, H, D)).reshape(n, H * D) \
            + np.abs(reference)
