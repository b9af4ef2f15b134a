"""Elementwise add and multiply (with an optional scalar), taking one row, taking a run
of columns, and joining two heads' columns."""

from __future__ import annotations

import numpy as np

from . import native
from .base import EPS32, Operator, Tolerance, as64


class Add(Operator):
    """``a + scale * b``: same shapes (a residual add; ``scale`` is Granite's
    ``residual_multiplier``, 1.0 for none), or ``b`` one row ``(hidden,)`` added to every
    row of ``a`` (a learned initial state, HrmTextModel's ``z_L_init`` broadcast)."""

    name = "add"
    rows_alone = True

    def shape(self, a, b, scale=1.0):
        if a != b and tuple(b) != tuple(a[-1:]):
            raise ValueError(f"add: shapes {a} and {b} differ (b may be one row of a's width)")
        return a

    def reference(self, a, b, scale=1.0):
        return as64(a) + scale * as64(b)

    def kernel(self, out, a, b, scratch=None, scale=1.0):
        if scale == 1.0:
            np.add(a, b, out=out)
        elif a.shape != b.shape:
            np.add(a, np.multiply(b, np.float32(scale)), out=out)
        else:
            np.multiply(b, np.float32(scale), out=out)
            out += a

    def lower(self, out, a, b, scratch=None, scale=1.0):
        if a.shape != b.shape or not native.contiguous(out, a, b):
            return None
        return native.Step(native.OP_ADD, (out, a, b), (a.size,), (scale,), rows=0)

    def tolerance(self, a, b, scale=1.0):
        return Tolerance(atol=0.0, rtol=2 * EPS32)

    def scale(self, reference, a, b, scale=1.0):
        return np.abs(as64(a)) + np.abs(scale * as64(b))


class Mul(Operator):
    """``a * b`` elementwise, or ``a * scale`` when ``b`` is absent. ``b`` may be of
    ``a``'s shape or broadcast to it from fewer, trailing axes (a ``(1,)`` gain multiplying
    a whole layer's output, transformers' Gemma4TextDecoderLayer ``layer_scalar``)."""

    name = "mul"
    rows_alone = True

    def shape(self, a, b=None, scale=1.0):
        if b is not None and (len(b) > len(a) or any(
                y not in (1, x) for x, y in zip(a[len(a) - len(b):], b))):
            raise ValueError(f"mul: shape {b} does not broadcast to {a}")
        return a

    def reference(self, a, b=None, scale=1.0):
        return as64(a) * (scale if b is None else as64(b))

    def kernel(self, out, a, b=None, scratch=None, scale=1.0):
        np.multiply(a, np.float32(scale) if b is None else b, out=out)

    def lower(self, out, a, b=None, scratch=None, scale=1.0):
        # Element i of a meets b's element i % b.size: b of a's trailing shape (leading
        # ones aside), or one value.
        if not native.contiguous(out, a, b):
            return None
        if b is not None:
            tail = b.shape
            while tail and tail[0] == 1:
                tail = tail[1:]
            if tail != a.shape[a.ndim - len(tail):]:
                return None
        return native.Step(native.OP_MUL, (out, a, b), (a.size, 1 if b is None else b.size),
                           (scale,), rows=0)

    def tolerance(self, a, b=None, scale=1.0):
        return Tolerance(atol=0.0, rtol=EPS32)


class Affine(Operator):
    """``x * weight + bias`` over the last axis: ``x`` ``(..., d)``, ``weight`` and ``bias``
    ``(d,)`` (bias None: none); a norm that normalizes nothing, transformers' MobileBERT
    ``NoNorm``. Two roundings in the kernel, the product's then the sum's, as torch's
    ``input_tensor * self.weight + self.bias``.

    Raises:
        ValueError: a weight or bias other than ``(d,)``.
    """

    name = "affine"
    rows_alone = True

    def shape(self, x, weight, bias=None):
        for name, v in (("weight", weight), ("bias", bias)):
            if v is not None and tuple(v) != (x[-1],):
                raise ValueError(f"affine: {name} {v} is not ({x[-1]},) for x {x}")
        return x

    def reference(self, x, weight, bias=None):
        y = as64(x) * as64(weight)
        return y if bias is None else y + as64(bias)

    def kernel(self, out, x, weight, bias=None, scratch=None):
        np.multiply(x, weight, out=out)
        if bias is not None:
            out += bias

    def tolerance(self, x, weight, bias=None):
        return Tolerance(atol=0.0, rtol=2 * EPS32)

    def scale(self, reference, x, weight, bias=None):
        # The sum's rounding is relative to its terms, which may cancel.
        s = np.abs(as64(x) * as64(weight))
        return s if bias is None else s + np.abs(as64(bias))


class TakeRow(Operator):
    """Row ``index`` of ``x`` ``(n, d)`` as ``(1, d)``: a prompt chunk's last row, whose
    logits alone are needed."""

    name = "take_row"
    rows_alone = True
    keeps_bound = False
    call_attr = "index"

    def shape(self, x, index=0):
        return (1, x[1])

    def reference(self, x, index=0):
        return as64(x)[index: index + 1]

    def kernel(self, out, x, scratch=None, index=0):
        out[0] = x[index]

    def lower(self, out, x, scratch=None):
        # The row the call's ``index`` names (a prompt chunk's last: rows - 1), checked
        # within the rows the call runs.
        if x.ndim != 2 or not native.contiguous(out, x):
            return None
        return native.Step(native.OP_TAKE_ROW, (out, x), (x.shape[1], x.shape[0]), rows=1)

    def tolerance(self, x, index=0):
        return Tolerance(atol=0.0, rtol=0.0)


