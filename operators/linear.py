"""Linear projection, as torch.nn.Linear: ``x @ weight.T (+ bias)``.

One row (a decode step) is a GEMV on the decode pool (``operators.native``) where it is
built, else BLAS through numpy; a prompt chunk's rows are one GEMM, BLAS through numpy.
"""

from __future__ import annotations

import sys

import numpy as np

from . import native
from .base import EPS32, Operator, Tolerance, as64

REFERENCE_ROWS = 8192  # weight rows the reference widens to float64 at once


class Linear(Operator):
    """``x`` ``(n, in)`` and ``weight`` ``(out, in)`` (row-major, a checkpoint's own layout)
    give ``(n, out)``; an optional third input ``bias`` ``(out,)`` is added.
    """

    name = "linear"

    def shape(self, x, weight, bias=None):
        if len(x) != 2 or len(weight) != 2 or x[1] != weight[1]:
            raise ValueError(f"linear: x {x} does not meet weight {weight} (out, in)")
        if bias is not None and bias != (weight[0],):
            raise ValueError(f"linear: bias {bias} is not ({weight[0]},)")
        return (x[0], weight[0])

    def reference(self, x, weight, bias=None):
        # Widened a block of output rows at a time: a whole lm_head in float64 is 1.3 GB on
        # a 262144-token vocabulary, for a product that needs none of it at once.
        x = as64(x)
        y = np.empty(x.shape[:-1] + (weight.shape[0],), np.float64)
        for i in range(0, weight.shape[0], REFERENCE_ROWS):
            y[..., i: i + REFERENCE_ROWS] = x @ as64(weight[i: i + REFERENCE_ROWS]).T
        return y if bias is None else y + as64(bias)

    def pack_reduced(self, index, array, dtype):
        """The weight as bfloat16's 16-bit patterns (numpy uint16), where every value holds
        exactly: a bfloat16 checkpoint's own weights, half the bytes a decode step streams,
        and the same products as float32's."""
        if index != 1 or dtype != "bfloat16":
            return None
        # Each float32 as its two 16-bit halves (views, no copy): the high half is the
        # bfloat16, and the low half must be zero for it to be exact.
        halves = np.ascontiguousarray(array, np.float32).view(np.uint16).reshape(-1, 2)
        low, high = (0, 1) if sys.byteorder == "little" else (1, 0)
        inexact = int(np.count_nonzero(halves[:, low]))
        if inexact:
            raise ValueError(f"{inexact} of {halves.shape[0]} values do not hold exactly in "
                             "bfloat16; bfloat16 decode weights keep a bfloat16 checkpoint's "
                             "weights as they are, never rounded (--decode-weights float32 "
                             "reads any)")
        return np.ascontiguousarray(halves[:, high]).reshape(array.shape)

    def kernel(self, out, x, weight, bias=None, scratch=None):
        if weight.dtype == np.uint16:  # bfloat16 bits (pack_reduced): a decode step's
            lib = native.lib()
            if lib is not None and x.shape[0] == 1 and x[0].flags.c_contiguous:
                lib.gemv(out[0], x[0], weight, bias)
                return
            weight = (weight.astype(np.uint32) << 16).view(np.float32)
        lib = native.lib() if x.shape[0] == 1 else None
        if lib is not None and x[0].flags.c_contiguous and out[0].flags.c_contiguous \
                and weight.flags.c_contiguous:
            lib.gemv(out[0], x[0], weight, bias)
            return
        np.matmul(x, weight.T, out=out)
        if bias is not None:
            out += bias

    def tolerance(self, x, weight, bias=None):
        # A float32 dot product of K terms errs by at most ~K * eps * sum|x_k w_k| (Higham);
        # BLAS's blocked sums stay well inside it, so a fraction of K is used.
        K = x[1]
        return Tolerance(atol=1e-6, rtol=max(4.0, K / 8) * EPS32)

    def scale(self, reference, x, weight, bias=None):
        mag = np.abs(as64(x)) @ np.abs(as64(weight)).T
        return mag if bias is None else mag + np.abs(as64(bias))
