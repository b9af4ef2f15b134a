"""A 1-D convolution over rows, as an audio tower's front convolutions run it.

``conv1d``: ``x`` ``(n, in_channels)`` (one row per frame) by ``weight`` ``(out_channels,
in_channels, kernel)`` (torch's ``nn.Conv1d`` layout) with ``stride`` and zero ``padding``
on both ends, plus an optional ``bias``: ``((n + 2 * padding - kernel) // stride + 1,
out_channels)``, as ``nn.Conv1d`` on ``x.T``. The kernel gathers each output row's
``kernel`` input rows side by side (im2col) and runs one GEMM by the weight packed
``(kernel * in_channels, out_channels)``.
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
