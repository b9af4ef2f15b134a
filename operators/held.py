"""Weights held as the checkpoint stores them: the forms a projection's or an embedding's
weight may take, and what each kernel reads of them.

A held weight is a matrix ``(rows, k)`` in one of:

- ``F32``: a float32 array (a float32 checkpoint's, or drawn weights);
- ``BF16``, ``F16``: an ``ml_dtypes.bfloat16`` or ``numpy.float16`` array, typically a
  read-only view of the memory-mapped safetensors or GGUF file: no float32 copy;
- a GGML block form (``Blocks``: ``Q8_0``, ``Q4_0``, ``Q4_1``, ``Q5_0``, ``Q5_1``,
  ``Q4_K``, ``Q5_K``, ``Q6_K``): each row ``k / block`` blocks of the bytes a GGUF tensor
  holds (ggml-common.h's ``block_q8_0`` ...), typically a view of the file too.

Every kernel reads each form as it is (``operators/_cpu_held.h``) and computes in float32 from
the values llama.cpp's ``dequantize_row_*`` gives (``widen``: the same float32 operations, so
the same values, bit for bit). What a kernel rounds beyond the stored form:

- one row of x (a decode step's GEMV) on a block form meets x as ``formats.quantize_x8``
  rounds it (per 32 values an int8 each and a float32 scale, at most 1/254 of the block's
  largest off), so each block's products sum exactly in integers, as llama.cpp's integer dot
  products do (``operators/_cpu_held_x8.h``: VNNI where the CPU has it);
  ``reference_x`` gives the values it stands for;
- more rows (a prompt chunk's GEMM) on bfloat16 rows asked to (``RoundingX``: under
  ``--prefill-weights bfloat16``) meet x rounded to the nearest bfloat16 (ties to even), as
  llama.cpp's bfloat16 GEMM rounds it: float32 sums of bfloat16 products (AVX-512 BF16's
  VDPBF16PS where the CPU has it; ``_cpu_held_gemm.h``);
- more rows on Q8_0 meet x quantized per 32-value block to 8 bits and a float32 scale
  (``formats.x8_values``), so each block's products sum exactly in integers (AVX-512 VNNI's
  VPDPBUSD where the CPU has it), as llama.cpp's Q8_0 GEMM;
- more rows on any other form, and one row on a float form, meet x as it is: float32
  products of x and the stored values, summed in float32.

The float64 reference widens a held weight a block of rows at a time (``widen``), never the
whole of it.
"""

from __future__ import annotations

from typing import Callable

import ml_dtypes
import numpy as np

from . import formats

#: Each form's code in the kernels (GGML's type number: ``gguf.GGMLQuantizationType``).
CODES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8,
         "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "BF16": 30}
#: The forms a weight is held in as a numpy array of that dtype.
ARRAY_FORMS = {"F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
               "BF16": np.dtype(ml_dtypes.bfloat16)}
#: Values a block of each block form holds, and its bytes.
BLOCKS = {"Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22),
          "Q5_1": (32, 24), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210)}

ROWS = 8192  # rows widened at a time where a caller wants them all (widen_all)