class Columns(Operator):
    """Columns ``begin .. end`` of ``x`` ``(n, d)`` as ``(n, end - begin)``: one part of a
    fused projection's output (q, k and v of a fused ``qkv_proj``)."""

    name = "columns"
    rows_alone = True

    def shape(self, x, begin=0, end=0):
        if len(x) != 2 or not 0 <= begin < end <= x[1]:
            raise ValueError(f"columns: {begin}..{end} is not a run of the columns of {x}")
        return (x[0], end - begin)

    def reference(self, x, begin=0, end=0):
        return as64(x)[:, begin:end].copy()

    def kernel(self, out, x, scratch=None, begin=0, end=0):
        np.copyto(out, x[:, begin:end])

    def lower(self, out, x, scratch=None, begin=0, end=0):
        # x may be a fused projection's column view (rows apart): its rows' stride is read.
        if not native.contiguous(out) or not (native.contiguous(x) or native.rows_apart(x)):
            return None
        return native.Step(native.OP_COLUMNS, (out, x), (x.shape[1], begin, end, x.shape[0]),
                           rows=3)

    def tolerance(self, x, begin=0, end=0):
        return Tolerance(atol=0.0, rtol=0.0)


class Clamp(Operator):
    """``x`` clamped to ``[-limit, limit]``, of ``x``'s shape: transformers' OlmoAttention
    ``clip_qkv`` (``clamp_(min=-clip_qkv, max=clip_qkv)`` on each projection). Attribute:
    ``limit``, above 0 (the kernel clamps to it rounded to float32, as torch does)."""

    name = "clamp"
    rows_alone = True

    def shape(self, x, limit=1.0):
        if not limit > 0:
            raise ValueError(f"clamp: limit {limit} is not above 0")
        return x

    def reference(self, x, limit=1.0):
        return np.clip(as64(x), -limit, limit)

    def kernel(self, out, x, scratch=None, limit=1.0):
        c = np.float32(limit)
        np.clip(x, -c, c, out=out)

    def lower(self, out, x, scratch=None, limit=1.0):
        # Rows apart: a fused projection's column views, read in place.
        if x.ndim != 2 or not native.rows_apart(out, x):
            return None
        return native.Step(native.OP_CLAMP, (out, x), x.shape, (float(np.float32(limit)),),
                           rows=0)

    def tolerance(self, x, limit=1.0):
        return Tolerance(atol=0.0, rtol=EPS32)


class Clip(Operator):
    """``x`` clipped to ``[low, high]``, of ``x``'s shape: transformers'
    Gemma4ClippableLinear (``torch.clamp`` of a projection's input and output between bounds
    the checkpoint holds, ``input_min`` .. ``output_max``). Attributes ``low`` and ``high``
    (either may be infinite; the kernel clips to them rounded to float32, as the float32
    bounds torch reads)."""

    name = "clip"
    rows_alone = True

    def shape(self, x, low=-np.inf, high=np.inf):
        if not low <= high:
            raise ValueError(f"clip: low {low} is above high {high}")
        return x

    def reference(self, x, low=-np.inf, high=np.inf):
        return np.clip(as64(x), low, high)

    def kernel(self, out, x, scratch=None, low=-np.inf, high=np.inf):
        np.clip(x, np.float32(low), np.float32(high), out=out)

    def tolerance(self, x, low=-np.inf, high=np.inf):
        return Tolerance(atol=0.0, rtol=EPS32)


class JoinHeads(Operator):
    """Each head's columns of ``a`` ``(n, ha, da)`` then of ``b`` ``(n, hb, db)``, as ``(n,
    heads, da + db)``: a head axis of 1 serves every head (``heads`` the other's, or 1). The
    keys of multi-head latent attention: the RoPE part shared by every head beside each
    head's own (DeepseekV2Attention's ``expand_kv``, ``k_rot.expand`` then the copy into
    ``key_states``). Exact: a copy. Runs on numpy (no native step)."""

    name = "join_heads"
    rows_alone = True

    def shape(self, a, b):
        heads = max(a[1], b[1]) if len(a) == 3 and len(b) == 3 else 0
        if not heads or a[0] != b[0] or {a[1], b[1]} - {1, heads}:
            raise ValueError(f"join_heads: {a} and {b} are not (n, heads or 1, d) of one n "
                             "and one head count")
        return (a[0], heads, a[2] + b[2])

    def reference(self, a, b):
        a, b = as64(a), as64(b)
        heads = max(a.shape[1], b.shape[1])
        return np.concatenate([np.broadcast_to(a, (a.shape[0], heads, a.shape[2])),
                               np.broadcast_to(b, (b.shape[0], heads, b.shape[2]))], axis=2)

    def kernel(self, out, a, b, scratch=None):
        da = a.shape[2]
        np.copyto(out[..., :da], a)
        np.copyto(out[..., da:], b)

    def tolerance(self, a, b):
        return Tolerance(atol=0.0, rtol=0.0)
