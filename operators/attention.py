"""Scaled dot-product attention over a KV cache, with grouped-query heads (GQA).

A cache holds ``(kv_heads, max_seq_len, head_dim)`` per layer, head-major so each kv head's
keys are one contiguous block; a call reads it only up to its last position.
"""

from __future__ import annotations

import numpy as np

from . import native
from .base import EPS32, Operator, Tolerance, as64


class KVWrite(Operator):
    """Write ``x`` ``(n, kv_heads, head_dim)`` into ``cache`` ``(kv_heads, L, head_dim)`` at
    positions ``start .. start + n``; the cache, written in place, is the output.
    """

    name = "kv_write"
    writes = 1

    def shape(self, x, cache, start=0):
        if len(x) != 3 or len(cache) != 3 or (x[1], x[2]) != (cache[0], cache[2]):
            raise ValueError(f"kv_write: x {x} does not fit cache {cache}")
        return cache

    def reference(self, x, cache, start=0):
        # A float64 cache is written where it is (the reference's own, no copy per step).
        out = np.asarray(cache, np.float64)
        out[:, start:start + x.shape[0]] = as64(x).transpose(1, 0, 2)
        return out

    def kernel(self, out, x, cache, scratch=None, start=0):
        cache[:, start:start + x.shape[0]] = x.transpose(1, 0, 2)

    def tolerance(self, x, cache, start=0):
        return Tolerance(atol=0.0, rtol=0.0)


LONG = 512  # positions from which one query's attention runs a GEMV per head
BLOCK = 64  # rows of a prompt chunk whose scores are taken at once


def _softcap(s: np.ndarray, cap: float) -> None:
    """``tanh(s / cap) * cap`` in place (Gemma 2's attention logit softcapping)."""
    s /= np.float32(cap)
    np.tanh(s, out=s)
    s *= np.float32(cap)


def _softmax_numerators(s: np.ndarray, total: np.ndarray) -> None:
    """``exp(s - max)`` in place over the last axis, its sum into ``total``. The softmax's
    division is left to the caller, taken after the values' sum: over (rows, head_dim)
    rather than (rows, positions), the same quotient to a rounding."""
    np.maximum.reduce(s, axis=-1, keepdims=True, out=total)
    s -= total
    np.exp(s, out=s)
    np.add.reduce(s, axis=-1, keepdims=True, out=total)


