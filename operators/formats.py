"""Reduced-precision weight formats a decode step's GEMV reads: bfloat16 and Q8_0.

- ``bfloat16``: a float32's upper 16 bits, as numpy uint16. Exact where the low half is
  zero (a bfloat16 checkpoint's weights); ``round_bfloat16`` rounds any float32 to nearest,
  ties to even (as torch's ``tensor.to(torch.bfloat16)``).
- ``Q8_0``: llama.cpp's 8-bit blocks (ggml-quants.c, ``quantize_row_q8_0_ref``): per 32
  consecutive weights of a row, a float16 scale ``d = max|w| / 127`` and 32 int8 values
  ``q = round(w / d)`` (half away from zero), ``w ~ d * q``; 34 bytes a block, ``d`` first,
  little-endian; a row of ``k`` weights is ``k / 32`` blocks in order, as numpy uint8
  ``(rows, k / 32 * 34)``. The same bytes as a GGUF file's Q8_0 tensor rows.

- ``x16``: what a GEMV on Q8_0 weights multiplies them by (``quantize_x16``): the input
  row per 32-value block as int16 with a float32 scale, ``dx = max|x| / 32767``,
  ``q = rint(x * (1 / dx))`` (ties to even), in float32 as the kernel computes them; so each
  block's 32 products sum exactly in int32 (``operators/_cpu_gemv.h``, as llama.cpp's Q8_0
  dot quantizes its input, at 16 bits instead of 8: the error, at most ``dx / 2`` a value,
  is 2^-16 of the block's largest, well under Q8_0's own 2^-8).
- ``x8``: what a decode step's GEMV on a held block form (Q8_0, Q4_0, ..., the K forms:
  ``operators/_cpu_held_x8.h``) multiplies the stored integers by (``quantize_x8``): the same
  blocks at 8 bits, ``dx = max|x| / 127``, ``q = rint(x * (1 / dx))``, as llama.cpp quantizes
  a GEMV's input to Q8_0 before its integer dot products (``quantize_row_q8_0``; its ``d`` is
  then rounded to float16 and its Q8_K per 256 values, ours kept in float32 per 32, so an
  error of at most ``dx / 2`` a value: 1/254 of the block's largest).

The decode step's GEMV (``operators/_cpu_gemv.h``) reads either in **row groups**
(``group_bfloat16``, ``group_q8_0``): the rows in groups of ``ROW_GROUP`` (the last group
holding the rest), a group's weights one after another in the order the kernel reads them,
so each thread streams one sequential range and a group's rows' sums run side by side. Same
dtype, shape and bytes as the row-major form; only the order within a group differs.

A prompt chunk's GEMM on bfloat16 (``--prefill-weights bfloat16``) reads **tiles**
(``tile_bfloat16``): the weight padded with zeros to whole tiles of 16 rows by 32 columns,
``(ceil(rows / 16), ceil(k / 32), 16, 32)`` uint16, each tile's row ``r`` holding columns
``2r`` and ``2r + 1`` of each of its 16 rows side by side: the pair ("VNNI") layout an Intel
AMX B tile is read in (``operators/_cpu_tiles.h``).
"""

from __future__ import annotations

import numpy as np

Q8_BLOCK, Q8_BYTES = 32, 34  # weights per block; bytes per block (a float16 d, 32 int8)
X16_MAX = 32767  # the largest int16 a block's x is scaled to
X8_MAX = 127  # the largest int8 a block's x is scaled to (x8)
X16_TINY = np.float32(2.0 ** -100)  # a block whose max |x| is below this is zeros (its 1 / dx
#                                     would overflow float32 near 2^-126)
ROW_GROUP = 4  # rows a group of the decode forms holds (_cpu.c's GEMV_GROUP)
CHUNK = 32  # columns a bfloat16 group's chunk holds: 16 pairs (column j, column 16 + j)
# Values converted a piece at a time: each conversion's temporaries (uint32 and uint64
# views, a regrouping's transposed copy) stay a few MB, not a multiple of the weight (a
# 262144 x 640 head's whole-array temporaries took 660 MB over its copy, at load).
PIECE = 1 << 20


