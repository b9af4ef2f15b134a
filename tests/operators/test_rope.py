"""RoPE: inverse frequencies (default, linear, llama3), cos/sin tables, and the Rope op
(transformers' rotate_half: column i turns with column i + rotary/2)."""

import math

import numpy as np
import pytest

from iron_spec.operators import Rope, rope_inv_freq, rope_tables

OP = Rope()
LLAMA31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


# --- inverse frequencies ---------------------------------------------------------------

def test_default_inv_freq_hand_values():
    inv, factor = rope_inv_freq(4, 10000.0)
    # theta ** -(2i / dim): 10000 ** 0 and 10000 ** -0.5
    np.testing.assert_allclose(inv, [1.0, 0.01], rtol=1e-7)
    assert inv.dtype == np.float32 and factor == 1.0


def test_default_inv_freq_closed_form():
    inv, _ = rope_inv_freq(8, 10000.0)
    np.testing.assert_allclose(inv, [1.0, 10 ** -1.0, 10 ** -2.0, 10 ** -3.0], rtol=1e-6)


@pytest.mark.parametrize("scaling", [None, {}, {"rope_type": "default"}])
def test_no_scaling_is_default(scaling):
    np.testing.assert_array_equal(rope_inv_freq(4, 10000.0, scaling)[0], [1.0, np.float32(0.01)])


@pytest.mark.parametrize("key", ["rope_type", "type"])  # "type" is the older config key
def test_linear_divides_by_factor(key):
    inv, factor = rope_inv_freq(4, 10000.0, {key: "linear", "factor": 4.0})
    np.testing.assert_allclose(inv, [0.25, 0.0025], rtol=1e-7)
    assert factor == 1.0


def test_llama3_bands_by_hand():
    # theta 500000, dim 8: wavelengths 2*pi/inv are 6.28, 167, 4443 and 118143; with the
    # Llama 3.1 parameters the bands are < 2048 (kept), > 8192 (/ factor) and between.
    inv, factor = rope_inv_freq(8, 500000.0, LLAMA31)
    base = [500000.0 ** (-i / 4) for i in range(4)]
    np.testing.assert_allclose(inv[:2], base[:2], rtol=1e-6)  # high frequencies kept
    np.testing.assert_allclose(inv[3], base[3] / 8, rtol=1e-6)  # low frequency / 8
    # middle: smooth = (8192 / 4442.88 - 1) / (4 - 1); (1 - smooth) * inv / 8 + smooth * inv
    np.testing.assert_allclose(inv[2], 5.248461609929547e-04, rtol=1e-6)
    assert base[2] / 8 < inv[2] < base[2]
    assert factor == 1.0


