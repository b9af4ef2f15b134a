"""Softcap against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from iron_spec.operators import Softcap


def test_reference_is_tanh_of_x_over_cap_times_cap():
    x = np.array([[0.0, 1.0, -30.0, 1000.0]])
    got = Softcap().reference(x, cap=30.0)
    np.testing.assert_allclose(got, [[0.0, 30 * math.tanh(1 / 30), -30 * math.tanh(1.0), 30.0]],
                               rtol=1e-15)


def test_kernel_within_tolerance_and_bounded():
    op = Softcap()
    x = np.random.default_rng(0).normal(0, 10, (3, 50)).astype(np.float32)
    out = np.empty_like(x)
    op.kernel(out, x, cap=5.0)
    ref = op.reference(x, cap=5.0)
    assert np.all(np.abs(out) <= 5.0)
    bound = op.tolerance(x.shape, cap=5.0).bound(op.scale(ref, x, cap=5.0))
    assert np.all(np.abs(out - ref) <= bound)


def test_non_positive_cap_refused():
    with pytest.raises(ValueError, match="cap"):
        Softcap().shape((2, 3), cap=0.0)
