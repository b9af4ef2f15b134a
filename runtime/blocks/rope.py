"""Rotary position embeddings: one table's options (``RopeOptions``) and its cos/sin tables
(``rope_table``), the queries' own scaled table (``QUERIES``, ``query_scale``), and the length
past which a scaled table changes (``rope_switch``). The tables are computed once per model
and handed to every attention that turns by them.

Not for: turning queries and keys (``operators.rope``, run by ``attention``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from iron_spec.operators import rope_switch as rope_switch_of
from iron_spec.operators import rope_table as rope_table_of


@dataclass(frozen=True)
class RopeOptions:
    """One RoPE table: ``theta``, transformers' ``rope_scaling`` dict (or None), the rotated
    width ``rotary_dim`` (head_dim, or less under partial rotary) and the config's
    ``max_position_embeddings`` (which ``dynamic`` and ``longrope`` scaling read).
    ``interleaved``: columns ``2i`` and ``2i + 1`` turn together (GPTJAttention's
    ``rotate_every_two``), else ``i`` and ``i + rotary_dim / 2`` (LlamaAttention's
    ``rotate_half``); a layer reading the table turns so (``AttentionOptions``).
    ``negated``: every angle turns the other way, the sin table negated (NanoChat's
    ``rotate_half`` as ``cat(x2, -x1)``: ``x1 cos + x2 sin``, ``x2 cos - x1 sin``; negation is
    exact in float32, so the rotation equals transformers' to the bit). ``query_scale``:
    ``(beta, period)``, the queries turned by this table are then scaled by ``1 + beta *
    log(1 + floor(position / period))`` after RoPE (Ministral3Attention's
    ``get_llama_4_attn_scale``, ``period`` its original context): a table of its own for the
    queries, cos and sin times that scale (``rope_table``), the keys' unscaled (None: none).
    ``sections``: multimodal RoPE (M-RoPE, Qwen2-VL's ``mrope_section``): the table's
    ``rotary_dim // 2`` columns cut into these sections, each turning by a position of its
    own (time, height, width), given per row (``POSITIONS``; ``operators.rope.RopeSections``);
    a text's rows, all three equal, turn as without sections (None: none).
    """

    theta: float
    rotary_dim: int
    scaling: dict | None = None
    max_position_embeddings: int = 2048
    interleaved: bool = False
    negated: bool = False
    query_scale: tuple[float, int] | None = None
    sections: tuple[int, ...] | None = None


def rope_table(o: RopeOptions, positions: int, length: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The cos and sin tables ``(positions, rotary_dim // 2)`` of ``o`` for a sequence of
    ``length`` tokens (``operators.rope.rope_table``); ``negated``: the sin table negated."""
    cos, sin = rope_table_of(o.rotary_dim, o.theta, o.scaling, positions,
                             o.max_position_embeddings, length)
    if o.negated:
        sin = -sin
    if o.query_scale is not None:
        # (q cos + rot(q) sin) * s as q (cos s) + rot(q) (sin s): float32 rounding apart,
        # and exact where s is 1 (every position within the period).
        s = query_scale(*o.query_scale, positions)[:, None]
        cos, sin = (cos * s).astype(np.float32), (sin * s).astype(np.float32)
    return cos, sin


QUERIES = ":queries"  # a table's name + this: the queries' own table (RopeOptions.query_scale)
# Among the tables every layer is given: each row's positions, one per section's axis, and
# the tables that read them (``RopeOptions.sections``): ``(handle, {name: sections})``.
POSITIONS = "positions"


def query_scale(beta: float, period: int, positions: int) -> np.ndarray:
    """``1 + beta * log(1 + floor(p / period))`` for ``p`` in ``0..positions - 1``, float32 as
    transformers' ``get_llama_4_attn_scale`` computes it (the position over the period in
    float32, floored, the log in float32): 1 for every position below ``period``.

    Raises:
        ValueError: a period below 1.
    """
    if period < 1:
        raise ValueError(f"query_scale period {period} is not a whole number >= 1")
    ratio = np.arange(positions, dtype=np.float32) / np.float32(period)
    grown = np.log(np.float32(1.0) + np.floor(ratio)).astype(np.float32)
    return (np.float32(1.0) + np.float32(beta) * grown).astype(np.float32)


def rope_switch(o: RopeOptions) -> int | None:
    """The sequence length past which ``o``'s table changes for every row, else None."""
    return rope_switch_of(o.scaling, o.max_position_embeddings)
