"""Scaled dot-product attention over a KV cache, with grouped-query heads (GQA).

A cache holds ``(kv_heads, capacity, head_dim)`` per layer, head-major so each kv head's
keys are one contiguous block; a call reads it only up to its last position. Position ``p``
is row ``p``, or with ``ring`` (a sliding window's cache of ``ring`` rows) row ``p % ring``:
a ring holds the last ``ring`` positions written, so ``ring >= window + rows - 1`` keeps
every position a call's queries see (the window before its first row, and its own rows).
The capacity may be less than the most a cache holds (it grows with the sequence,
``runtime.module.State``); a call needs its positions (or the ring's rows) within it.
"""

from __future__ import annotations

import functools

import numpy as np

from . import native
from .base import EPS32, Operator, Tolerance, as64
from .formats import to_bfloat16, widen_bfloat16
from .relative import position_bias


def rows_of(start: int, n: int, ring: int | None) -> np.ndarray:
    """The cache rows of positions ``start .. start + n``: themselves, or their slots in a
    ring of ``ring`` rows."""
    p = np.arange(start, start + n)
    return p if ring is None else p % ring


def _runs(start: int, n: int, ring: int | None) -> list[tuple[int, int, int]]:
    """Positions ``start .. start + n`` as runs of consecutive rows: ``(first position's
    offset, row, length)``; one run, or two where a ring's rows wrap past its end."""
    if ring is None or start % ring + n <= ring:
        return [(0, start if ring is None else start % ring, n)]
    first = ring - start % ring
    return [(0, start % ring, first), (first, 0, n - first)]


class KVWrite(Operator):
    """Write ``x`` ``(n, kv_heads, head_dim)`` into ``cache`` ``(kv_heads, capacity,
    head_dim)`` at positions ``start .. start + n`` (rows ``p % ring`` with ``ring``); the
    cache, written in place, is the output. A bfloat16 cache (uint16 bits,
    ``runtime.module.State``) holds each value rounded as ``formats.to_bfloat16``; the
    reference writes it exactly (the plan's check rounds what it expects, as the cache
    holds it).
    """

    name = "kv_write"
    writes = 1

    def shape(self, x, cache, start=0, ring=None):
        if len(x) != 3 or len(cache) != 3 or (x[1], x[2]) != (cache[0], cache[2]):
            raise ValueError(f"kv_write: x {x} does not fit cache {cache}")
        if ring is not None and not x[0] <= ring == cache[1]:
            raise ValueError(f"kv_write: a ring of {ring} rows does not hold {x[0]} rows in "
                             f"cache {cache}")
        return cache

    def reference(self, x, cache, start=0, ring=None):
        # A float64 cache is written where it is (the reference's own, no copy per step).
        out = np.asarray(cache, np.float64)
        out[:, rows_of(start, x.shape[0], ring)] = as64(x).transpose(1, 0, 2)
        return out

    def kernel(self, out, x, cache, scratch=None, start=0, ring=None):
        for at, row, n in _runs(start, x.shape[0], ring):
            rows = x[at:at + n].transpose(1, 0, 2)
            cache[:, row:row + n] = to_bfloat16(rows) if cache.dtype == np.uint16 else rows

    def lower(self, out, x, cache, scratch=None, ring=None):
        # Each position's kv heads' rows copied into their places, as kernel (x may be the
        # fused projection's column view); every row within the cache (checked first).
        if not native.rows_apart(x) or not native.contiguous(cache):
            return None
        G, L, D = cache.shape
        return native.Step(native.OP_KV_WRITE, (cache, x), (G, L, D, ring or 0, x.shape[0]),
                           rows=4)

    def tolerance(self, x, cache, start=0, ring=None):
        return Tolerance(atol=0.0, rtol=0.0)


LONG = 512  # positions from which one query's attention runs a GEMV per head
BLOCK = 64  # rows of a prompt chunk whose scores are taken at once


def _softcap(s: np.ndarray, cap: float) -> None:
    """``tanh(s / cap) * cap`` in place (Gemma 2's attention logit softcapping)."""
    s /= np.float32(cap)
    np.tanh(s, out=s)
    s *= np.float32(cap)


