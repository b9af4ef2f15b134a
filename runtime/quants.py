"""GGML's tensor formats (the element types of a GGUF file), dequantized to float32 with numpy.

Each quantized format stores a row as blocks of ``block`` values in ``nbytes`` bytes: a float16
scale (and a minimum, or 6-bit sub-block scales for the 256-value "K" formats) beside packed
integers. The arithmetic follows ggml-quants.c's ``dequantize_row_*`` in float32, in the
operation order gguf-py's ``gguf.quants`` uses, so the values are the same bits as llama.cpp's
own Python reader gives.

Not for: reading a file (``runtime.gguf``), or running quantized weights (a kernel reads the
blocks of ``Format`` as they are).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

QK = 32    # values in a block of the 32-value formats
QK_K = 256  # values in a super-block of the K formats
CHUNK = 1 << 16  # blocks dequantized at a time: bounds the temporaries to a few MB


@dataclass(frozen=True)
class Format:
    """One GGML element type: ``block`` values stored in ``nbytes`` bytes, turned back into
    float32 by ``blocks``: ``(n, nbytes)`` uint8 -> ``(n, block)`` float32."""

    name: str
    block: int
    nbytes: int
    blocks: Callable[[np.ndarray], np.ndarray]


def _f16(b: np.ndarray) -> np.ndarray:
    """Little-endian float16 held in ``(n, 2)`` uint8 columns, as ``(n, 1)`` float32."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """``(n, k)`` packed bytes -> ``(n, 2k)``: the low nibbles of all k bytes, then the high
    ones (ggml's layout: value j in byte j's low half, value j + k in its high half)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _f32(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float32)