class Attention(Operator):
    """Causal GQA attention of queries at positions ``start .. start + n`` over a cache.

    Inputs: ``q`` ``(n, heads, head_dim)``, ``keys`` and ``values`` ``(kv_heads, L,
    head_dim)``, of which positions ``0 .. start + n - 1`` are read. Query head ``h`` reads kv
    head ``h // (heads // kv_heads)``, as transformers' ``repeat_kv``. Output ``(n, heads *
    head_dim)``. Attributes: ``start``; ``scale`` (default ``head_dim ** -0.5``); ``window``
    (a query sees the ``window`` positions ending at its own, transformers'
    ``sliding_window``; None: all); ``softcap`` (``tanh(s / c) * c`` on the scores; None:
    none). Softmax in float32 (float64 in the reference).
    """

    name = "attention"

    def shape(self, q, keys, values, start=0, scale=None, window=None, softcap=None):
        if len(q) != 3 or keys != values or len(keys) != 3 or q[1] % keys[0] or q[2] != keys[2]:
            raise ValueError(f"attention: q {q} (n, heads, head_dim) does not meet cache {keys}")
        return (q[0], q[1] * q[2])

    def _mask(self, n, start, window, lo=0):
        """Which keys from ``lo`` to the last query's position each of ``n`` queries at
        ``start ..`` sees: ``(n, start + n - lo)`` bool."""
        qpos = np.arange(start, start + n)[:, None]
        kpos = np.arange(lo, start + n)[None, :]
        allowed = kpos <= qpos
        if window is not None:
            allowed &= kpos > qpos - window
        return allowed

    def reference(self, q, keys, values, start=0, scale=None, window=None, softcap=None):
        n, H, D = q.shape
        G = keys.shape[0]
        t = start + n
        scale = D ** -0.5 if scale is None else scale
        k = np.repeat(as64(keys)[:, :t], H // G, axis=0)  # (H, t, D)
        v = np.repeat(as64(values)[:, :t], H // G, axis=0)
        s = np.einsum("nhd,htd->hnt", as64(q), k) * scale
        if softcap is not None:
            s = np.tanh(s / softcap) * softcap
        s = np.where(self._mask(n, start, window)[None], s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        return np.einsum("hnt,htd->nhd", p, v).reshape(n, H * D)

    def kernel(self, out, q, keys, values, scratch=None, start=0, scale=None, window=None,
               softcap=None):
        n, H, D = q.shape
        G = keys.shape[0]
        R = H // G
        scale = np.float32(D ** -0.5 if scale is None else scale)
        lib = native.lib() if n == 1 else None
        if lib is not None and all(a.flags.c_contiguous for a in (out, q, keys, values)):
            # One query (a decode step): the decode pool's threads share its positions.
            lib.attend(out, q, keys, values, scratch, G, start, window or 0, float(scale),
                       float(softcap or 0.0))
            return
        # The queries times the scale, not the scores: n * H * D products, not n * H * w
        # (exact where the scale is a power of two, head_dim ** -0.5 for head_dim 64).
        # Queries are grouped by kv head, then row, (G, n, R, D): a block of rows is one
        # GEMM per kv head, and its output is written over its queries.
        qg = scratch[: H * n * D].reshape(G, n, R, D)
        np.multiply(q.reshape(n, G, R, D).transpose(1, 0, 2, 3), scale, out=qg)
        rest = scratch[H * n * D:]
        if n == 1:
            self._one(qg.reshape(G, R, D), keys, values, rest, start, window, softcap)
        else:
            for i in range(0, n, BLOCK):
                self._block(qg, i, min(n, i + BLOCK), keys, values, rest, start, window, softcap)
        np.copyto(out.reshape(n, G, R, D), qg.transpose(1, 0, 2, 3))

    def _block(self, qg, i0, i1, keys, values, scratch, start, window, softcap):
        """Rows ``i0 .. i1`` of a prompt chunk, in place over their queries. A block reads the
        keys up to its last row's position (no further: causal), from its first row's window
        on, and its scores, at most (heads, BLOCK, positions), stay in a core's L2."""
        G, _, R, D = qg.shape
        nb, hi = i1 - i0, start + i1
        lo = 0 if window is None else max(0, start + i0 - window + 1)
        w = hi - lo
        qb = qg[:, i0:i1].reshape(G, nb * R, D)
        s = scratch[: G * nb * R * w].reshape(G, nb * R, w)
        np.matmul(qb, keys[:, lo:hi].transpose(0, 2, 1), out=s)
        if softcap is not None:
            _softcap(s, softcap)
        # Only the columns some row of the block may not see: its own (causal) and, under a
        # window, those before its last row's window.
        allowed = self._mask(nb, start + i0, window, lo)
        rows = s.reshape(G, nb, R, w)
        causal = start + i0 - lo + 1
        if causal < w:
            np.copyto(rows[..., causal:], np.float32(-np.inf),
                      where=~allowed[:, None, causal:])
        early = 0 if window is None else max(0, hi - window - lo)
        if early > 0:
            np.copyto(rows[..., :early], np.float32(-np.inf), where=~allowed[:, None, :early])
        m = scratch[G * nb * R * w: G * nb * R * (w + 1)].reshape(G, nb * R, 1)
        _softmax_numerators(s, m)
        np.matmul(s, values[:, lo:hi], out=qb)
        qb /= m

    def _one(self, qg, keys, values, scratch, start, window, softcap):
        """One query at ``start`` (a decode step), in place over ``qg`` ``(G, R, D)``: it sees
        every key from its window's first on, so nothing is masked."""
        G, R, D = qg.shape
        t = start + 1
        lo = 0 if window is None else max(0, t - window)
        w = t - lo
        s = scratch[: G * R * w].reshape(G, R, w)
        # A long cache: a GEMV per head reads the keys without the packing copy a small-M
        # GEMM makes (measured 61 us against 99 us for 2000 positions).
        per_head = w >= LONG
        if per_head:
            for g in range(G):
                for r in range(R):
                    np.matmul(keys[g, lo:t], qg[g, r], out=s[g, r])
        else:
            np.matmul(qg, keys[:, lo:t].transpose(0, 2, 1), out=s)
        if softcap is not None:
            _softcap(s, softcap)
        m = scratch[G * R * w: G * R * (w + 1)].reshape(G, R, 1)
        _softmax_numerators(s, m)
        if per_head:
            for g in range(G):
                for r in range(R):
                    np.matmul(s[g, r], values[g, lo:t], out=qg[g, r])
        else:
            np.matmul(s, values[:, lo:t], out=qg)
        qg /= m

    def scratch(self, q, keys, values, start=0, scale=None, window=None, softcap=None):
        n, H, D = q
        G, L = keys[0], keys[1]
        rows = H * min(n, BLOCK)
        own = H * n * D + rows * (L + 1)
        return max(own, native.attend_scratch(H, G, D, L)) if n == 1 else own

    def tolerance(self, q, keys, values, start=0, scale=None, window=None, softcap=None):
        return Tolerance(atol=1e-6, rtol=max(16.0, q[2] / 4) * EPS32)

    def scale(self, reference, q, keys, values, start=0, scale=None, window=None, softcap=None):
        # A convex combination of values: bounded by the largest |value| of its kv head.
        n, H, D = q.shape
        G = keys.shape[0]
        t = start + n
        vmax = np.abs(as64(values)[:, :t]).max(axis=(1, 2))  # (G,)
        return np.broadcast_to(np.repeat(vmax, H // G)[None, :, None], (n, H, D)).reshape(n, H * D) \
            + np.abs(reference)
