"""The gated RMSNorm a state-space or delta-rule mixer ends with: its output normed by
groups of columns and gated by ``silu`` of a second projection.

``x`` and ``z`` ``(n, W)``, ``weight`` ``(W,)`` (or ``(group,)``, every group's: a norm per
head, Qwen3NextRMSNormGated's), each row's ``W`` columns normed in groups of ``group``. Two orders, as the families write them:

- ``gate_first`` (Mamba2RMSNormGated, and Bamba's, GraniteMoeHybrid's, NemotronH's,
  Zamba2's): ``w * norm(x * silu(z))``, transformers' ``norm_before_gate=False``;
- norm first (Qwen3NextRMSNormGated per head; FalconH1RMSNormGated with
  ``mamba_norm_before_gate``): ``w * norm(x) * silu(z)``.

``norm(y) = y / sqrt(mean(y^2) + eps)`` over each group, in float32 as transformers computes
it (every such norm casts to float32 first).
"""

from __future__ import annotations

import numpy as np

from . import native
from .base import EPS32, Operator, Tolerance, as64


class GatedRMSNorm(Operator):
    """``x``, ``z`` ``(n, W)`` (rows apart allowed) and ``weight`` ``(W,)`` or ``(group,)``
    give ``(n, W)``.

    Attributes: ``group`` (columns a norm spans; ``W`` a multiple), ``eps``, ``gate_first``.

    Raises:
        ValueError: shapes that do not fit, or a group that does not divide ``W``.
    """

    name = "gated_rms_norm"

    def shape(self, x, z, weight, group=1, eps=1e-6, gate_first=False):
        if len(x) != 2 or tuple(z) != tuple(x) or tuple(weight) not in ((x[1],), (group,)) or \
                group < 1 or x[1] % group:
            raise ValueError(f"gated_rms_norm takes x, z (n, W) and weight (W,) or (group,), W "
                             f"a multiple of the group {group}, not {x}, {z} and {weight}")
        return tuple(x)

    def reference(self, x, z, weight, group=1, eps=1e-6, gate_first=False):
        x, z = as64(x), as64(z)
        n, W = x.shape
        gate = z / (1.0 + np.exp(-z))
        y = (x * gate if gate_first else x).reshape(n, W // group, group)
        y = (y / np.sqrt(np.mean(y * y, axis=-1, keepdims=True) + eps))
        y = (y.reshape(n, -1, weight.size) * as64(weight)).reshape(n, W)
        return y if gate_first else y * gate

    def kernel(self, out, x, z, weight, scratch=None, group=1, eps=1e-6, gate_first=False):
        n, W = x.shape
        gate = scratch[: n * W].reshape(n, W)
        np.negative(z, out=gate)
        np.exp(gate, out=gate)
        gate += np.float32(1.0)
        np.divide(z, gate, out=gate)
        if gate_first:
            np.multiply(x, gate, out=out)
        else:
            out[...] = x
        y = out.reshape(n, W // group, group)
        ms = np.einsum("ngc,ngc->ng", y, y)[:, :, None]
        ms *= np.float32(1.0 / group)
        ms += np.float32(eps)
        np.sqrt(ms, out=ms)
        y /= ms
        out.reshape(n, -1, weight.size)[...] *= weight
        if not gate_first:
            out *= gate

    def lower(self, out, x, z, weight, scratch=None, group=1, eps=1e-6, gate_first=False):
        # Rows on the pool (operators/_cpu_recurrent.h's gnorm_rows).
        if not native.rows_apart(x, z) or not native.contiguous(out, weight):
            return None
        n, W = x.shape
        return native.Step(native.OP_GATED_NORM, (out, x, z, weight),
                           (n, W, group, weight.size, int(gate_first)), (eps,), rows=0)

    def scratch(self, x, z, weight, **attrs):
        return x[0] * x[1]

    def tolerance(self, x, z, weight, group=1, **attrs):
        return Tolerance(atol=1e-6, rtol=max(16.0, group / 8) * EPS32)
