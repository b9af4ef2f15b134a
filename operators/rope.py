"""Rotary position embedding (RoPE), half-rotated as transformers' Llama or on interleaved
pairs as GPT-J, and its tables.

The tables follow transformers' ``modeling_rope_utils``: inverse frequencies in float32 from
``rope_theta`` and the checkpoint's ``rope_scaling`` (types ``default``, ``linear``,
``llama3``, ``yarn``, ``dynamic`` and ``longrope``), angles ``position * inv_freq`` in float32,
cos and sin of them. ``dynamic`` and ``longrope`` change with the sequence length in
transformers: a ``dynamic`` row is what transformers uses for a token decoded at that
position with a KV cache; a ``longrope`` table is the one for the whole sequence's length
(``rope_switch``), as transformers turns every position of a forward.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from . import native
from .base import EPS32, Operator, Tolerance, as64

ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope", "proportional",
              "mrope")


def rope_inv_freq(dim: int, theta: float,
                  scaling: Mapping[str, Any] | None = None) -> tuple[np.ndarray, float]:
    """Inverse frequencies ``(dim // 2,)`` float32 and the attention factor cos/sin scale by.

    As transformers' ``_compute_default_rope_parameters`` and ``_compute_*_parameters`` for
    ``rope_scaling["rope_type"]`` (or the older ``"type"``): ``linear`` divides by ``factor``;
    ``llama3`` divides long wavelengths by ``factor`` and blends the middle band
    (``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``);
    ``yarn`` ramps between interpolated and extrapolated frequencies (``beta_fast``,
    ``beta_slow``, ``truncate``) and scales cos/sin by its attention factor; ``proportional``
    turns the first ``partial_rotary_factor`` of the pairs (exponents over the whole ``dim``)
    and leaves the rest (frequency 0). ``dynamic`` and
    ``longrope`` give the default frequencies here (their rows past the original context
    are ``rope_table``'s).

    Raises:
        ValueError: an unknown rope type, or one missing a parameter it needs.
    """
    exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    inv = (np.float32(1.0) / np.power(np.float32(theta), exponents)).astype(np.float32)
    kind = "default" if not scaling else scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ValueError(f"rope_scaling type {kind!r} is not one of {', '.join(ROPE_TYPES)}")
    if kind in ("default", "dynamic", "longrope", "mrope"):
        # dynamic and longrope equal default within their original context (rope_table);
        # mrope is default's frequencies (Qwen2VLTextConfig renames it so), by sections.
        return inv, 1.0
    try:
        if kind == "yarn":
            return _yarn(dim, theta, scaling)
        if kind == "proportional":
            # transformers' _compute_proportional_rope_parameters: the first pairs turn at
            # exponents over the whole head, the rest (frequency 0) stay as they are.
            angles = int(scaling.get("partial_rotary_factor", 1.0) * dim // 2)
            inv[angles:] = 0.0
            return (inv / np.float32(scaling.get("factor", 1.0))).astype(np.float32), 1.0
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
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    if not high > low:  # an empty band (equal factors: Llama-4-Scout's): nothing smoothed
        return scaled, 1.0
    smooth = ((old / wavelen - low) / (high - low)).astype(np.float32)
    smoothed = ((1 - smooth) * scaled / factor + smooth * scaled).astype(np.float32)
    return np.where(medium, smoothed, scaled).astype(np.float32), 1.0


def _yarn(dim: int, theta: float, scaling: Mapping[str, Any]) -> tuple[np.ndarray, float]:
    """transformers' ``_compute_yarn_parameters`` (float32 as there)."""
    factor = float(scaling["factor"])
    old = scaling["original_max_position_embeddings"]
    attention = scaling.get("attention_factor")
    mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")

    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if attention is None:
        attention = (get_mscale(factor, mscale) / get_mscale(factor, mscale_all)
                     if mscale and mscale_all else get_mscale(factor))
    fast, slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction(rotations):
        return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction(fast), correction(slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    pos = np.power(np.float32(theta), np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
    extrapolation = (np.float32(1.0) / pos).astype(np.float32)
    interpolation = (np.float32(1.0) / (np.float32(factor) * pos)).astype(np.float32)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low))
                   / np.float32(high - low), 0, 1).astype(np.float32)
    keep = (np.float32(1.0) - ramp).astype(np.float32)
    inv = interpolation * (np.float32(1.0) - keep) + extrapolation * keep
    return inv.astype(np.float32), float(attention)


def ntk_alpha_theta(theta: float, alpha: float, dim: int) -> float:
    """The RoPE base NTK-aware scaling by a fixed ``alpha`` gives: ``theta * alpha ** (dim /
    (dim - 2))`` in float64, as HunYuanDenseV1RotaryEmbedding's
    ``compute_ntk_alpha_rope_parameters`` (``dim`` its ``head_dim``); its frequencies are the
    default ones over this base, whatever the sequence length.

    Raises:
        ValueError: ``dim`` 2 or less (the power divides by ``dim - 2``), or a base past
            float64.
    """
    if dim <= 2:
        raise ValueError(f"ntk_alpha scales the base by a power dim / (dim - 2): a table of "
                         f"{dim} columns has none (at least 4)")
    try:
        base = theta * alpha ** (dim / (dim - 2))
    except OverflowError:
        base = math.inf
    if not math.isfinite(base):
        raise ValueError(f"ntk_alpha {alpha:g} over theta {theta:g} gives a base past float64")
    return base


def rope_switch(scaling: Mapping[str, Any] | None, max_position_embeddings: int) -> int | None:
    """The sequence length past which a ``rope_table`` changes for every row, or None where
    it never does: ``longrope``'s ``original_max_position_embeddings`` (transformers'
    ``longrope_frequency_update`` takes the long factors for all positions of a forward
    whose last position is past it)."""
    kind = "default" if not scaling else scaling.get("rope_type", scaling.get("type", "default"))
    if kind != "longrope":
        return None
    return int(scaling.get("original_max_position_embeddings") or max_position_embeddings)


def rope_table(dim: int, theta: float, scaling: Mapping[str, Any] | None, positions: int,
               max_position_embeddings: int, length: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin ``(positions, dim // 2)`` float32 for ``rope_scaling`` ``scaling``, as
    transformers turns a sequence of ``length`` tokens.

    Static types are ``rope_tables(rope_inv_freq(...))``. ``dynamic`` (NTK): rows past
    ``max_position_embeddings`` use the base transformers computes at sequence length
    ``row + 1``. ``longrope``: every row turns by ``short_factor`` where ``length`` is within
    ``original_max_position_embeddings``, else by ``long_factor`` (``rope_switch``); every
    row scales by the attention factor (given, else from ``factor``, else
    ``max_position_embeddings / original``).

    Raises:
        ValueError: as ``rope_inv_freq``.
    """
    inv, attention = rope_inv_freq(dim, theta, scaling)
    kind = "default" if not scaling else scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ("dynamic", "longrope"):
        return rope_tables(inv, positions, attention)
    try:
        if kind == "dynamic":
            return _dynamic(dim, theta, float(scaling["factor"]), positions,
                            max_position_embeddings, inv)
        old = int(scaling.get("original_max_position_embeddings") or max_position_embeddings)
        factor = scaling.get("factor") or max_position_embeddings / old
        attention = scaling.get("attention_factor")
        if attention is None:
            attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(old))
        shape = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
        for key in ("short_factor", "long_factor"):
            ext = np.asarray(scaling[key], np.float32)
            if ext.shape != (dim // 2,):
                raise ValueError(f"rope_scaling {key} has {ext.size} values, not {dim // 2}")
        ext = np.asarray(scaling["short_factor" if length <= old else "long_factor"], np.float32)
        f = (np.float32(1.0) / (ext * np.power(np.float32(theta), shape))).astype(np.float32)
        return rope_tables(f, positions, float(attention))
    except KeyError as e:
        raise ValueError(f"rope_scaling {dict(scaling)} of type {kind!r} lacks {e.args[0]!r}") from None


def _dynamic(dim, theta, factor, positions, native, inv):
    cos, sin = rope_tables(inv, positions)
    exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    for p in range(native, positions):
        base = theta * ((factor * (p + 1) / native) - (factor - 1)) ** (dim / (dim - 2))
        f = (np.float32(1.0) / np.power(np.float32(base), exponents)).astype(np.float32)
        angle = (np.float32(p) * f).astype(np.float64)
        cos[p], sin[p] = np.cos(angle), np.sin(angle)
    return cos, sin


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

    Inputs: ``x``, ``cos`` and ``sin`` ``(positions, rotary // 2)``; the first ``rotary``
    columns of each head turn, the rest pass through (partial rotary). Pair ``i`` turns by
    row column ``i``: ``(x[i], x[i + rotary // 2])`` half against half (transformers'
    ``rotate_half`` of LlamaAttention), or with ``interleaved`` ``(x[2i], x[2i + 1])``
    (GPTJAttention's ``rotate_every_two`` with sin and cos ``repeat_interleave``d; the same
    pairing as the interleaved ``rotate_half`` of CohereAttention and of GlmAttention /
    Glm4Attention, which turn the first ``rotary_dim`` columns only). Attributes:
    ``start`` (often per call), ``interleaved``.

    Interleaved pairs are turned here rather than by permuting the q and k projection rows
    at load into half-against-half order (exact too, as attention scores only see q.k):
    the permutation would have to follow every reader of those rows (fused q/k/v layouts,
    biases, per-head q/k norm weights, the tensors ``show`` lists and a golden records),
    while the kernel costs the same one pass either way. A decode step's one row runs the
    same per-column products in a native program (``lower``), pairs taken as ``interleaved``
    says, so no path turns an interleaved table half against half.
    """

    name = "rope"

    def shape(self, x, cos, sin, start=0, interleaved=False):
        if len(x) != 3 or cos != sin or 2 * cos[1] > x[2]:
            raise ValueError(f"rope: x {x} (n, heads, head_dim) does not meet table {cos}")
        return x

    @staticmethod
    def _pairs(a, half: int, interleaved: bool):
        """The two members of every pair along the last axis (views)."""
        if interleaved:
            return a[..., 0:2 * half:2], a[..., 1:2 * half:2]
        return a[..., :half], a[..., half:2 * half]

    def reference(self, x, cos, sin, start=0, interleaved=False):
        x = as64(x)
        n, half = x.shape[0], cos.shape[1]
        c = as64(cos)[start:start + n, None, :]
        s = as64(sin)[start:start + n, None, :]
        return self.turned(x, c, s, half, interleaved)

    @classmethod
    def turned(cls, x, c, s, half, interleaved):
        """``x`` (float64) with each column pair turned by angles whose cos and sin are
        ``c``, ``s`` (broadcast over its rows and heads): the references' rotation."""
        out = x.copy()
        x1, x2 = cls._pairs(x, half, interleaved)
        o1, o2 = cls._pairs(out, half, interleaved)
        o1[...] = x1 * c - x2 * s
        o2[...] = x2 * c + x1 * s
        return out

    def kernel(self, out, x, cos, sin, scratch=None, start=0, interleaved=False):
        # cos and sin as packed (``pack``): per column, so every column turns in one pass:
        # x * cos + partner(x) * sin, the same products and sums as the reference's
        # x1 * c - x2 * s and x2 * c + x1 * s, to the bit.
        n, heads, D = x.shape
        R = cos.shape[1]
        lib = native.lib() if n > 1 else None
        if lib is not None and native.rows_apart(x) and native.contiguous(out, cos, sin):
            # A prompt chunk's rows on the pool (x may be the fused projection's column view).
            lib.rope(out, x, cos, sin, start, interleaved)
            return
        half = R // 2
        xr = x[..., :R]
        if interleaved:
            partner = scratch[: n * heads * R].reshape(n, heads, half, 2)
            np.copyto(partner, xr.reshape(n, heads, half, 2)[..., ::-1])
        else:
            partner = scratch[: n * heads * R].reshape(n, heads, 2, half)
            np.copyto(partner, xr.reshape(n, heads, 2, half)[:, :, ::-1])
        partner = partner.reshape(n, heads, R)
        partner *= sin[start:start + n, None, :]
        np.multiply(xr, cos[start:start + n, None, :], out=out[..., :R])
        out[..., :R] += partner
        if R < D:
            out[..., R:] = x[..., R:]

    def lower(self, out, x, cos, sin, scratch=None, interleaved=False):
        # x * cos + partner(x) * sin per column, as kernel's lib.rope (x may be the fused
        # projection's column view); row r at table row start + r, within the table.
        if not native.rows_apart(x) or not native.contiguous(out, cos, sin):
            return None
        n, heads, D = x.shape
        return native.Step(native.OP_ROPE, (out, x, cos, sin),
                           (heads, D, cos.shape[1], int(interleaved), cos.shape[0], n), rows=5)

    def pack(self, index, array, start=0, interleaved=False):
        # The tables (L, rotary_dim / 2) widened to one value per column: half against
        # half [cos, cos] and [-sin, sin]; interleaved each pair's (cos, cos), (-sin, sin).
        t = np.asarray(array, np.float32)
        if index in (1, 2):
            first = t if index == 1 else -t
            if interleaved:
                return np.ascontiguousarray(np.stack([first, t], axis=2).reshape(t.shape[0], -1))
            return np.ascontiguousarray(np.concatenate([first, t], axis=1))
        return super().pack(index, array)

    def scratch(self, x, cos, sin, start=0, interleaved=False):
        return x[0] * x[1] * 2 * cos[1]

    def tolerance(self, x, cos, sin, start=0, interleaved=False):
        return Tolerance(atol=1e-6, rtol=4 * EPS32)

    def scale(self, reference, x, cos, sin, start=0, interleaved=False):
        # Each output is a sum of two products, each bounded by |x|.
        half = cos.shape[1]
        x = as64(x)
        mag = np.abs(x).copy()
        a, b = self._pairs(x, half, interleaved)
        m1, m2 = self._pairs(mag, half, interleaved)
        pair = np.abs(a) + np.abs(b)
        m1[...] = pair
        m2[...] = pair
        return mag


class RopeSections(Operator):
    """``x`` ``(n, heads, head_dim)`` turned as ``rope`` turns it, each row's angles taken
    from table rows of its own by section: ``positions`` ``(n, S)`` whole numbers (bounded,
    a call's rows), and the table's ``rotary // 2`` columns cut into ``sections`` (summing
    to them) cycling through the ``S`` position columns: column ``j`` of row ``i`` turns by
    table row ``positions[i, s(j) % S]`` where section ``s(j)`` holds ``j``. Multimodal RoPE
    (M-RoPE: Qwen2-VL's ``mrope_section``, time, height and width), as
    ``Qwen2_5_VLRotaryEmbedding.recomposition_frequencies`` composes cos and sin; a text's
    rows, whose columns are equal, turn exactly as ``rope`` at those positions. Tables in
    ``rope``'s packed form (``Rope.pack``)."""

    name = "rope_sections"

    def shape(self, x, cos, sin, positions, sections=(), interleaved=False):
        if len(x) != 3 or cos != sin or 2 * cos[1] > x[2] or len(positions) != 2 \
                or positions[0] != x[0] or sum(sections) != cos[1] or min(sections, default=0) < 1:
            raise ValueError(f"rope_sections: x {x} (n, heads, head_dim), table {cos}, "
                             f"positions {positions} (n, S) and sections {sections} (summing "
                             "to the table's columns) do not meet")
        return x

    @staticmethod
    def _rows(positions, sections):
        """``(n, half)``: each column's table row for each row."""
        S = positions.shape[1]
        which = np.repeat(np.arange(len(sections)) % S, sections)
        return np.asarray(positions, np.int64)[:, which]

    def reference(self, x, cos, sin, positions, sections=(), interleaved=False):
        x = as64(x)
        half = cos.shape[1]
        rows = self._rows(positions, sections)
        cols = np.arange(half)[None, :]
        c, s = as64(cos)[rows, cols][:, None, :], as64(sin)[rows, cols][:, None, :]
        return Rope.turned(x, c, s, half, interleaved)

    def pack(self, index, array, sections=(), interleaved=False):
        if index in (1, 2):
            return Rope().pack(index, array, interleaved=interleaved)
        return super().pack(index, array)

    def kernel(self, out, x, cos, sin, positions, scratch=None, sections=(), interleaved=False):
        # The packed tables hold a value per column (Rope.pack): each column's row gathered,
        # then the products and sums rope's kernel takes, in its order.
        n, heads, D = x.shape
        R = cos.shape[1]
        rows = self._rows(positions[:n], sections)  # (n, R // 2)
        if interleaved:
            rows = np.repeat(rows, 2, axis=1)
        else:
            rows = np.concatenate([rows, rows], axis=1)
        cols = np.arange(R)[None, :]
        c, s = cos[rows, cols][:, None, :], sin[rows, cols][:, None, :]
        half = R // 2
        xr = x[..., :R]
        if interleaved:
            partner = xr.reshape(n, heads, half, 2)[..., ::-1].reshape(n, heads, R)
        else:
            partner = xr.reshape(n, heads, 2, half)[:, :, ::-1].reshape(n, heads, R)
        np.multiply(xr, c, out=out[..., :R])
        out[..., :R] += partner * s
        if R < D:
            out[..., R:] = x[..., R:]

    def tolerance(self, x, cos, sin, positions, sections=(), interleaved=False):
        return Tolerance(atol=1e-6, rtol=4 * EPS32)

    def scale(self, reference, x, cos, sin, positions, sections=(), interleaved=False):
        return Rope().scale(reference, x, cos, sin)
