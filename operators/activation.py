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
    """``act(gate) * up``: the gate of a gated MLP (transformers' LlamaMLP), ``(n, m)``.

    With ``up`` absent, ``gate`` is ``(n, 2m)``: gate then up, as a fused ``gate_up_proj``
    writes them (transformers' Phi3MLP ``chunk(2, dim=-1)``).
    """

    name = "gated_activation"

    @staticmethod
    def _halves(gate, up):
        if up is not None:
            return gate, up
        m = gate.shape[-1] // 2
        return gate[..., :m], gate[..., m:]

    def shape(self, gate, up=None, act="silu"):
        if act not in ACTIVATIONS:
            raise ValueError(f"activation {act!r} is not one of {', '.join(ACTIVATIONS)}")
        if up is None:
            if gate[-1] % 2:
                raise ValueError(f"gated_activation: fused gate and up {gate} has an odd width")
            return gate[:-1] + (gate[-1] // 2,)
        if gate != up:
            raise ValueError(f"gated_activation: gate {gate} and up {up} differ")
        return gate

    def reference(self, gate, up=None, act="silu"):
        g, u = self._halves(gate, up)
        return act_reference(g, act) * as64(u)

    def kernel(self, out, gate, up=None, scratch=None, act="silu"):
        g, u = self._halves(gate, up)
        act_kernel(out, g, act, scratch[: out.size].reshape(out.shape))
        out *= u

    def scratch(self, gate, up=None, act="silu"):
        return int(np.prod(gate)) // (2 if up is None else 1)

    def tolerance(self, gate, up=None, act="silu"):
        return Tolerance(atol=1e-6, rtol=16 * EPS32)

    def scale(self, reference, gate, up=None, act="silu"):
        g, u = self._halves(gate, up)
        return (np.abs(act_reference(g, act)) + np.abs(as64(g))) * np.abs(as64(u))
