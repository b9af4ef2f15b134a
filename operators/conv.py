"""1-D and 2-D convolutions, as audio towers' front convolutions run them.

``conv1d``: ``x`` ``(n, in_channels)`` (one row per frame) by ``weight`` ``(out_channels,
in_channels, kernel)`` (torch's ``nn.Conv1d`` layout) with ``stride`` and zero ``padding``
on both ends, plus an optional ``bias``: ``((n + 2 * padding - kernel) // stride + 1,
out_channels)``, as ``nn.Conv1d`` on ``x.T``. The kernel gathers each output row's
``kernel`` input rows side by side (im2col) and runs one GEMM by the weight packed
``(kernel * in_channels, out_channels)``.

``conv2d``: a channels-last feature map ``(rows, cols, in_channels)`` by torch's
``nn.Conv2d`` weight (``Conv2d``'s docstring), im2col and one GEMM likewise.
"""

from __future__ import annotations

import numpy as np

from .base import EPS32, Operator, Tolerance, as64


def _gathered(x: np.ndarray, kernel: int, stride: int, padding: int) -> np.ndarray:
    """``(n_out, kernel, in)``: each output row's input rows, zeros past the ends."""
    n, C = x.shape
    padded = np.zeros((n + 2 * padding, C), x.dtype)
    padded[padding: padding + n] = x
    n_out = (n + 2 * padding - kernel) // stride + 1
    return np.lib.stride_tricks.as_strided(
        padded, (n_out, kernel, C), (padded.strides[0] * stride, padded.strides[0],
                                     padded.strides[1]))


