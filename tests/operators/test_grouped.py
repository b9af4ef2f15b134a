"""grouped_linear against the dense projection by its block-diagonal weight (torch's
Conv1d with groups, kernel 1), and the numpy kernel against the reference."""

from __future__ import annotations

import numpy as np
import pytest

from iron_spec.operators import OPERATORS
from tests.operators.conftest import _check_kernel

OP = OPERATORS["grouped_linear"]


def _block_diagonal(weight: np.ndarray, groups: int, cin: int) -> np.ndarray:
    cout, ci = weight.shape
    full = np.zeros((cout, cin))
    co = cout // groups
    for g in range(groups):
        full[g * co:(g + 1) * co, g * ci:(g + 1) * ci] = weight[g * co:(g + 1) * co]
    return full


@pytest.mark.parametrize("cin, cout, groups", [(8, 8, 1), (8, 12, 2), (16, 8, 4), (6, 6, 6)])
def test_each_output_reads_its_own_groups_inputs(cin, cout, groups):
    rng = np.random.default_rng(cin * cout + groups)
    x = rng.standard_normal((5, cin)).astype(np.float32)
    w = rng.standard_normal((cout, cin // groups)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    want = x.astype(np.float64) @ _block_diagonal(w, groups, cin).T + b
    got, ref = _check_kernel(OP, x, w, b, groups=groups)
    np.testing.assert_allclose(ref, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_two_groups_by_hand():
    # Outputs 0, 1 read inputs 0, 1; outputs 2, 3 read inputs 2, 3.
    x = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
    w = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, -1.0]], np.float32)
    got, _ = _check_kernel(OP, x, w, None, groups=2)
    np.testing.assert_array_equal(got, [[1.0, 2.0, 7.0, 2.0]])


def test_widths_that_do_not_split_are_refused():
    with pytest.raises(ValueError, match="split into 3 groups"):
        OP.shape((2, 8), (8, 4), None, groups=3)