def _softmax_numerators(s: np.ndarray, total: np.ndarray, sink: np.ndarray | None = None
                        ) -> None:
    """``exp(s - max)`` in place over the last axis, its sum into ``total``. The softmax's
    division is left to the caller, taken after the values' sum: over (rows, head_dim)
    rather than (rows, positions), the same quotient to a rounding. ``sink`` (shaped as
    ``total``, overwritten): each row's sink logit, one more term of the sum and of the max
    (``Attention``'s ``sinks``)."""
    np.maximum.reduce(s, axis=-1, keepdims=True, out=total)
    if sink is not None:
        np.maximum(total, sink, out=total)
        sink -= total
        np.exp(sink, out=sink)
    s -= total
    np.exp(s, out=s)
    np.add.reduce(s, axis=-1, keepdims=True, out=total)
    if sink is not None:
        total += sink


def _span(cache: np.ndarray, lo: int, hi: int, ring: int | None, buf: np.ndarray) -> np.ndarray:
    """Positions ``lo .. hi`` of ``cache`` ``(G, capacity, D)`` as ``(G, hi - lo, D)``, in
    order: a view, or where a ring's rows wrap past its end, its two runs copied into
    ``buf``, so every kernel reads the positions as a cache without a ring holds them."""
    runs = _runs(lo, hi - lo, ring)
    if len(runs) == 1:
        return cache[:, runs[0][1]: runs[0][1] + hi - lo]
    G, _, D = cache.shape
    out = buf[: G * (hi - lo) * D].reshape(G, hi - lo, D)
    for at, row, n in runs:
        out[:, at:at + n] = cache[:, row:row + n]
    return out


def widened(cache: np.ndarray, t: int, ring: int | None) -> np.ndarray:
    """A bfloat16 cache's (uint16 bits ``(G, capacity, D)``) rows a call ending at position
    ``t`` may read, as float32 of the same shape (rows past them zeros): every row of a
    ring, else the first ``t``."""
    out = np.zeros(cache.shape, np.float32)
    held = cache.shape[1] if ring is not None else min(t, cache.shape[1])
    out[:, :held] = widen_bfloat16(cache[:, :held])
    return out


def alibi_slopes(heads: int, max_bias: float = 8.0) -> tuple[float, ...]:
    """ALiBi's per-head slopes (Press et al. 2021), float32-rounded: with ``P`` the power of
    two at or above ``heads``, slopes ``2 ** (-max_bias * i / P)`` for ``i = 1 .. P``, and
    where ``heads`` is no power of two, those of even ``i`` then those of odd ``i``, the
    first ``heads`` of them. With ``max_bias`` 8 these are transformers' BloomModel
    ``build_alibi_tensor`` slopes (its closest power of two, then the odd powers of the
    next); for any ``max_bias``, MptModel's ``build_mpt_alibi_tensor`` (``alibi_bias_max``).

    Raises:
        ValueError: fewer than one head, or a ``max_bias`` not above 0.
    """
    if heads < 1 or not max_bias > 0:
        raise ValueError(f"alibi slopes of {heads} heads with max_bias {max_bias}: at least "
                         "one head and a max_bias above 0")
    P = 1 << (heads - 1).bit_length()
    slopes = 2.0 ** (-max_bias * np.arange(1, P + 1) / P)
    if P != heads:
        slopes = np.concatenate([slopes[1::2], slopes[::2]])[:heads]
    return tuple(float(np.float32(x)) for x in slopes)


@functools.lru_cache(maxsize=64)
def _slopes32(alibi: tuple) -> np.ndarray:
    """``alibi``'s slopes as the C kernels read them: float32 ``(heads,)``, read-only, one
    array per tuple (a step's array must outlive its program)."""
    a = np.asarray(alibi, np.float32)
    a.setflags(write=False)
    return a


