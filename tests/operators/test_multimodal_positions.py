"""The operators Qwen2-VL's towers and M-RoPE add: ``rope_sections`` (each row's columns
turned by positions of their own, by section), ``self_attention`` within ``segments`` (a
vision tower's windows), ``gather_rows`` (rows in a given order): kernels against their
references, and each against a computation of its own."""

from __future__ import annotations

import numpy as np
import pytest

from iron_spec.operators import GatherRows, Rope, RopeSections, SelfAttention
from tests.operators.conftest import _check_kernel, _run_kernel


def tables(rows: int, half: int, theta: float = 10000.0):
    inv = theta ** (-np.arange(half) / half)
    angles = np.arange(rows)[:, None] * inv[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rows_whose_axes_agree_turn_as_rope(interleaved):
    # A text's rows under M-RoPE: every axis at the row's position is plain RoPE there.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 2, 16)).astype(np.float32)
    cos, sin = tables(32, 8)
    positions = np.repeat(np.arange(7, 12)[:, None], 3, axis=1)
    got = _run_kernel(RopeSections(), x, cos, sin, positions, packed=(1, 2),
                      sections=(2, 3, 3), interleaved=interleaved)
    want = _run_kernel(Rope(), x, cos, sin, packed=(1, 2), start=7, interleaved=interleaved)
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_each_section_turns_by_its_axis_by_hand():
    # Columns 0-1 by time, 2-4 by height, 5-7 by width (Qwen2_5_VLRotaryEmbedding's
    # mrope_section [2, 3, 3] over 8 column pairs): the pair (j, j + 8) turns by
    # positions[axis(j)] * inv[j].
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 1, 16))
    cos, sin = tables(40, 8)
    positions = np.array([[1, 5, 9], [2, 30, 0], [3, 3, 3]])
    got, _ = _check_kernel(RopeSections(), x, cos, sin, positions, packed=(1, 2),
                           sections=(2, 3, 3))
    axis = np.repeat([0, 1, 2], [2, 3, 3])
    inv = 10000.0 ** (-np.arange(8) / 8)
    angle = positions[:, axis] * inv[None, :]
    a, b = x[:, 0, :8], x[:, 0, 8:]
    want = np.concatenate([a * np.cos(angle) - b * np.sin(angle),
                           b * np.cos(angle) + a * np.sin(angle)], axis=1)
    np.testing.assert_allclose(got[:, 0], want, atol=2e-5)


def test_two_axes_for_a_vision_tower():
    # Qwen2.5-VL's 2-D RoPE: two sections (height, width), same frequencies in each.
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 2, 16)).astype(np.float32)
    cos, sin = tables(8, 8)
    positions = rng.integers(0, 8, (6, 2))
    _check_kernel(RopeSections(), x, cos, sin, positions, packed=(1, 2), sections=(4, 4))
    with pytest.raises(ValueError, match="sections"):
        RopeSections().shape((6, 2, 16), (8, 8), (8, 8), (6, 2), sections=(4, 3))


def test_attention_within_segments_is_each_segment_alone():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((10, 2, 8)).astype(np.float32) for _ in range(3))
    segments = (0, 4, 6, 10)
    got, _ = _check_kernel(SelfAttention(), q, k, v, segments=segments)
    for a, b in zip(segments, segments[1:]):
        alone = _run_kernel(SelfAttention(), q[a:b], k[a:b], v[a:b])
        np.testing.assert_allclose(got[a:b], alone, atol=1e-6)
    with pytest.raises(ValueError, match="segments"):
        SelfAttention().shape((10, 2, 8), (10, 2, 8), (10, 2, 8), segments=(0, 4, 9))


def test_gather_rows_is_exact():
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    index = np.array([2, 0, 3, 1, 2])
    got, _ = _check_kernel(GatherRows(), x, index, packed=(1,))
    np.testing.assert_array_equal(got, x[index])
