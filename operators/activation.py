"""Activations by transformers' ``ACT2FN`` names, and the gated form a gated MLP uses.

Each name computes what transformers' ``activations.py`` maps it to: ``gelu`` and
``gelu_python`` the erf form (GELUActivation); ``gelu_new``, ``gelu_pytorch_tanh``,
``gelu_python_tanh`` and ``gelu_accurate`` the tanh form (NewGELUActivation, GELUTanh,
AccurateGELUActivation: one formula); ``gelu_fast`` the tanh form with its own constant
(FastGELUActivation); ``gelu_10`` the erf form clipped to [-10, 10]; ``quick_gelu``
``x * sigmoid(1.702 x)``; ``silu`` and ``swish`` ``x * sigmoid(x)``; ``relu``, ``relu2``
(ReLU squared), ``relu6``, ``leaky_relu`` (slope 0.01, nn.LeakyReLU's default), ``sigmoid``,
``tanh``, ``mish`` (``x * tanh(softplus(x))``), ``laplace`` (LaplaceActivation's
``mu = 0.707107``, ``sigma = 0.282095``), ``hardswish``, ``sqrtsoftplus``, ``linear``
(identity). Two hold learned parameters, the inputs after ``x`` (``ACTIVATION_PARAMS``):
``prelu`` (nn.PReLU's ``weight`` ``(1,)``) and ``xielu`` (XIELUActivation).

References are float64 from the definitions (erf by ``math.erf``); kernels are float32
numpy into the output and scratch, nothing allocated of the input's size.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from . import native
from .base import EPS32, Operator, Tolerance, as64

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_FAST_GELU = 0.7978845608  # FastGELUActivation's literal, not sqrt(2 / pi) itself
_LAPLACE_MU, _LAPLACE_SIGMA = 0.707107, 0.282095
_LEAKY_SLOPE = 0.01
_SOFTPLUS_THRESHOLD = 20.0  # torch's softplus: x itself above it

#: The parameters an activation holds, in the order they follow ``x``, and their shapes,
#: as transformers' module holds them (``act_fn.<name>``). XIELUActivation stores
#: ``alpha_p`` and ``alpha_n`` before softplus, and ``beta`` and ``eps`` as 0-d buffers.
ACTIVATION_PARAMS: dict[str, tuple[tuple[str, tuple[int, ...]], ...]] = {
    "prelu": (("weight", (1,)),),
    "xielu": (("alpha_p", (1,)), ("alpha_n", (1,)), ("beta", ()), ("eps", ())),
}


def _erf64(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _softplus64(x: np.ndarray) -> np.ndarray:
    """torch.nn.functional.softplus (beta 1, threshold 20) in float64."""
    return np.where(x > _SOFTPLUS_THRESHOLD, x, np.log1p(np.exp(np.minimum(x, _SOFTPLUS_THRESHOLD))))


def _gelu_tanh64(x):
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)))


def _gelu64(x):
    return 0.5 * x * (1.0 + _erf64(x / math.sqrt(2.0)))


def _xielu64(x, p):
    """XIELUActivation._xielu_python: ``alpha_p = softplus(alpha_p)``, ``alpha_n = beta +
    softplus(alpha_n)``; ``x > 0``: ``alpha_p x^2 + beta x``, else ``(expm1(min(x, eps)) - x)
    alpha_n + beta x``."""
    a_p, a_n, beta, eps = (float(np.asarray(v, np.float64).reshape(-1)[0]) for v in p)
    a_p = float(_softplus64(np.float64(a_p)))
    a_n = beta + float(_softplus64(np.float64(a_n)))
    return np.where(x > 0, a_p * x * x + beta * x, (np.expm1(np.minimum(x, eps)) - x) * a_n + beta * x)


_REFERENCES: dict[str, Callable] = {
    "silu": lambda x, p: x / (1.0 + np.exp(-x)),
    "swish": lambda x, p: x / (1.0 + np.exp(-x)),
    "sigmoid": lambda x, p: 1.0 / (1.0 + np.exp(-x)),
    "tanh": lambda x, p: np.tanh(x),
    "gelu": lambda x, p: _gelu64(x),
    "gelu_python": lambda x, p: _gelu64(x),
    "gelu_10": lambda x, p: np.clip(_gelu64(x), -10.0, 10.0),
    "gelu_new": lambda x, p: _gelu_tanh64(x),
    "gelu_pytorch_tanh": lambda x, p: _gelu_tanh64(x),
    "gelu_python_tanh": lambda x, p: _gelu_tanh64(x),
    "gelu_accurate": lambda x, p: _gelu_tanh64(x),
    "gelu_fast": lambda x, p: 0.5 * x * (1.0 + np.tanh(x * _FAST_GELU * (1.0 + 0.044715 * x * x))),
    "quick_gelu": lambda x, p: x / (1.0 + np.exp(-1.702 * x)),
    "relu": lambda x, p: np.maximum(x, 0.0),
    "relu2": lambda x, p: np.maximum(x, 0.0) ** 2,
    "relu6": lambda x, p: np.clip(x, 0.0, 6.0),
    "leaky_relu": lambda x, p: np.where(x > 0, x, _LEAKY_SLOPE * x),
    "mish": lambda x, p: x * np.tanh(_softplus64(x)),
    "laplace": lambda x, p: 0.5 * (1.0 + _erf64((x - _LAPLACE_MU) / (_LAPLACE_SIGMA * math.sqrt(2.0)))),
    "hardswish": lambda x, p: x * np.clip(x + 3.0, 0.0, 6.0) / 6.0,
    "sqrtsoftplus": lambda x, p: np.sqrt(_softplus64(x)),
    "linear": lambda x, p: x.copy(),
    "prelu": lambda x, p: np.where(x >= 0, x, float(as64(p[0]).reshape(-1)[0]) * x),
    "xielu": _xielu64,
}

ACTIVATIONS = tuple(_REFERENCES)


def _erfc32(out, w, z, acc):
    """erfc(w) into ``out`` (float32): Numerical Recipes' ``erfcc`` (fractional error below
    1.2e-7) for ``|w|``, then ``2 - erfc(|w|)`` where ``w < 0``. ``w``, ``z``, ``acc`` are
    scratch of ``out``'s shape; ``w`` is overwritten."""
    f = np.float32
    np.abs(w, out=z)
    np.multiply(z, f(0.5), out=out)
    out += f(1.0)
    np.reciprocal(out, out=out)  # t
    acc.fill(f(0.17087277))
    for c in (-0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418,
              0.37409196, 1.00002368, -1.26551223):
        acc *= out
        acc += f(c)
    np.multiply(z, z, out=z)
    acc -= z
    np.exp(acc, out=acc)
    out *= acc  # erfc(|w|)
    # s = 1 where w < 0, 0 where w > 0 (1/2 at 0, where erfc(|w|) = 1 makes it moot):
    # erfc(w) = e + s * (2 - 2e) without a boolean mask.
    np.sign(w, out=w)
    w -= f(1.0)
    w *= f(-0.5)
    np.multiply(out, f(-2.0), out=z)
    z += f(2.0)
    z *= w
    out += z


