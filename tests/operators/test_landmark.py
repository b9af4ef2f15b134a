"""landmark_attention against what it approximates, computed independently: numpy's SVD
pseudo-inverse in place of the iterations, softmax attention where the landmarks are the
rows themselves; a value convolution by head written out by hand; and the numpy kernels
against the references."""

from __future__ import annotations

import numpy as np
import pytest

from iron_spec.operators import OPERATORS
from tests.operators.conftest import _check_kernel

LANDMARK = OPERATORS["landmark_attention"]


def _softmax(s):
    p = np.exp(s - s.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def _qkv(n, H, D, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, H, D)).astype(np.float32) for _ in range(3)]


def test_many_iterations_reach_the_svd_pseudo_inverse():
    # Nystrom attention with pinv(softmax(ql kl^T)) from numpy's SVD: the iterations
    # converge to it (cubically), so 30 of them meet it to float64's rounding.
    q, k, v = _qkv(12, 2, 4)
    n, H, D = q.shape
    qh, kh, vh = (x.astype(np.float64).transpose(1, 0, 2) for x in (q, k, v))
    qh, kh = qh / D ** 0.25, kh / D ** 0.25
    ql, kl = qh.reshape(H, 3, 4, D).mean(2), kh.reshape(H, 3, 4, D).mean(2)
    k2 = _softmax(ql @ kl.transpose(0, 2, 1))
    want = (_softmax(qh @ kl.transpose(0, 2, 1)) @ np.linalg.pinv(k2)
            @ (_softmax(ql @ kh.transpose(0, 2, 1)) @ vh)).transpose(1, 0, 2).reshape(n, H * D)
    got = LANDMARK.reference(q, k, v, landmarks=3, segment=12, iterations=30)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)
    # Six (transformers') are not yet there: the approximation is the iterations'.
    assert np.abs(LANDMARK.reference(q, k, v, landmarks=3, segment=12) - want).max() > 1e-8


def test_landmarks_equal_to_the_segment_are_softmax_attention_at_any_length():
    q, k, v = _qkv(7, 2, 4)
    want = OPERATORS["self_attention"].reference(q, k, v)
    got = LANDMARK.reference(q, k, v, landmarks=16, segment=16)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-14)


def test_a_value_convolution_by_head_shares_each_heads_taps_over_its_columns():
    # Two heads of two columns, kernel 3: head 0 by taps (1, 2, 3), out[i] = v[i-1] + 2 v[i]
    # + 3 v[i+1] in both its columns, zeros past the ends; head 1 by (0, 1, 0), itself.
    conv = OPERATORS["depthwise_conv"]
    v = np.arange(12, dtype=np.float32).reshape(3, 4)
    w = np.array([[1.0, 2.0, 3.0], [0.0, 1.0, 0.0]], np.float32)
    h0 = v[:, :2].astype(np.float64)
    want = np.concatenate([np.stack([2 * h0[0] + 3 * h0[1], h0[0] + 2 * h0[1] + 3 * h0[2],
                                     h0[1] + 2 * h0[2]]), v[:, 2:]], axis=1)
    got, ref = _check_kernel(conv, v, w, group=2)
    np.testing.assert_allclose(ref, want, rtol=0, atol=1e-14)
    np.testing.assert_allclose(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("n, H, landmarks, segment",
                         [(16, 4, 4, 16), (24, 2, 3, 24), (9, 3, 5, 5), (1, 2, 8, 8),
                          (64, 2, 8, 64)])
def test_the_kernel_meets_the_reference(n, H, landmarks, segment):
    q, k, v = _qkv(n, H, 8, seed=n)
    _check_kernel(LANDMARK, q, k, v, landmarks=landmarks, segment=segment)


def test_an_approximated_call_of_another_length_and_bad_shapes_are_refused():
    q, k, v = _qkv(12, 2, 4)
    with pytest.raises(ValueError, match="exactly 16 rows"):
        LANDMARK.reference(q, k, v, landmarks=4, segment=16)
    with pytest.raises(ValueError, match="do not split into 5 landmark segments"):
        LANDMARK.shape((16, 2, 4), (16, 2, 4), (16, 2, 4), landmarks=5, segment=16)
    with pytest.raises(ValueError, match="a key head per query head"):
        LANDMARK.shape((16, 2, 4), (16, 1, 4), (16, 1, 4), landmarks=4, segment=16)


LSH = OPERATORS["lsh_expectation_attention"]


def test_lsh_expectation_weighs_keys_by_the_chance_all_hyperplanes_agree():
    # One head, 2-D: the query along x; keys along x (angle 0: weight 1), along y (pi / 2:
    # 1/2 ** bits), against x (pi: 0). The output row is the weighed values, scaled to unit
    # length.
    q = np.array([[[2.0, 0.0]]] * 3, np.float32)
    k = np.array([[[3.0, 0.0]], [[0.0, 0.5]], [[-1.0, 0.0]]], np.float32)
    v = np.array([[[1.0, 0.0]], [[0.0, 8.0]], [[5.0, 5.0]]], np.float32)
    bits = 3
    mixed = np.array([1.0, 0.0]) + 0.5 ** bits * np.array([0.0, 8.0])
    want = np.tile(mixed / np.linalg.norm(mixed), (3, 1))
    got, ref = _check_kernel(LSH, q, k, v, bits=bits)
    np.testing.assert_allclose(ref, want, rtol=0, atol=1e-15)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("n, H, bits", [(1, 2, 9), (11, 4, 5), (24, 2, 1), (40, 3, 16)])
def test_the_lsh_expectation_kernel_meets_the_reference(n, H, bits):
    q, k, v = _qkv(n, H, 8, seed=n)
    _check_kernel(LSH, q, k, v, bits=bits)
