"""Linear projection, as torch.nn.Linear: ``x @ weight.T (+ bias)``.

One row (a decode step) is a GEMV on the decode pool (``operators.native``) where it is
built, else BLAS through numpy; a prompt chunk's rows are one GEMM, on the same pool
(``native.GEMM``) or BLAS through numpy.
"""

from __future__ import annotations

import numpy as np

from . import formats, held, native
from .base import EPS32, Operator, Tolerance, as64

REFERENCE_ROWS = 8192  # weight rows the reference widens to float64 at once


class Linear(Operator):
    """``x`` ``(n, in)`` and ``weight`` ``(out, in)`` (row-major, a checkpoint's own layout)
    give ``(n, out)``; an optional third input ``bias`` ``(out,)`` is added.
    """

    name = "linear"

    def shape(self, x, weight, bias=None):
        if len(x) != 2 or len(weight) != 2 or x[1] != weight[1]:
            raise ValueError(f"linear: x {x} does not meet weight {weight} (out, in)")
        if bias is not None and bias != (weight[0],):
            raise ValueError(f"linear: bias {bias} is not ({weight[0]},)")
        return (x[0], weight[0])

    def reference(self, x, weight, bias=None):
        # Widened a block of output rows at a time: a whole lm_head in float64 is 1.3 GB on
        # a 262144-token vocabulary, for a product that needs none of it at once. A weight
        # held in its stored form (operators.held) is widened by numpy, as llama.cpp's
        # dequantize_row_* (not by the kernels under test).
        x = as64(x)
        y = np.empty(x.shape[:-1] + (weight.shape[0],), np.float64)
        for i in range(0, weight.shape[0], REFERENCE_ROWS):
            y[..., i: i + REFERENCE_ROWS] = x @ as64(held.widen(weight, i, i + REFERENCE_ROWS)).T
        return y if bias is None else y + as64(bias)

    def pack(self, index, array, **attrs):
        """A weight held in its stored form (``operators.held``) as it is: every kernel here
        reads it so; float32 as ``Operator.pack``."""
        if index == 1 and held.is_held(array):
            return array
        return super().pack(index, array, **attrs)

    def pack_reduced(self, index, array, dtype, rows=None):
        """The weight in a reduced form (``operators.formats``), or None for any other input
        (a bias stays float32):

        - ``bfloat16``: bfloat16's 16-bit patterns (uint16), where every value holds
          exactly (a bfloat16 checkpoint's own weights): the same products as float32's.
        - ``bfloat16-rounded``: any float32 rounded to the nearest bfloat16.
        - ``int8``: Q8_0 blocks (uint8), a float16 scale per 32 weights of a row; the
          GEMV meets them with x per 32-value block as int16 (``formats.quantize_x16``),
          each block's products summed exactly in integers (``reference_inputs``).

        Each in the GEMV's row groups (``formats.group_bfloat16``, ``formats.group_q8_0``):
        the weight's shape, its rows' bytes in the order the kernel streams them.

        - ``bfloat16-tiles`` (a prompt chunk's, ``--prefill-weights bfloat16``): rounded to
          the nearest bfloat16 (a bfloat16 checkpoint's weights as they are), in the GEMM's
          tiles (``formats.tile_bfloat16``); the GEMM rounds x to bfloat16 too
          (``reference_inputs``). None for a projection of one row (a prompt chunk's head,
          on its last row), which stays float32.

        Raises:
            ValueError: a value ``bfloat16`` would round, a value not finite, or (``int8``)
                rows whose length is not a multiple of 32.
        """
        if index != 1:
            return None
        if held.is_held(array):
            # A held weight already in the form asked for is read as it is (no copy); another
            # is widened first, then made the copy asked for (a small model's option: the
            # widened float32 is transient, but whole).
            if (dtype in ("bfloat16", "bfloat16-rounded") and held.form(array) == "BF16") or \
                    (dtype == "int8" and held.form(array) == "Q8_0"):
                return None
            if dtype == "bfloat16-tiles" and held.form(array) == "BF16":
                # the held rows themselves, their GEMM rounding x (no tiles, no copy)
                return None if rows == 1 else held.rounding_x(array)
            array = held.widen_all(array)
        if dtype == "bfloat16-tiles":
            if rows == 1:
                return None
            return formats.tile_bfloat16(formats.round_bfloat16(array))
        if dtype == "bfloat16":
            bits, inexact = formats.bfloat16_exact(array)
            if inexact:
                raise ValueError(f"{inexact} of {bits.size} values do not hold exactly in "
                                 "bfloat16; bfloat16 decode weights keep a bfloat16 "
                                 "checkpoint's weights as they are (--decode-weights "
                                 "bfloat16-rounded rounds them, --decode-weights float32 "
                                 "reads any)")
            return formats.group_bfloat16(bits)
        if dtype == "bfloat16-rounded":
            return formats.group_bfloat16(formats.round_bfloat16(array))
        if dtype == "int8":
            return formats.group_q8_0(formats.quantize_q8_0(array))
        return None

    def widen_reduced(self, index, packed, shape=None):
        """The float32 values a reduced weight stands for (what the kernel multiplies by)."""
        if packed.ndim == 4:  # bfloat16 tiles, padded past the weight's own shape
            return formats.widen_bfloat16(formats.untile_bfloat16(packed, *shape))
        if packed.dtype == np.uint16:
            return formats.widen_bfloat16(formats.ungroup_bfloat16(packed))
        if packed.dtype == np.uint8:
            return formats.widen_q8_0(formats.ungroup_q8_0(packed))
        return packed

    def reference_inputs(self, inputs, kernel_inputs):
        """On Q8_0 weights, x as the kernel quantizes it (``formats.x16_values``, exact); on
        bfloat16 tiles, x rounded to bfloat16 as the GEMM rounds it; on a held weight, x as
        its kernel meets it (``held.reference_x``: one row on a block form, x8's)."""
        if held.is_held(kernel_inputs[1]):
            return [held.reference_x(inputs[0], kernel_inputs[1])] + list(inputs[1:])
        if kernel_inputs[1].ndim == 4:
            return [formats.widen_bfloat16(formats.round_bfloat16(inputs[0])).astype(np.float64)] \
                + list(inputs[1:])
        if kernel_inputs[1].dtype == np.uint8:
            return [formats.x16_values(inputs[0])] + list(inputs[1:])
        return inputs

    def kernel(self, out, x, weight, bias=None, scratch=None):
        if held.is_held(weight):
            self._held_kernel(out, x, weight, bias)
            return
        if weight.ndim == 4:  # a prompt chunk's bfloat16 tiles: the GEMM rounds x
            lib = native.lib()
            if lib is not None and native.contiguous(out, x):
                lib.gemm(out, x, weight, bias)
                return
            x = formats.widen_bfloat16(formats.round_bfloat16(x))
            weight = self.widen_reduced(1, weight, (out.shape[1], x.shape[1]))
        elif weight.dtype != np.float32:  # a decode step's reduced weights (pack_reduced)
            lib = native.lib()
            if lib is not None and x.shape[0] == 1 and x[0].flags.c_contiguous:
                lib.gemv(out[0], x[0], weight, bias)
                return
            if weight.dtype == np.uint8:  # the same product as the GEMV's: x as int16 blocks
                x = formats.x16_values(x).astype(np.float32)
            weight = self.widen_reduced(1, weight)
        lib = native.lib() if x.shape[0] == 1 else native.gemm_lib()
        if lib is not None and x.flags.c_contiguous and out.flags.c_contiguous \
                and weight.flags.c_contiguous:
            if x.shape[0] == 1:
                lib.gemv(out[0], x[0], weight, bias)
            else:
                lib.gemm(out, x, weight, bias)
            return
        np.matmul(x, weight.T, out=out)
        if bias is not None:
            out += bias

    @staticmethod
    def _held_kernel(out, x, weight, bias):
        """A held weight's product: the pool's held GEMV (one row) or GEMM, else numpy on
        its rows widened a block at a time, in float64 (x as the kernels meet it)."""
        lib = native.lib()
        w = held.raw(weight)
        if lib is not None and native.contiguous(out, x, bias) and w.flags.c_contiguous:
            if x.shape[0] == 1:
                lib.gemv(out[0], x[0], w, bias, held.code(weight))
            else:
                lib.gemm(out, x, w, bias, held.code(weight))
            return
        xv = held.reference_x(x, weight)
        for i in range(0, weight.shape[0], REFERENCE_ROWS):
            out[:, i: i + REFERENCE_ROWS] = xv @ held.widen(weight, i, i + REFERENCE_ROWS).T
        if bias is not None:
            out += bias

    def lower(self, out, x, weight, bias=None, scratch=None):
        # As kernel: one row by the decode pool's gemv, more (a prompt chunk's, float32
        # weights) by its gemm, unless IRON_SPEC_GEMM=blas leaves them to numpy's BLAS. A
        # held weight's by the held kernels, whatever GEMM says (BLAS reads float32 alone).
        if native.LIB is None:
            return None
        if held.is_held(weight):
            w = held.raw(weight)
            if not (native.contiguous(out, x, bias) and w.flags.c_contiguous):
                return None
            if x.shape[0] == 1:
                return native.Step(native.OP_GEMV, (out, x, w, bias),
                                   (weight.shape[0], x.shape[1], held.code(weight)))
            return native.Step(native.OP_GEMM, (out, x, w, bias),
                               (weight.shape[0], x.shape[1], x.shape[0], held.code(weight)),
                               rows=2)
        if not native.contiguous(out, x, weight, bias):
            return None
        if x.shape[0] == 1:
            return native.Step(native.OP_GEMV, (out, x, weight, bias),
                               (weight.shape[0], x.shape[1]))
        if weight.ndim == 4:  # bfloat16 tiles: the tile GEMM (_cpu_tiles.h), whatever GEMM says
            return native.Step(native.OP_GEMM, (out, x, weight, bias),
                               (out.shape[1], x.shape[1], x.shape[0]), rows=2)
        if weight.dtype != np.float32 or native.GEMM != "native":
            return None
        return native.Step(native.OP_GEMM, (out, x, weight, bias),
                           (weight.shape[0], x.shape[1], x.shape[0]), rows=2)

    def tolerance(self, x, weight, bias=None):
        # A float32 dot product of K terms errs by at most ~K * eps * sum|x_k w_k| (Higham);
        # BLAS's blocked sums stay well inside it, so a fraction of K is used.
        K = x[1]
        return Tolerance(atol=1e-6, rtol=max(4.0, K / 8) * EPS32)

    def scale(self, reference, x, weight, bias=None):
        ax = np.abs(as64(x))
        mag = np.empty(ax.shape[:-1] + (weight.shape[0],), np.float64)
        for i in range(0, weight.shape[0], REFERENCE_ROWS):  # as reference: a block at a time
            mag[..., i: i + REFERENCE_ROWS] = ax @ np.abs(as64(held.widen(weight, i, i + REFERENCE_ROWS))).T
        return mag if bias is None else mag + np.abs(as64(bias))
