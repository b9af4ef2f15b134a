"""AddRows: rows of a position table from a call's first position, added (hand values)."""

import numpy as np

from iron_spec.operators import AddRows

X = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
TABLE = np.array([[0.0, 0.0], [10.0, 20.0], [30.0, 40.0], [50.0, 60.0]], np.float32)


def test_add_rows_hand(run_kernel):
    # start 1: rows 1 and 2 of the table (OPT's offset folded into the start).
    expected = [[11.0, 22.0], [33.0, 44.0]]
    np.testing.assert_array_equal(AddRows().reference(X, TABLE, start=1), expected)
    np.testing.assert_array_equal(run_kernel(AddRows(), X, TABLE, start=1), expected)
    np.testing.assert_array_equal(run_kernel(AddRows(), X[:1], TABLE, start=3), [[51.0, 62.0]])
