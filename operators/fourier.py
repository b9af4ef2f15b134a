"""Fourier token mixing: the real part of a call's 2-D discrete Fourier transform over its
rows (the sequence) and columns (the hidden width), in place of attention.

As transformers' FNetBasicFourierTransform: ``torch.fft.fftn(x, dim=(1, 2)).real`` over a
batch of one text. Its ``use_tpu_fourier_optimizations`` path computes the same transform
as two DFT-matrix products (in complex64, for texts exactly ``tpu_short_seq_length`` long):
one transform, so one operator.

Not for: attention (``self_attention``), a transform with learned filters.
"""

from __future__ import annotations

import numpy as np

from .base import EPS32, Operator, Tolerance, as64


class FourierMix(Operator):
    """``Re(F_n x F_d)`` of ``x`` ``(n, d)``: ``out[m, k] = sum_{i, j} x[i, j] cos(2 pi (m i
    / n + k j / d))``, the real part of the ``n``-point DFT over the rows after the
    ``d``-point DFT over the columns; output ``(n, d)``.

    Raises:
        ValueError: ``x`` is not ``(n, d)``.
    """

    name = "fourier_mix"

    def shape(self, x):
        if len(x) != 2:
            raise ValueError(f"fourier_mix takes x (n, d), not {x}")
        return tuple(x)

    def reference(self, x):
        return np.fft.fft2(as64(x)).real

    def kernel(self, out, x, scratch=None):
        # pocketfft (numpy's FFT) transforms float32 in complex64 into a buffer of its own:
        # the complex spectrum is the transform's working memory, not the output's.
        np.copyto(out, np.fft.fft2(x).real)

    def tolerance(self, x):
        # An FFT's rounding grows with log2 of its length: per element about
        # eps * log2(n * d) times the input's norm (below).
        n, d = x
        return Tolerance(atol=1e-6, rtol=(4 + 2 * np.log2(max(2, n * d))) * EPS32)

    def scale(self, reference, x):
        # Every output sums all n * d inputs with unit weights: its error is measured against
        # the input's L2 norm (Parseval: the outputs' root-mean-square), not its own size,
        # which cancellation may make tiny.
        return np.broadcast_to(np.sqrt(np.square(as64(x)).sum()), reference.shape)
