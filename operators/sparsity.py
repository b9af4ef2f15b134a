"""Activation sparsity: the gaussian top-k cut a sparse MLP applies to its gate projection.

As transformers' Gemma3nTextMLP ``_gaussian_topk``: each row keeps what lies above its mean
plus ``std_multiplier`` standard deviations (population std, ``unbiased=False``), less that
cutoff, so that a share ``sparsity`` of a normal row is cut to 0:
``relu(x - (mean(x) + std(x) * std_multiplier))``, ``std_multiplier`` the standard normal's
quantile at ``sparsity``.

Not for: which layers cut, or where the MLP sits (``runtime.blocks.mlp.MLP``).
"""

from __future__ import annotations

import math

import numpy as np

from .base import EPS32, Operator, Tolerance, as64

# torch's calc_erfinv (aten/src/ATen/native/Math.h): G. L. Pavlis' rational approximation,
# central below 0.7, then two Newton steps on erf.
_CENTRAL = 0.7
_A = (0.886226899, -1.645349621, 0.914624893, -0.140543331)
_B = (-2.118377725, 1.442710462, -0.329097515, 0.012229801)
_C = (-1.970840454, -1.624906493, 3.429567803, 1.641345311)
_D = (3.543889200, 1.637067800)


def _erfinv(y: float) -> float:
    """erfinv of ``y`` in (-1, 1), in float64, as torch's ``calc_erfinv``."""
    if abs(y) <= _CENTRAL:
        z = y * y
        num = ((_A[3] * z + _A[2]) * z + _A[1]) * z + _A[0]
        dem = (((_B[3] * z + _B[2]) * z + _B[1]) * z + _B[0]) * z + 1.0
        x = y * num / dem
    else:
        z = math.sqrt(-math.log((1.0 - abs(y)) / 2.0))
        num = ((_C[3] * z + _C[2]) * z + _C[1]) * z + _C[0]
        dem = (_D[1] * z + _D[0]) * z + 1.0
        x = math.copysign(1.0, y) * num / dem
    for _ in range(2):
        x -= (math.erf(x) - y) / (2.0 / math.sqrt(math.pi) * math.exp(-x * x))
    return x


def std_multiplier(sparsity: float) -> float:
    """The standard normal's quantile at ``sparsity``, as transformers computes it in float32:
    ``torch.distributions.normal.Normal(0, 1).icdf(torch.tensor(sparsity, float32))``, that is
    ``erfinv(2 * s - 1) * sqrt(2)`` with ``s``, ``2 s - 1``, the erfinv and the product each
    rounded to float32 (the erfinv as torch's ``calc_erfinv``, in float64, then rounded).
    Equal to torch 2.13's value on every sparsity of three decimals on one CPU, within a
    float32 ulp on another whose torch build takes another path (tests/operators/
    test_sparsity.py). Returned as the float32 value, held in a Python float.

    Raises:
        ValueError: ``sparsity`` is not within (0, 1).
    """
    if not 0.0 < sparsity < 1.0:
        raise ValueError(f"activation sparsity {sparsity} is not within (0, 1) (0: no cut)")
    f = np.float32
    y = f(2.0) * f(sparsity) - f(1.0)
    return float(f(_erfinv(float(y))) * f(math.sqrt(2.0)))


class GaussianTopK(Operator):
    """``x`` ``(..., m)`` to ``relu(x - (mean + std * std_multiplier))``, mean and population
    std over each row's ``m`` values; attribute ``std_multiplier`` (``std_multiplier()`` of
    the sparsity). The native program has no step for it: numpy runs it.

    Raises:
        ValueError: ``x`` has no axis.
    """

    name = "gaussian_topk"

    def shape(self, x, std_multiplier=0.0):
        if len(x) < 1:
            raise ValueError("gaussian_topk takes rows (..., m), not a scalar")
        return x

    def reference(self, x, std_multiplier=0.0):
        x = as64(x)
        mean = x.mean(-1, keepdims=True)
        std = np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True))
        return np.maximum(x - (mean + std * std_multiplier), 0.0)

    def kernel(self, out, x, scratch=None, std_multiplier=0.0):
        d = scratch[: x.size].reshape(x.shape)
        mean = x.mean(-1, keepdims=True)
        np.subtract(x, mean, out=d)
        np.multiply(d, d, out=out)
        std = np.sqrt(out.mean(-1, keepdims=True))
        cutoff = mean + std * np.float32(std_multiplier)
        np.subtract(x, cutoff, out=out)
        np.maximum(out, np.float32(0.0), out=out)

    def scratch(self, x, std_multiplier=0.0):
        return int(np.prod(x))

    def tolerance(self, x, std_multiplier=0.0):
        # The row sums round by log2(m) steps at most (numpy's pairwise sum).
        return Tolerance(atol=1e-6, rtol=(8 + 2 * math.log2(max(x[-1], 2))) * EPS32)

    def scale(self, reference, x, std_multiplier=0.0):
        # The cutoff's own rounding, in every element of its row, beside x's.
        x = as64(x)
        rms = np.sqrt((x * x).mean(-1, keepdims=True))
        return np.abs(x) + np.abs(x).mean(-1, keepdims=True) + rms * (1.0 + abs(std_multiplier))
