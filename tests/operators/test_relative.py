"""Relative position buckets and biases against transformers' own values: T5's decoder
buckets (unidirectional) and CpmAntSegmentPositionEmbedding's bias with segment pairs."""

from __future__ import annotations

import numpy as np
import pytest

from iron_spec.operators.relative import position_bias, relative_buckets

# transformers' T5Attention._relative_position_bucket(arange(-300, 301), bidirectional=False,
# num_buckets=32, max_distance=128), as (first relative position, bucket) where it changes.
T5_DECODER_BUCKETS = [
    (-300, 31), (-112, 30), (-98, 29), (-86, 28), (-76, 27), (-66, 26), (-58, 25), (-51, 24),
    (-45, 23), (-39, 22), (-34, 21), (-30, 20), (-26, 19), (-23, 18), (-20, 17), (-18, 16),
    (-15, 15), (-14, 14), (-13, 13), (-12, 12), (-11, 11), (-10, 10), (-9, 9), (-8, 8),
    (-7, 7), (-6, 6), (-5, 5), (-4, 4), (-3, 3), (-2, 2), (-1, 1), (0, 0)]

# transformers' CpmAntSegmentPositionEmbedding (32 buckets, max_distance 128, 4 segments) on
# positions 0..6 of segments [0, 0, 0, 2, 2, 2, 2], its table row r holding r: the row each
# (query, key) reads. A pair of segments reads 32 + sq * 4 + sk (34, 40).
CPMANT_ROWS = [[0, 17, 18, 34, 34, 34, 34], [1, 0, 17, 34, 34, 34, 34],
               [2, 1, 0, 34, 34, 34, 34], [40, 40, 40, 0, 17, 18, 19],
               [40, 40, 40, 1, 0, 17, 18], [40, 40, 40, 2, 1, 0, 17],
               [40, 40, 40, 3, 2, 1, 0]]


def test_unidirectional_buckets_are_t5_decoders():
    rel = np.arange(-300, 301)
    want = np.zeros(rel.shape, np.int64)  # later keys (rel > 0): bucket 0
    for (start, bucket), (end, _) in zip(T5_DECODER_BUCKETS, T5_DECODER_BUCKETS[1:] + [(1, None)]):
        want[(rel >= start) & (rel < end)] = bucket
    np.testing.assert_array_equal(relative_buckets(rel, 32, 128, bidirectional=False), want)


def test_segment_pairs_are_cpmants():
    table = np.arange(48, dtype=np.float64)[:, None]  # one head, row r holds r
    pos = np.arange(7)
    # Positions below 3 are the prefix's (segment 0), the rest the text's (segment 2).
    got = position_bias(table, pos, pos, 32, 128, True, (4, 3, 0, 2))
    np.testing.assert_array_equal(got[0], np.asarray(CPMANT_ROWS, np.float64))


def test_a_query_row_of_a_later_call_reads_the_cache_positions():
    # A decode step's query at 6 over keys 0..6: the last row of the whole square.
    table = np.arange(48, dtype=np.float64)[:, None]
    got = position_bias(table, np.array([6]), np.arange(7), 32, 128, True, (4, 3, 0, 2))
    np.testing.assert_array_equal(got[0, 0], np.asarray(CPMANT_ROWS[6], np.float64))


def test_a_row_past_the_table_is_refused():
    with pytest.raises(ValueError, match="row 40 is past the bias table's 36 rows"):
        position_bias(np.zeros((36, 1)), np.arange(7), np.arange(7), 32, 128, True, (4, 3, 0, 2))
