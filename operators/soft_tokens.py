"""What a tower's soft tokens meet: pooling over a patch grid, placing soft rows at a text's
placeholder rows, and attention in which one image's rows see each other.

- ``prepend_row``, ``row_range``: a class row before an image's patch rows, and rows cut
  from a tower's output (CLIP's class embedding, LLaVA's feature selection).
- ``gather_rows``: rows taken in a given order (a vision tower's windows, and back).
- ``average_pool``: a vision tower's rows, a row-major grid of patches, averaged over square
  windows (torch's ``nn.AvgPool2d(kernel, stride=kernel)``, Gemma3MultiModalProjector's).
- ``pixel_shuffle``: a square grid's rows, each ``factor`` x ``factor`` window's side by side
  in one row (Idefics3Connector's ``pixel_shuffle``).
- ``place_rows``: a prompt chunk's embedding rows with its placeholder rows replaced by soft
  tokens, as transformers' ``inputs_embeds.masked_scatter(mask, features)``.
- ``attention_reach``: causal attention over a KV cache in which query ``i`` sees the keys up
  to ``reach[i]`` (at least its own position): an image's rows see the whole image, as
  transformers' ``blockwise_overlay`` or'ed with the causal mask (Gemma 3's
  ``create_masks_for_vision_model``), and a sliding window still bounds them.
"""

from __future__ import annotations

import numpy as np

from .attention import rows_of, widened
from .base import EPS32, Operator, Tolerance, as64