def bfloat16(x: np.ndarray) -> np.ndarray:
    """``x`` float32 rounded to bfloat16 (to nearest, ties to even, as torch's
    ``.bfloat16()``), held in float32."""
    b = np.ascontiguousarray(x, np.float32).view(np.uint32)
    b = (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return b.view(np.float32)


def alibi_bias(alibi: tuple, qpos: np.ndarray, kpos: np.ndarray, bf16: float | None = None
               ) -> np.ndarray:
    """Each head's ALiBi bias ``(heads, n, w)`` float32 of queries at ``qpos`` over keys at
    ``kpos``: ``slope * (key - query)``; with ``bf16`` (a scale) FalconModel's form,
    ``bfloat16(bfloat16(slope) * key) * bf16`` (its ``build_alibi_tensor`` in bfloat16 over
    absolute key positions, divided by sqrt(head_dim) in its sdpa mask): the same under the
    softmax but for bfloat16's rounding, which depends on the key's absolute position."""
    if bf16 is None:
        d = (kpos[None, :] - qpos[:, None]).astype(np.float32)
        return np.asarray(alibi, np.float32)[:, None, None] * d[None]
    slopes = bfloat16(np.asarray(alibi, np.float32))
    keys = bfloat16(slopes[:, None] * kpos.astype(np.float32)[None, :]) * np.float32(bf16)
    return np.broadcast_to(keys[:, None, :], (len(alibi), len(qpos), len(kpos)))


def _add_relative(rows: np.ndarray, relative: tuple, qpos: np.ndarray, kpos: np.ndarray
                  ) -> None:
    """Each head's relative position bias (``relative``: the table ``(rows, heads)`` and its
    options, ``relative.position_bias``) added to its scores ``rows`` ``(G, n, R, w)`` (head
    ``g * R + r``), in place."""
    G, _, R, _ = rows.shape
    table, options = relative
    bias = position_bias(table, qpos, kpos, *options)
    rows += bias.reshape(G, R, len(qpos), len(kpos)).transpose(0, 2, 1, 3)


def _add_alibi(rows: np.ndarray, alibi: tuple, qpos: np.ndarray, kpos: np.ndarray) -> None:
    """Each head's ALiBi bias (``alibi``: the slopes and the bfloat16 form's scale or None,
    ``alibi_bias``) added to its scores ``rows`` ``(G, n, R, w)`` (head ``g * R + r``), in
    place."""
    G, _, R, _ = rows.shape
    bias = alibi_bias(alibi[0], qpos, kpos, alibi[1])
    for h in range(len(alibi[0])):
        rows[h // R, :, h % R] += bias[h]


def temperatures(temperature: tuple, qpos: np.ndarray, dtype=np.float32) -> np.ndarray:
    """Each query's factor ``1 + attn_scale * log1p(floor((p + 1) / floor_scale))`` at its
    position ``p`` (``temperature``: ``(attn_scale, floor_scale)``), ``(len(qpos),)`` in
    ``dtype``: Llama4TextAttention's ``attn_temperature_tuning``, in float32 as it computes
    it (``positions.float()``, then ``torch.log1p(torch.floor(...)) * attn_scale + 1.0``)."""
    a, f = temperature
    p = qpos.astype(dtype) + dtype(1.0)
    return np.log1p(np.floor(p / dtype(f))) * dtype(a) + dtype(1.0)


class Attention(Operator):
    """Causal GQA attention of queries at positions ``start .. start + n`` over a cache.

    Inputs: ``q`` ``(n, heads, head_dim)``, ``keys`` and ``values`` ``(kv_heads, capacity,
    head_dim)``, of which positions ``0 .. start + n - 1`` are read (rows ``p % ring`` with
    ``ring``, of which those in the window). Query head ``h`` reads kv head ``h // (heads //
    kv_heads)``, as transformers' ``repeat_kv``. Output ``(n, heads * value_dim)``: the
    values ``(kv_heads, capacity, value_dim)`` may be narrower or wider than the keys
    (multi-head latent attention's ``v_head_dim`` beside ``qk_head_dim``, DeepseekV2Attention),
    run by the numpy kernels (the C pool's take values as wide as the keys).
    Attributes: ``start``; ``scale`` (default ``head_dim ** -0.5``); ``window`` (a query
    sees the ``window`` positions ending at its own, transformers' ``sliding_window``; None:
    all); ``softcap`` (``tanh(s / c) * c`` on the scores; None: none); ``ring`` (the cache
    is a ring of that many rows, at least ``window + n - 1``; None: row ``p`` is position
    ``p``); ``alibi`` (per-head slopes, ``alibi_slopes``: head ``h``'s score of key ``j``
    from query ``i`` gains ``alibi[h] * (j - i)`` after the scale and softcap, as
    BloomAttention's ``baddbmm`` of the alibi tensor, whose ``slope * j`` differs by a
    constant per query, nothing under the softmax; None: none). Softmax in float32
    (float64 in the reference). ``alibi_bf16``: a scale (None: none) for FalconModel's
    bfloat16 form of that bias (``alibi_bias``), run by the numpy kernels (the C pool's take
    plain slopes: ``lower`` gives no native step, the plan calls ``kernel``).

    ``sinks``: an optional fourth input ``(heads,)``, each head's learned sink logit, one more
    term ``exp(sink)`` in its softmax's denominator and no value: the output is the softmax's
    times ``sigmoid(logsumexp(scores) - sink)``, as transformers' GraniteSWAAttention
    (``eager_attention_forward``'s ``sink_scale``) and GptOssAttention's ``sinks`` (an extra
    column dropped after the softmax). Run by the numpy kernels only: the C pool's softmax has
    no sink term, so ``kernel`` does not call it and ``lower`` gives no native step for a
    step with sinks (the plan calls ``kernel``).

    ``bias``: an optional fifth input ``(kv_heads, capacity, 1)``, a value per key position
    (held as the keys are: rows ``p % ring`` with ``ring``) added to the scaled scores of
    every query head reading that kv head, after any softcap and ALiBi: a mask computed
    from the keys' own values, as DogeAttention's dynamic mask (``attn_weights +
    attn_mask``, its ``dt_states`` per kv head and key). Run by the numpy kernels only, as
    ``sinks``.

    ``table``: an optional sixth input ``(rows, heads)``, a learned relative position bias
    read as ``relative`` says (``(buckets, max_distance, bidirectional, segments)``): head
    ``h``'s score of the key at position ``j`` from the query at ``i`` gains
    ``table[bucket(j - i), h]`` after the scale (``operators.relative.position_bias``: T5's
    bucketed distance; with ``segments``, a pair of different segments reads its own row,
    CpmAntSegmentPositionEmbedding's), over every position the cache holds, as
    T5Attention's ``compute_bias`` over the past keys. Run by the numpy kernels only, as
    ``sinks``.

    ``sees``: which keys a query sees: ``own``, those up to its own position (causal);
    ``call``, those up to the call's last position, its own call's later rows too, as
    CpmAntModel's mask (``context`` all ones: every row of a call sees the whole call and
    the cache). One query (a decode step) sees the same either way; a prompt chunk's rows
    with ``call`` run on the numpy kernels, and never with a window.

    ``chunk``: chunked attention, a query at position ``p`` sees the keys of its own chunk
    of ``chunk`` positions alone, from ``p - p % chunk`` to ``p`` (transformers'
    ``create_chunked_causal_mask``, ``kv_idx // chunk == q_idx // chunk``: Llama 4's
    ``attention_chunk_size`` layers); None: none. ``temperature``: ``(attn_scale,
    floor_scale)``, each query times ``temperatures`` of its position before its scores
    (Llama4TextAttention's ``attn_temperature_tuning`` on its NoPE layers); None: none.
    Both run on the numpy kernels (``lower`` gives no native step), over a cache without a
    ring. ``kv_tiled``: query head ``h`` reads kv head ``h % kv_heads``, the kv heads tiled
    rather than repeated (JetMoeAttention's ``key_states.repeat(1, top_k, 1, 1)``: its
    queries are ``top_k`` slots of ``kv_heads`` heads each, slot-major), on the numpy
    kernels; false: ``repeat_kv``'s ``h // (heads // kv_heads)``.
    """

    name = "attention"

    def shape(self, q, keys, values, sinks=None, bias=None, table=None, start=0, scale=None,
              window=None, softcap=None, ring=None, alibi=None, alibi_bf16=None, relative=None,
              sees="own", chunk=None, temperature=None, kv_tiled=False):
        if sinks is not None and tuple(sinks) != (q[1],):
            raise ValueError(f"attention: sinks {sinks} are not one per head ({q[1]},)")
        if bias is not None and tuple(bias) != (keys[0], keys[1], 1):
            raise ValueError(f"attention: bias {bias} is not one value per key of cache {keys} "
                             f"({keys[0]}, {keys[1]}, 1)")
        if alibi is not None and len(alibi) != q[1]:
            raise ValueError(f"attention: {len(alibi)} alibi slopes for {q[1]} heads")
        if (table is None) != (relative is None) or (
                table is not None and (len(table) != 2 or table[1] != q[1])):
            raise ValueError(f"attention: a relative bias table {table} (rows, {q[1]} heads) "
                             f"and its options {relative} go together")
        if sees not in ("own", "call") or (sees == "call" and window is not None):
            raise ValueError(f"attention: sees {sees!r} is own or call (call: not with a "
                             f"window, here {window})")
        if chunk is not None and (not isinstance(chunk, int) or chunk < 1 or sees != "own"
                                  or ring is not None):
            raise ValueError(f"attention: chunk {chunk!r} is a whole number >= 1, causal "
                             "(sees own) over a cache without a ring")
        if kv_tiled and (sinks is not None or alibi is not None or table is not None):
            raise ValueError("attention: kv_tiled heads take no per-head sinks, ALiBi or "
                             "relative bias")
        if temperature is not None and (len(temperature) != 2 or not temperature[1] > 0):
            raise ValueError(f"attention: temperature {temperature!r} is (attn_scale, "
                             "floor_scale), floor_scale above 0")
        if len(q) != 3 or len(keys) != 3 or len(values) != 3 or keys[:2] != values[:2] or \
                q[1] % keys[0] or q[2] != keys[2]:
            raise ValueError(f"attention: q {q} (n, heads, head_dim) does not meet cache "
                             f"{keys} (values {values})")
        if ring is not None and (window is None or ring < window + q[0] - 1 or ring != keys[1]):
            raise ValueError(f"attention: a ring of {ring} rows (cache {keys}) does not hold a "
                             f"window of {window} before {q[0]} rows")
        return (q[0], q[1] * values[2])

    def _mask(self, n, start, window, lo=0, chunk=None):
        """Which keys from ``lo`` to the last query's position each of ``n`` queries at
        ``start ..`` sees: ``(n, start + n - lo)`` bool."""
        qpos = np.arange(start, start + n)[:, None]
        kpos = np.arange(lo, start + n)[None, :]
        allowed = kpos <= qpos
        if window is not None:
            allowed &= kpos > qpos - window
        if chunk is not None:
            allowed &= kpos >= qpos - qpos % chunk
        return allowed

    def reference(self, q, keys, values, sinks=None, bias=None, table=None, start=0, scale=None,
                  window=None, softcap=None, ring=None, alibi=None, alibi_bf16=None,
                  relative=None, sees="own", chunk=None, temperature=None, kv_tiled=False):
        n, H, D = q.shape
        G = keys.shape[0]
        t = start + n
        scale = D ** -0.5 if scale is None else scale
        # A ring holds the last ``ring`` positions: those before are out of every window.
        lo = 0 if ring is None else max(0, t - ring)
        held = rows_of(lo, t - lo, ring)
        # Query head h reads kv head h // (H // G) (repeat_kv), or h % G where kv_tiled.
        spread = (lambda a: np.tile(a, (H // G, 1, 1))) if kv_tiled else \
            (lambda a: np.repeat(a, H // G, axis=0))
        k = spread(as64(keys)[:, held])  # (H, t - lo, D)
        v = spread(as64(values)[:, held])
        q = as64(q)
        if temperature is not None:
            q = q * temperatures(temperature, np.arange(start, t), np.float64)[:, None, None]
        s = np.einsum("nhd,htd->hnt", q, k) * scale
        if softcap is not None:
            s = np.tanh(s / softcap) * softcap
        if alibi is not None and alibi_bf16 is None:
            d = np.arange(lo, t)[None, :] - np.arange(start, t)[:, None]
            s = s + np.asarray(alibi, np.float64)[:, None, None] * d[None]
        elif alibi is not None:  # bfloat16's values, as they are: float32 holds them exactly
            s = s + as64(alibi_bias(alibi, np.arange(start, t), np.arange(lo, t), alibi_bf16))
        if bias is not None:
            s = s + np.repeat(as64(bias)[:, held, 0], H // G, axis=0)[:, None, :]
        if table is not None:
            s = s + position_bias(as64(table), np.arange(start, t), np.arange(lo, t), *relative)
        if sees == "own":
            s = np.where(self._mask(n, start, window, lo, chunk)[None], s, -np.inf)
        m = s.max(-1, keepdims=True)
        if sinks is not None:  # the sink's logit is one more column of the softmax
            m = np.maximum(m, as64(sinks)[:, None, None])
        p = np.exp(s - m)
        total = p.sum(-1, keepdims=True)
        if sinks is not None:
            total = total + np.exp(as64(sinks)[:, None, None] - m)
        p /= total
        return np.einsum("hnt,htd->nhd", p, v).reshape(n, -1)

    def kernel(self, out, q, keys, values, sinks=None, bias=None, table=None, scratch=None, start=0,
               scale=None, window=None, softcap=None, ring=None, alibi=None, alibi_bf16=None,
               relative=None, sees="own", chunk=None, temperature=None, kv_tiled=False):
        n, H, D = q.shape
        G = keys.shape[0]
        R = H // G
        scale = np.float32(D ** -0.5 if scale is None else scale)
        Dv = values.shape[2]
        # The pool's: plain slopes, no sink term, values as wide as the keys.
        lib = native.lib() if alibi_bf16 is None and sinks is None and bias is None \
            and table is None and Dv == D and (sees == "own" or n == 1) \
            and chunk is None and temperature is None and not kv_tiled else None
        slopes = None if alibi is None else _slopes32(alibi)
        if lib is not None and n == 1 and all(
                a.flags.c_contiguous for a in (out, q, keys, values)):
            # One query (a decode step): the decode pool's threads share its positions.
            lib.attend(out, q, keys, values, scratch, G, start, window or 0, float(scale),
                       float(softcap or 0.0), ring or 0, slopes)
            return
        if lib is not None and n > 1 and q.strides[1:] == (4 * D, 4) and all(
                a.flags.c_contiguous for a in (out, keys, values)):
            # A prompt chunk: the pool's threads share its heads' blocks of rows (q may be
            # a column view of the fused projection: its rows stand apart).
            lib.attend_chunk(out, q, keys, values, scratch, G, start, window or 0,
                             float(scale), float(softcap or 0.0), ring or 0, slopes)
            return
        if keys.dtype == np.uint16:
            # A bfloat16 cache, widened exactly (the C kernels read its bits as they are):
            # the rows this call may read, a copy.
            keys, values = widened(keys, start + n, ring), widened(values, start + n, ring)
        # The queries times the scale, not the scores: n * H * D products, not n * H * w
        # (exact where the scale is a power of two, head_dim ** -0.5 for head_dim 64).
        # Queries are grouped by kv head, then row, (G, n, R, D): a block of rows is one
        # GEMM per kv head, and its output is written over its queries.
        qg = scratch[: H * n * D].reshape(G, n, R, D)
        # (kv_tiled: head r * G + g reads kv head g, so the heads are (R, G), not (G, R).)
        qh = q.reshape(n, R, G, D).transpose(2, 0, 1, 3) if kv_tiled else \
            q.reshape(n, G, R, D).transpose(1, 0, 2, 3)
        np.multiply(qh, scale, out=qg)
        if temperature is not None:
            qg *= temperatures(temperature, np.arange(start, start + n))[None, :, None, None]
        at = H * n * D
        # Values narrower or wider than the keys: their sums have a buffer of their own.
        og = qg if Dv == D else scratch[at: at + H * n * Dv].reshape(G, n, R, Dv)
        at += 0 if Dv == D else H * n * Dv
        # Room for a ring's wrapped keys and values, copied in order (_span).
        kspan, vspan = (0, 0) if ring is None else (G * ring * D, G * ring * Dv)
        kbuf, vbuf = scratch[at: at + kspan], scratch[at + kspan: at + kspan + vspan]
        rest = scratch[at + kspan + vspan:]
        cache = (keys, values, kbuf, vbuf, ring, bias,
                 None if table is None else (table, relative), sees == "call" and start + n,
                 chunk)
        if alibi is not None:
            alibi = (alibi, alibi_bf16)  # the slopes and the bfloat16 form's scale (_add_alibi)
        sg = None if sinks is None else sinks.reshape(G, 1, R)  # head g * R + r
        if n == 1:
            self._one(qg.reshape(G, R, D), og.reshape(G, R, Dv), cache, rest, start, window,
                      softcap, alibi, sg)
        else:
            for i in range(0, n, BLOCK):
                self._block(qg, og, i, min(n, i + BLOCK), cache, rest, start, window, softcap,
                            alibi, sg)
        if kv_tiled:
            np.copyto(out.reshape(n, R, G, Dv), og.transpose(1, 2, 0, 3))
        else:
            np.copyto(out.reshape(n, G, R, Dv), og.transpose(1, 0, 2, 3))

    def _block(self, qg, og, i0, i1, cache, scratch, start, window, softcap, alibi=None,
               sinks=None):
        """Rows ``i0 .. i1`` of a prompt chunk, into ``og`` (over their queries where the
        values are as wide as the keys: ``og`` is ``qg``). A block reads the
        keys up to its last row's position (no further: causal), from its first row's window
        on, and its scores, at most (heads, BLOCK, positions), stay in a core's L2."""
        G, _, R, D = qg.shape
        keys, values, kbuf, vbuf, ring, bias, relative, end, chunk = cache
        # Seeing the call: every row reads the keys up to the call's last row, unmasked.
        nb, hi = i1 - i0, end or start + i1
        lo = 0 if window is None else max(0, start + i0 - window + 1)
        if chunk is not None:  # from the first row's chunk on
            lo = max(lo, start + i0 - (start + i0) % chunk)
        w = hi - lo
        qb = qg[:, i0:i1].reshape(G, nb * R, D)
        s = scratch[: G * nb * R * w].reshape(G, nb * R, w)
        np.matmul(qb, _span(keys, lo, hi, ring, kbuf).transpose(0, 2, 1), out=s)
        if softcap is not None:
            _softcap(s, softcap)
        rows = s.reshape(G, nb, R, w)
        if alibi is not None:
            _add_alibi(rows, alibi, np.arange(start + i0, start + i1), np.arange(lo, hi))
        if bias is not None:
            rows += bias[:, rows_of(lo, w, ring), 0][:, None, None, :]
        if relative is not None:
            _add_relative(rows, relative, np.arange(start + i0, start + i1), np.arange(lo, hi))
        # Only the columns some row of the block may not see: its own (causal) and, under a
        # window, those before its last row's window.
        allowed = self._mask(nb, start + i0, window, lo, chunk)
        causal = w if end else start + i0 - lo + 1
        if causal < w:
            np.copyto(rows[..., causal:], np.float32(-np.inf),
                      where=~allowed[:, None, causal:])
        early = 0 if window is None else max(0, hi - window - lo)
        if chunk is not None:  # the keys before the last row's chunk
            early = max(early, hi - 1 - (hi - 1) % chunk - lo)
        if early > 0:
            np.copyto(rows[..., :early], np.float32(-np.inf), where=~allowed[:, None, :early])
        m = scratch[G * nb * R * w: G * nb * R * (w + 1)].reshape(G, nb * R, 1)
        if sinks is None:
            _softmax_numerators(s, m)
        else:
            sink = scratch[G * nb * R * (w + 1): G * nb * R * (w + 2)].reshape(G, nb, R)
            np.copyto(sink, sinks)
            _softmax_numerators(s, m, sink.reshape(G, nb * R, 1))
        ob = og[:, i0:i1].reshape(G, nb * R, og.shape[3])
        np.matmul(s, _span(values, lo, hi, ring, vbuf), out=ob)
        ob /= m

    def _one(self, qg, og, cache, scratch, start, window, softcap, alibi=None, sinks=None):
        """One query at ``start`` (a decode step) ``qg`` ``(G, R, D)``, into ``og`` ``(G, R,
        Dv)`` (``qg`` itself where ``Dv == D``): it sees every key from its window's first on,
        so nothing is masked."""
        G, R, D = qg.shape
        keys, values, kbuf, vbuf, ring, bias, relative, _, chunk = cache
        t = start + 1
        lo = 0 if window is None else max(0, t - window)
        if chunk is not None:  # its own chunk's keys
            lo = max(lo, start - start % chunk)
        w = t - lo
        keys, values = _span(keys, lo, t, ring, kbuf), _span(values, lo, t, ring, vbuf)
        s = scratch[: G * R * w].reshape(G, R, w)
        # A long cache: a GEMV per head reads the keys without the packing copy a small-M
        # GEMM makes (measured 61 us against 99 us for 2000 positions).
        per_head = w >= LONG
        if per_head:
            for g in range(G):
                for r in range(R):
                    np.matmul(keys[g], qg[g, r], out=s[g, r])
        else:
            np.matmul(qg, keys.transpose(0, 2, 1), out=s)
        if softcap is not None:
            _softcap(s, softcap)
        if alibi is not None:
            _add_alibi(s.reshape(G, 1, R, w), alibi, np.arange(start, t), np.arange(lo, t))
        if bias is not None:
            s += bias[:, rows_of(lo, w, ring), 0][:, None, :]
        if relative is not None:
            _add_relative(s.reshape(G, 1, R, w), relative, np.arange(start, t), np.arange(lo, t))
        m = scratch[G * R * w: G * R * (w + 1)].reshape(G, R, 1)
        if sinks is None:
            _softmax_numerators(s, m)
        else:
            sink = scratch[G * R * (w + 1): G * R * (w + 2)].reshape(G, R, 1)
            np.copyto(sink, sinks.reshape(G, R, 1))
            _softmax_numerators(s, m, sink)
        if per_head:
            for g in range(G):
                for r in range(R):
                    np.matmul(s[g, r], values[g], out=og[g, r])
        else:
            np.matmul(s, values, out=og)
        og /= m

    def lower(self, out, q, keys, values, sinks=None, bias=None, table=None, scratch=None,
              scale=None, window=None, softcap=None, ring=None, alibi=None, alibi_bf16=None,
              relative=None, sees="own", chunk=None, temperature=None, kv_tiled=False):
        # As kernel runs it on the pool: one query (a decode step's) by lib.attend's code,
        # more (a prompt chunk's, q maybe the fused projection's column view) by
        # lib.attend_chunk's; FalconModel's bfloat16 form of the bias and sinks on numpy's only.
        if alibi_bf16 is not None or sinks is not None or bias is not None or \
                table is not None or (sees == "call" and q.shape[0] > 1) or \
                chunk is not None or temperature is not None or kv_tiled or \
                values.shape[2] != q.shape[2] or \
                native.LIB is None or scratch is None or \
                not native.rows_apart(q) or not native.contiguous(out, keys, values, scratch):
            return None
        n, H, D = q.shape
        G, L, _ = keys.shape
        scale = np.float32(D ** -0.5 if scale is None else scale)
        slopes = None if alibi is None else _slopes32(alibi)
        return native.Step(native.OP_ATTEND, (out, q, keys, values, scratch, slopes),
                           (H, G, D, L, window or 0, ring or 0, n),
                           (float(scale), float(softcap or 0.0)), rows=6)

    def scratch(self, q, keys, values, sinks=None, bias=None, table=None, start=0, scale=None,
                window=None, softcap=None, ring=None, alibi=None, alibi_bf16=None, relative=None,
                sees="own", chunk=None, temperature=None, kv_tiled=False):
        n, H, D = q
        G, L = keys[0], keys[1]
        rows = H * min(n, BLOCK)
        # Each row's scores and total (and with sinks its sink term).
        Dv = values[2]
        own = H * n * D + rows * (L + 1 + (sinks is not None)) + (
            0 if ring is None else G * ring * (D + Dv)) + (0 if Dv == D else H * n * Dv)
        if n == 1:
            return max(own, native.attend_scratch(H, G, D, L))
        # A chunk's call may run one row (its last): attend's own scratch then.
        return max(own, native.attend_chunk_scratch(D, L), native.attend_scratch(H, G, D, L))

    def tolerance(self, q, keys, values, sinks=None, bias=None, table=None, start=0, scale=None,
                  window=None, softcap=None, ring=None, alibi=None, alibi_bf16=None,
                  relative=None, sees="own", chunk=None, temperature=None, kv_tiled=False):
        return Tolerance(atol=1e-6, rtol=max(16.0, q[2] / 4) * EPS32)

    def scale(self, reference, q, keys, values, sinks=None, bias=None, table=None, start=0,
              scale=None, window=None, softcap=None, ring=None, alibi=None, alibi_bf16=None,
              relative=None, sees="own", chunk=None, temperature=None, kv_tiled=False):
        # A convex combination of values: bounded by the largest |value| of its kv head
        # (with a ring, of every row it holds: a looser bound, never a tighter one).
        n, H, D = q.shape
        G = keys.shape[0]
        t = start + n
        vmax = np.abs(as64(values)[:, :t]).max(axis=(1, 2))  # (G,)
        Dv = values.shape[2]
        per_head = np.tile(vmax, H // G) if kv_tiled else np.repeat(vmax, H // G)
        return np.broadcast_to(per_head[None, :, None], (n, H, Dv)).reshape(n, H * Dv) \
            + np.abs(reference)
