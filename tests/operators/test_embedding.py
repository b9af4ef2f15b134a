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
