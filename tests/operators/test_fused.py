"""Splitting fused projections: columns of a fused qkv, and a gated activation over a fused
gate-and-up, against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from iron_spec.operators import Columns, GatedActivation


def test_columns_takes_a_run():
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    op = Columns()
    assert op.shape((2, 6), begin=2, end=5) == (2, 3)
    out = np.empty((2, 3), np.float32)
    op.kernel(out, x, begin=2, end=5)
    np.testing.assert_array_equal(out, [[2, 3, 4], [8, 9, 10]])
    np.testing.assert_array_equal(op.reference(x, begin=2, end=5), out)


@pytest.mark.parametrize("begin,end", [(3, 3), (-1, 2), (0, 7)])
def test_columns_out_of_range_refused(begin, end):
    with pytest.raises(ValueError, match="columns"):
        Columns().shape((2, 6), begin=begin, end=end)


def test_gated_activation_on_fused_gate_then_up():
    # gate [1, 0], up [2, 3]: silu(1) * 2 and silu(0) * 3 = 0
    x = np.array([[1.0, 0.0, 2.0, 3.0]], np.float32)
    op = GatedActivation()
    assert op.shape((1, 4), None, act="silu") == (1, 2)
    silu1 = 1 / (1 + math.exp(-1))
    np.testing.assert_allclose(op.reference(x, None, act="silu"), [[2 * silu1, 0.0]], rtol=1e-15)
    out = np.empty((1, 2), np.float32)
    op.kernel(out, x, None, scratch=np.empty(op.scratch((1, 4), None), np.float32), act="silu")
    np.testing.assert_allclose(out, [[2 * silu1, 0.0]], rtol=1e-6)


def test_gated_activation_odd_fused_width_refused():
    with pytest.raises(ValueError, match="odd"):
        GatedActivation().shape((1, 5), None)
