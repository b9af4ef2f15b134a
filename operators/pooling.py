"""Pooling a call's rows into one vector, and what sentence-embedding heads apply after it:
mean over rows, L2 normalization of a row, and tanh (a pooler's activation).

Semantics as sentence-transformers' ``Pooling`` (mean over the tokens a mask keeps: here, a
call's rows) and ``Normalize`` (``torch.nn.functional.normalize``, p=2), and a pooler's
``tanh(dense(first row))``.
"""

from __future__ import annotations

import numpy as np

from .base import EPS32, Operator, Tolerance, as64


class MeanRows(Operator):
    """The mean of ``x`` ``(n, d)`` over its ``n`` rows, ``(1, d)``: a call's rows, all of
    them and only them (the output does not keep the row bound)."""

    name = "mean_rows"
    keeps_bound = False

    def shape(self, x):
        if len(x) != 2:
            raise ValueError(f"mean_rows takes x (n, d), not {x}")
        return (1, x[1])

    def reference(self, x):
        return as64(x).mean(axis=0, keepdims=True)

    def kernel(self, out, x, scratch=None):
        np.sum(x, axis=0, keepdims=True, out=out)
        out *= np.float32(1.0 / x.shape[0])

    def tolerance(self, x):
        return Tolerance(atol=1e-7, rtol=max(4.0, x[0] / 8) * EPS32)

    def scale(self, reference, x):
        return np.abs(as64(x)).mean(axis=0, keepdims=True)


class L2Normalize(Operator):
    """Each row of ``x`` ``(n, d)`` divided by its Euclidean norm (at least ``eps``), as
    ``torch.nn.functional.normalize(x, p=2, dim=-1, eps=1e-12)``."""

    name = "l2_normalize"

    def shape(self, x, eps=1e-12):
        if len(x) != 2:
            raise ValueError(f"l2_normalize takes x (n, d), not {x}")
        return x

    def reference(self, x, eps=1e-12):
        x = as64(x)
        return x / np.maximum(np.sqrt(np.sum(x * x, axis=-1, keepdims=True)), eps)

    def kernel(self, out, x, scratch=None, eps=1e-12):
        n = x.shape[0]
        s = scratch[:n].reshape(n, 1)
        np.einsum("ij,ij->i", x, x, out=s[:, 0])
        np.sqrt(s, out=s)
        np.maximum(s, np.float32(eps), out=s)
        np.divide(x, s, out=out)

    def scratch(self, x, eps=1e-12):
        return x[0]

    def tolerance(self, x, eps=1e-12):
        return Tolerance(atol=1e-7, rtol=max(8.0, x[-1] / 16) * EPS32)

    def scale(self, reference, x, eps=1e-12):
        # Each element errs relative to the unit row, not to its own (possibly tiny) value.
        return np.ones_like(reference)


class Tanh(Operator):
    """``tanh(x)`` elementwise: a pooler's activation (not a ``hidden_act`` name)."""

    name = "tanh"

    def shape(self, x):
        return x

    def reference(self, x):
        return np.tanh(as64(x))

    def kernel(self, out, x, scratch=None):
        np.tanh(x, out=out)

    def tolerance(self, x):
        return Tolerance(atol=1e-7, rtol=8 * EPS32)
