"""token_dropout_rescale against hand-computed values (EsmEmbeddings' token_dropout)."""

from __future__ import annotations

import numpy as np
import pytest

from iron_spec.operators import OPERATORS

OP = OPERATORS["token_dropout_rescale"]


def test_mask_rows_zeroed_and_the_rest_scaled_by_the_observed_share():
    # 4 rows, one of them the mask (id 7): factor (1 - 0.12) / (1 - 1/4) = 0.88 / 0.75.
    x = np.array([[1.0, 2.0], [3.0, -4.0], [5.0, 6.0], [-0.5, 0.25]], np.float32)
    ids = np.array([3, 7, 0, 1], np.int32)
    want = np.array([[1.0, 2.0], [0.0, 0.0], [5.0, 6.0], [-0.5, 0.25]]) * (0.88 / 0.75)
    out = np.empty_like(x)
    OP.kernel(out, x, ids, mask_id=7, ratio=0.12)
    np.testing.assert_allclose(out, want, rtol=2e-7)
    np.testing.assert_allclose(OP.reference(x, ids, mask_id=7, ratio=0.12), want, rtol=1e-15)


def test_no_mask_scales_by_one_less_the_ratio():
    x = np.full((3, 2), 2.0, np.float32)
    out = np.empty_like(x)
    OP.kernel(out, x, np.zeros(3, np.int32), mask_id=5, ratio=0.12)
    np.testing.assert_allclose(out, np.full((3, 2), 1.76), rtol=2e-7)


def test_masks_alone_are_nan_as_transformers():
    # (1 - 0.12) / (1 - 2/2) divides by zero and 0 * inf is NaN, in torch as in numpy.
    x = np.ones((2, 3), np.float32)
    out = np.empty_like(x)
    OP.kernel(out, x, np.full(2, 4, np.int32), mask_id=4, ratio=0.12)
    assert np.isnan(out).all()
    assert np.isnan(OP.reference(x, np.full(2, 4, np.int32), mask_id=4, ratio=0.12)).all()


def test_shapes_that_do_not_pair_are_refused():
    with pytest.raises(ValueError, match=r"x \(n, d\) and ids \(n,\)"):
        OP.shape((4, 2), (3,), mask_id=1, ratio=0.1)
