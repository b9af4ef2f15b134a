"""Embeddings rescaled for the share of masked tokens in a call: the inference half of
ESM's token dropout.

As transformers' EsmEmbeddings with ``token_dropout``: the rows whose id is the mask token
are zeroed, and every row is scaled by ``(1 - ratio) / (1 - masked / rows)``, the training
mask ratio (``0.15 * 0.8``) over the ratio this call observes (its masked ids over its
rows, every row attended), so a text's embeddings keep the scale training saw.
"""

from __future__ import annotations

import numpy as np

from .base import EPS32, Operator, Tolerance, as64


class TokenDropoutRescale(Operator):
    """``x`` ``(n, d)`` float with its ``n`` rows' ``ids`` ``(n,)`` int: rows of id
    ``mask_id`` set to 0, all rows times ``(1 - ratio) / (1 - k / n)`` where ``k`` ids are
    ``mask_id``. A call of masks alone divides by 0, and its rows are NaN (0 * inf), as
    transformers' are.

    Raises:
        ValueError: ``x`` is not ``(n, d)``, or ``ids`` is not ``(n,)``.
    """

    name = "token_dropout_rescale"

    def shape(self, x, ids, mask_id=0, ratio=0.0):
        if len(x) != 2 or tuple(ids) != (x[0],):
            raise ValueError(f"token_dropout_rescale takes x (n, d) and ids (n,), not {x} "
                             f"and {ids}")
        return x

    @staticmethod
    def _factor(ids, mask_id, ratio) -> tuple[np.ndarray, float]:
        masked = ids == mask_id
        with np.errstate(divide="ignore"):
            return masked, np.float64(1.0 - ratio) / (1.0 - masked.sum() / ids.shape[0])

    def reference(self, x, ids, mask_id=0, ratio=0.0):
        masked, factor = self._factor(np.asarray(ids), mask_id, ratio)
        with np.errstate(invalid="ignore"):
            return np.where(masked[:, None], 0.0, as64(x)) * factor

    def kernel(self, out, x, ids, scratch=None, mask_id=0, ratio=0.0):
        masked, factor = self._factor(ids, mask_id, ratio)
        with np.errstate(invalid="ignore"):
            np.multiply(x, np.float32(factor), out=out)
            out[masked] *= np.float32(0.0)

    def tolerance(self, x, ids, mask_id=0, ratio=0.0):
        return Tolerance(atol=0.0, rtol=2 * EPS32)

    def scale(self, reference, x, ids, mask_id=0, ratio=0.0):
        return np.abs(reference)
