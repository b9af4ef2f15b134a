"""``conv2d`` (``operators.conv.Conv2d``): a channels-last 2-D convolution against a plain
loop over torch's ``nn.Conv2d`` definition, and its kernel against its reference."""

from __future__ import annotations

import numpy as np
import pytest

from iron_spec.operators import OPERATORS
from tests.operators.conftest import _check_kernel

op = OPERATORS["conv2d"]


def loop(x, w, stride, padding):
    """nn.Conv2d's sum, pixel by pixel: out[r, c, o] = sum over i, a, b of w[o, i, a, b]
    * x[r * stride + a - padding, c * stride + b - padding, i], zero outside the map."""
    H, W, C = x.shape
    O, _, k, _ = w.shape
    Ho, Wo = (H + 2 * padding - k) // stride + 1, (W + 2 * padding - k) // stride + 1
    out = np.zeros((Ho, Wo, O))
    for r in range(Ho):
        for c in range(Wo):
            for a in range(k):
                for b in range(k):
                    y, z = r * stride + a - padding, c * stride + b - padding
                    if 0 <= y < H and 0 <= z < W:
                        out[r, c] += w[:, :, a, b] @ x[y, z]
    return out


@pytest.mark.parametrize("shape,stride,padding", [((9, 10, 1), 2, 1), ((7, 6, 3), 2, 1),
                                                  ((5, 5, 2), 1, 0), ((6, 4, 2), 3, 2)])
def test_equals_the_definition(shape, stride, padding):
    rng = np.random.default_rng(0)
    x = rng.normal(size=shape).astype(np.float32)
    w = rng.normal(size=(4, shape[2], 3, 3)).astype(np.float32)
    want = loop(x.astype(np.float64), w.astype(np.float64), stride, padding)
    assert np.allclose(op.reference(x, w, stride=stride, padding=padding), want, atol=1e-12)
    got, _ = _check_kernel(op, x, w, packed=(1,), stride=stride, padding=padding)
    assert np.abs(got - want).max() <= 1e-5


def test_the_kernel_runs_band_by_band():
    # More output rows than a band: every band written.
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2 * op.BAND * 2 + 5, 8, 2)).astype(np.float32)
    w = rng.normal(size=(3, 2, 3, 3)).astype(np.float32)
    _check_kernel(op, x, w, packed=(1,), stride=2, padding=1)


def test_shapes_that_do_not_meet_are_refused():
    with pytest.raises(ValueError, match="does not meet"):
        op.shape((5, 5, 2), (4, 3, 3, 3))
    with pytest.raises(ValueError, match="does not fit"):
        op.shape((2, 2, 1), (4, 1, 3, 3), stride=1, padding=0)
