"""Convolutions over a call's rows (the sequence): a depthwise one with learned taps per
column, and a dynamic one whose taps each row computes for itself.

As transformers' ConvBERT (ConvBertSelfAttention): ``SeparableConv1D``'s ``depthwise``
(``nn.Conv1d(groups=channels, padding=kernel // 2, bias=False)`` over the sequence) and the
span-based dynamic convolution (``conv_kernel_layer``'s logits softmaxed over the kernel's
taps, applied to ``nn.functional.unfold`` windows of ``conv_out_layer``'s output). Rows past
the call's ends read zeros, as both pad.

Not for: attention (``self_attention``), convolutions over the hidden axis.
"""

from __future__ import annotations

import numpy as np

from .base import EPS32, Operator, Tolerance, as64


def _windows(x: np.ndarray, kernel: int) -> np.ndarray:
    """``(n, d, kernel)``: ``out[i, c, t] = x[i + t - (kernel - 1) // 2, c]``, zero past the
    ends (an odd kernel centred on row ``i``)."""
    n, d = x.shape
    p = (kernel - 1) // 2
    padded = np.zeros((n + kernel - 1, d), x.dtype)
    padded[p: p + n] = x
    return np.lib.stride_tricks.sliding_window_view(padded, kernel, axis=0)[:n]


def _odd(kernel: int, name: str) -> None:
    if kernel < 1 or kernel % 2 == 0:
        raise ValueError(f"{name}: kernel {kernel} is not an odd number from 1 (an even one "
                         "pads the rows unevenly, past the queries' rows)")


class DepthwiseConv(Operator):
    """Column ``c`` of ``x`` ``(n, d)`` convolved over the rows by its own ``weight[c]``
    ``(d, kernel)``: ``out[i, c] = sum_t weight[c, t] x[i + t - (kernel - 1) // 2, c]``
    (a cross-correlation, as torch's Conv1d), zeros past the ends; output ``(n, d)``.
    Attribute ``group``: ``group`` consecutive columns share one row of taps (``weight``
    ``(d / group, kernel)``: a head's columns convolved by its taps, as a Conv2d of kernel
    ``(kernel, 1)`` with ``groups=heads`` over ``(heads, n, head_dim)``).

    Raises:
        ValueError: ``x`` not ``(n, d)``, a weight not ``(d / group, kernel)``, or an even
            kernel.
    """

    name = "depthwise_conv"

    def shape(self, x, weight, group=1):
        if len(x) != 2 or len(weight) != 2 or group < 1 or weight[0] * group != x[1]:
            raise ValueError(f"depthwise_conv takes x (n, d) and weight (d / {group}, kernel), "
                             f"not {x} and {weight}")
        _odd(weight[1], self.name)
        return tuple(x)

    def reference(self, x, weight, group=1):
        w = np.repeat(as64(weight), group, axis=0)
        return np.einsum("nct,ct->nc", _windows(as64(x), weight.shape[1]), w)

    def kernel(self, out, x, weight, scratch=None, group=1):
        # One multiply-add per tap over all rows and columns at once.
        n, K = x.shape[0], weight.shape[1]
        p = (K - 1) // 2
        taps = weight if group == 1 else np.repeat(weight, group, axis=0)
        out[...] = 0.0
        for t in range(K):
            lo, hi = max(0, p - t), min(n, n + p - t)  # rows i with 0 <= i + t - p < n
            if lo < hi:
                out[lo:hi] += x[lo + t - p: hi + t - p] * taps[:, t]

    def tolerance(self, x, weight, group=1):
        return Tolerance(atol=1e-6, rtol=(2 + weight[1]) * EPS32)

    def scale(self, reference, x, weight, group=1):
        return np.einsum("nct,ct->nc", np.abs(_windows(as64(x), weight.shape[1])),
                         np.abs(np.repeat(as64(weight), group, axis=0)))


class DynamicConv(Operator):
    """A span-based dynamic convolution: each row ``i`` and head ``h`` of ``heads`` softmaxes
    its own taps ``logits[i, h * kernel: (h + 1) * kernel]`` (``logits`` ``(n, heads *
    kernel)``) and sums ``values`` ``(n, heads * head_dim)``'s rows ``i - (kernel - 1) // 2 ..
    i + (kernel - 1) // 2`` of head ``h``'s columns by them, zeros past the ends; output
    ``(n, heads * head_dim)``. As ConvBertSelfAttention's ``conv_kernel_layer`` softmax and
    ``unfold`` of ``conv_out_layer``. Softmax in float32 (float64 in the reference).

    Raises:
        ValueError: shapes that do not split into ``heads``, or an even kernel.
    """

    name = "dynamic_conv"

    def shape(self, logits, values, heads=1, kernel=1):
        _odd(kernel, self.name)
        if len(logits) != 2 or len(values) != 2 or logits[0] != values[0] or \
                logits[1] != heads * kernel or values[1] % heads:
            raise ValueError(f"dynamic_conv: logits {logits} (n, {heads} heads * kernel "
                             f"{kernel}) and values {values} (n, heads * head_dim) do not meet")
        return tuple(values)

    @staticmethod
    def _taps(logits, heads, kernel):
        s = logits.reshape(logits.shape[0], heads, kernel)
        p = np.exp(s - s.max(-1, keepdims=True))
        return p / p.sum(-1, keepdims=True)  # (n, heads, kernel)

    def reference(self, logits, values, heads=1, kernel=1):
        n, A = values.shape
        w = self._taps(as64(logits), heads, kernel)
        win = _windows(as64(values), kernel).reshape(n, heads, A // heads, kernel)
        return np.einsum("nhdt,nht->nhd", win, w).reshape(n, A)

    def kernel(self, out, logits, values, scratch=None, heads=1, kernel=1):
        n, A = values.shape
        w = self._taps(logits, heads, kernel)
        win = _windows(values, kernel).reshape(n, heads, A // heads, kernel)
        np.copyto(out.reshape(n, heads, A // heads),
                  np.matmul(win, w[..., None])[..., 0])

    def tolerance(self, logits, values, heads=1, kernel=1):
        return Tolerance(atol=1e-6, rtol=(4 + kernel) * EPS32)

    def scale(self, reference, logits, values, heads=1, kernel=1):
        # A convex combination of values: bounded by the largest |value| of its window.
        n, A = values.shape
        win = np.abs(_windows(as64(values), kernel)).max(axis=2)
        return win + np.abs(reference)
