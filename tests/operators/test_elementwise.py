"""Add (``a + scale * b``), Mul (``a * b`` or ``a * scale``), TakeRow."""

import numpy as np
import pytest

from iron_spec.operators import Add, Affine, Clamp, Clip, Mul, TakeRow

A = np.array([[1.0, 2.0], [-3.0, 4.0]], np.float32)
B = np.array([[10.0, 20.0], [0.5, -8.0]], np.float32)


@pytest.mark.parametrize("scale,expected", [
    (1.0, [[11.0, 22.0], [-2.5, -4.0]]),
    (0.5, [[6.0, 12.0], [-2.75, 0.0]]),    # Granite's residual_multiplier
])
def test_add_hand(run_kernel, scale, expected):
    np.testing.assert_array_equal(Add().reference(A, B, scale=scale), expected)
    np.testing.assert_array_equal(run_kernel(Add(), A, B, scale=scale), expected)


def test_add_of_one_row_to_every_row_hand(run_kernel):
    # A learned initial state (hidden,) added to each row (HrmTextModel's z_L_init + z_H).
    row = np.array([0.5, -2.0], np.float32)
    assert Add().shape((2, 2), (2,)) == (2, 2)
    for scale, expected in [(1.0, [[1.5, 0.0], [-2.5, 2.0]]), (2.0, [[2.0, -2.0], [-2.0, 0.0]])]:
        np.testing.assert_array_equal(Add().reference(A, row, scale=scale), expected)
        np.testing.assert_array_equal(run_kernel(Add(), A, row, scale=scale), expected)
    with pytest.raises(ValueError, match="one row of a's width"):
        Add().shape((2, 2), (3,))


def test_mul_hand(run_kernel):
    expected = [[10.0, 40.0], [-1.5, -32.0]]
    np.testing.assert_array_equal(Mul().reference(A, B), expected)
    np.testing.assert_array_equal(run_kernel(Mul(), A, B), expected)


def test_mul_by_a_broadcast_gain_hand(run_kernel):
    # A (1,) gain times a whole (n, d) output, as Gemma4TextDecoderLayer's layer_scalar.
    gain = np.array([0.5], np.float32)
    expected = [[0.5, 1.0], [-1.5, 2.0]]
    assert Mul().shape((2, 2), (1,)) == (2, 2)
    np.testing.assert_array_equal(Mul().reference(A, gain), expected)
    np.testing.assert_array_equal(run_kernel(Mul(), A, gain), expected)
    row = np.array([2.0, -1.0], np.float32)  # a trailing-axis vector broadcasts too
    np.testing.assert_array_equal(run_kernel(Mul(), A, row), [[2.0, -2.0], [-6.0, -4.0]])


def test_mul_by_scalar_hand(run_kernel):
    expected = [[0.25, 0.5], [-0.75, 1.0]]
    np.testing.assert_array_equal(Mul().reference(A, scale=0.25), expected)
    np.testing.assert_array_equal(run_kernel(Mul(), A, scale=0.25), expected)


@pytest.mark.parametrize("scale", [1.0, 0.22, 3.7])
def test_add_kernel_within_tolerance(check_kernel, randn, scale):
    check_kernel(Add(), randn(5, 64), randn(5, 64, scale=30.0), scale=scale)


def test_mul_kernel_within_tolerance(check_kernel, randn):
    check_kernel(Mul(), randn(5, 64), randn(5, 64))
    check_kernel(Mul(), randn(5, 64), randn(1))
    check_kernel(Mul(), randn(5, 64), scale=0.1234567)


@pytest.mark.parametrize("index", [0, 2])
def test_take_row(run_kernel, index):
    x = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)
    expected = [[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]][index]]
    assert TakeRow().shape((3, 2), index=index) == (1, 2)
    np.testing.assert_array_equal(TakeRow().reference(x, index=index), expected)
    np.testing.assert_array_equal(run_kernel(TakeRow(), x, index=index), expected)


def test_shape_mismatches():
    with pytest.raises(ValueError):
        Add().shape((2, 3), (3, 2))
    with pytest.raises(ValueError):
        Mul().shape((2, 3), (2, 4))
    with pytest.raises(ValueError, match="does not broadcast"):
        Mul().shape((3,), (2, 3))
    assert Mul().shape((2, 3)) == (2, 3)


def test_clamp_hand(run_kernel):
    # As OlmoAttention's clip_qkv 2.5: values past +-2.5 become +-2.5, the rest stay.
    expected = [[1.0, 2.0], [-2.5, 2.5]]
    np.testing.assert_array_equal(Clamp().reference(A, limit=2.5), expected)
    np.testing.assert_array_equal(run_kernel(Clamp(), A, limit=2.5), expected)


def test_clamp_refuses_a_limit_not_above_zero():
    with pytest.raises(ValueError, match="limit 0 is not above 0"):
        Clamp().shape((2, 2), limit=0)


def test_join_heads_by_hand():
    from iron_spec.operators import JoinHeads
    op = JoinHeads()
    a = np.array([[[1.0, 2.0]]])                      # (1, 1, 2): every head's
    b = np.array([[[3.0], [4.0], [5.0]]])             # (1, 3, 1): each head's own
    expected = [[[1, 2, 3], [1, 2, 4], [1, 2, 5]]]
    np.testing.assert_array_equal(op.reference(a, b), expected)
    out = np.empty((1, 3, 3), np.float32)
    op.kernel(out, a.astype(np.float32), b.astype(np.float32))
    np.testing.assert_array_equal(out, expected)
    with pytest.raises(ValueError, match="join_heads"):
        op.shape((1, 2, 2), (1, 3, 1))


def test_affine_is_x_times_weight_plus_bias(check_kernel):
    # MobileBERT's NoNorm: input_tensor * weight + bias, no normalization.
    op = Affine()
    x = np.array([[1.0, -2.0, 0.5], [4.0, 0.0, -1.0]], np.float32)
    w = np.array([2.0, 0.5, -1.0], np.float32)
    b = np.array([0.25, 1.0, 0.0], np.float32)
    want = [[2.25, 0.0, -0.5], [8.25, 1.0, 1.0]]
    got, ref = check_kernel(op, x, w, b)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(ref, want, rtol=0, atol=0)
    got, _ = check_kernel(op, x, w, None)
    np.testing.assert_array_equal(got, [[2.0, -1.0, -0.5], [8.0, 0.0, 1.0]])
    with pytest.raises(ValueError, match=r"affine: bias \(2,\) is not \(3,\)"):
        op.shape((2, 3), (3,), (2,))


def test_clip_hand(run_kernel):
    # Gemma4ClippableLinear's bounds: asymmetric, either may be infinite (none).
    x = np.array([[-3.0, -0.5, 0.25, 2.0]], np.float32)
    got = run_kernel(Clip(), x, low=-1.0, high=0.5)
    assert got.tolist() == [[-1.0, -0.5, 0.25, 0.5]]
    assert run_kernel(Clip(), x, low=-np.inf, high=0.0).tolist() == [[-3.0, -0.5, 0.0, 0.0]]


def test_clip_refuses_bounds_out_of_order():
    with pytest.raises(ValueError, match="low 1.0 is above high 0.0"):
        Clip().shape((2, 2), low=1.0, high=0.0)
