"""trigram against rows laid out by hand (MobileBertEmbeddings' trigram_input), and the
numpy kernel against the reference."""

from __future__ import annotations

import numpy as np
import pytest

from iron_spec.operators import OPERATORS
from tests.operators.conftest import _check_kernel

OP = OPERATORS["trigram"]


def test_each_row_sits_between_its_next_and_previous():
    x = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)
    want = [[3.0, 4.0, 1.0, 2.0, 0.0, 0.0],
            [5.0, 6.0, 3.0, 4.0, 1.0, 2.0],
            [0.0, 0.0, 5.0, 6.0, 3.0, 4.0]]
    got, ref = _check_kernel(OP, x)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(ref, want)


def test_one_row_has_neither_neighbour():
    got, _ = _check_kernel(OP, np.array([[7.0, -1.0]], np.float32))
    np.testing.assert_array_equal(got, [[0.0, 0.0, 7.0, -1.0, 0.0, 0.0]])


def test_a_shape_that_is_no_matrix_is_refused():
    with pytest.raises(ValueError, match=r"x \(n, d\)"):
        OP.shape((2, 3, 4))