def _gelu32(out, x, t):
    # gelu(x) = 0.5 x erfc(-x / sqrt(2)): no cancellation for negative x.
    np.multiply(x, np.float32(-1.0 / math.sqrt(2.0)), out=t[0])
    _erfc32(out, t[0], t[1], t[2])
    out *= x
    out *= np.float32(0.5)


def _gelu_tanh32(out, x, t, k=_SQRT_2_OVER_PI):
    tmp = t[0]
    np.multiply(x, x, out=tmp)
    tmp *= x
    tmp *= np.float32(0.044715)
    tmp += x
    tmp *= np.float32(k)
    np.tanh(tmp, out=tmp)
    tmp += np.float32(1.0)
    np.multiply(x, tmp, out=out)
    out *= np.float32(0.5)


def _gelu_fast32(out, x, t):
    tmp = t[0]
    np.multiply(x, x, out=tmp)
    tmp *= np.float32(0.044715)
    tmp += np.float32(1.0)
    tmp *= np.float32(_FAST_GELU)
    tmp *= x
    np.tanh(tmp, out=tmp)
    tmp += np.float32(1.0)
    np.multiply(x, tmp, out=out)
    out *= np.float32(0.5)


def _sigmoid_times32(out, x, t, k=1.0):
    """``x * sigmoid(k x)`` as ``x / (1 + exp(-k x))``."""
    np.multiply(x, np.float32(-k), out=t[0])
    np.exp(t[0], out=t[0])
    t[0] += np.float32(1.0)
    np.divide(x, t[0], out=out)