class AveragePool(Operator):
    """``x`` ``(side * width, d)``, a row-major grid of ``side`` rows of ``width`` (0: a
    square, ``side``), averaged over ``kernel`` x ``kernel`` windows: ``((side // kernel) *
    (width // kernel), d)``, row-major over the windows (``nn.AvgPool2d(kernel,
    stride=kernel)`` on ``(d, side, width)``, flattened and transposed back; Gemma 4's
    ``_avg_pool_by_positions`` on a whole grid)."""

    name = "average_pool"
    keeps_bound = False

    def shape(self, x, side=1, kernel=1, width=0):
        w = width or side
        if len(x) != 2 or x[0] != side * w or kernel < 1 or side % kernel or w % kernel:
            raise ValueError(f"average_pool: {x} is not a {side}x{w} grid of rows that "
                             f"{kernel}x{kernel} windows tile")
        return ((side // kernel) * (w // kernel), x[1])

    def reference(self, x, side=1, kernel=1, width=0):
        h, w, d = side // kernel, (width or side) // kernel, x.shape[1]
        return as64(x).reshape(h, kernel, w, kernel, d).mean(axis=(1, 3)).reshape(h * w, d)

    def kernel(self, out, x, scratch=None, side=1, kernel=1, width=0):
        h, w, d = side // kernel, (width or side) // kernel, x.shape[1]
        grid = x.reshape(h, kernel, w, kernel, d)
        o = out.reshape(h, w, d)
        np.sum(grid, axis=(1, 3), out=o)
        o *= np.float32(1.0 / (kernel * kernel))

    def tolerance(self, x, side=1, kernel=1, width=0):
        return Tolerance(atol=1e-7, rtol=max(4.0, kernel * kernel / 4) * EPS32)

    def scale(self, reference, x, side=1, kernel=1, width=0):
        return self.reference(np.abs(as64(x)), side=side, kernel=kernel, width=width)


class PixelShuffle(Operator):
    """``x`` ``(side * side, d)``, a row-major square grid of rows, to ``((side // factor) **
    2, factor * factor * d)``: output row ``(i, j)`` (row-major over the windows) holds the
    rows ``(i * factor + a, j * factor + b)`` for ``a``, then ``b``, in ``0 .. factor - 1``,
    side by side: Idefics3Connector's ``pixel_shuffle`` (its views and permutes, traced).
    A permutation: exact."""

    name = "pixel_shuffle"
    keeps_bound = False

    def shape(self, x, side=1, factor=1):
        if len(x) != 2 or x[0] != side * side or factor < 1 or side % factor:
            raise ValueError(f"pixel_shuffle: {x} is not a {side}x{side} grid of rows that "
                             f"{factor}x{factor} windows tile")
        return ((side // factor) ** 2, factor * factor * x[1])

    @staticmethod
    def _shuffled(x, side, factor):
        w, d = side // factor, x.shape[1]
        return x.reshape(w, factor, w, factor, d).transpose(0, 2, 1, 3, 4).reshape(
            w * w, factor * factor * d)

    def reference(self, x, side=1, factor=1):
        return self._shuffled(as64(x), side, factor)

    def kernel(self, out, x, scratch=None, side=1, factor=1):
        w, d = side // factor, x.shape[1]
        np.copyto(out.reshape(w, w, factor, factor, d),
                  x.reshape(w, factor, w, factor, d).transpose(0, 2, 1, 3, 4))

    def tolerance(self, x, side=1, factor=1):
        return Tolerance(atol=0.0, rtol=0.0)


class GatherRows(Operator):
    """Rows ``index[0], index[1], ...`` of ``x`` ``(n, d)``: ``(len(index), d)``, with
    ``index`` ``(m,)`` a whole-number table (a const: a permutation of a vision tower's rows
    into its windows, Qwen2_5_VisionTransformerPretrainedModel's ``window_index``, and back).
    Exact."""

    name = "gather_rows"
    keeps_bound = False

    def shape(self, x, index):
        if len(x) != 2 or len(index) != 1:
            raise ValueError(f"gather_rows: x {x} (n, d) and an index {index} (m,)")
        return (index[0], x[1])

    def reference(self, x, index):
        return as64(x)[np.asarray(index, np.int64)]

    def pack(self, index, array, **attrs):
        if index == 1:
            return np.ascontiguousarray(array, np.int64)
        return super().pack(index, array)

    def kernel(self, out, x, index, scratch=None):
        np.take(x, index, axis=0, out=out)

    def tolerance(self, x, index):
        return Tolerance(atol=0.0, rtol=0.0)


class PrependRow(Operator):
    """``row`` ``(d,)`` then the rows of ``x`` ``(n, d)``: ``(n + 1, d)``, a class embedding
    before an image's patches (CLIPVisionEmbeddings' ``cat([class_embeds, patch_embeds])``)."""

    name = "prepend_row"
    keeps_bound = False

    def shape(self, x, row):
        if len(x) != 2 or tuple(row) != (x[1],):
            raise ValueError(f"prepend_row: a row {row} of x {x}'s width")
        return (x[0] + 1, x[1])

    def reference(self, x, row):
        return np.concatenate([as64(row)[None], as64(x)])

    def kernel(self, out, x, row, scratch=None):
        out[0] = row
        out[1:] = x

    def tolerance(self, x, row):
        return Tolerance(atol=0.0, rtol=0.0)


class RowRange(Operator):
    """Rows ``begin .. end - 1`` of ``x`` ``(n, d)``: an image's patch rows without its class
    row (LlavaModel's ``selected_image_feature[:, 1:]``)."""

    name = "row_range"
    keeps_bound = False

    def shape(self, x, begin=0, end=None):
        end = x[0] if end is None else end
        if len(x) != 2 or not 0 <= begin < end <= x[0]:
            raise ValueError(f"row_range: rows {begin}..{end} of {x}")
        return (end - begin, x[1])

    def reference(self, x, begin=0, end=None):
        return as64(x)[begin:end]

    def kernel(self, out, x, scratch=None, begin=0, end=None):
        out[...] = x[begin:end]

    def tolerance(self, x, begin=0, end=None):
        return Tolerance(atol=0.0, rtol=0.0)


class CallRows(Operator):
    """The first rows of ``x`` ``(n, d)``, as many as the call runs: the rows of a fixed-size
    front end (an audio tower's 30-second window) that hold its input, read by the encoder
    layers after it (``rows`` ``(n,)`` int32, a bounded input: only its count is read).
    Qwen2AudioEncoder masks the keys past the sound's frames; rows past them reach no soft
    token, so the layers run on the sound's rows alone."""

    name = "call_rows"

    def shape(self, x, rows):
        if len(x) != 2 or tuple(rows) != (x[0],):
            raise ValueError(f"call_rows: x {x} (n, d) and a bound rows {rows} (n,)")
        return x

    def reference(self, x, rows):
        return as64(x)[: len(rows)]

    def kernel(self, out, x, rows, scratch=None):
        out[...] = x[: out.shape[0]]

    def tolerance(self, x, rows):
        return Tolerance(atol=0.0, rtol=0.0)


class PairMean(Operator):
    """Row ``i`` of the output the mean of rows ``2i`` and ``2i + 1`` of ``x`` ``(n, d)``,
    for ``i < n // 2``, zeros after (the rows stay as many as the call's):
    ``nn.AvgPool1d(2, stride=2)`` over the rows, Qwen2AudioEncoder's ``avg_pooler``."""

    name = "pair_mean"

    def shape(self, x):
        if len(x) != 2:
            raise ValueError(f"pair_mean: x {x} is not (n, d)")
        return x

    def reference(self, x):
        x = as64(x)
        h = x.shape[0] // 2
        out = np.zeros_like(x)
        out[:h] = (x[0: 2 * h: 2] + x[1: 2 * h: 2]) / 2
        return out

    def kernel(self, out, x, scratch=None):
        h = x.shape[0] // 2
        np.add(x[0: 2 * h: 2], x[1: 2 * h: 2], out=out[:h])
        out[:h] *= np.float32(0.5)
        out[h:] = 0.0

    def tolerance(self, x):
        return Tolerance(atol=0.0, rtol=2 * EPS32)


class PlaceRows(Operator):
    """``x`` ``(n, d)`` with each row ``i`` where ``mask[i]`` is not 0 replaced by
    ``soft[i]`` (``soft`` ``(n, d)``, the soft tokens laid out at their placeholder rows):
    ``masked_scatter`` of a placeholder mask, exact."""

    name = "place_rows"

    def shape(self, x, soft, mask):
        if len(x) != 2 or tuple(soft) != tuple(x) or tuple(mask) != (x[0],):
            raise ValueError(f"place_rows: rows {x}, soft rows {soft} and a mask {mask} of "
                             "one per row")
        return x

    def reference(self, x, soft, mask):
        return np.where(np.asarray(mask)[:, None] != 0, as64(soft), as64(x))

    def kernel(self, out, x, soft, mask, scratch=None):
        np.copyto(out, x)
        at = np.flatnonzero(mask)
        out[at] = soft[at]

    def tolerance(self, x, soft, mask):
        return Tolerance(atol=0.0, rtol=0.0)


BLOCK = 64  # query rows a block of attention_reach scores at once


class ReachAttention(Operator):
    """Causal GQA attention of queries at positions ``start .. start + n`` over a cache, query
    ``i`` seeing the keys from its window's first (``window``: those at most ``window - 1``
    before it; None: all) up to position ``reach[i]`` (``reach`` ``(n,)`` int32, at least
    ``start + i``, at most the call's last position). Otherwise as ``attention``
    (``operators.attention.Attention``): ``q`` ``(n, heads, head_dim)``, ``keys`` and
    ``values`` ``(kv_heads, capacity, head_dim)`` (a ring of ``ring`` rows), ``scale``,
    ``softcap``; softmax in float32, float64 in the reference."""

    name = "attention_reach"

    def shape(self, q, keys, values, reach, start=0, scale=None, window=None, softcap=None,
              ring=None):
        if len(q) != 3 or len(keys) != 3 or tuple(values[:2]) != tuple(keys[:2]) or \
                q[1] % keys[0] or q[2] != keys[2] or tuple(reach) != (q[0],):
            raise ValueError(f"attention_reach: q {q} (n, heads, head_dim), cache {keys} "
                             f"(values {values}) and reach {reach} (n,) do not meet")
        if ring is not None and (window is None or ring < window + q[0] - 1):
            raise ValueError(f"attention_reach: a ring of {ring} rows does not hold a window of "
                             f"{window} before {q[0]} rows")
        return (q[0], q[1] * values[2])

    @staticmethod
    def _allowed(reach, start, lo, hi, window):
        """Which keys ``lo .. hi - 1`` each query at ``start ..`` sees: ``(n, hi - lo)``."""
        qpos = np.arange(start, start + len(reach))[:, None]
        kpos = np.arange(lo, hi)[None, :]
        allowed = kpos <= np.asarray(reach)[:, None]
        if window is not None:
            allowed &= kpos > qpos - window
        return allowed

    def reference(self, q, keys, values, reach, start=0, scale=None, window=None, softcap=None,
                  ring=None):
        n, H, D = q.shape
        G = keys.shape[0]
        t = start + n
        lo = 0 if ring is None else max(0, t - ring)
        held = rows_of(lo, t - lo, ring)
        k = np.repeat(as64(keys)[:, held], H // G, axis=0)
        v = np.repeat(as64(values)[:, held], H // G, axis=0)
        s = np.einsum("nhd,htd->hnt", as64(q), k) * (D ** -0.5 if scale is None else scale)
        if softcap is not None:
            s = np.tanh(s / softcap) * softcap
        s = np.where(self._allowed(reach, start, lo, t, window)[None], s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        return np.einsum("hnt,htd->nhd", p, v).reshape(n, -1)

    def kernel(self, out, q, keys, values, reach, scratch=None, start=0, scale=None,
               window=None, softcap=None, ring=None):
        n, H, D = q.shape
        G, Dv = keys.shape[0], values.shape[2]
        R = H // G
        t = start + n
        if keys.dtype == np.uint16:  # a bfloat16 cache, widened exactly
            keys, values = widened(keys, t, ring), widened(values, t, ring)
        f = np.float32(D ** -0.5 if scale is None else scale)
        o = out.reshape(n, G, R, Dv)
        for i0 in range(0, n, BLOCK):
            i1 = min(n, i0 + BLOCK)
            hi = int(np.max(reach[i0:i1])) + 1
            lo = 0 if window is None else max(0, start + i0 - window + 1)
            rows = rows_of(lo, hi - lo, ring)
            k, v = keys[:, rows], values[:, rows]  # (G, w, D)
            qb = q[i0:i1].reshape(i1 - i0, G, R, D).transpose(1, 0, 2, 3) * f
            s = np.matmul(qb.reshape(G, -1, D), k.transpose(0, 2, 1))  # (G, nb * R, w)
            if softcap is not None:
                s = np.tanh(s / np.float32(softcap)) * np.float32(softcap)
            s = s.reshape(G, i1 - i0, R, -1)
            allowed = self._allowed(reach[i0:i1], start + i0, lo, hi, window)
            np.copyto(s, np.float32(-np.inf), where=~allowed[None, :, None, :])
            s -= s.max(-1, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(-1, keepdims=True)
            ob = np.matmul(s.reshape(G, -1, s.shape[-1]), v)  # (G, nb * R, Dv)
            o[i0:i1] = ob.reshape(G, i1 - i0, R, Dv).transpose(1, 0, 2, 3)

    def tolerance(self, q, keys, values, reach, start=0, scale=None, window=None, softcap=None,
                  ring=None):
        return Tolerance(atol=1e-6, rtol=max(16.0, q[2] / 4) * EPS32)

    def scale(self, reference, q, keys, values, reach, start=0, scale=None, window=None,
              softcap=None, ring=None):
        n, H, _ = q.shape
        G = keys.shape[0]
        top = np.abs(as64(values)).max(axis=(1, 2))  # each kv head's largest |value|
        return np.broadcast_to(np.repeat(top, H // G)[None, :, None],
                               (n, H, values.shape[2])).reshape(n, -1)
