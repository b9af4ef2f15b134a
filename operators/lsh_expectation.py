"""Attention by the expected collisions of random-hyperplane hashes: each key weighs a query
by the chance that ``bits`` random hyperplanes all put the two unit vectors on one side,
``(1 - angle / pi) ** bits``, in place of a softmax, and each head's output is scaled to
unit length.

As transformers' YosoSelfAttention with ``use_expectation`` (YosoCumulation, the
expectation the LSH sampling estimates; Zeng et al. 2021, "You Only Sample (Almost)
Once"): queries and keys L2-normalized per head (``nn.functional.normalize``, eps 1e-12),
``E = (1 - acos(q k^T) / pi) ** hash_code_len``, ``E v``, L2-normalized per head. No
randomness: the sampled path (``use_expectation`` false: ``torch.randn`` hyperplanes at
every call, CUDA kernels) is not this.

Not for: softmax attention (``self_attention``), decoding over a KV cache.
"""

from __future__ import annotations

import numpy as np

from .base import EPS32, Operator, Tolerance


def _unit(x: np.ndarray) -> np.ndarray:
    """``x / max(||x||, 1e-12)`` over the last axis, as torch's ``normalize``."""
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), x.dtype.type(1e-12))


def _attend(q, k, v, bits: int, dtype) -> np.ndarray:
    n, H, D = q.shape
    qh, kh, vh = (np.asarray(x, dtype).transpose(1, 0, 2) for x in (q, k, v))
    cos = _unit(qh) @ _unit(kh).transpose(0, 2, 1)
    weights = (1 - np.arccos(cos) / dtype(np.pi)) ** bits
    return _unit(weights @ vh).transpose(1, 0, 2).reshape(n, H * D)


class LshExpectationAttention(Operator):
    """Attention of ``q``, ``k``, ``v`` ``(n, heads, head_dim)`` by the expected collisions
    of ``bits`` random-hyperplane hashes (YosoCumulation), each head's output row of unit
    length; output ``(n, heads * head_dim)``. In float32 (float64 in the reference).

    Raises:
        ValueError: shapes that do not meet (one key head per query head), or ``bits``
            below 1.
    """

    name = "lsh_expectation_attention"

    def shape(self, q, k, v, bits=1):
        if len(q) != 3 or q != k or k != v or bits < 1:
            raise ValueError(f"lsh_expectation_attention: q {q}, k {k} and v {v} are not one "
                             f"(n, heads, head_dim), or {bits} bits are below 1")
        return (q[0], q[1] * q[2])

    def reference(self, q, k, v, bits=1):
        return _attend(q, k, v, bits, np.float64)

    def kernel(self, out, q, k, v, scratch=None, bits=1):
        np.copyto(out, _attend(q, k, v, bits, np.float32))

    def tolerance(self, q, k, v, bits=1):
        # acos is steep near cos 1 (a key along its query): float32's rounding of the cosine
        # grows there by 1 / sqrt(1 - cos^2), and the power multiplies it by the bits.
        return Tolerance(atol=2e-6, rtol=(32 + 8 * bits) * EPS32)

    def scale(self, reference, q, k, v, bits=1):
        # A unit vector per row and head: its elements are at most 1.
        return np.ones_like(reference)