def _sigmoid32(out, x, t):
    np.negative(x, out=t[0])
    np.exp(t[0], out=t[0])
    t[0] += np.float32(1.0)
    np.reciprocal(t[0], out=out)


def _leaky32(out, x, t, slope):
    # max(x, 0) + slope * min(x, 0): x where x > 0, slope * x elsewhere, exactly.
    np.minimum(x, np.float32(0.0), out=t[0])
    t[0] *= np.float32(slope)
    np.maximum(x, np.float32(0.0), out=out)
    out += t[0]


def _softplus32(out, x):
    np.logaddexp(np.float32(0.0), x, out=out)


def _laplace32(out, x, t):
    np.subtract(x, np.float32(_LAPLACE_MU), out=t[0])
    t[0] *= np.float32(-1.0 / (_LAPLACE_SIGMA * math.sqrt(2.0)))
    _erfc32(out, t[0], t[1], t[2])
    out *= np.float32(0.5)


def _xielu32(out, x, t, p):
    a_p, a_n, beta, eps = (float(np.asarray(v).reshape(-1)[0]) for v in p)
    f = np.float32
    a_p = f(_softplus64(np.float64(a_p)))
    a_n = f(f(beta) + f(_softplus64(np.float64(a_n))))
    neg, sel = t[0], t[1]
    np.minimum(x, f(eps), out=neg)
    np.expm1(neg, out=neg)
    neg -= x
    neg *= a_n
    np.multiply(x, a_p, out=out)
    out *= x
    # Select without a boolean array: sel is 1.0 where x > 0, else 0.0; both branches
    # are finite, so out * sel + neg * (1 - sel) is the one branch exactly.
    np.greater(x, f(0.0), out=sel)
    out *= sel
    np.subtract(f(1.0), sel, out=sel)
    neg *= sel
    out += neg
    np.multiply(x, f(beta), out=neg)
    out += neg


def _kernel(out, x, act, t, p):
    if act in ("silu", "swish"):
        _sigmoid_times32(out, x, t)
    elif act == "quick_gelu":
        _sigmoid_times32(out, x, t, 1.702)
    elif act == "sigmoid":
        _sigmoid32(out, x, t)
    elif act == "tanh":
        np.tanh(x, out=out)
    elif act in ("gelu", "gelu_python", "gelu_10"):
        _gelu32(out, x, t)
        if act == "gelu_10":
            np.clip(out, np.float32(-10.0), np.float32(10.0), out=out)
    elif act in ("gelu_new", "gelu_pytorch_tanh", "gelu_python_tanh", "gelu_accurate"):
        _gelu_tanh32(out, x, t)
    elif act == "gelu_fast":
        _gelu_fast32(out, x, t)
    elif act == "relu":
        np.maximum(x, np.float32(0.0), out=out)
    elif act == "relu2":
        np.maximum(x, np.float32(0.0), out=out)
        np.multiply(out, out, out=out)
    elif act == "relu6":
        np.clip(x, np.float32(0.0), np.float32(6.0), out=out)
    elif act == "leaky_relu":
        _leaky32(out, x, t, _LEAKY_SLOPE)
    elif act == "prelu":
        _leaky32(out, x, t, float(np.asarray(p[0]).reshape(-1)[0]))
    elif act == "mish":
        _softplus32(t[0], x)
        np.tanh(t[0], out=t[0])
        np.multiply(x, t[0], out=out)
    elif act == "laplace":
        _laplace32(out, x, t)
    elif act == "hardswish":
        np.add(x, np.float32(3.0), out=t[0])
        np.clip(t[0], np.float32(0.0), np.float32(6.0), out=t[0])
        np.multiply(x, t[0], out=out)
        out /= np.float32(6.0)
    elif act == "sqrtsoftplus":
        _softplus32(out, x)
        np.sqrt(out, out=out)
    elif act == "linear":
        np.copyto(out, x)
    elif act == "xielu":
        _xielu32(out, x, t, p)
    else:
        raise ValueError(_unknown(act))


