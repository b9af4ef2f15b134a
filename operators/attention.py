"""Scaled dot-product attention over a KV cache, with grouped-query heads (GQA).

A cache holds ``(kv_heads, max_seq_len, head_dim)`` per layer, head-major so each kv head's
keys are one contiguous block; a call reads it only up to its last position.
"""

from __future__ import annotations

import numpy as np

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

    def _mask(self, n, start, window):
        t = start + n
        qpos = np.arange(start, t)[:, None]
        kpos = np.arange(t)[None, :]
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
        R, t = H // G, start + n
        # A window reads only the keys the first query can see, not the whole cache.
        lo = 0 if window is None else max(0, start - window + 1)
        w = t - lo
        scale = D ** -0.5 if scale is None else scale
        if n == 1:  # one query row is already grouped by kv head: no regrouping copies
            qg, og = q.reshape(G, R, D), out.reshape(G, R, D)
        else:  # queries regrouped by kv head, (G, R * n, D), so each group is one GEMM
            qg = scratch[: H * n * D].reshape(G, R, n, D)
            np.copyto(qg, q.reshape(n, G, R, D).transpose(1, 2, 0, 3))
            qg = og = qg.reshape(G, R * n, D)
        at = H * n * D
        s = scratch[at: at + H * n * w].reshape(G, R * n, w)
        # One query over a long cache: a GEMV per head reads the keys without the packing
        # copy a small-M GEMM makes (measured 61 us against 99 us for 2000 positions).
        per_head = n == 1 and w >= LONG
        if per_head:
            for g in range(G):
                for r in range(R):
                    np.matmul(keys[g, lo:t], qg[g, r], out=s[g, r])
        else:
            np.matmul(qg, keys[:, lo:t].transpose(0, 2, 1), out=s)
        s *= np.float32(scale)
        if softcap is not None:
            s /= np.float32(softcap)
            np.tanh(s, out=s)
            s *= np.float32(softcap)
        if n > 1:  # one query at the last position sees every key from lo on
            # Only the columns some query may not see: the chunk's own (causal) and, under a
            # window, those before the last query's window.
            first = (start - lo) if window is None else 0
            masked = ~self._mask(n, start, window)[:, lo + first:]
            np.copyto(s.reshape(G, R, n, w)[..., first:], np.float32(-np.inf), where=masked)
        m = scratch[at + H * n * w: at + H * n * w + H * n].reshape(G, R * n, 1)
        np.maximum.reduce(s, axis=-1, keepdims=True, out=m)
        s -= m
        np.exp(s, out=s)
        np.add.reduce(s, axis=-1, keepdims=True, out=m)
        # The softmax's division is taken after the values' sum: over (rows, head_dim)
        # rather than (rows, positions), the same quotient to a rounding.
        if per_head:
            for g in range(G):
                for r in range(R):
                    np.matmul(s[g, r], values[g, lo:t], out=og[g, r])
        else:
            np.matmul(s, values[:, lo:t], out=og)
        og /= m
        if n > 1:
            np.copyto(out.reshape(n, G, R, D), og.reshape(G, R, n, D).transpose(2, 0, 1, 3))

    def scratch(self, q, keys, values, start=0, scale=None, window=None, softcap=None):
        n, H, D = q
        L = keys[1]
        return H * n * D + H * n * L + H * n

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
