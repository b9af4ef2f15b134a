"""Layer normalization over the last axis, as torch.nn.LayerNorm: the mean removed, divided by
the standard deviation, scaled and shifted.

Not for: RMSNorm (``norm``), which keeps the mean.
"""

from __future__ import annotations

import numpy as np

from . import native
from .base import EPS32, Operator, Tolerance, as64


class LayerNorm(Operator):
    """``x`` ``(n, ..., d)``, ``weight`` ``(d,)`` and an optional ``bias`` ``(d,)`` give
    ``(x - mean(x)) / sqrt(var(x) + eps) * weight + bias`` over the last axis, of ``x``'s
    shape (a q/k norm runs per head on ``(n, heads, head_dim)``, as transformers'
    PersimmonAttention's ``q_layernorm``; weight and bias may then be ``(heads, head_dim)``,
    each head its own, as StableLmLayerNormPerHead).

    The variance is the biased one (divided by ``d``), as torch's. Attributes: ``eps``;
    ``plus_one`` scales by ``1 + weight`` instead, as transformers' NemotronLayerNorm1P
    (``weight + 1`` in float32, then ``F.layer_norm``). The kernel takes the mean and the sum
    of squared deviations in float32, as torch's float32 LayerNorm does (its two passes, not
    one pass of ``E[x^2] - E[x]^2``, which cancels).

    Raises (``shape``):
        ValueError: ``x`` has fewer than two axes, ``weight`` is neither ``(d,)`` nor (per
            head) ``(heads, d)``, or ``bias`` is not of the weight's shape.
    """

    name = "layer_norm"

    def shape(self, x, weight, bias=None, eps=1e-5, plus_one=False):
        if len(x) < 2:
            raise ValueError(f"layer_norm takes x (n, ..., d), not {x}")
        if weight not in _widths(x):
            raise ValueError(f"layer_norm: weight {weight} is not one of {_widths(x)} for x {x}")
        if bias is not None and bias != weight:
            raise ValueError(f"layer_norm: bias {bias} is not the weight's {weight}")
        return x

    def _normalized(self, x, eps):
        x = as64(x)
        c = x - x.mean(axis=-1, keepdims=True)
        return c / np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + eps)

    def _weight(self, weight, plus_one):
        return as64(weight) + (1.0 if plus_one else 0.0)

    def reference(self, x, weight, bias=None, eps=1e-5, plus_one=False):
        y = self._normalized(x, eps) * self._weight(weight, plus_one)
        return y if bias is None else y + as64(bias)

    def kernel(self, out, x, weight, bias=None, scratch=None, eps=1e-5, plus_one=False):
        rows, d = x.shape[:-1], x.shape[-1]
        s = scratch[: int(np.prod(rows))].reshape(*rows, 1)
        np.sum(x, axis=-1, keepdims=True, out=s)
        s *= np.float32(1.0 / d)
        np.subtract(x, s, out=out)
        np.einsum("...j,...j->...", out, out, out=s[..., 0])
        s *= np.float32(1.0 / d)
        s += np.float32(eps)
        np.sqrt(s, out=s)
        out /= s
        out *= weight  # packed: already 1 + weight where plus_one
        if bias is not None:
            out += bias

    def lower(self, out, x, weight, bias=None, scratch=None, eps=1e-5, plus_one=False):
        # The kernel's two passes per row of the last axis, the weight's rows in turn (one,
        # or one per head), x's rows apart (a fused projection's heads).
        if x.ndim not in (2, 3) or not native.rows_apart(out, x) or \
                not native.contiguous(weight, bias):
            return None
        d = x.shape[-1]
        inner = x.shape[1] if x.ndim == 3 else 1
        return native.Step(native.OP_LAYER_NORM, (out, x, weight, bias),
                           (x.size // d, d, weight.size // d, inner), (eps,), rows=0)

    def pack(self, index, array, eps=1e-5, plus_one=False):
        w = np.asarray(array, np.float32)
        # transformers adds the one in float32, as here; the bias (index 2) as it is.
        return np.ascontiguousarray(w + np.float32(1.0) if plus_one and index == 1 else w)

    def scratch(self, x, weight, bias=None, eps=1e-5, plus_one=False):
        return int(np.prod(x[:-1]))

    def tolerance(self, x, weight, bias=None, eps=1e-5, plus_one=False):
        return Tolerance(atol=1e-6, rtol=max(8.0, x[-1] / 16) * EPS32)

    def scale(self, reference, x, weight, bias=None, eps=1e-5, plus_one=False):
        # The error is relative to the normalized row's magnitude (order one), not to an
        # output near zero where x is near its mean; then scaled by |weight|, plus |bias|.
        mag = (np.abs(self._normalized(x, eps)) + 1.0) * np.abs(self._weight(weight, plus_one))
        return mag if bias is None else mag + np.abs(as64(bias))


def _widths(x: tuple) -> list[tuple]:
    """The weight shapes a norm of ``x`` takes: ``(d,)``, and ``(heads, d)`` per head of an
    ``x`` ``(n, heads, d)`` (transformers' StableLmLayerNormPerHead)."""
    return [(x[-1],)] + ([tuple(x[-2:])] if len(x) == 3 else [])
