"""M-RoPE positions (Qwen2-VL's multimodal RoPE): each row of a history turned by three
positions, time, height and width, as transformers' ``Qwen2_5_VLModel.get_rope_index``
computes them for images.

A text row's three positions are equal, one past the previous row's largest; an image's soft
tokens, a (time, height, width) grid of merged blocks written row-major, take the position
before them plus their index along each axis; the text after an image continues from one
past the image's largest position (so a history is shorter in positions than in rows: the
``delta``, negative, which every later row adds to its index, as transformers' rope deltas
in decoding).

Not for: turning rows by them (``operators.rope.RopeSections``), where the soft tokens go
(``multimodal``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def rope_positions(n: int, images: Sequence[tuple[int, tuple[int, int, int]]]
                   ) -> tuple[np.ndarray, int]:
    """``(n, 3)`` int32 positions of a history of ``n`` rows whose images each start at a
    row and span a ``(t, h, w)`` grid (``images``: (first row, grid)), and the delta a row
    past them adds to its index.

    Raises:
        ValueError: images that overlap or pass the history's end.
    """
    out = np.empty((n, 3), np.int32)
    row = cur = 0
    for start, (t, h, w) in sorted(images):
        size = t * h * w
        if start < row or start + size > n:
            raise ValueError(f"an image of {t}x{h}x{w} soft tokens at row {start} overlaps "
                             f"another or passes the history's {n} rows")
        out[row:start] = (cur + np.arange(start - row))[:, None]
        cur += start - row
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
        out[start: start + size] = cur + np.stack([tt, hh, ww], -1).reshape(size, 3)
        cur += max(h, w)  # transformers: the height and width alone, time not counted
        row = start + size
    out[row:] = (cur + np.arange(n - row))[:, None]
    return out, cur + (n - row) - n