def _f16_values(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _bf16(b: np.ndarray) -> np.ndarray:
    # bfloat16 is the top half of a float32: shift its 16 bits up.
    return (np.ascontiguousarray(b).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def _q8_0(b: np.ndarray) -> np.ndarray:
    # block_q8_0: d (f16), qs[32] (int8); x = q * d
    return b[:, 2:].view(np.int8).astype(np.float32) * _f16(b[:, :2])


def _q4_0(b: np.ndarray) -> np.ndarray:
    # block_q4_0: d (f16), qs[16]; x = (nibble - 8) * d
    return _f16(b[:, :2]) * (_nibbles(b[:, 2:]).astype(np.float32) - 8)


def _q4_1(b: np.ndarray) -> np.ndarray:
    # block_q4_1: d, m (f16), qs[16]; x = nibble * d + m
    return _f16(b[:, :2]) * _nibbles(b[:, 4:]).astype(np.float32) + _f16(b[:, 2:4])


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """``(n, 4)`` bytes of a little-endian uint32 -> ``(n, 32)`` its bits, bit j for value j."""
    bits = np.ascontiguousarray(qh).view(np.uint32)
    return ((bits >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _q5_0(b: np.ndarray) -> np.ndarray:
    # block_q5_0: d (f16), qh (u32: the 5th bit of each value), qs[16]; x = (q - 16) * d
    q = _nibbles(b[:, 6:]) | (_high_bits(b[:, 2:6]) << 4)
    return _f16(b[:, :2]) * (q.astype(np.float32) - 16)


def _q5_1(b: np.ndarray) -> np.ndarray:
    # block_q5_1: d, m (f16), qh (u32), qs[16]; x = q * d + m
    q = _nibbles(b[:, 8:]) | (_high_bits(b[:, 4:8]) << 4)
    return _f16(b[:, :2]) * q.astype(np.float32) + _f16(b[:, 2:4])


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 sub-block scales and mins (6 bits each) packed in 12 bytes, as ggml-quants.c's
    ``get_scale_min_k4``: sub-block j < 4 in the low 6 bits of bytes j and j + 4; j >= 4 in
    byte j + 4's nibbles, topped by the 2 high bits of bytes j - 4 and j."""
    sc = np.concatenate([s[:, 0:4] & 0x3F, (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    mn = np.concatenate([s[:, 4:8] & 0x3F, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _k_chunks(qs: np.ndarray) -> np.ndarray:
    """``(n, 128)`` packed bytes of a K super-block -> ``(n, 8, 32)``: each 32-byte run gives
    two sub-blocks, its low nibbles then its high ones."""
    runs = qs.reshape(len(qs), 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (runs & 0x0F).reshape(len(qs), 8, 32)


def _q4_k(b: np.ndarray) -> np.ndarray:
    # block_q4_K: d, dmin (f16), scales[12], qs[128]; x = d * sc_j * q - dmin * m_j
    sc, mn = _k_scales(b[:, 4:16])
    d = (_f16(b[:, :2]) * sc)[:, :, None]
    dm = (_f16(b[:, 2:4]) * mn)[:, :, None]
    return (d * _k_chunks(b[:, 16:]).astype(np.float32) - dm).reshape(len(b), QK_K)


def _q5_k(b: np.ndarray) -> np.ndarray:
    # block_q5_K: d, dmin (f16), scales[12], qh[32], qs[128]; sub-block j's 5th bits are bit j
    # of each of the 32 qh bytes.
    sc, mn = _k_scales(b[:, 4:16])
    d = (_f16(b[:, :2]) * sc)[:, :, None]
    dm = (_f16(b[:, 2:4]) * mn)[:, :, None]
    qh = (b[:, None, 16:48] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    q = _k_chunks(b[:, 48:]) | (qh << 4)
    return (d * q.astype(np.float32) - dm).reshape(len(b), QK_K)


def _q6_k(b: np.ndarray) -> np.ndarray:
    # block_q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] (int8), d (f16);
    # x = d * scale_i * (q - 32), a scale per 16 values. Each half (128 values) takes 64 ql
    # bytes (values l and l + 64 from byte l's nibbles) and 32 qh bytes (2 bits per value).
    n = len(b)
    ql = b[:, :128].reshape(n, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    ql = (ql & 0x0F).reshape(n, 2, 4, 32)
    qh = b[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    q = (ql | ((qh & 0x03) << 4)).astype(np.int8) - np.int8(32)
    scales = b[:, 192:208].view(np.int8).astype(np.float32)
    d = (_f16(b[:, 208:210]) * scales).reshape(n, 16, 1)
    return (d * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, QK_K)


#: Every format read, by GGML's type name (``gguf.GGMLQuantizationType``).
FORMATS: dict[str, Format] = {f.name: f for f in [
    Format("F32", 1, 4, _f32),
    Format("F16", 1, 2, _f16_values),
    Format("BF16", 1, 2, _bf16),
    Format("Q8_0", QK, 2 + QK, _q8_0),
    Format("Q4_0", QK, 2 + QK // 2, _q4_0),
    Format("Q4_1", QK, 4 + QK // 2, _q4_1),
    Format("Q5_0", QK, 6 + QK // 2, _q5_0),
    Format("Q5_1", QK, 8 + QK // 2, _q5_1),
    Format("Q4_K", QK_K, 4 + 12 + QK_K // 2, _q4_k),
    Format("Q5_K", QK_K, 4 + 12 + QK_K // 8 + QK_K // 2, _q5_k),
    Format("Q6_K", QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2, _q6_k),
]}


def dequantize(data: np.ndarray, fmt: Format) -> np.ndarray:
    """``data``'s values as a new float32 array.

    Args:
        data: uint8, ``(n_blocks * fmt.nbytes,)`` or ``(n_blocks, fmt.nbytes)``: the bytes as
            the file stores them (a memory map is fine: it is read ``CHUNK`` blocks at a time).
        fmt: their format.

    Returns:
        float32, ``(n_blocks * fmt.block,)``.

    Raises:
        ValueError: the bytes are not a whole number of blocks.
    """
    flat = data.reshape(-1)
    if flat.size % fmt.nbytes:
        raise ValueError(f"{flat.size} bytes are not a whole number of {fmt.name} blocks of "
                         f"{fmt.nbytes} bytes")
    blocks = flat.reshape(-1, fmt.nbytes)
    out = np.empty((len(blocks), fmt.block), np.float32)
    for i in range(0, len(blocks), CHUNK):
        out[i:i + CHUNK] = fmt.blocks(blocks[i:i + CHUNK])
    return out.reshape(-1)
