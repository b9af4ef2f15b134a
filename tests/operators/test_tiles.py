"""A prompt chunk's GEMM on bfloat16 tiles (``--prefill-weights bfloat16``): the tile layout
by hand, the rounding of x by hand, and the product against float64 on the rounded values,
on each tile kernel this CPU runs (AMX, AVX-512 BF16 where it has them, the portable loop
everywhere)."""

from __future__ import annotations

import numpy as np
import pytest

from iron_spec.operators import formats, native
from iron_spec.operators.linear import Linear

KERNELS = ("amx", "avx512bf16", "portable")


@pytest.fixture(params=KERNELS)
def tiles(request):
    """Each tile kernel in turn (AMX skipped where the CPU or OS lacks it), then back."""
    if native.LIB is None:
        pytest.skip("the decode pool is off here (IRON_SPEC_NATIVE) or operators._cpu is not built")
    before = native.LIB.tiles()
    try:
        native.LIB.use_tiles(request.param)
    except ValueError:
        pytest.skip(f"this CPU (or its OS) offers no {request.param} tiles")
    yield request.param
    native.LIB.use_tiles(before)


def test_tile_layout_by_hand():
    # 18 rows x 35 columns: two tiles of rows (the second 2 rows, zeros after), two of
    # columns (the second 3 columns).
    bits = np.arange(18 * 35, dtype=np.uint16).reshape(18, 35) + 1
    t = formats.tile_bfloat16(bits)
    assert t.shape == (2, 2, 16, 32) and t.dtype == np.uint16
    for j, tt, p, q, e in [(0, 0, 0, 0, 0), (0, 0, 0, 0, 1), (0, 0, 3, 5, 1), (1, 0, 7, 1, 0),
                           (0, 1, 1, 15, 0), (1, 1, 0, 1, 1)]:
        assert t[j, tt, p, 2 * q + e] == bits[16 * j + q, 32 * tt + 2 * p + e]
    assert t[1, 0, 0, 2 * 2] == 0  # row 18: padding
    assert t[0, 1, 2, 0] == 0      # column 32 + 4 = 36: padding
    assert (formats.untile_bfloat16(t, 18, 35) == bits).all()


def _rounded(a):
    return formats.widen_bfloat16(formats.round_bfloat16(a)).astype(np.float64)


@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (2, 16, 32), (5, 17, 33), (33, 50, 70),
                                     (31, 7, 1000), (64, 96, 576), (40, 33, 64)])
def test_gemm_on_tiles_is_the_rounded_product(tiles, m, n, k):
    rng = np.random.default_rng(m * 1000 + n + k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    out = np.full((m, n), np.nan, np.float32)
    native.LIB.gemm(out, x, formats.tile_bfloat16(formats.round_bfloat16(w)), b)
    expected = _rounded(x) @ _rounded(w).T + b
    # Each product of two bfloat16 is exact in float32; only the k sums round (Higham's
    # bound, K eps32 sum|x w|).
    bound = k * 2.0 ** -24 * (np.abs(_rounded(x)) @ np.abs(_rounded(w)).T + np.abs(b))
    assert np.isfinite(out).all()
    assert (np.abs(out - expected) <= bound).all()
    # and x was rounded, not read as float32: the unrounded product is further off
    if m * k > 1:
        assert np.abs(out - (x.astype(np.float64) @ _rounded(w).T + b)).max() > bound.max()


def test_x_rounds_to_nearest_ties_to_even(tiles):
    # bfloat16 keeps 8 significant bits: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 and
    # rounds to 1 (even); 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6, to 1 + 2^-6;
    # 1 + 2^-8 + 2^-20 is past halfway, to 1 + 2^-7.
    x = np.array([[1 + 2 ** -8], [1 + 3 * 2 ** -8], [1 + 2 ** -8 + 2 ** -20], [-(1 + 2 ** -8)]],
                 np.float32)
    w = formats.tile_bfloat16(formats.round_bfloat16(np.ones((1, 1), np.float32)))
    out = np.empty((4, 1), np.float32)
    native.LIB.gemm(out, x, w, None)
    assert out[:, 0].tolist() == [1.0, 1 + 2 ** -6, 1 + 2 ** -7, -1.0]


def test_a_tile_gemm_refuses_tiles_of_another_shape():
    if native.LIB is None:
        pytest.skip("operators._cpu is not built")
    x = np.ones((3, 40), np.float32)
    w = formats.tile_bfloat16(formats.round_bfloat16(np.ones((20, 40), np.float32)))
    with pytest.raises(ValueError, match=r"bfloat16 tiles \(ceil\(n / 16\), ceil\(k / 32\)"):
        native.LIB.gemm(np.empty((3, 33), np.float32), x, w, None)  # 33 columns: 3 tiles
    with pytest.raises(ValueError, match="tile kernel: amx, avx512bf16 or portable"):
        native.LIB.use_tiles("avx")


def test_linear_packs_tiles_for_rows_and_keeps_one_row_float32():
    w = np.random.default_rng(0).standard_normal((20, 40)).astype(np.float32)
    op = Linear()
    packed = op.pack_reduced(1, w, "bfloat16-tiles", rows=8)
    assert packed.shape == (2, 2, 16, 32)
    assert op.pack_reduced(1, w, "bfloat16-tiles", rows=1) is None  # a chunk's head: one row
    assert op.pack_reduced(2, w[:, 0], "bfloat16-tiles", rows=8) is None  # a bias
    widened = op.widen_reduced(1, packed, w.shape)
    assert (widened == formats.widen_bfloat16(formats.round_bfloat16(w))).all()


def test_linear_kernel_without_the_extension_gives_the_same_product(monkeypatch):
    # The numpy fallback: x and w rounded, widened, multiplied in float32.
    rng = np.random.default_rng(1)
    x = rng.standard_normal((9, 40)).astype(np.float32)
    w = rng.standard_normal((20, 40)).astype(np.float32)
    packed = Linear().pack_reduced(1, w, "bfloat16-tiles", rows=9)
    monkeypatch.setattr(native, "lib", lambda: None)
    out = np.empty((9, 20), np.float32)
    Linear().kernel(out, x, packed, None)
    expected = _rounded(x) @ _rounded(w).T
    assert np.abs(out - expected).max() <= 40 * 2.0 ** -24 * np.abs(expected).max()


@pytest.mark.skipif(not native.PROGRAM, reason="no native program here")
def test_a_bfloat16_prompt_chunk_is_one_native_call_with_a_float32_head():
    from iron_spec.spec.build import load_model
    from tests.conftest import SPECS
    loaded = load_model(SPECS / "llama3.yaml", random_weights=0, toy=True,
                        prefill_weights="bfloat16")
    plan = loaded.lm.prompt_chunk.plan
    assert plan.weights == "bfloat16-tiles"
    assert len(plan._order) == 1 and isinstance(plan._order[0], tuple), plan._order
    forms = {r.step.where: r.ins[1].ndim for r in plan.runs if r.step.op.name == "linear"}
    assert forms.pop("lm_head") == 2  # one row: float32
    assert set(forms.values()) == {4}, forms  # every other projection on tiles
    assert loaded.lm.decode_step.plan.weights == "float32"