#: The activations a native program runs (operators/_cpu_program.h), by the same float32
#: operations as their numpy kernels here.
_NATIVE = {"silu": native.ACT_SILU, "swish": native.ACT_SILU,
           **{a: native.ACT_GELU_TANH for a in ("gelu_new", "gelu_pytorch_tanh",
                                                "gelu_python_tanh", "gelu_accurate")},
           "gelu": native.ACT_GELU_ERF, "gelu_python": native.ACT_GELU_ERF,
           "relu": native.ACT_RELU, "quick_gelu": native.ACT_QUICK_GELU,
           "relu2": native.ACT_RELU2, "sigmoid": native.ACT_SIGMOID}

#: The activations a prompt chunk's gated rows run natively (``_cpu.gated``).
_CHUNK = (native.ACT_SILU, native.ACT_GELU_TANH)

#: Scratch buffers of the input's size each kernel needs.
_SCRATCH = {"gelu": 3, "gelu_python": 3, "gelu_10": 3, "laplace": 3, "xielu": 2}


def _unknown(act) -> str:
    return f"activation {act!r} is not one of {', '.join(ACTIVATIONS)}"


def check_params(act: str, shapes) -> None:
    """Raise ValueError unless ``act`` is known and ``shapes`` are its parameters' shapes
    (``ACTIVATION_PARAMS``; none for most)."""
    if act not in _REFERENCES:
        raise ValueError(_unknown(act))
    want = tuple(s for _, s in ACTIVATION_PARAMS.get(act, ()))
    got = tuple(tuple(s) for s in shapes)
    if got != want:
        names = ", ".join(f"{n} {s}" for n, s in ACTIVATION_PARAMS.get(act, ())) or "none"
        raise ValueError(f"activation {act!r} takes parameters {names}, not shapes {list(got)}")


def act_reference(x: np.ndarray, act: str, params=()) -> np.ndarray:
    """``act`` of ``x`` in float64; ``params`` the activation's parameters
    (``ACTIVATION_PARAMS``). Raises ValueError naming the valid activations."""
    if act not in _REFERENCES:
        raise ValueError(_unknown(act))
    return _REFERENCES[act](as64(x), params)


def act_kernel(out: np.ndarray, x: np.ndarray, act: str, scratch: np.ndarray,
               params=()) -> None:
    """``act`` of float32 ``x`` into ``out``; ``scratch`` holds ``act_scratch(act)`` buffers
    of ``x``'s size; ``params`` as ``act_reference``."""
    k = act_scratch(act)
    t = scratch[: k * x.size].reshape((k,) + x.shape)
    _kernel(out, x, act, t, params)


def act_magnitude(x: np.ndarray, act: str, params=()) -> np.ndarray:
    """Beside ``|act(x)|``, the magnitude of the terms a kernel sums for ``act(x)``
    (float64): ``|x|``, and for ``xielu`` each branch's terms (its ``alpha_p x^2`` and
    ``beta x`` may cancel), for ``prelu`` the slope's product."""
    mag = np.abs(x)
    if act == "xielu":
        a_p, a_n, beta, _ = (float(as64(v).reshape(-1)[0]) for v in params)
        a_p = float(_softplus64(np.float64(a_p)))
        a_n = abs(beta) + float(_softplus64(np.float64(a_n)))
        return mag * (1.0 + abs(beta) + a_n) + a_p * x * x + a_n
    if act == "prelu":
        return mag * (1.0 + abs(float(as64(params[0]).reshape(-1)[0])))
    return mag


