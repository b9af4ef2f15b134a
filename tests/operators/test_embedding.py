"""Embedding: rows of the table named by the ids, times ``scale`` (torch.nn.Embedding)."""

import math

import numpy as np
import pytest

from iron_spec.operators import Embedding

OP = Embedding()
TABLE = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)


def test_reference_gathers_rows_in_id_order():
    ids = np.array([2, 0, 2], np.int32)
    np.testing.assert_array_equal(OP.reference(ids, TABLE), [[5, 6], [1, 2], [5, 6]])


def test_reference_scales_rows():
    ids = np.array([1], np.int32)
    np.testing.assert_array_equal(OP.reference(ids, TABLE, scale=0.5), [[1.5, 2.0]])


def test_kernel_gather_is_exact(run_kernel):
    ids = np.array([2, 0, 2, 1], np.int32)
    got = run_kernel(OP, ids, TABLE)
    np.testing.assert_array_equal(got, [[5, 6], [1, 2], [5, 6], [3, 4]])


@pytest.mark.parametrize("scale", [1.0, 0.5, math.sqrt(2048)])  # sqrt(hidden): Gemma's normalizer
def test_kernel_within_tolerance(check_kernel, randn, scale):
    weight = randn(50, 16)
    ids = np.array([0, 49, 7, 7, 3], np.int32)
    check_kernel(OP, ids, weight, scale=scale)


def test_shape_and_mismatch():
    assert OP.shape((5,), (50, 16)) == (5, 16)
    with pytest.raises(ValueError):
        OP.shape((5, 1), (50, 16))
    with pytest.raises(ValueError):
        OP.shape((5,), (50, 16, 2))


def test_ids_outside_the_table_read_the_outside_row(run_kernel):
    # Gemma3nTextModel.get_per_layer_inputs: ids past vocab_size_per_layer_input read row 0.
    ids = np.array([2, 3, 7, 1], np.int32)
    want = [[5, 6], [1, 2], [1, 2], [3, 4]]
    np.testing.assert_array_equal(OP.reference(ids, TABLE, outside=0), want)
    np.testing.assert_array_equal(run_kernel(OP, ids, TABLE, outside=0), want)
    with pytest.raises(ValueError, match="row 3 for ids outside the table is not one of its 3"):
        OP.shape((4,), (3, 2), outside=3)
