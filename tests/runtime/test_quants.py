"""GGML block formats dequantized: each against gguf-py's own ``gguf.quants.dequantize`` on
many blocks (bit for bit), and one block of each against a hand computation from ggml's block
layouts (ggml-common.h's ``block_q*`` structs, ggml-quants.c's ``dequantize_row_*``)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants

from iron_spec.runtime.quants import FORMATS, dequantize


def f16(x: float) -> list[int]:
    return list(np.float16(x).tobytes())


def random_blocks(name: str, n: int, seed: int) -> np.ndarray:
    """``n`` blocks of random bytes whose float16 fields hold finite scales."""
    fmt = FORMATS[name]
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, (n, fmt.nbytes), dtype=np.uint8)
    halves = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2],
              "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [fmt.nbytes - 2]}[name]
    for at in halves:
        b[:, at:at + 2] = rng.uniform(-0.1, 0.1, n).astype(np.float16).view(np.uint8).reshape(n, 2)
    return b


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"])
def test_blocks_equal_gguf_py_bit_for_bit(name):
    blocks = random_blocks(name, 300, seed=len(name))
    ours = dequantize(blocks, FORMATS[name])
    theirs = quants.dequantize(blocks, T[name]).reshape(-1)
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    assert ours.tobytes() == theirs.astype(np.float32).tobytes()


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "BF16", "F16"])
def test_gguf_py_quantized_values_read_back(name):
    x = np.random.default_rng(3).standard_normal((8, 64)).astype(np.float32)
    stored = quants.quantize(x, T[name])
    ours = dequantize(stored.view(np.uint8), FORMATS[name]).reshape(x.shape)
    assert ours.tobytes() == quants.dequantize(stored, T[name]).astype(np.float32).tobytes()
    assert np.abs(ours - x).max() < 0.3  # half a 4-bit step of a block of |x| < 4.5


def test_unquantized_formats():
    x = np.array([1.5, -2.25, 3.0e-3, 65504.0], np.float32)
    assert dequantize(x.view(np.uint8), FORMATS["F32"]).tolist() == x.tolist()
    assert dequantize(x.astype(np.float16).view(np.uint8), FORMATS["F16"]).tolist() == \
        [1.5, -2.25, float(np.float16(3.0e-3)), 65504.0]
    # bfloat16 1.5 is 0x3FC0, -2.25 is 0xC010
    raw = np.array([0x3FC0, 0xC010], np.uint16).view(np.uint8)
    assert dequantize(raw, FORMATS["BF16"]).tolist() == [1.5, -2.25]


def test_q8_0_by_hand():
    # block_q8_0 {half d; int8 qs[32]}: x_j = d * q_j
    q = np.arange(-16, 16, dtype=np.int8)
    block = np.array(f16(0.5) + list(q.view(np.uint8)), np.uint8)
    assert dequantize(block, FORMATS["Q8_0"]).tolist() == [0.5 * v for v in range(-16, 16)]


def test_q4_0_by_hand():
    # block_q4_0 {half d; uint8 qs[16]}: x_j = d * ((qs_j & 15) - 8), x_{j+16} = d * ((qs_j >> 4) - 8)
    qs = [0x5A] + [0x88] * 15
    out = dequantize(np.array(f16(2.0) + qs, np.uint8), FORMATS["Q4_0"])
    assert out[0] == 2.0 * (10 - 8) and out[16] == 2.0 * (5 - 8)
    assert (np.delete(out, [0, 16]) == 0).all()


def test_q4_1_by_hand():
    # block_q4_1 {half d, m; uint8 qs[16]}: x = d * nibble + m
    qs = [0x31] + [0x00] * 15
    out = dequantize(np.array(f16(0.25) + f16(-1.0) + qs, np.uint8), FORMATS["Q4_1"])
    assert out[0] == 0.25 * 1 - 1.0 and out[16] == 0.25 * 3 - 1.0
    assert (np.delete(out, [0, 16]) == -1.0).all()


def test_q5_0_by_hand():
    # block_q5_0 {half d; uint32 qh; uint8 qs[16]}: the 5th bit of value j is bit j of qh;
    # x = d * (q - 16)
    qh = (1 << 0) | (1 << 17)
    qs = [0x21, 0x00] + [0x00] * 14
    out = dequantize(np.array(f16(1.0) + list(np.uint32(qh).tobytes()) + qs, np.uint8),
                     FORMATS["Q5_0"])
    assert out[0] == (1 + 16) - 16   # low nibble 1, bit 0 set
    assert out[16] == 2 - 16         # high nibble 2, bit 16 clear
    assert out[17] == (0 + 16) - 16  # bit 17 set
    assert out[1] == -16


def test_q5_1_by_hand():
    # block_q5_1 {half d, m; uint32 qh; uint8 qs[16]}: x = d * q + m
    qh = 1 << 16
    qs = [0xF3] + [0x00] * 15
    out = dequantize(np.array(f16(0.5) + f16(1.0) + list(np.uint32(qh).tobytes()) + qs, np.uint8),
                     FORMATS["Q5_1"])
    assert out[0] == 0.5 * 3 + 1.0
    assert out[16] == 0.5 * (15 + 16) + 1.0
    assert out[1] == 1.0


def k_scales(sc: list[int], mn: list[int]) -> list[int]:
    """12 bytes packing 8 six-bit scales and mins as ggml-quants.c's get_scale_min_k4 reads
    them: j < 4 in bytes j (scale) and j + 4 (min); j >= 4 in byte j + 4's low (scale) and
    high (min) nibble, their top 2 bits in the top bits of bytes j - 4 and j."""
    b = [0] * 12
    for j in range(4):
        b[j] = sc[j] | ((sc[j + 4] >> 4) << 6)
        b[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6)
        b[j + 8] = (sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4)
    return b


def test_q4_k_by_hand():
    # block_q4_K {half d, dmin; uint8 scales[12]; uint8 qs[128]}: 8 sub-blocks of 32; the 32
    # bytes qs[32c .. 32c+31] hold sub-block 2c (low nibbles) and 2c+1 (high nibbles);
    # x = d * sc_s * q - dmin * m_s
    sc, mn = [1, 2, 3, 4, 5, 6, 7, 63], [0, 1, 2, 3, 4, 5, 6, 40]
    qs = [0] * 128
    qs[0] = 0x9E        # sub-block 0 value 0: 14; sub-block 1 value 0: 9
    qs[96 + 31] = 0x7F  # sub-block 6 value 31: 15; sub-block 7 value 31: 7
    out = dequantize(np.array(f16(0.5) + f16(0.25) + k_scales(sc, mn) + qs, np.uint8),
                     FORMATS["Q4_K"])
    assert out[0] == 0.5 * 1 * 14 - 0.25 * 0
    assert out[32] == 0.5 * 2 * 9 - 0.25 * 1
    assert out[6 * 32 + 31] == 0.5 * 7 * 15 - 0.25 * 6
    assert out[7 * 32 + 31] == 0.5 * 63 * 7 - 0.25 * 40
    assert out[33] == -0.25 * 1


def test_q5_k_by_hand():
    # block_q5_K {half d, dmin; scales[12]; uint8 qh[32]; uint8 qs[128]}: sub-block s's 5th
    # bits are bit s of qh[0..31]; x = d * sc_s * q - dmin * m_s
    sc, mn = [1, 2, 3, 4, 5, 6, 7, 8], [8, 7, 6, 5, 4, 3, 2, 1]
    qh = [0] * 32
    qh[0] = 0b00000010   # sub-block 1 value 0 gets +16
    qh[5] = 0b10000000   # sub-block 7 value 5 gets +16
    qs = [0] * 128
    qs[0] = 0x3C         # sub-block 0 value 0: 12; sub-block 1 value 0: 3
    qs[96 + 5] = 0x20    # sub-block 7 value 5: 2
    out = dequantize(np.array(f16(1.0) + f16(0.5) + k_scales(sc, mn) + qh + qs, np.uint8),
                     FORMATS["Q5_K"])
    assert out[0] == 1 * 12 - 0.5 * 8
    assert out[32] == 2 * (3 + 16) - 0.5 * 7
    assert out[7 * 32 + 5] == 8 * (2 + 16) - 0.5 * 1


def test_q6_k_by_hand():
    # block_q6_K {uint8 ql[128], qh[64]; int8 scales[16]; half d}: each half of 128 values
    # takes 64 ql and 32 qh bytes; value l (l < 32) of a half: ql[l] low | qh[l] bits 0-1,
    # l + 32: ql[l+32] low | bits 2-3, l + 64: ql[l] high | bits 4-5, l + 96: ql[l+32] high
    # | bits 6-7; x = d * scale_{value // 16} * (q - 32)
    ql, qh = [0] * 128, [0] * 64
    ql[0], ql[32], qh[0] = 0x21, 0x43, 0b11100100
    ql[64 + 1] = 0x05  # second half, value 1
    scales = list(np.arange(1, 17, dtype=np.int8).view(np.uint8))
    scales[8] = np.uint8(256 - 2)  # scale -2, of the second half's first 16 values
    out = dequantize(np.array(ql + qh + scales + f16(0.5), np.uint8), FORMATS["Q6_K"])
    assert out[0] == 0.5 * 1 * ((1 | (0 << 4)) - 32)
    assert out[32] == 0.5 * 3 * ((3 | (1 << 4)) - 32)
    assert out[64] == 0.5 * 5 * ((2 | (2 << 4)) - 32)
    assert out[96] == 0.5 * 7 * ((4 | (3 << 4)) - 32)
    assert out[128 + 1] == 0.5 * -2 * (5 - 32)


def test_a_partial_block_is_refused():
    with pytest.raises(ValueError, match="not a whole number of Q8_0 blocks of 34 bytes"):
        dequantize(np.zeros(35, np.uint8), FORMATS["Q8_0"])
