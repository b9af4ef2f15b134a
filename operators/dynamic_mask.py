"""A dynamic attention mask: one value per kv head and key, computed from the key's own
values, ``exp(A * softplus(dt))``, as transformers' DogeAttention (``dt_states``; the
attention operator's ``bias`` adds it to the scores)."""

from __future__ import annotations

import numpy as np

from .base import EPS32, Operator, Tolerance, as64

THRESHOLD = 20.0  # torch's F.softplus: x itself past it (beta 1)


def softplus(x: np.ndarray) -> np.ndarray:
    """``log(1 + exp(x))``, ``x`` itself past ``THRESHOLD``, in ``x``'s dtype, as
    ``torch.nn.functional.softplus`` (beta 1, threshold 20)."""
    return np.where(x > THRESHOLD, x, np.log1p(np.exp(np.minimum(x, THRESHOLD))))


class DynamicMask(Operator):
    """``exp(A * softplus(dt))``: ``dt`` ``(n, kv_heads)`` (``dt_proj`` of each position's
    values), ``A`` ``(kv_heads,)`` learned; output ``(n, kv_heads)``, DogeAttention's
    ``dt_states`` per position (float32, float64 in the reference)."""

    name = "dynamic_mask"

    def shape(self, dt, a):
        if len(dt) != 2 or tuple(a) != (dt[1],):
            raise ValueError(f"dynamic_mask: A {a} is not one per kv head of dt {dt} (n, kv_heads)")
        return dt

    def reference(self, dt, a):
        return np.exp(as64(a) * softplus(as64(dt)))

    def kernel(self, out, dt, a, scratch=None):
        np.copyto(out, softplus(dt))
        out *= a
        np.exp(out, out=out)

    def tolerance(self, dt, a):
        # exp's relative error grows with its argument's size: A * softplus(dt) of order ten
        # at most on drawn weights.
        return Tolerance(atol=0.0, rtol=64 * EPS32)