def act_scratch(act: str) -> int:
    """How many buffers of the input's size ``act``'s kernel needs."""
    return _SCRATCH.get(act, 1)


class Activation(Operator):
    """``act(x)`` elementwise; attribute ``act`` an ``ACT2FN`` name; inputs after ``x``: the
    activation's parameters (``ACTIVATION_PARAMS``)."""

    name = "activation"

    def shape(self, x, *params, act="silu"):
        check_params(act, params)
        return x

    def reference(self, x, *params, act="silu"):
        return act_reference(x, act, params)

    def kernel(self, out, x, *params, scratch=None, act="silu"):
        act_kernel(out, x, act, scratch, params)

    def lower(self, out, x, *params, scratch=None, act="silu"):
        if act not in _NATIVE or params or x.ndim < 1 or not native.contiguous(out, x):
            return None
        rows = x.shape[0] if x.ndim > 1 else 1
        return native.Step(native.OP_ACTIVATION, (out, x), (rows, x.size // rows, _NATIVE[act]),
                           rows=0)

    def scratch(self, x, *params, act="silu"):
        return act_scratch(act) * int(np.prod(x))

    def tolerance(self, x, *params, act="silu"):
        return Tolerance(atol=1e-6, rtol=16 * EPS32)

    def scale(self, reference, x, *params, act="silu"):
        return np.abs(reference) + act_magnitude(as64(x), act, params)


class GatedActivation(Operator):
    """``act(gate) * up``: the gate of a gated MLP (transformers' LlamaMLP), ``(n, m)``.

    With ``up`` absent, ``gate`` is ``(n, 2m)``: gate then up, as a fused ``gate_up_proj``
    writes them (transformers' Phi3MLP ``chunk(2, dim=-1)``). Inputs after ``up``: the
    activation's parameters (``ACTIVATION_PARAMS``).
    """

    name = "gated_activation"

    @staticmethod
    def _halves(gate, up):
        if up is not None:
            return gate, up
        m = gate.shape[-1] // 2
        return gate[..., :m], gate[..., m:]

    def shape(self, gate, up=None, *params, act="silu"):
        check_params(act, params)
        if up is None:
            if gate[-1] % 2:
                raise ValueError(f"gated_activation: fused gate and up {gate} has an odd width")
            return gate[:-1] + (gate[-1] // 2,)
        if gate != up:
            raise ValueError(f"gated_activation: gate {gate} and up {up} differ")
        return gate

    def reference(self, gate, up=None, *params, act="silu"):
        g, u = self._halves(gate, up)
        return act_reference(g, act, params) * as64(u)

    def kernel(self, out, gate, up=None, *params, scratch=None, act="silu"):
        g, u = self._halves(gate, up)
        lib = native.lib() if _NATIVE.get(act) in _CHUNK and not params and out.ndim == 2 \
            and out.shape[0] > 1 else None
        if lib is not None and native.rows_apart(out, g, u):
            # A prompt chunk's rows on the pool, the body the native program's step runs (g
            # and u may be the fused gate/up projection's column views).
            lib.gated(out, g, u, _NATIVE[act])
            return
        act_kernel(out, g, act, scratch, params)
        out *= u

    def lower(self, out, gate, up=None, *params, scratch=None, act="silu"):
        # Rows apart: the fused gate/up projection's column views, read in place.
        if act not in _NATIVE or params or out.ndim != 2 or not native.rows_apart(out, gate, up):
            return None
        m = out.shape[-1]
        return native.Step(native.OP_GATED, (out, gate, up), (out.shape[0], m, _NATIVE[act]),
                           rows=0)

    def scratch(self, gate, up=None, *params, act="silu"):
        return act_scratch(act) * (int(np.prod(gate)) // (2 if up is None else 1))

    def tolerance(self, gate, up=None, *params, act="silu"):
        return Tolerance(atol=1e-6, rtol=16 * EPS32)

    def scale(self, reference, gate, up=None, *params, act="silu"):
        g, u = self._halves(gate, up)
        g = as64(g)
        return (np.abs(act_reference(g, act, params)) + act_magnitude(g, act, params)) * np.abs(as64(u))
