"""Reduced-precision weight formats a decode step's GEMV reads: bfloat16 and Q8_0.

- ``bfloat16``: a float32's upper 16 bits, as numpy uint16. Exact where the low half is
  zero (a bfloat16 checkpoint's weights); ``round_bfloat16`` rounds any float32 to nearest,
  ties to even (as torch's ``tensor.to(torch.bfloat16)``).
- ``Q8_0``: llama.cpp's 8-bit blocks (ggml-quants.c, ``quantize_row_q8_0_ref``): per 32
  consecutive weights of a row, a float16 scale ``d = max|w| / 127`` and 32 int8 values
  ``q = round(w / d)`` (half away from zero), ``w ~ d * q``; 34 bytes a block, ``d`` first,
  little-endian; a row of ``k`` weights is ``k / 32`` blocks in order, as numpy uint8
  ``(rows, k / 32 * 34)``. The same bytes as a GGUF file's Q8_0 tensor rows.
"""

from __future__ import annotations

import numpy as np

Q8_BLOCK, Q8_BYTES = 32, 34  # weights per block; bytes per block (a float16 d, 32 int8)


def bfloat16_exact(array: np.ndarray) -> tuple[np.ndarray, int]:
    """``array`` (float32) as bfloat16 bits (uint16, same shape), truncated, and how many
    values that changed (nonzero low halves)."""
    bits = np.ascontiguousarray(array, np.float32).view(np.uint32)
    return (bits >> 16).astype(np.uint16), int(np.count_nonzero(bits & 0xFFFF))


def round_bfloat16(array: np.ndarray) -> np.ndarray:
    """``array`` (float32, finite) rounded to the nearest bfloat16, ties to even, as its
    16-bit patterns (uint16, same shape).

    Raises:
        ValueError: a value is NaN or infinite (rounding would not keep it).
    """
    a = np.ascontiguousarray(array, np.float32)
    if not np.isfinite(a).all():
        raise ValueError(f"{int(np.count_nonzero(~np.isfinite(a)))} values are not finite")
    bits = a.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    if ((rounded & 0x7F80) == 0x7F80).any():  # a value past bfloat16's largest rounds to inf
        raise ValueError("a value past bfloat16's largest finite value (3.39e38) would round "
                         "to infinity")
    return rounded.astype(np.uint16)


def widen_bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) as float32, exactly."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def quantize_q8_0(array: np.ndarray) -> np.ndarray:
    """``array`` ``(rows, k)`` float32 (finite) as Q8_0 blocks: uint8 ``(rows, k / 32 * 34)``.

    Raises:
        ValueError: ``k`` is not a multiple of 32, or a value is not finite.
    """
    a = np.ascontiguousarray(array, np.float32)
    if a.ndim != 2 or a.shape[1] % Q8_BLOCK:
        raise ValueError(f"Q8_0 quantizes rows of a multiple of {Q8_BLOCK} weights; this "
                         f"weight is {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError(f"{int(np.count_nonzero(~np.isfinite(a)))} values are not finite")
    n, k = a.shape
    out = np.empty((n, k // Q8_BLOCK, Q8_BYTES), np.uint8)
    step = max(1, (1 << 22) // k)  # rows a time: the float32 temporaries stay ~16 MB
    for r in range(0, n, step):
        blocks = a[r: r + step].reshape(-1, k // Q8_BLOCK, Q8_BLOCK)
        d = np.abs(blocks).max(axis=2) / np.float32(127)
        inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
        v = blocks * inv[..., None]
        q = np.trunc(v + np.copysign(np.float32(0.5), v))  # C's roundf: half away from zero
        out[r: r + step, :, 2:] = q.astype(np.int8).view(np.uint8)
        out[r: r + step, :, :2] = d.astype("<f2")[..., None].view(np.uint8)
    return out.reshape(n, k // Q8_BLOCK * Q8_BYTES)


def widen_q8_0(packed: np.ndarray) -> np.ndarray:
    """Q8_0 blocks (uint8 ``(rows, k / 32 * 34)``) as the float32 ``(rows, k)`` they stand
    for, ``d * q`` (each product exact in float32: 11 bits of d times 8 of q)."""
    n, width = packed.shape
    blocks = packed.reshape(n, width // Q8_BYTES, Q8_BYTES)
    d = np.ascontiguousarray(blocks[..., :2]).view("<f2").astype(np.float32)
    q = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).astype(np.float32)
    return (q * d).reshape(n, width // Q8_BYTES * Q8_BLOCK)
