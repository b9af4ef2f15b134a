"""fourier_mix against the 2-D DFT's definition summed by hand (no FFT), and the numpy
kernel against the float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

from iron_spec.operators import OPERATORS
from tests.operators.conftest import _check_kernel

OP = OPERATORS["fourier_mix"]


def _by_definition(x: np.ndarray) -> np.ndarray:
    # Re(sum_ij x[i, j] exp(-2 pi i (m i / n + k j / d))) = sum_ij x[i, j] cos(...), as
    # torch.fft.fftn(x, dim=(1, 2)).real over one text (FNetBasicFourierTransform).
    n, d = x.shape
    m, i = np.arange(n)[:, None, None, None], np.arange(n)[None, None, :, None]
    k, j = np.arange(d)[None, :, None, None], np.arange(d)[None, None, None, :]
    angle = 2 * np.pi * (m * i / n + k * j / d)
    return (np.cos(angle) * x[None, None]).sum(axis=(2, 3))


@pytest.mark.parametrize("n, d", [(1, 8), (2, 3), (11, 32), (24, 32)])
def test_reference_is_the_real_part_of_the_2d_dft(n, d):
    x = np.random.default_rng(n * d).standard_normal((n, d))
    np.testing.assert_allclose(OP.reference(x), _by_definition(x), rtol=0, atol=1e-11)


def test_a_one_row_text_transforms_its_columns_alone():
    # n = 1: the sequence's DFT is the identity, so each row is its own 1-D DFT's real part.
    x = np.array([[1.0, 2.0, 0.0, -1.0]])
    # Re X_k = sum_j x_j cos(pi k j / 2): 1 + 2 - 1, 1 + 0 + 0, 1 - 2 + 1, 1 + 0 + 0.
    np.testing.assert_allclose(OP.reference(x), [[2.0, 1.0, 0.0, 1.0]], rtol=0, atol=1e-15)


@pytest.mark.parametrize("n, d", [(1, 32), (11, 32), (24, 32), (128, 768)])
def test_kernel_meets_the_reference(n, d):
    x = np.random.default_rng(0).standard_normal((n, d)).astype(np.float32)
    _check_kernel(OP, x)


def test_a_shape_that_is_no_matrix_is_refused():
    with pytest.raises(ValueError, match=r"x \(n, d\)"):
        OP.shape((2, 3, 4))
