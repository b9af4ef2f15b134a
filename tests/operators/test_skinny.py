"""A batched decode step's GEMV on held weights (operators/_cpu_skinny.h): each of the m rows
of x against a weight read once for all of them gives the one-row GEMV's result bit for bit,
on every instruction set this CPU runs.

The one-row GEMV is held to gguf-py's and ml_dtypes' values in test_held.py; here each
batched row is held to it exactly (a batch that reordered one sum would differ in the last
bits), and to those values within the one-row test's bound too.
"""

from __future__ import annotations

import numpy as np
import pytest

from iron_spec.operators import formats, held, native
from iron_spec.operators.linear import Linear
from test_held import BLOCK_FORMS, FLOAT_FORMS, bound, on, weight  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(not native.PROGRAM, reason="a batched GEMV runs in a program")


def batched(w, x: np.ndarray, b) -> np.ndarray:
    """x (m, k) against held w as the batched decode step runs it: one OP_GEMV over m rows
    (runtime/batch.py's encoding of a projection)."""
    m, n = x.shape[0], w.shape[0]
    y = np.full((m, n), np.nan, np.float32)
    one = Linear().lower(y[:1], x[:1], w, b)
    step = native.Step(native.OP_GEMV, (y, x) + tuple(one.arrays[2:]),
                       tuple(one.ints[:2]) + (one.ints[2] if len(one.ints) > 2 else -1, m), one.floats, rows=3)
    native.run(native.program([(step, None, m)]), {"rows": m}, 0, 1)
    return y


def assert_rows_are_one_row_gemvs(got: np.ndarray, w, x: np.ndarray, b) -> None:
    """Each row of ``got`` (the batched GEMV of x's rows) has the bits of the one-row GEMV
    of that row of x (the decode step's kernel, an independent entry)."""
    for j in range(x.shape[0]):
        one = np.empty(w.shape[0], np.float32)
        native.LIB.gemv(one, x[j], held.raw(w), b, held.code(w))
        assert got[j].tobytes() == one.tobytes(), \
            f"row {j} of {x.shape[0]} differs from its GEMV"


@pytest.mark.parametrize("form", BLOCK_FORMS + FLOAT_FORMS)
@pytest.mark.parametrize("m", [2, 3, 8, 9, 16])
def test_each_batched_row_is_the_one_row_gemv(form, m, on):
    # k: whole 32-value blocks, whole super-blocks, or (a float form) a tail past 32-value runs
    k = {32: 832, 256: 768}.get(held.BLOCKS.get(form, (0,))[0], 839)
    rng = np.random.default_rng(m)
    n = 37  # groups of 4 and a rest; two threads' parts split unevenly
    w, values = weight(form, n, k, rng)
    # Rows of different magnitudes (each its own 8-bit scales), one with a zero block.
    x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 10, (m, 1))).astype(np.float32)
    x[m - 1, 32:64] = 0.0
    b = rng.standard_normal(n).astype(np.float32)
    got = batched(w, x, b)
    assert_rows_are_one_row_gemvs(got, w, x, b)
    xv = formats.x8_values(x) if form in BLOCK_FORMS else x.astype(np.float64)
    assert np.all(np.abs(got - (xv @ values.T + b)) <= bound(xv, values) + 1e-6)


@pytest.mark.parametrize("form,k", [("Q8_0", 800), ("BF16", 32 * 27 + 7), ("BF16", 16 * 27)])
@pytest.mark.parametrize("m", [3, 8, 9])
def test_odd_counts_of_blocks_and_chunks_are_the_one_row_gemv(form, k, m, on):
    # Q8_0: 25 blocks (the last one alone, the even blocks' sum); bfloat16: 27 runs of 32
    # values on AVX-512 (the last run alone) and a tail, or 27 runs of 16 (AVX2's 8-lane
    # runs odd too); weight rows 4 tiles and a rest
    rng = np.random.default_rng(100 + m)
    n = 23
    w, _ = weight(form, n, k, rng)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 10, (m, 1))).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    got = batched(w, x, b)
    assert_rows_are_one_row_gemvs(got, w, x, b)


@pytest.mark.parametrize("form", ["Q8_0", "Q4_0", "BF16"])
def test_rows_with_an_infinity_or_a_nan_are_the_one_row_gemv(form, on):
    # x's non-finite blocks take quantize_x8's own path (the batched one's faster path is for
    # finite blocks): each row still its one-row GEMV's bits, not finite where x was not
    rng = np.random.default_rng(7)
    n, k, m = 9, 256, 5
    w, _ = weight(form, n, k, rng)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[1, 40] = np.inf
    x[3, 200] = np.nan
    got = batched(w, x, None)
    assert_rows_are_one_row_gemvs(got, w, x, None)
    assert not np.isfinite(got[[1, 3]]).any() and np.isfinite(got[[0, 2, 4]]).all()


def test_a_batched_gemv_without_a_bias_is_the_one_row_gemv(on):
    rng = np.random.default_rng(3)
    w, _ = weight("Q4_K", 9, 512, rng)
    x = rng.standard_normal((5, 512)).astype(np.float32)
    got = batched(w, x, None)
    assert_rows_are_one_row_gemvs(got, w, x, None)
