"""A causal depthwise convolution over the rows of a call, carrying its last rows as state.

Channel ``c`` of ``x`` ``(n, C)`` is convolved by its own ``K`` taps over the rows and the
``K - 1`` rows before the call: ``y[t, c] = bias[c] + sum_j w[c, j] xx[t + j, c]`` over
``xx = [state; x]``, then the activation (none, or silu). The state, ``(K - 1, C)``, is the
last ``K - 1`` rows of ``xx`` after the call: what the next call's first rows convolve
with. A decode step is one row; a prompt chunk any number (fewer than ``K - 1`` too).

As transformers' ``causal_conv1d_fn`` and ``causal_conv1d_update`` (models/mamba: the torch
fallback of the causal-conv1d kernels; ``F.conv1d(groups=channels, padding=K - 1)`` cut to
the sequence, its conv state the last ``K - 1`` inputs), which Lfm2ShortConv (no
activation), MambaMixer, Mamba2Mixer, Qwen3NextGatedDeltaNet and their kin (silu) call.
The taps are stored as torch's ``nn.Conv1d`` weight ``(C, 1, K)``.

Not for: convolutions centred on a row (``span_conv``), over the hidden axis.
"""

from __future__ import annotations

import numpy as np

from . import native
from .base import EPS32, Operator, Tolerance, as64

#: The activations a causal convolution applies to its sum, by ACT2FN's names.
CONV_ACTS = (None, "silu", "swish")


def _silu64(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


class CausalConv(Operator):
    """``x`` ``(n, C)`` (rows apart allowed), ``weight`` ``(C, K)``, ``bias`` ``(C,)`` or
    None, ``state`` ``(K - 1, C)`` (updated in place) give ``y`` ``(n, C)`` float32.

    Attributes: ``start`` (the call's first position: at 0 the state before it is zeros),
    ``act`` (None, ``silu`` or ``swish``).

    Raises:
        ValueError: shapes that do not fit, a kernel below 2, an unknown activation.
    """

    name = "causal_conv"
    updates = 3

    def shape(self, x, weight, bias, state, start=0, act=None):
        if len(x) != 2 or len(weight) != 2 or weight[0] != x[1] or weight[1] < 2 or \
                (bias is not None and tuple(bias) != (x[1],)) or \
                tuple(state) != (weight[1] - 1, x[1]):
            raise ValueError(f"causal_conv takes x (n, C), weight (C, K >= 2), bias (C,) and "
                             f"state (K - 1, C), not {x}, {weight}, {bias} and {state}")
        if act not in CONV_ACTS:
            raise ValueError(f"causal_conv: activation {act!r} is not one of "
                             f"{', '.join(map(str, CONV_ACTS))}")
        return tuple(x)

    def reference(self, x, weight, bias, state, start=0, act=None):
        # The recurrence a row at a time: the window slides by one row per token.
        x, w = as64(x), as64(weight)
        window = np.zeros(state.shape, np.float64) if start == 0 else as64(state).copy()
        out = np.empty(x.shape, np.float64)
        for t in range(x.shape[0]):
            full = np.concatenate([window, x[t:t + 1]])  # (K, C)
            y = np.einsum("kc,ck->c", full, w)
            if bias is not None:
                y = y + as64(bias)
            out[t] = _silu64(y) if act is not None else y
            window = full[1:]
        state[...] = window  # the caller's state, updated where it is
        return out

    def kernel(self, out, x, weight, bias, state, scratch=None, start=0, act=None):
        # weight is packed (K, C): tap j's row times the rows j .. j + n of [state; x].
        n, C = x.shape
        K1 = state.shape[0]
        xx = scratch[: (K1 + n) * C].reshape(K1 + n, C)
        if start == 0:
            xx[:K1] = 0.0
        else:
            xx[:K1] = state
        xx[K1:] = x
        np.multiply(xx[:n], weight[0], out=out)
        for j in range(1, K1 + 1):
            out += xx[j:j + n] * weight[j]
        if bias is not None:
            out += bias
        if act is not None:
            # x * sigmoid(x), as the activation operator's silu computes it.
            sig = scratch[(K1 + n) * C: (K1 + n) * C + n * C].reshape(n, C)
            np.negative(out, out=sig)
            np.exp(sig, out=sig)
            sig += np.float32(1.0)
            np.divide(out, sig, out=out)
        state[...] = xx[n:n + K1]

    def lower(self, out, x, weight, bias, state, scratch=None, act=None):
        # The rows on the pool by channels (operators/_cpu_recurrent.h's conv_cols).
        if not native.rows_apart(x) or not native.contiguous(out, weight, bias, state):
            return None
        n, C = x.shape
        return native.Step(native.OP_CAUSAL_CONV, (out, x, weight, bias, state),
                           (n, C, weight.shape[0], int(act is not None)), rows=0)

    def pack(self, index, array, start=0, act=None):
        a = np.asarray(array, np.float32)
        return np.ascontiguousarray(a.T) if index == 1 else np.ascontiguousarray(a)

    def scratch(self, x, weight, bias, state, start=0, act=None):
        return (state[0] + 2 * x[0]) * x[1]

    def tolerance(self, x, weight, bias, state, start=0, act=None):
        return Tolerance(atol=1e-6, rtol=(4 + weight[1]) * EPS32)

    def scale(self, reference, x, weight, bias, state, start=0, act=None):
        # The sum of the products' magnitudes (of the window the reference read).
        K1 = weight.shape[1] - 1
        xx = np.concatenate([np.zeros((K1, x.shape[1])) if start == 0 else np.abs(as64(state)),
                             np.abs(as64(x))])
        w = np.abs(as64(weight))
        s = sum(xx[j:j + x.shape[0]] * w[:, j] for j in range(K1 + 1))
        return s + (0.0 if bias is None else np.abs(as64(bias)))

    def state_tolerance(self, x, weight, bias, state, start=0, act=None):
        return Tolerance(atol=0.0, rtol=0.0)  # rows copied, exactly
