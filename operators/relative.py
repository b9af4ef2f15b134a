"""Relative position buckets: a key's distance from its query mapped to one of a few
buckets, as T5-style attention biases index their learned table (T5Attention's
``_relative_position_bucket``, MPNetEncoder's ``relative_position_bucket``).

Not for: absolute positions (``positions``), RoPE (``rope``), ALiBi (``attention``).
"""

from __future__ import annotations

import math

import numpy as np


def relative_buckets(relative: np.ndarray, buckets: int = 32, max_distance: int = 128,
                     bidirectional: bool = True) -> np.ndarray:
    """The bucket of each ``relative`` position (key minus query), int64 of its shape.

    Bidirectional: half the buckets for keys after the query (``relative > 0``), half for
    the rest; within a half, distances below ``max_exact = half // 2`` are their own
    bucket, longer ones share log-spaced buckets up to ``max_distance``, and farther ones the
    last. The log runs in float32 and truncates, as transformers' torch code does, so the
    boundaries (distance 16, 32, 64 of 32 buckets) fall where its do. Unidirectional (a
    decoder's): every bucket for keys at or before the query, later keys bucket 0.

    Raises:
        ValueError: fewer than 4 buckets (2 per half), or a max_distance not past max_exact.
    """
    rel = np.asarray(relative, np.int64)
    half = buckets // 2 if bidirectional else buckets
    exact = half // 2
    if exact < 1 or max_distance <= exact:
        raise ValueError(f"{buckets} relative buckets with max_distance {max_distance}: at "
                         f"least {4 if bidirectional else 2} buckets and a max_distance past "
                         f"{max(exact, 1)}")
    n = -rel
    out = np.zeros(rel.shape, np.int64)
    if bidirectional:
        out += (n < 0) * half
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    # Distances below max_exact take their own bucket: their log (of 0 too) is never read.
    logs = np.log(np.maximum(n, exact).astype(np.float32) / np.float32(exact))
    large = exact + (logs / np.float32(math.log(max_distance / exact))
                     * np.float32(half - exact)).astype(np.int64)
    large = np.minimum(large, half - 1)
    return out + np.where(n < exact, n, large)


def relative_bias(table: np.ndarray, n: int, buckets: int, max_distance: int,
                  bidirectional: bool = True) -> np.ndarray:
    """Each head's bias ``(heads, n, n)`` of ``table`` ``(rows, heads)``: row ``i``, column
    ``j`` is ``table[bucket(j - i), h]`` (``relative_buckets``), as MPNetEncoder's
    ``compute_position_bias`` over positions ``0 .. n - 1``, in ``table``'s dtype.

    Raises:
        ValueError: a bucket past the table's rows.
    """
    i = np.arange(n)
    b = relative_buckets(i[None, :] - i[:, None], buckets, max_distance, bidirectional)
    if b.size and b.max() >= table.shape[0]:
        raise ValueError(f"relative bucket {int(b.max())} is past the bias table's "
                         f"{table.shape[0]} rows")
    return np.ascontiguousarray(table[b].transpose(2, 0, 1))


def segment_of(positions: np.ndarray, segments: tuple[int, int, int, int]) -> np.ndarray:
    """Each position's segment, int64 of ``positions``' shape: ``segments`` is ``(count,
    prefix, first, rest)``, positions below ``prefix`` (a prefix prepended to every
    sequence) in segment ``first``, the others in ``rest``, of ``count`` segments."""
    _, prefix, first, rest = segments
    return np.where(np.asarray(positions) < prefix, first, rest).astype(np.int64)


def position_bias(table: np.ndarray, qpos: np.ndarray, kpos: np.ndarray, buckets: int,
                  max_distance: int, bidirectional: bool = True,
                  segments: tuple[int, int, int, int] | None = None) -> np.ndarray:
    """Each head's bias ``(heads, n, w)`` of queries at positions ``qpos`` ``(n,)`` over keys
    at ``kpos`` ``(w,)``, in ``table``'s dtype: ``table[bucket(key - query), h]``
    (``relative_buckets``), as T5Attention's ``compute_bias`` over a cache's positions.
    With ``segments`` (``(count, prefix, first, rest)``, ``segment_of``) a query and a key of
    different segments read row ``buckets + sq * count + sk`` instead, by the pair of
    segments, as CpmAntSegmentPositionEmbedding (its ``relative_attention_bias`` holds the
    ``buckets`` rows first, then ``count ** 2`` rows of pairs).

    Raises:
        ValueError: a row past the table's (``relative_buckets``' own errors too).
    """
    q, k = np.asarray(qpos, np.int64), np.asarray(kpos, np.int64)
    b = relative_buckets(k[None, :] - q[:, None], buckets, max_distance, bidirectional)
    if segments is not None:
        sq, sk = segment_of(q, segments), segment_of(k, segments)
        b = np.where(sq[:, None] == sk[None, :], b, buckets + sq[:, None] * segments[0]
                     + sk[None, :])
    if b.size and b.max() >= table.shape[0]:
        raise ValueError(f"relative bias row {int(b.max())} is past the bias table's "
                         f"{table.shape[0]} rows")
    return np.ascontiguousarray(table[b].transpose(2, 0, 1))