class Conv1d(Operator):
    """Module docstring: ``conv1d``."""

    name = "conv1d"
    keeps_bound = False

    def shape(self, x, weight, bias=None, stride=1, padding=0):
        if len(x) != 2 or len(weight) != 3 or weight[1] != x[1] or (
                bias is not None and tuple(bias) != (weight[0],)):
            raise ValueError(f"conv1d: x {x} (n, in) does not meet weight {weight} (out, in, "
                             f"kernel) and bias {bias}")
        n_out = (x[0] + 2 * padding - weight[2]) // stride + 1
        if stride < 1 or padding < 0 or n_out < 1:
            raise ValueError(f"conv1d: a kernel of {weight[2]} at stride {stride}, padding "
                             f"{padding} does not fit {x[0]} rows")
        return (n_out, weight[0])

    def reference(self, x, weight, bias=None, stride=1, padding=0):
        rows = _gathered(as64(x), weight.shape[2], stride, padding)
        out = np.einsum("tjc,ocj->to", rows, as64(weight))
        return out if bias is None else out + as64(bias)

    def pack(self, index, array, **attrs):
        if index == 1:  # (out, in, kernel) -> (kernel * in, out), the gathered rows' order
            out, C, k = array.shape
            return np.ascontiguousarray(np.asarray(array, np.float32).transpose(2, 1, 0)
                                        .reshape(k * C, out))
        return np.ascontiguousarray(array, dtype=np.float32)

    def kernel(self, out, x, weight, bias=None, scratch=None, stride=1, padding=0):
        kC = weight.shape[0]
        rows = _gathered(x, kC // x.shape[1], stride, padding).reshape(out.shape[0], kC)
        np.matmul(rows, weight, out=out)
        if bias is not None:
            out += bias

    def tolerance(self, x, weight, bias=None, stride=1, padding=0):
        return Tolerance(atol=1e-6, rtol=max(8.0, weight[1] * weight[2] / 8) * EPS32)

    def scale(self, reference, x, weight, bias=None, stride=1, padding=0):
        s = self.reference(np.abs(as64(x)), np.abs(as64(weight)), None, stride, padding)
        return s if bias is None else s + np.abs(as64(bias))


def _gathered2d(x: np.ndarray, kernel: int, stride: int, padding: int
                ) -> np.ndarray:
    """``(rows_out, cols_out, kernel, kernel, in)``: each output pixel's input pixels (a
    view of a zero-padded copy), zeros past the edges."""
    H, W, C = x.shape
    padded = np.zeros((H + 2 * padding, W + 2 * padding, C), x.dtype)
    padded[padding: padding + H, padding: padding + W] = x
    Ho = (H + 2 * padding - kernel) // stride + 1
    Wo = (W + 2 * padding - kernel) // stride + 1
    s0, s1, s2 = padded.strides
    return np.lib.stride_tricks.as_strided(
        padded, (Ho, Wo, kernel, kernel, C), (s0 * stride, s1 * stride, s0, s1, s2))


class Conv2d(Operator):
    """A bias-free 2-D convolution of a channels-last feature map, as ``nn.Conv2d`` with a
    square ``kernel``, ``stride`` and zero ``padding`` on every side (the seeds' ``Conv2d``).

    ``x`` ``(rows, cols, in_channels)`` by ``weight`` ``(out_channels, in_channels, kernel,
    kernel)`` (torch's layout) gives ``((rows + 2 * padding - kernel) // stride + 1, (cols +
    2 * padding - kernel) // stride + 1, out_channels)``: torch's ``(out, rows, cols)``
    output with its channels last. Gemma4AudioSubSampleConvProjection's convolutions of
    the log-mel frames (rows: time, cols: mel bins). The kernel gathers each output pixel's
    ``kernel * kernel * in`` inputs side by side (im2col, a band of output rows at a time, so
    the gathered rows stay a few MB) and runs one GEMM by the weight packed ``(kernel *
    kernel * in, out)``.

    Raises (``shape``):
        ValueError: shapes that do not meet, a kernel that is not square, or one that does
            not fit the padded map.
    """

    name = "conv2d"
    keeps_bound = False
    #: Output rows gathered at once: bounds the im2col copy.
    BAND = 64

    def shape(self, x, weight, stride=1, padding=0):
        if len(x) != 3 or len(weight) != 4 or weight[1] != x[2] or weight[2] != weight[3]:
            raise ValueError(f"conv2d: x {x} (rows, cols, in) does not meet weight {weight} "
                             "(out, in, kernel, kernel)")
        k = weight[2]
        rows = (x[0] + 2 * padding - k) // stride + 1 if stride >= 1 else 0
        cols = (x[1] + 2 * padding - k) // stride + 1 if stride >= 1 else 0
        if stride < 1 or padding < 0 or rows < 1 or cols < 1:
            raise ValueError(f"conv2d: a kernel of {k} at stride {stride}, padding {padding} "
                             f"does not fit a map of {x[0]}x{x[1]}")
        return (rows, cols, weight[0])

    def reference(self, x, weight, stride=1, padding=0):
        g = _gathered2d(as64(x), weight.shape[2], stride, padding)
        return np.einsum("rcijk,okij->rco", g, as64(weight))

    def pack(self, index, array, **attrs):
        if index == 1:  # (out, in, k, k) -> (k * k * in, out), the gathered pixels' order
            out, C, k, _ = array.shape
            return np.ascontiguousarray(np.asarray(array, np.float32).transpose(2, 3, 1, 0)
                                        .reshape(k * k * C, out))
        return np.ascontiguousarray(array, dtype=np.float32)

    def kernel(self, out, x, weight, scratch=None, stride=1, padding=0):
        Ho, Wo, O = out.shape
        kkC = weight.shape[0]
        k = int(round((kkC // x.shape[2]) ** 0.5))
        g = _gathered2d(x, k, stride, padding)
        for a in range(0, Ho, self.BAND):
            b = min(Ho, a + self.BAND)
            rows = np.ascontiguousarray(g[a:b]).reshape((b - a) * Wo, kkC)
            np.matmul(rows, weight, out=out[a:b].reshape((b - a) * Wo, O))

    def tolerance(self, x, weight, stride=1, padding=0):
        return Tolerance(atol=1e-6, rtol=max(8.0, weight[1] * weight[2] * weight[3] / 8) * EPS32)

    def scale(self, reference, x, weight, stride=1, padding=0):
        return self.reference(np.abs(as64(x)), np.abs(as64(weight)), stride, padding)
