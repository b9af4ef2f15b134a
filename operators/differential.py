"""Differential attention: two softmax maps of one query, the second subtracted with a
learned weight, over paired values (Ye et al. 2024, "Differential Transformer").

Run by the numpy kernels only: the C decode pool has no second map, so ``lower`` gives no
native step (the plan calls ``kernel``). Not the head norm that follows it (an RMSNorm
over each pair's doubled width: ``RMSNorm``).
"""

from __future__ import annotations

import numpy as np

from .attention import Attention, rows_of
from .base import EPS32, Operator, Tolerance, as64

_ATTENTION = Attention()


def _paired(values: np.ndarray, lo: int, t: int, ring: int | None) -> np.ndarray:
    """Positions ``lo .. t`` of ``values`` ``(G, capacity, D)`` paired ``(G, t - lo, 2 D)``:
    kv head ``g`` holds heads ``g mod G/2`` and ``G/2 + g mod G/2`` side by side, as
    transformers' DiffLlamaAttention's ``torch.chunk(value_states, 2, dim=1)`` halves each
    ``repeat(1, 2, 1, 1)``'d and the two calls' outputs joined on the last axis."""
    G = values.shape[0]
    held = values[:, rows_of(lo, t - lo, ring)]
    half = np.concatenate([held[: G // 2], held[G // 2:]], axis=-1)
    return np.concatenate([half, half])


def lambda_full(lq1, lk1, lq2, lk2, lambda_init: float, dtype=np.float64) -> float:
    """``exp(sum(lq1 * lk1)) - exp(sum(lq2 * lk2)) + lambda_init`` in ``dtype``: the second
    map's weight, DiffLlamaAttention's ``lambda_full`` (float32: its products summed and
    exponentiated in float32, as its ``torch.sum(..., dtype=torch.float32)``)."""
    a = np.sum((lq1.astype(dtype) * lk1.astype(dtype)).astype(dtype), dtype=dtype)
    b = np.sum((lq2.astype(dtype) * lk2.astype(dtype)).astype(dtype), dtype=dtype)
    return dtype(np.exp(a, dtype=dtype) - np.exp(b, dtype=dtype) + dtype(lambda_init))


class DifferentialAttention(Operator):
    """Causal GQA differential attention of queries at ``start .. start + n`` over a cache.

    Inputs: ``q`` ``(n, heads, head_dim)``, ``keys`` and ``values`` ``(kv_heads, capacity,
    head_dim)`` (read as ``Attention`` reads them: positions up to the last query's, rows
    ``p % ring`` with ``ring``, a ``window``), and the four learned vectors ``lambda_q1``,
    ``lambda_k1``, ``lambda_q2``, ``lambda_k2`` ``(head_dim,)``. Output ``(n, heads / 2, 2
    head_dim)``: for pair ``j < heads / 2``, ``P_j V_j - lam * P_{j + heads/2} V_j``, where
    ``P_h`` is head ``h``'s softmax map (``scale``, default ``head_dim ** -0.5``; float32,
    float64 in the reference), ``V_j`` the values of kv heads ``g`` and ``g + kv_heads /
    2`` side by side (``g`` the kv head query head ``j`` reads) and ``lam`` ``lambda_full``
    of the four vectors and ``lambda_init``: transformers' DiffLlamaAttention before its
    ``groupnorm``.
    """

    name = "differential_attention"

    def shape(self, q, keys, values, lq1, lk1, lq2, lk2, start=0, scale=None, window=None,
              ring=None, lambda_init=0.0):
        n, H, D = q if len(q) == 3 else (None, None, None)
        if H is None or H % 2 or keys[0] % 2:
            raise ValueError(f"differential_attention: q {q} and cache {keys} do not pair "
                             "heads: an even number of heads and of kv heads")
        if values[2] != D or any(tuple(v) != (D,) for v in (lq1, lk1, lq2, lk2)):
            raise ValueError(f"differential_attention: values {values} and lambda vectors "
                             f"{lq1}, {lk1}, {lq2}, {lk2} are not of head_dim {D}")
        _ATTENTION.shape(q, keys, values, start=start, scale=scale, window=window, ring=ring)
        return (n, H // 2, 2 * D)

    def _held(self, n, start, ring):
        t = start + n
        return (0 if ring is None else max(0, t - ring)), t

    def reference(self, q, keys, values, lq1, lk1, lq2, lk2, start=0, scale=None,
                  window=None, ring=None, lambda_init=0.0):
        n, H, D = q.shape
        lo, t = self._held(n, start, ring)
        pairs = _paired(as64(values), lo, t, ring)
        # The paired span holds positions lo .. t as rows 0 ..: keys taken so too.
        keys = as64(keys)[:, rows_of(lo, t - lo, ring)]
        both = self._both(q, keys, pairs, start - lo, scale, window)
        lam = lambda_full(*(as64(v) for v in (lq1, lk1, lq2, lk2)), lambda_init)
        return both[:, : H // 2] - lam * both[:, H // 2:]

    @staticmethod
    def _both(q, keys, pairs, start, scale, window):
        """Every head's output over the paired values, ``(n, H, 2 D)`` (the reference's
        float64 ``Attention``)."""
        n, H, D = q.shape
        return _ATTENTION.reference(as64(q), keys, pairs, start=start, scale=scale,
                                    window=window).reshape(n, H, 2 * D)

    def kernel(self, out, q, keys, values, lq1, lk1, lq2, lk2, scratch=None, start=0,
               scale=None, window=None, ring=None, lambda_init=0.0):
        n, H, D = q.shape
        G = keys.shape[0]
        lo, t = self._held(n, start, ring)
        w = t - lo
        pairs = scratch[: G * w * 2 * D].reshape(G, w, 2 * D)
        rows = slice(lo, t) if ring is None else rows_of(lo, w, ring)
        for g in range(G):
            pairs[g, :, :D] = values[g % (G // 2), rows]
            pairs[g, :, D:] = values[G // 2 + g % (G // 2), rows]
        # A ring's span in order (a copy of its keys, as Attention's own _span makes).
        k = keys[:, :t] if ring is None else keys[:, rows]
        both = scratch[G * w * 2 * D: G * w * 2 * D + n * H * 2 * D].reshape(n, H * 2 * D)
        rest = scratch[G * w * 2 * D + n * H * 2 * D:]
        _ATTENTION.kernel(both, q, k, pairs, scratch=rest, start=start - lo, scale=scale,
                          window=window)
        both = both.reshape(n, H, 2 * D)
        lam = lambda_full(lq1, lk1, lq2, lk2, lambda_init, np.float32)
        np.multiply(both[:, H // 2:], lam, out=out)
        np.subtract(both[:, : H // 2], out, out=out)

    def scratch(self, q, keys, values, lq1, lk1, lq2, lk2, start=0, scale=None, window=None,
                ring=None, lambda_init=0.0):
        n, H, D = q
        G, L = keys[0], keys[1]
        # The paired values and every head's output over them, then attention's own scratch
        # over keys and values of the span held (at most the capacity).
        return G * L * 2 * D + n * H * 2 * D + _ATTENTION.scratch(
            q, keys, (G, L, 2 * D), start=start, scale=scale, window=window)

    def tolerance(self, q, keys, values, *vectors, start=0, scale=None, window=None, ring=None,
                  lambda_init=0.0):
        return Tolerance(atol=1e-6, rtol=max(16.0, q[2] / 4) * EPS32)

    def scale(self, reference, q, keys, values, lq1, lk1, lq2, lk2, start=0, scale=None,
              window=None, ring=None, lambda_init=0.0):
        # Two convex combinations of values, the second times lam: bounded by (1 + |lam|)
        # times the largest |value| held.
        lam = lambda_full(*(as64(v) for v in (lq1, lk1, lq2, lk2)), lambda_init)
        vmax = np.abs(as64(values)[:, : start + q.shape[0]]).max()
        return (1 + abs(lam)) * vmax + np.abs(reference)
