"""Activations by Hugging Face's ``hidden_act`` names, and the gated form a gated MLP uses.

``silu`` is ``x * sigmoid(x)``; ``gelu`` the exact erf form; ``gelu_pytorch_tanh`` the tanh
approximation, as torch.nn.functional.gelu(approximate="tanh").
"""

from __future__ import annotations

import math

import numpy as np

from .base import EPS32, Operator, Tolerance, as64

ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh", "relu")
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _erf64(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def act_reference(x: np.ndarray, act: str) -> np.ndarray:
    """``act`` of ``x`` in float64. Raises ValueError naming the valid activations."""
    x = as64(x)
    if act == "silu":
        return x / (1.0 + np.exp(-x))
    if act == "gelu":
        return 0.5 * x * (1.0 + _erf64(x / math.sqrt(2.0)))
    if act == "gelu_pytorch_tanh":
        return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)))
    if act == "relu":
        return np.maximum(x, 0.0)
    raise ValueError(f"activation {act!r} is not one of {', '.join(ACTIVATIONS)}")


def act_kernel(out: np.ndarray, x: np.ndarray, act: str, tmp: np.ndarray) -> None:
    """``act`` of float32 ``x`` into ``out``; ``tmp`` is scratch of ``x``'s shape."""
    if act == "silu":
        np.negative(x, out=tmp)
        np.exp(tmp, out=tmp)
        tmp += np.float32(1.0)
        np.divide(x, tmp, out=out)
    elif act == "gelu_pytorch_tanh":
        np.multiply(x, x, out=tmp)
        tmp *= x
        tmp *= np.float32(0.044715)
        tmp += x
        tmp *= np.float32(_SQRT_2_OVER_PI)
        np.tanh(tmp, out=tmp)
        tmp += np.float32(1.0)
        np.multiply(x, tmp, out=out)
        out *= np.float32(0.5)
    elif act == "gelu":
        # numpy has no erf ufunc; the float64 form rounded once is exact enough.
        np.copyto(out, act_reference(x, act))
    elif act == "relu":
        np.maximum(x, np.float32(0.0), out=out)
    else:
        raise ValueError(f"activation {act!r} is not one of {', '.join(ACTIVATIONS)}")


class Activation(Operator):
    """``act(x)`` elementwise; attribute ``act`` is a ``hidden_act`` name."""

    name = "activation"

    def shape(self, x, act="silu"):
        if act not in ACTIVATIONS:
            raise ValueError(f"activation {act!r} is not one of {', '.join(ACTIVATIONS)}")
        return x

    def reference(self, x, act="silu"):
        return act_reference(x, act)

    def kernel(self, out, x, scratch=None, act="silu"):
        act_kernel(out, x, act, scratch[: x.size].reshape(x.shape))

    def scratch(self, x, act="silu"):
        return int(np.prod(x))

    def tolerance(self, x, act="silu"):
        return Tolerance(atol=1e-6, rtol=16 * EPS32)

    def scale(self, reference, x, act="silu"):
        return np.abs(reference) + np.abs(as64(x))


class GatedActivation(Operator):
    """``act(gate) * up``: the gate of a gated MLP (transformers' LlamaMLP), ``(n, m)``."""

    name = "gated_activation"

    def shape(self, gate, up, act="silu"):
        if gate != up:
            raise ValueError(f"gated_activation: gate {gate} and up {up} differ")
        if act not in ACTIVATIONS:
            raise ValueError(f"activation {act!r} is not one of {', '.join(ACTIVATIONS)}")
        return gate

    def reference(self, gate, up, act="silu"):
        return act_reference(gate, act) * as64(up)

    def kernel(self, out, gate, up, scratch=None, act="silu"):
        act_kernel(out, gate, act, scratch[: gate.size].reshape(gate.shape))
        out *= up

    def scratch(self, gate, up, act="silu"):
        return int(np.prod(gate))

    def tolerance(self, gate, up, act="silu"):
        return Tolerance(atol=1e-6, rtol=16 * EPS32)

    def scale(self, reference, gate, up, act="silu"):
        return (np.abs(act_reference(gate, act)) + np.abs(as64(gate))) * np.abs(as64(up))
