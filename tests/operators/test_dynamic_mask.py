"""The dynamic mask exp(A * softplus(dt)), DogeAttention's dt_states."""

import math

import numpy as np
import pytest

from iron_spec.operators import DynamicMask

OP = DynamicMask()


def test_by_hand(run_kernel):
    # softplus(0) = ln 2, so A = 2 gives exp(2 ln 2) = 4; softplus(ln 3) = ln 4, A = 0.5
    # gives 2; past torch's threshold 20 softplus is x itself: exp(0.1 * 30) = e ** 3.
    dt = np.array([[0.0, math.log(3.0), 30.0]])
    a = np.array([2.0, 0.5, 0.1])
    expected = [[4.0, 2.0, math.e ** 3]]
    np.testing.assert_allclose(OP.reference(dt, a), expected, rtol=1e-12)
    np.testing.assert_allclose(run_kernel(OP, dt, a), expected, rtol=1e-6)


def test_kernel_meets_reference(check_kernel, randn):
    check_kernel(OP, randn(40, 4, scale=3.0), randn(4))


def test_one_a_per_kv_head():
    with pytest.raises(ValueError, match=r"A \(3,\) is not one per kv head"):
        OP.shape((5, 2), (3,))