class Blocks:
    """A matrix ``shape`` ``(rows, k)`` held as GGML blocks of ``form``: ``data`` uint8
    ``(rows, k / block * bytes)``, each row's blocks in order (a view of a GGUF file's tensor,
    or blocks quantized at load).

    ``dequantize(data)``: ``(n, bytes)`` uint8 blocks -> ``(n, block)`` float32, the reference
    widening (``runtime.quants``' numpy one, equal to gguf-py's; the caller gives it so that
    this module need not import the runtime's).

    Raises:
        ValueError: ``form`` is no block form, or ``data`` is not ``shape``'s bytes.
    """

    def __init__(self, form: str, data: np.ndarray, shape: tuple[int, int],
                 dequantize: Callable[[np.ndarray], np.ndarray]):
        if form not in BLOCKS:
            raise ValueError(f"{form} is not a block form ({', '.join(BLOCKS)})")
        block, nbytes = BLOCKS[form]
        rows, k = (int(s) for s in shape)
        if k % block or data.dtype != np.uint8 or data.shape != (rows, k // block * nbytes):
            raise ValueError(f"{form} blocks of a ({rows}, {k}) matrix are uint8 "
                             f"({rows}, {k // block * nbytes}), not {data.dtype} {data.shape}")
        self.form, self.data, self.shape = form, data, (rows, k)
        self.dequantize = dequantize

    ndim = 2
    dtype = np.dtype(np.uint8)  # its bytes' (a recording's handle names one)

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def __len__(self) -> int:
        return self.shape[0]

    def rows(self, lo: int, hi: int) -> "Blocks":
        """Rows ``lo .. hi`` (a view)."""
        lo, hi = max(0, lo), min(self.shape[0], hi)
        return Blocks(self.form, self.data[lo:hi], (hi - lo, self.shape[1]), self.dequantize)

    def __repr__(self) -> str:
        return f"Blocks({self.form}, {self.shape})"


def form(weight) -> str:
    """The form ``weight`` is held in: ``F32``, ``F16``, ``BF16`` or a block form's name.

    Raises:
        TypeError: ``weight`` is none of them.
    """
    if isinstance(weight, Blocks):
        return weight.form
    if hasattr(weight, "matrix"):  # a stack of matrices held as one (experts.HeldStack)
        return form(weight.matrix)
    if isinstance(weight, np.ndarray):
        for name, dtype in ARRAY_FORMS.items():
            if weight.dtype == dtype:
                return name
    raise TypeError(f"a weight held as {type(weight).__name__} "
                    f"{getattr(weight, 'dtype', '')}: not one of {', '.join(CODES)}")


def is_held(weight) -> bool:
    """Whether ``weight`` is held in a form other than float32 (kernels read it as it is)."""
    if hasattr(weight, "matrix"):  # a stack of matrices held as one (experts.HeldStack)
        return is_held(weight.matrix)
    return isinstance(weight, Blocks) or (
        isinstance(weight, np.ndarray) and weight.dtype in (ARRAY_FORMS["F16"], ARRAY_FORMS["BF16"]))


def is_block(weight) -> bool:
    """Whether ``weight`` is held as GGML blocks (a decode step's GEMV meets x8)."""
    return isinstance(weight, Blocks)


class RoundingX(np.ndarray):
    """bfloat16 rows a prompt chunk's GEMM meets with x rounded to bfloat16 too, as
    llama.cpp's bfloat16 GEMM does (AVX-512 BF16's VDPBF16PS, ``_cpu_held_gemm.h``): the held
    rows themselves (a view, no copy), asked for by ``--prefill-weights bfloat16``. Plain
    bfloat16 rows meet x as it is."""


#: The kernels' code for ``RoundingX`` rows (``_cpu.c``'s HELD_BF16_X: not a GGML type).
ROUNDING_X = 1030


def rounding_x(weight) -> "RoundingX":
    """``weight`` (bfloat16 rows) as ``RoundingX`` rows: a view."""
    if form(weight) != "BF16":
        raise ValueError(f"x is rounded to bfloat16 against bfloat16 rows, not {form(weight)}")
    return weight.view(RoundingX)


def code(weight) -> int:
    """``weight``'s form as the kernels name it (``CODES``; ``ROUNDING_X`` for RoundingX)."""
    return ROUNDING_X if isinstance(weight, RoundingX) else CODES[form(weight)]


def raw(weight) -> np.ndarray:
    """The array the kernels read: its bytes in its form, C-contiguous rows (a float16 or
    bfloat16 array as its 16-bit patterns, blocks as their bytes)."""
    if isinstance(weight, Blocks):
        return weight.data
    if weight.dtype == ARRAY_FORMS["BF16"]:
        return weight.view(np.uint16)
    return weight


def contiguous(weight) -> bool:
    return raw(weight).flags.c_contiguous


def widen(weight, lo: int = 0, hi: int | None = None) -> np.ndarray:
    """Rows ``lo .. hi`` of ``weight`` as a new float32 array ``(hi - lo, k)``: exactly the
    values it holds (a block form's as llama.cpp's ``dequantize_row_*``, by numpy)."""
    hi = len(weight) if hi is None else hi
    if isinstance(weight, Blocks):
        part = weight.rows(lo, hi)
        block, nbytes = BLOCKS[weight.form]
        values = part.dequantize(part.data.reshape(-1, nbytes))
        return np.asarray(values, np.float32).reshape(part.shape)
    return np.asarray(weight[lo:hi], np.float32)


def widen_all(weight) -> np.ndarray:
    """The whole of ``weight`` as float32 (a copy: for small weights and fallbacks only)."""
    if not is_held(weight):
        return weight
    out = np.empty(weight.shape, np.float32)
    for lo in range(0, len(weight), ROWS):
        out[lo: lo + ROWS] = widen(weight, lo, lo + ROWS)
    return out


def gather(weight, ids: np.ndarray) -> np.ndarray:
    """Rows ``ids`` of ``weight`` as float32 ``(len(ids), k)`` (an embedding's gather)."""
    ids = np.asarray(ids).reshape(-1)
    if not is_held(weight):
        return np.asarray(weight[ids], np.float32)
    if isinstance(weight, Blocks):
        block, nbytes = BLOCKS[weight.form]
        values = weight.dequantize(weight.data[ids].reshape(-1, nbytes))
        return np.asarray(values, np.float32).reshape(len(ids), weight.shape[1])
    return np.asarray(weight[ids], np.float32)


def reference_x(x: np.ndarray, weight) -> np.ndarray:
    """The values a kernel multiplies ``weight`` by for input rows ``x`` (float64): one row on
    a block form, x8's (``formats.x8_values``); more rows on ``RoundingX`` bfloat16 rows, x
    rounded to the nearest bfloat16 (ties to even, a NaN kept), on Q8_0 x8's too: the prompt
    chunk's GEMMs round x so, as llama.cpp's do; else x itself."""
    if is_block(weight) and x.shape[0] == 1:
        return formats.x8_values(x)
    if isinstance(weight, RoundingX) and x.shape[0] > 1:
        return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    if form(weight) == "Q8_0" and x.shape[0] > 1:
        return formats.x8_values(x)
    return np.asarray(x, np.float64)


def nbytes(weight) -> int:
    """Bytes ``weight`` holds."""
    return int(weight.nbytes)
