"""Logit softcap: ``tanh(x / cap) * cap``, bounding every value to ``(-cap, cap)`` smoothly
(transformers' ``final_logit_softcapping``; attention's own is inside ``attention``)."""

from __future__ import annotations

import numpy as np

from . import native
from .base import EPS32, Operator, Tolerance, as64


class Softcap(Operator):
    """``x`` of any shape to ``tanh(x / cap) * cap``, elementwise, in float32 as transformers
    (divide, tanh, multiply). Attribute ``cap`` > 0.
    """

    name = "softcap"

    def shape(self, x, cap=1.0):
        if not cap > 0:
            raise ValueError(f"softcap: cap {cap} is not positive")
        return x

    def reference(self, x, cap=1.0):
        return np.tanh(as64(x) / cap) * cap

    def kernel(self, out, x, scratch=None, cap=1.0):
        np.divide(x, np.float32(cap), out=out)
        np.tanh(out, out=out)
        out *= np.float32(cap)

    def lower(self, out, x, scratch=None, cap=1.0):
        if not native.contiguous(out, x):
            return None
        return native.Step(native.OP_SOFTCAP, (out, x), (x.size,), (cap,), rows=0)

    def tolerance(self, x, cap=1.0):
        return Tolerance(atol=1e-6, rtol=8 * EPS32)

    def scale(self, reference, x, cap=1.0):
        # tanh's slope is at most 1: an input rounding of |x| moves the output by as much.
        return np.abs(reference) + np.minimum(np.abs(as64(x)), cap)
