"""RoPE scaling types beyond linear and llama3 (yarn, longrope, dynamic, proportional), and
RMSNorm per head, against values computed by hand from transformers' formulas."""

from __future__ import annotations

import math

import numpy as np

from iron_spec.operators import RMSNorm, rope_inv_freq, rope_switch, rope_table


def test_yarn_ramps_from_extrapolated_to_interpolated():
    # dim 8, theta 10000, original 16, factor 4: correction dims for beta 32 and 1 are
    # 8 * ln(16 / (2 pi b)) / (2 ln 10000): b=32 -> negative (0), b=1 -> 0.8122 -> ceil 1.
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    inv, attention = rope_inv_freq(8, 10000.0, scaling)
    base = [1.0, 0.1, 0.01, 0.001]
    # ramp (i - 0) / (1 - 0) clipped: [0, 1, 1, 1]; keep = 1 - ramp = [1, 0, 0, 0]
    np.testing.assert_allclose(inv, [base[0], base[1] / 4, base[2] / 4, base[3] / 4], rtol=1e-6)
    assert attention == 0.1 * math.log(4.0) + 1.0


def test_longrope_short_within_the_original_context_long_past_it_every_row_scaled():
    # transformers' longrope_frequency_update: the long factors for every position of a
    # sequence longer than original_max_position_embeddings, the short ones otherwise.
    scaling = {"rope_type": "longrope", "short_factor": [1.0, 2.0], "long_factor": [4.0, 8.0],
               "original_max_position_embeddings": 4}
    attention = math.sqrt(1 + math.log(4.0) / math.log(4))  # factor 16 / 4 = 4
    short = np.array([1.0, 0.1]) / [1.0, 2.0]
    long = np.array([1.0, 0.1]) / [4.0, 8.0]
    assert rope_switch(scaling, 16) == 4 and rope_switch(None, 16) is None
    cos, sin = rope_table(4, 100.0, scaling, 6, 16, length=4)
    np.testing.assert_allclose(cos[3], np.cos(3 * short) * attention, rtol=1e-6)
    np.testing.assert_allclose(sin[5], np.sin(5 * short) * attention, rtol=1e-6)
    cos, sin = rope_table(4, 100.0, scaling, 6, 16, length=5)
    np.testing.assert_allclose(cos[3], np.cos(3 * long) * attention, rtol=1e-6)
    np.testing.assert_allclose(sin[5], np.sin(5 * long) * attention, rtol=1e-6)


def test_dynamic_is_default_within_context_and_ntk_past_it():
    scaling = {"rope_type": "dynamic", "factor": 2.0}
    cos, _ = rope_table(4, 100.0, scaling, 6, 4)
    np.testing.assert_allclose(cos[3], np.cos(3 * np.array([1.0, 0.1])), rtol=1e-6)
    base = 100.0 * ((2.0 * 6 / 4) - 1.0) ** (4 / 2)  # at row 5, sequence length 6
    np.testing.assert_allclose(cos[5], np.cos(5 * np.array([1.0, base ** -0.5])), rtol=1e-6)


def test_proportional_rotates_a_fraction_of_pairs_across_the_whole_head():
    scaling = {"rope_type": "proportional", "partial_rotary_factor": 0.5}
    inv, _ = rope_inv_freq(8, 10000.0, scaling)
    # 2 of 4 angle pairs turn, at exponents 0/8 and 2/8 of the whole head; the others stay.
    np.testing.assert_allclose(inv, [1.0, 0.1, 0.0, 0.0], rtol=1e-6)


def test_rms_norm_per_head():
    x = np.array([[[3.0, 4.0], [1.0, 1.0]]])  # (1 row, 2 heads, 2)
    op = RMSNorm()
    got = op.reference(x, np.array([1.0, 2.0]), eps=0.0)
    r = math.sqrt(12.5)
    np.testing.assert_allclose(got, [[[3 / r, 8 / r], [1.0, 2.0]]], rtol=1e-12)
    out = np.empty(x.shape, np.float32)
    w = op.pack(1, np.array([1.0, 2.0]), eps=0.0)
    op.kernel(out, x.astype(np.float32), w, scratch=np.empty(op.scratch(x.shape, (2,)), np.float32),
              eps=0.0)
    np.testing.assert_allclose(out, got, rtol=1e-6)
