"""Rotary position embedding (RoPE), half-rotated as transformers' Llama, and its tables.

The tables follow transformers' ``modeling_rope_utils``: inverse frequencies in float32 from
``rope_theta`` and the checkpoint's ``rope_scaling`` (types ``default``, ``linear`` and
``llama3``), angles ``position * inv_freq`` in float32, cos and sin of them.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from .base import EPS32, Operator, Tolerance, as64

ROPE_TYPES = ("default", "linear", "llama3")


def rope_inv_freq(dim: int, theta: float,
                  scaling: Mapping[str, Any] | None = None) -> tuple[np.ndarray, float]:
    """Inverse frequencies ``(dim // 2,)`` float32 and the attention factor cos/sin scale by.

    As transformers' ``_compute_default_rope_parameters`` and ``_compute_*_parameters`` for
    ``rope_scaling["rope_type"]`` (or the older ``"type"``): ``linear`` divides by ``factor``;
    ``llama3`` divides long wavelengths by ``factor`` and blends the middle band
    (``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``).

    Raises:
        ValueError: an unknown rope type, or one missing a parameter it needs.
    """
    exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    inv = (np.float32(1.0) / np.power(np.float32(theta), exponents)).astype(np.float32)
    kind = "default" if not scaling else scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ValueError(f"rope_scaling type {kind!r} is not one of {', '.join(ROPE_TYPES)}")
    if kind == "default":
        return inv, 1.0
    try:
        factor = np.float32(scaling["factor"])
        if kind == "linear":
            return (inv / factor).astype(np.float32), 1.0
        low = np.float32(scaling["low_freq_factor"])
        high = np.float32(scaling["high_freq_factor"])
        old = np.float32(scaling["original_max_position_embeddings"])
    except KeyError as e:
        raise ValueError(f"rope_scaling {dict(scaling)} of type {kind!r} lacks {e.args[0]!r}") from None
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = (np.float32(2 * math.pi) / inv).astype(np.float32)
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv).astype(np.float32)
    smooth = ((old / wavelen - low) / (high - low)).astype(np.float32)
    smoothed = ((1 - smooth) * scaled / factor + smooth * scaled).astype(np.float32)
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32), 1.0


def rope_tables(inv_freq: np.ndarray, positions: int,
                attention_factor: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables, each ``(positions, len(inv_freq))`` float32.

    Angles are ``float32(position) * inv_freq`` rounded to float32, as transformers forms
    them; cos and sin are evaluated in float64 and rounded once.
    """
    angles = np.arange(positions, dtype=np.float32)[:, None] * inv_freq[None, :]
    cos = (np.cos(angles.astype(np.float64)) * attention_factor).astype(np.float32)
    sin = (np.sin(angles.astype(np.float64)) * attention_factor).astype(np.float32)
    return cos, sin


class Rope(Operator):
    """``x`` ``(n, heads, head_dim)`` turned by the table rows ``start .. start + n``.

    Inputs: ``x``, ``cos`` and ``sin`` ``(positions, rotary // 2)``. The first ``rotary``
    columns of each head are rotated half against half (transformers' ``rotate_half``), the
    rest pass through (partial rotary). Attributes: ``start`` (often per call).
    """

    name = "rope"

    def shape(self, x, cos, sin, start=0):
        if len(x) != 3 or cos != sin or 2 * cos[1] > x[2]:
            raise ValueError(f"rope: x {x} (n, heads, head_dim) does not meet table {cos}")
        return x

    def reference(self, x, cos, sin, start=0):
        x = as64(x)
        n, half = x.shape[0], cos.shape[1]
        c = as64(cos)[start:start + n, None, :]
        s = as64(sin)[start:start + n, None, :]
        out = x.copy()
        x1, x2 = x[..., :half], x[..., half:2 * half]
        out[..., :half] = x1 * c - x2 * s
        out[..., half:2 * half] = x2 * c + x1 * s
        return out

    def kernel(self, out, x, cos, sin, scratch=None, start=0):
        n, heads, D = x.shape
        half = cos.shape[1]
        c = cos[start:start + n, None, :]
        s = sin[start:start + n, None, :]
        x1, x2 = x[..., :half], x[..., half:2 * half]
        tmp = scratch[: n * heads * half].reshape(n, heads, half)
        np.multiply(x1, c, out=out[..., :half])
        np.multiply(x2, s, out=tmp)
        out[..., :half] -= tmp
        np.multiply(x2, c, out=out[..., half:2 * half])
        np.multiply(x1, s, out=tmp)
        out[..., half:2 * half] += tmp
        if 2 * half < D:
            out[..., 2 * half:] = x[..., 2 * half:]

    def scratch(self, x, cos, sin, start=0):
        return x[0] * x[1] * cos[1]

    def tolerance(self, x, cos, sin, start=0):
        return Tolerance(atol=1e-6, rtol=4 * EPS32)

    def scale(self, reference, x, cos, sin, start=0):
        # Each output is a sum of two products, each bounded by |x|.
        n, half = x.shape[0], cos.shape[1]
        mag = np.abs(as64(x)).copy()
        pair = np.abs(as64(x[..., :half])) + np.abs(as64(x[..., half:2 * half]))
        mag[..., :half] = pair
        mag[..., half:2 * half] = pair
        return mag