def _meta_apply_scaling(freqs, factor, low, high, old):
    """Meta's Llama 3.1 ``apply_scaling``, frequency by frequency, in float64."""
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(f)
        elif wavelen > old / low:
            out.append(f / factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return np.array(out)


@pytest.mark.parametrize("dim,theta", [(64, 500000.0), (128, 500000.0), (32, 10000.0)])
def test_llama3_matches_meta_formula(dim, theta):
    base = theta ** (-np.arange(0, dim, 2) / dim)
    expected = _meta_apply_scaling(base, 8.0, 1.0, 4.0, 8192.0)
    inv, _ = rope_inv_freq(dim, theta, LLAMA31)
    assert inv.shape == (dim // 2,)
    np.testing.assert_allclose(inv, expected, rtol=5e-6)
    # all three bands occur for the Llama 3.1 head (dim 128)
    if dim == 128:
        assert (expected == base).any() and (expected == base / 8).any()
        assert ((expected != base) & (expected != base / 8)).any()


def test_llama3_equal_factors_scale_or_keep_each_frequency():
    # Llama-4-Scout's low_freq_factor = high_freq_factor = 1.0: no band between them, so a
    # frequency whose wavelength is past original / low is divided by factor, the others kept
    # (transformers' _compute_llama3_parameters: no frequency is smoothed).
    scout = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
             "high_freq_factor": 1.0, "original_max_position_embeddings": 64}
    plain, _ = rope_inv_freq(16, 500000.0)
    inv, _ = rope_inv_freq(16, 500000.0, scout)
    long = 2 * math.pi / plain > 64
    assert long.any() and (~long).any()
    np.testing.assert_array_equal(inv, np.where(long, plain / np.float32(8.0), plain))


@pytest.mark.parametrize("kind", ["ntk", "su", "mrope2"])
def test_unknown_rope_type_raises(kind):
    with pytest.raises(ValueError, match=kind):
        rope_inv_freq(8, 10000.0, {"rope_type": kind, "factor": 2.0})


def test_mrope_is_defaults_frequencies():
    # Qwen2-VL's published rope_scaling {"type": "mrope", "mrope_section": [...]}: its config
    # classes read it as rope_type default (the sections cut the columns, not the frequencies).
    inv, scale = rope_inv_freq(8, 10000.0, {"type": "mrope", "mrope_section": [1, 1, 2]})
    np.testing.assert_allclose(inv, 10000.0 ** (-np.arange(0, 8, 2) / 8), rtol=1e-6)
    assert scale == 1.0


@pytest.mark.parametrize("scaling", [
    {"rope_type": "linear"},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
])
def test_missing_parameter_raises(scaling):
    with pytest.raises(ValueError):
        rope_inv_freq(8, 10000.0, scaling)


# --- tables ----------------------------------------------------------------------------

def test_tables_at_positions_zero_and_one():
    cos, sin = rope_tables(np.array([1.0, 0.01], np.float32), 3)
    assert cos.shape == sin.shape == (3, 2) and cos.dtype == sin.dtype == np.float32
    np.testing.assert_array_equal(cos[0], [1.0, 1.0])
    np.testing.assert_array_equal(sin[0], [0.0, 0.0])
    np.testing.assert_allclose(cos[1], [0.5403023058681398, 0.9999500004166653], rtol=1e-7)
    np.testing.assert_allclose(sin[1], [0.8414709848078965, 0.009999833334166664], rtol=1e-7)
    np.testing.assert_allclose(cos[2, 0], math.cos(2.0), rtol=1e-7)


def test_tables_attention_factor_scales_cos_and_sin():
    cos, sin = rope_tables(np.array([1.0], np.float32), 2, attention_factor=0.5)
    np.testing.assert_allclose([cos[0, 0], sin[0, 0]], [0.5, 0.0])
    np.testing.assert_allclose([cos[1, 0], sin[1, 0]],
                               [0.5 * 0.5403023058681398, 0.5 * 0.8414709848078965], rtol=1e-7)


# --- the Rope op -----------------------------------------------------------------------

def _tables(dim, positions, theta=10000.0):
    return rope_tables(rope_inv_freq(dim, theta)[0], positions)


def test_quarter_turn_by_hand(run_kernel):
    # head_dim 2: one pair; the table row at position 1 is a quarter turn (cos 0, sin 1).
    cos = np.array([[1.0], [0.0]], np.float32)
    sin = np.array([[0.0], [1.0]], np.float32)
    x = np.array([[[1.0, 0.0]], [[0.0, 1.0]]], np.float32)  # at positions 0 and 1
    # (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)
    expected = [[[1.0, 0.0]], [[-1.0, 0.0]]]
    np.testing.assert_array_equal(OP.reference(x, cos, sin), expected)
    np.testing.assert_array_equal(run_kernel(OP, x, cos, sin, packed=(1, 2)), expected)


def test_rotate_half_pairs_column_i_with_i_plus_half(run_kernel):
    # head_dim 4: pairs (0, 2) and (1, 3); a quarter turn for the first, a half for the second.
    cos = np.array([[0.0, -1.0]], np.float32)
    sin = np.array([[1.0, 0.0]], np.float32)
    x = np.array([[[1.0, 2.0, 3.0, 4.0]]], np.float32)
    # (1, 3) turned a quarter is (-3, 1); (2, 4) turned a half is (-2, -4)
    expected = [[[-3.0, -2.0, 1.0, -4.0]]]
    np.testing.assert_array_equal(OP.reference(x, cos, sin), expected)
    np.testing.assert_array_equal(run_kernel(OP, x, cos, sin, packed=(1, 2)), expected)


def test_position_zero_is_identity(run_kernel, randn):
    cos, sin = _tables(8, 4)
    x = randn(1, 3, 8)
    np.testing.assert_array_equal(OP.reference(x, cos, sin), x)
    np.testing.assert_array_equal(run_kernel(OP, x, cos, sin, packed=(1, 2)), x)


def test_rotation_preserves_each_pair_norm(run_kernel, randn):
    cos, sin = _tables(16, 40)
    x = randn(5, 2, 16)
    for got, atol in [(OP.reference(x, cos, sin, start=30), 1e-6),
                      (run_kernel(OP, x, cos, sin, start=30, packed=(1, 2)), 1e-5)]:
        pair_norm = lambda y: np.hypot(y[..., :8].astype(np.float64), y[..., 8:])  # noqa: E731
        np.testing.assert_allclose(pair_norm(got), pair_norm(x), rtol=1e-6, atol=atol)


def test_dot_product_depends_only_on_relative_position(run_kernel, randn):
    # <R_p q, R_p' k> = <q, R_(p'-p) k>: shifting both positions by the same amount keeps it.
    cos, sin = _tables(32, 64)
    q, k = randn(1, 1, 32), randn(1, 1, 32)
    for rope in (lambda x, s: OP.reference(x, cos, sin, start=s),
                 lambda x, s: run_kernel(OP, x, cos, sin, start=s, packed=(1, 2)).astype(np.float64)):
        dots = [np.sum(rope(q, p) * rope(k, p - 3)) for p in (3, 10, 37, 60)]
        np.testing.assert_allclose(dots, dots[0], rtol=2e-5)
        # and it does depend on the offset
        assert abs(np.sum(rope(q, 10) * rope(k, 9)) - dots[0]) > 1e-3


def test_start_selects_table_rows(run_kernel, randn):
    # Rows at start .. start + n equal the same rows of a call from position 0.
    cos, sin = _tables(8, 10)
    x = randn(10, 2, 8)
    full = OP.reference(x, cos, sin)
    np.testing.assert_allclose(OP.reference(x[6:9], cos, sin, start=6), full[6:9], rtol=1e-15)
    np.testing.assert_array_equal(run_kernel(OP, x[6:9], cos, sin, start=6, packed=(1, 2)),
                                  run_kernel(OP, x, cos, sin, packed=(1, 2))[6:9])


def test_partial_rotary_leaves_trailing_columns(run_kernel, randn):
    cos, sin = _tables(4, 8)  # rotary 4 of head_dim 10
    x = randn(3, 2, 10)
    ref = OP.reference(x, cos, sin, start=5)
    got = run_kernel(OP, x, cos, sin, start=5, packed=(1, 2))
    np.testing.assert_array_equal(ref[..., 4:], x[..., 4:])
    np.testing.assert_array_equal(got[..., 4:], x[..., 4:])
    assert not np.allclose(ref[..., :4], x[..., :4])  # the rotary part does turn
    # the rotary part is what a head_dim-4 call gives
    np.testing.assert_allclose(ref[..., :4], OP.reference(x[..., :4], cos, sin, start=5),
                               rtol=1e-15)


@pytest.mark.parametrize("n,heads,head_dim,rotary,start", [
    (1, 4, 64, 64, 0), (1, 4, 64, 64, 117), (6, 3, 32, 32, 10), (5, 2, 80, 32, 3)])
def test_kernel_within_tolerance(check_kernel, randn, n, heads, head_dim, rotary, start):
    cos, sin = rope_tables(rope_inv_freq(rotary, 500000.0, LLAMA31)[0], 128)
    check_kernel(OP, randn(n, heads, head_dim, scale=4.0), cos, sin, start=start, packed=(1, 2))


def test_shape_mismatch():
    assert OP.shape((2, 3, 8), (16, 4), (16, 4)) == (2, 3, 8)
    with pytest.raises(ValueError):
        OP.shape((2, 3, 8), (16, 5), (16, 5))  # rotary 10 > head_dim 8
    with pytest.raises(ValueError):
        OP.shape((2, 24), (16, 4), (16, 4))


# --- interleaved pairs (GPT-J's rotate_every_two; Cohere's and GLM's rotate_half) ------

def test_interleaved_pairs_column_2i_with_2i_plus_1(run_kernel):
    # head_dim 4: pairs (0, 1) and (2, 3); a quarter turn for the first, a half for the second.
    cos = np.array([[0.0, -1.0]], np.float32)
    sin = np.array([[1.0, 0.0]], np.float32)
    x = np.array([[[1.0, 2.0, 3.0, 4.0]]], np.float32)
    # (1, 2) turned a quarter is (-2, 1); (3, 4) turned a half is (-3, -4)
    expected = [[[-2.0, 1.0, -3.0, -4.0]]]
    np.testing.assert_array_equal(OP.reference(x, cos, sin, interleaved=True), expected)
    np.testing.assert_array_equal(
        run_kernel(OP, x, cos, sin, interleaved=True, packed=(1, 2)), expected)


def _gptj(x, cos, sin, start, rotary):
    """transformers' GPTJ apply_rotary_pos_emb written out: sin and cos repeat_interleave'd,
    x * cos + rotate_every_two(x) * sin over the first ``rotary`` columns."""
    x = x.astype(np.float64)
    n = x.shape[0]
    c = np.repeat(cos[start:start + n].astype(np.float64), 2, axis=-1)[:, None, :]
    s = np.repeat(sin[start:start + n].astype(np.float64), 2, axis=-1)[:, None, :]
    rot = x[..., :rotary]
    every_two = np.stack([-rot[..., 1::2], rot[..., ::2]], axis=-1).reshape(rot.shape)
    out = x.copy()
    out[..., :rotary] = rot * c + every_two * s
    return out


@pytest.mark.parametrize("head_dim,rotary,start", [(16, 16, 0), (16, 16, 9), (24, 8, 5)])
def test_interleaved_is_gptj_rotate_every_two(run_kernel, randn, head_dim, rotary, start):
    cos, sin = _tables(rotary, 20)
    x = randn(4, 3, head_dim, scale=2.0)
    want = _gptj(x, cos, sin, start, rotary)
    np.testing.assert_allclose(OP.reference(x, cos, sin, start=start, interleaved=True), want,
                               rtol=1e-14, atol=1e-14)
    got = run_kernel(OP, x, cos, sin, start=start, interleaved=True, packed=(1, 2))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got[..., rotary:], x[..., rotary:])


