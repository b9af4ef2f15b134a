"""Normalization over the last axis: RMSNorm (weight or 1 + weight) and LayerNorm."""

from __future__ import annotations

import numpy as np

from . import native
from .base import EPS32, Operator, Tolerance, as64


class RMSNorm(Operator):
    """``x`` ``(n, ..., d)`` and ``weight`` ``(d,)`` give ``x / sqrt(mean(x^2) + eps) * w``
    over the last axis (a q/k norm runs per head on ``(n, heads, head_dim)``, its weight
    ``(head_dim,)``, or ``(heads, head_dim)``: each head its own).

    Attributes: ``eps``; ``plus_one`` scales by ``1 + weight`` instead, as transformers'
    Gemma3RMSNorm (``x * (1 + w)``, in float32). The sum of squares is taken in float32 as
    transformers' LlamaRMSNorm does on float32 hidden states.
    """

    name = "rms_norm"

    def shape(self, x, weight, eps=1e-6, plus_one=False):
        if weight not in _widths(x):
            raise ValueError(f"rms_norm: weight {weight} is not one of {_widths(x)} for x {x}")
        return x

    def reference(self, x, weight, eps=1e-6, plus_one=False):
        x = as64(x)
        w = as64(weight) + (1.0 if plus_one else 0.0)
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

    def kernel(self, out, x, weight, scratch=None, eps=1e-6, plus_one=False):
        if x.ndim == 2 and x.shape[0] == 1:
            # One row (a decode step): three calls instead of six; x * rsqrt(mean + eps),
            # the mean and rsqrt in float32, as transformers' LlamaRMSNorm computes it.
            mean = np.float32(np.dot(x[0], x[0])) / np.float32(x.shape[1])
            np.multiply(x, np.float32(1.0) / np.sqrt(mean + np.float32(eps)), out=out)
            out *= weight
            return
        lib = native.lib()
        if lib is not None and native.rows_apart(out, x) and weight.flags.c_contiguous:
            # A prompt chunk's rows on the pool: x * (1 / sqrt(mean + eps)) * w per row.
            lib.rms_norm(out, x, weight, float(eps))
            return
        rows = x.shape[:-1]
        ms = scratch[: int(np.prod(rows))].reshape(*rows, 1)
        np.einsum("...j,...j->...", x, x, out=ms[..., 0])
        ms *= np.float32(1.0 / x.shape[-1])
        ms += np.float32(eps)
        np.sqrt(ms, out=ms)
        np.divide(x, ms, out=out)
        out *= weight  # packed: already 1 + weight where plus_one

    def lower(self, out, x, weight, scratch=None, eps=1e-6, plus_one=False):
        # Per row of the last axis, the weight's rows in turn (one, or one per head); the
        # chunk kernel's body (lib.rms_norm) over rows apart (a fused projection's heads).
        if x.ndim not in (2, 3) or not native.rows_apart(out, x) or \
                not native.contiguous(weight):
            return None
        d = x.shape[-1]
        inner = x.shape[1] if x.ndim == 3 else 1
        return native.Step(native.OP_RMS_NORM, (out, x, weight),
                           (x.size // d, d, weight.size // d, inner), (eps,), rows=0)

    def pack(self, index, array, eps=1e-6, plus_one=False):
        w = np.asarray(array, np.float32)
        # transformers adds the one in float32, as here.
        return np.ascontiguousarray(w + np.float32(1.0) if plus_one else w)

    def scratch(self, x, weight, eps=1e-6, plus_one=False):
        return int(np.prod(x[:-1]))

    def tolerance(self, x, weight, eps=1e-6, plus_one=False):
        return Tolerance(atol=1e-6, rtol=max(8.0, x[-1] / 16) * EPS32)


def _widths(x: tuple) -> list[tuple]:
    """The weight shapes a norm of ``x`` takes: ``(d,)``, and ``(heads, d)`` per head of an
    ``x`` ``(n, heads, d)`` (transformers' StableLmLayerNormPerHead)."""
    return [(x[-1],)] + ([tuple(x[-2:])] if len(x) == 3 else [])
