"""Trigram inputs: each row beside its next and previous rows, as one row three times as
wide, zeros past the call's ends.

As transformers' MobileBertEmbeddings with ``trigram_input``: ``cat([x[1:] padded with a
zero row at the end, x, x[:-1] padded with a zero row at the start], dim=-1)`` over one
text's word embeddings, before ``embedding_transformation``.

Not for: convolutions with weights (a projection of this is one), positions.
"""

from __future__ import annotations

import numpy as np

from .base import Operator, Tolerance, as64


class Trigram(Operator):
    """``out[i] = [x[i + 1], x[i], x[i - 1]]`` for ``x`` ``(n, d)``, zeros where ``i + 1 = n``
    or ``i = 0``; output ``(n, 3 d)``. Exact: a copy.

    Raises:
        ValueError: ``x`` is not ``(n, d)``.
    """

    name = "trigram"

    def shape(self, x):
        if len(x) != 2:
            raise ValueError(f"trigram takes x (n, d), not {x}")
        return (x[0], 3 * x[1])

    def reference(self, x):
        x = as64(x)
        zero = np.zeros((1, x.shape[1]))
        return np.concatenate([np.concatenate([x[1:], zero]), x,
                               np.concatenate([zero, x[:-1]])], axis=1)

    def kernel(self, out, x, scratch=None):
        n, d = x.shape
        out[:n - 1, :d] = x[1:]
        out[n - 1, :d] = 0.0
        out[:, d:2 * d] = x
        out[0, 2 * d:] = 0.0
        out[1:, 2 * d:] = x[:-1]

    def tolerance(self, x):
        return Tolerance(atol=0.0, rtol=0.0)