def test_interleaved_is_half_rotation_of_permuted_columns(randn):
    # Columns (0, 2, 4, ..., 1, 3, 5, ...) of an interleaved head are a half-rotated head:
    # the permutation of q/k rows that would serve interleaved RoPE by the other layout.
    cos, sin = _tables(8, 12)
    x = randn(3, 2, 12)
    perm = np.r_[0:8:2, 1:8:2, 8:12]
    inter = OP.reference(x, cos, sin, start=4, interleaved=True)
    half = OP.reference(x[..., perm], cos, sin, start=4)
    np.testing.assert_allclose(inter[..., perm], half, rtol=1e-15, atol=1e-15)


def test_interleaved_tables_pack_per_pair():
    cos = np.array([[1.0, 2.0]], np.float32)
    np.testing.assert_array_equal(OP.pack(1, cos, interleaved=True), [[1.0, 1.0, 2.0, 2.0]])
    np.testing.assert_array_equal(OP.pack(2, cos, interleaved=True), [[-1.0, 1.0, -2.0, 2.0]])
    np.testing.assert_array_equal(OP.pack(2, cos), [[-1.0, -2.0, 1.0, 2.0]])


@pytest.mark.parametrize("n,heads,head_dim,rotary,start", [
    (1, 4, 64, 64, 117), (6, 3, 32, 32, 10), (5, 2, 80, 32, 3), (3, 2, 64, 16, 0)])
def test_interleaved_kernel_within_tolerance(check_kernel, randn, n, heads, head_dim, rotary, start):
    cos, sin = rope_tables(rope_inv_freq(rotary, 10000.0)[0], 128)
    check_kernel(OP, randn(n, heads, head_dim, scale=4.0), cos, sin, start=start,
                 interleaved=True, packed=(1, 2))


def test_ntk_alpha_base_by_hand():
    # alpha 1000 over theta 10000 at head_dim 128: 1000 ** (64 / 63) = 1000 * e^(6.9078 / 63)
    # = 1000 * 1.11589, so the base is 1.1159e7.
    from iron_spec.operators.rope import ntk_alpha_theta
    assert ntk_alpha_theta(10000.0, 1000.0, 128) == pytest.approx(1.1159e7, rel=1e-4)
    assert ntk_alpha_theta(10000.0, 1000.0, 128) == pytest.approx(10000.0 * 1000.0 ** (64 / 63))
    assert ntk_alpha_theta(5.0, 1.0, 8) == 5.0  # alpha 1 leaves the base
    with pytest.raises(ValueError, match="at least 4"):
        ntk_alpha_theta(10000.0, 2.0, 2)