def _pieces(n: int, per: int = 1):
    """``(lo, hi)`` over ``0 .. n`` in pieces of about ``PIECE`` values, ``per`` values an
    item (a row's width)."""
    step = max(1, PIECE // max(1, per))
    for lo in range(0, n, step):
        yield lo, min(n, lo + step)


def bfloat16_exact(array: np.ndarray) -> tuple[np.ndarray, int]:
    """``array`` (float32) as bfloat16 bits (uint16, same shape), truncated, and how many
    values that changed (nonzero low halves)."""
    bits = np.ascontiguousarray(array, np.float32).view(np.uint32)
    flat = bits.reshape(-1)
    out = np.empty(flat.shape, np.uint16)
    inexact = 0
    for lo, hi in _pieces(flat.size):
        out[lo:hi] = flat[lo:hi] >> 16
        inexact += int(np.count_nonzero(flat[lo:hi] & 0xFFFF))
    return out.reshape(bits.shape), inexact


def round_bfloat16(array: np.ndarray) -> np.ndarray:
    """``array`` (float32, finite) rounded to the nearest bfloat16, ties to even, as its
    16-bit patterns (uint16, same shape).

    Raises:
        ValueError: a value is NaN or infinite (rounding would not keep it).
    """
    a = np.ascontiguousarray(array, np.float32)
    flat = a.reshape(-1)
    out = np.empty(flat.shape, np.uint16)
    for lo, hi in _pieces(flat.size):
        piece = flat[lo:hi]
        if not np.isfinite(piece).all():
            raise ValueError(f"{int(np.count_nonzero(~np.isfinite(a)))} values are not finite")
        bits = piece.view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        if ((rounded & 0x7F80) == 0x7F80).any():  # past bfloat16's largest: rounds to inf
            raise ValueError("a value past bfloat16's largest finite value (3.39e38) would "
                             "round to infinity")
        out[lo:hi] = rounded
    return out.reshape(a.shape)


def to_bfloat16(array: np.ndarray) -> np.ndarray:
    """``array`` (float32, any values) as the bfloat16 torch's ``.to(torch.bfloat16)`` gives:
    to nearest, ties to even; past bfloat16's largest finite value, infinity; NaN a quiet
    NaN of its sign. Bits, uint16, same shape. What a bfloat16 KV cache holds of what is
    written to it (``runtime.module.State``; the C kernels' ``to_bf16``)."""
    bits = np.ascontiguousarray(array, np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
               >> np.uint32(16)).astype(np.uint16)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        rounded[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return rounded


def widen_bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) as float32, exactly."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


TILE_ROWS, TILE_COLS = 16, 32  # a bfloat16 tile: rows of the weight, columns (values of k)


def tile_bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits ``(rows, k)`` (uint16) as tiles: uint16 ``(ceil(rows / 16),
    ceil(k / 32), 16, 32)``, zeros past ``rows`` and ``k``; tile ``(j, t)``'s element
    ``(p, 2q + e)`` is ``bits[16 j + q, 32 t + 2p + e]``."""
    n, k = bits.shape
    nt, kt = -(-n // TILE_ROWS), -(-k // TILE_COLS)
    padded = np.zeros((nt * TILE_ROWS, kt * TILE_COLS), np.uint16)
    padded[:n, :k] = bits
    # (j, q, t, p, e) -> (j, t, p, q, e)
    t = padded.reshape(nt, TILE_ROWS, kt, TILE_COLS // 2, 2).transpose(0, 2, 3, 1, 4)
    return np.ascontiguousarray(t).reshape(nt, kt, TILE_ROWS, TILE_COLS)


def untile_bfloat16(tiles: np.ndarray, rows: int, k: int) -> np.ndarray:
    """``tile_bfloat16``'s inverse: the bits ``(rows, k)`` (uint16, row-major)."""
    nt, kt = tiles.shape[:2]
    t = tiles.reshape(nt, kt, TILE_COLS // 2, TILE_ROWS, 2).transpose(0, 3, 1, 2, 4)
    return np.ascontiguousarray(t.reshape(nt * TILE_ROWS, kt * TILE_COLS)[:rows, :k])


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



def _regroup(array: np.ndarray, pack, unpack: bool) -> np.ndarray:
    """``array`` ``(rows, width)`` into its row groups (``pack(a, G, R)``: ``G`` groups of
    ``R`` rows, ``(G * R, width)`` -> ``(G, R * width)``), or back (``unpack``): the whole
    groups a piece at a time, then the last group of the rest. Same dtype and shape."""
    n, width = array.shape
    full = n - n % ROW_GROUP
    out = np.empty_like(array)
    spans = [(g0 * ROW_GROUP, g1 * ROW_GROUP, ROW_GROUP)
             for g0, g1 in _pieces(full // ROW_GROUP, ROW_GROUP * width)]
    for lo, hi, R in spans + [(full, n, n - full)]:
        if hi > lo:
            out[lo:hi] = pack(array[lo:hi], (hi - lo) // R, R, unpack).reshape(hi - lo, width)
    return out


def _bfloat16_groups(a: np.ndarray, G: int, R: int, unpack: bool) -> np.ndarray:
    k = a.shape[1]
    C, T = k // CHUNK, k % CHUNK
    if not unpack:  # (group, row, chunk, half, j) -> (group, chunk, row, j, half); then tails
        g = a.reshape(G, R, k)
        paired = g[..., :C * CHUNK].reshape(G, R, C, 2, CHUNK // 2).transpose(0, 2, 1, 4, 3)
        return np.concatenate([paired.reshape(G, -1), g[..., C * CHUNK:].reshape(G, -1)], axis=1)
    g = a.reshape(G, R * k)
    paired = g[:, :C * CHUNK * R].reshape(G, C, R, CHUNK // 2, 2).transpose(0, 2, 1, 4, 3)
    return np.concatenate([paired.reshape(G, R, C * CHUNK), g[:, C * CHUNK * R:].reshape(G, R, T)],
                          axis=2)


def group_bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits ``(rows, k)`` (uint16, row-major) in the decode step's row groups
    (uint16, same shape): per group of R rows, for each whole 32-column chunk the R rows'
    32 values, each row's as 16 pairs (column j, column 16 + j), j = 0..15; then each row's
    ``k % 32`` last columns in order."""
    return _regroup(np.ascontiguousarray(bits, np.uint16), _bfloat16_groups, False)


def ungroup_bfloat16(grouped: np.ndarray) -> np.ndarray:
    """``group_bfloat16``'s inverse: the row-major bits (uint16, same shape)."""
    return _regroup(np.ascontiguousarray(grouped, np.uint16), _bfloat16_groups, True)


def _q8_0_groups(a: np.ndarray, G: int, R: int, unpack: bool) -> np.ndarray:
    B = a.shape[1] // Q8_BYTES
    if not unpack:  # (group, row, block, byte) -> per block: R scales, then R x 32 values
        g = a.reshape(G, R, B, Q8_BYTES).transpose(0, 2, 1, 3)
        return np.concatenate([g[..., :2].reshape(G, B, 2 * R), g[..., 2:].reshape(G, B, -1)],
                              axis=2)
    g = a.reshape(G, B, R * Q8_BYTES)
    d = g[..., :2 * R].reshape(G, B, R, 2)
    q = g[..., 2 * R:].reshape(G, B, R, Q8_BLOCK)
    return np.concatenate([d, q], axis=3).transpose(0, 2, 1, 3)


def group_q8_0(blocks: np.ndarray) -> np.ndarray:
    """Q8_0 blocks ``(rows, k / 32 * 34)`` (uint8, row-major, ``quantize_q8_0``) in the
    decode step's row groups (uint8, same shape): per group of R rows, for each block the R
    rows' float16 scales (2 R bytes), then their R x 32 int8 values, row by row."""
    return _regroup(np.ascontiguousarray(blocks, np.uint8), _q8_0_groups, False)


def ungroup_q8_0(grouped: np.ndarray) -> np.ndarray:
    """``group_q8_0``'s inverse: the row-major blocks (uint8, same shape)."""
    return _regroup(np.ascontiguousarray(grouped, np.uint8), _q8_0_groups, True)


def _quantize_x(x: np.ndarray, top: int, name: str) -> tuple[np.ndarray, np.ndarray]:
    """x per 32-value block as integers within +-``top`` and a float32 scale each (see
    ``quantize_x16``)."""
    x = np.asarray(x, np.float32)
    if x.shape[-1] % Q8_BLOCK:
        raise ValueError(f"{name} quantizes rows of a multiple of {Q8_BLOCK} values, not {x.shape}")
    blocks = x.reshape(x.shape[:-1] + (x.shape[-1] // Q8_BLOCK, Q8_BLOCK))
    with np.errstate(invalid="ignore", over="ignore"):
        amax = np.abs(blocks).max(axis=-1)
        d = np.where(amax >= X16_TINY, amax / np.float32(top), np.float32(0))
        inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
        q = np.rint(blocks * inv[..., None])
        dx = d + (blocks * np.float32(0)).sum(axis=-1, dtype=np.float32)  # NaN where not finite
    return q.reshape(x.shape), dx


def quantize_x16(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An input row (or rows) ``(..., k)`` float32, ``k`` a multiple of 32, as the Q8_0 GEMV
    reads it: the int16 values ``q`` (as float32, ``(..., k)``) and each block's scale ``dx``
    (float32, ``(..., k / 32)``), by the kernel's own float32 operations (see the module
    docstring). A block with a value not finite has ``dx`` NaN (its products NaN, as
    float32's would be); a block whose max |x| is below ``X16_TINY`` is zeros.

    Raises:
        ValueError: ``k`` is not a multiple of 32.
    """
    return _quantize_x(x, X16_MAX, "x16")


def quantize_x8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``quantize_x16`` at 8 bits (``X8_MAX``): how a decode step's GEMV on a held block form
    reads its input row, by the kernel's own float32 operations (``_cpu_held_x8.h``'s
    quantize_x8): ``q`` (as float32, within +-127) and ``dx`` (float32, per 32 values).

    Raises:
        ValueError: ``k`` is not a multiple of 32.
    """
    return _quantize_x(x, X8_MAX, "x8")


def _values(q: np.ndarray, dx: np.ndarray) -> np.ndarray:
    k = q.shape[-1]
    blocks = q.astype(np.float64).reshape(q.shape[:-1] + (k // Q8_BLOCK, Q8_BLOCK))
    with np.errstate(invalid="ignore"):
        return (blocks * dx.astype(np.float64)[..., None]).reshape(q.shape)


def x16_values(x: np.ndarray) -> np.ndarray:
    """The values ``quantize_x16`` makes of ``x``, ``q * dx``, exactly (float64, ``x``'s
    shape): what the Q8_0 GEMV's sums stand for."""
    return _values(*quantize_x16(x))


def x8_values(x: np.ndarray) -> np.ndarray:
    """The values ``quantize_x8`` makes of ``x``, ``q * dx``, exactly (float64, ``x``'s
    shape): what a held block form's GEMV sums stand for, and a prompt chunk's Q8_0 GEMM's
    (operators/_cpu_held_gemm.h: llama.cpp's quantize_row_q8_0 with the scale kept float32)."""
    return _values(*quantize_x8(x))
