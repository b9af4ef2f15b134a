"""Qwen2-VL's and Qwen2.5-VL's vision tower: an image of any size (a whole number of merged
patches) to soft tokens, as transformers' ``Qwen2_5_VisionTransformerPretrainedModel`` (and
``Qwen2VisionTransformerPretrainedModel``) computes them.

The tree, as a checkpoint's ``visual.`` tensors name it (``QwenVisionOptions``):

- ``patch_embed.proj``: a Conv3d of stride = kernel ``(temporal, patch, patch)`` without a
  bias, run as one GEMM of the processor's patch rows (``(patches, channels * temporal *
  patch * patch)``, the processor's ``pixel_values``) by the weight viewed ``(hidden,
  channels * temporal * patch * patch)``;
- ``blocks.{i}``: pre-norm blocks: ``norm1``, attention (``attn.qkv`` fused, ``attn.proj``)
  whose queries and keys turn by 2-D RoPE (the first half of each head's rotary columns by
  the patch's row, the second by its column, one set of frequencies from ``head_dim / 2``:
  ``Qwen2_5_VLVisionRotaryEmbedding``), ``norm2``, the MLP (Qwen2.5-VL: RMSNorm and a gated
  MLP with biases, ``gate_proj``, ``up_proj``, ``down_proj``; Qwen2-VL: LayerNorm and
  ``fc1``, act, ``fc2``);
- attention within windows (Qwen2.5-VL): the rows reordered once so each window's rows are
  consecutive (``window_index``), every block but ``full`` (``fullatt_block_indexes``)
  attending within its window, those within the whole image; the merger's rows put back;
- ``merger``: ``ln_q`` on each row, each ``merge`` x ``merge`` block of rows (consecutive:
  the processor writes them so) side by side in one row, then ``mlp.0``, GELU, ``mlp.2`` to
  the text model's width.

A version is compiled per grid (patches down and across), as many as images of other
shapes meet it. Positions, windows and their order are the grid's alone: numbers computed
here, held as constants of the version.

Not for: the pixels (``qwen_images``), M-RoPE on the text side (``mrope``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from ..blocks.norms import Norm, NormOptions
from ..blocks.projections import Linear
from ..graph import CallSpec, Recorder
from ..module import Module, Param
from ..plan import Plan
from ..reference import Reference

MLPS = ("gated", "plain")


@dataclass(frozen=True)
class QwenVisionOptions:
    """The tower's shape: ``hidden``, ``heads``, ``intermediate``, ``depth`` blocks;
    ``channels``, ``patch``, ``temporal`` (the Conv3d's kernel); ``merge`` (the merger's
    block side, ``spatial_merge_size``); ``window`` (a window's side in pixels; 0: every
    block attends within the whole image, Qwen2-VL) and ``full`` (the blocks attending
    within the whole image, ``fullatt_block_indexes``); ``norm`` (the blocks' norms:
    ``NormOptions``, RMSNorm for Qwen2.5-VL, LayerNorm for Qwen2-VL); ``mlp`` (``gated``:
    gate/up/down with biases; ``plain``: fc1, act, fc2); ``act`` (an ACT2FN name);
    ``theta`` (the 2-D RoPE's base); ``out``: the text model's width."""

    hidden: int
    heads: int
    intermediate: int
    depth: int
    out: int
    channels: int = 3
    patch: int = 14
    temporal: int = 2
    merge: int = 2
    window: int = 0
    full: tuple[int, ...] = ()
    norm: NormOptions = NormOptions("rms", 1e-6)
    mlp: str = "gated"
    act: str = "silu"
    theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def features(self) -> int:
        """A patch row's width: ``channels * temporal * patch * patch``."""
        return self.channels * self.temporal * self.patch * self.patch


def vision_positions(h: int, w: int, merge: int) -> np.ndarray:
    """``(h * w, 2)`` each patch row's (row, column) in the grid, the rows in the order the
    processor writes them (each ``merge`` x ``merge`` block's rows consecutive, the blocks
    row-major), as transformers' ``get_vision_position_ids``."""
    hp, wp = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    shape = (h // merge, merge, w // merge, merge)
    hp = hp.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
    wp = wp.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
    return np.stack([hp, wp], axis=1)


def window_order(h: int, w: int, merge: int, side: int) -> tuple[np.ndarray, tuple[int, ...]]:
    """The merged rows' order by windows of ``side`` x ``side`` merged rows (row-major
    windows over the merged grid padded to whole windows, row-major rows within each, the
    padding left out) and the windows' boundaries in patch rows, as transformers'
    ``get_vision_window_index`` (``side`` = window_size // merge // patch)."""
    lh, lw = h // merge, w // merge
    index = np.arange(lh * lw).reshape(lh, lw)
    ph, pw = side - lh % side, side - lw % side  # transformers pads a whole window more
    padded = np.full((lh + ph, lw + pw), -1)
    padded[:lh, :lw] = index
    nh, nw = (lh + ph) // side, (lw + pw) // side
    blocks = padded.reshape(nh, side, nw, side).transpose(0, 2, 1, 3).reshape(nh * nw, -1)
    order = blocks[blocks >= 0]
    sizes = (blocks >= 0).sum(1) * merge * merge
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    return order, tuple(int(b) for b in np.unique(bounds))


class PatchEmbed(Module):
    """``proj``: the Conv3d as a Linear over patch rows."""

    def __init__(self, o: QwenVisionOptions):
        self.proj = Linear(o.features, o.hidden, False)
        self.proj.weight.reshaped = (o.hidden, o.channels, o.temporal, o.patch, o.patch)


class VisionAttention(Module):
    """``qkv`` (fused, with a bias) and ``proj``."""

    def __init__(self, o: QwenVisionOptions):
        self.qkv = Linear(o.hidden, 3 * o.hidden, True)
        self.proj = Linear(o.hidden, o.hidden, True)


class VisionMLP(Module):
    """``gate_proj``, ``up_proj``, ``down_proj`` (gated) or ``fc1``, ``fc2`` (plain), with
    biases."""

    def __init__(self, o: QwenVisionOptions):
        E, F = o.hidden, o.intermediate
        if o.mlp == "gated":
            self.gate_proj, self.up_proj = Linear(E, F, True), Linear(E, F, True)
            self.down_proj = Linear(F, E, True)
        else:
            self.fc1, self.fc2 = Linear(E, F, True), Linear(F, E, True)
        self.options = o

    def __call__(self, rec: Recorder, x):
        o = self.options
        if o.mlp == "gated":
            h = rec.step("gated_activation", self.gate_proj(rec, x), self.up_proj(rec, x),
                         where=self.path, act=o.act)
            return self.down_proj(rec, h)
        return self.fc2(rec, rec.step("activation", self.fc1(rec, x), where=self.path,
                                      act=o.act))


class VisionBlock(Module):
    """``norm1``, ``attn``, ``norm2``, ``mlp``: pre-norm, residual around each."""

    def __init__(self, o: QwenVisionOptions):
        self.norm1, self.norm2 = Norm(o.hidden, o.norm), Norm(o.hidden, o.norm)
        self.attn = VisionAttention(o)
        self.mlp = VisionMLP(o)
        self.options = o

    def __call__(self, rec: Recorder, x, cos, sin, positions, segments):
        o = self.options
        n, H, D = x.shape[0], o.heads, o.head_dim
        h = self.norm1(rec, x)
        qkv = self.attn.qkv(rec, h)
        q, k, v = (rec.view(rec.step("columns", qkv, where=self.attn.where(name), begin=a,
                                     end=a + o.hidden), (n, H, D))
                   for name, a in (("q", 0), ("k", o.hidden), ("v", 2 * o.hidden)))
        half = D // 4
        q, k = (rec.step("rope_sections", t, cos, sin, positions, where=self.attn.where(name),
                         sections=(half, half)) for name, t in (("q", q), ("k", k)))
        a = rec.step("self_attention", q, k, v, where=self.attn.path, segments=segments)
        x = rec.step("add", x, self.attn.proj(rec, a), where=self.path)
        return rec.step("add", x, self.mlp(rec, self.norm2(rec, x)), where=self.path)


class Merger(Module):
    """``ln_q`` (RMSNorm for Qwen2.5-VL, LayerNorm for Qwen2-VL, eps 1e-6), then ``mlp.0``,
    GELU, ``mlp.2`` over each merged row (renamed ``fc1``, ``fc2`` here)."""

    def __init__(self, o: QwenVisionOptions):
        M = o.hidden * o.merge ** 2
        self.ln_q = Norm(o.hidden, NormOptions(o.norm.kind, 1e-6, bias=o.norm.bias))
        self.fc1, self.fc2 = Linear(M, M, True), Linear(M, o.out, True)
        self.options = o

    def __call__(self, rec: Recorder, x):
        o = self.options
        n = x.shape[0]
        x = rec.view(self.ln_q(rec, x), (n // o.merge ** 2, o.hidden * o.merge ** 2))
        h = rec.step("activation", self.fc1(rec, x), where=self.path, act="gelu")
        return self.fc2(rec, h)


class QwenVisionTower(Module):
    """``patch_embed``, ``blocks``, ``merger`` (module docstring). ``version(h, w)``: the
    tower compiled for a grid of ``h`` x ``w`` patches (kept; one compile per grid).

    Raises:
        ValueError: options that do not build (a head width not a multiple of 4, an MLP
            kind not built, a full-attention block outside the blocks).
    """

    def __init__(self, o: QwenVisionOptions):
        if o.hidden % o.heads or o.head_dim % 4:
            raise ValueError(f"{o.hidden} wide over {o.heads} heads: a head's width is a "
                             "whole multiple of 4 (2-D RoPE over half of it, by two axes)")
        if o.mlp not in MLPS:
            raise ValueError(f"mlp {o.mlp!r} is not one of {', '.join(MLPS)}")
        if any(not 0 <= i < o.depth for i in o.full):
            raise ValueError(f"full-attention blocks {list(o.full)} outside 0..{o.depth - 1}")
        if o.window and o.window % (o.merge * o.patch):
            raise ValueError(f"a window of {o.window} pixels is not a whole number of merged "
                             f"patches ({o.merge * o.patch} pixels)")
        self.patch_embed = PatchEmbed(o)
        self.blocks = [VisionBlock(o) for _ in range(o.depth)]
        self.merger = Merger(o)
        self.options = o
        self.name_tree()
        half = o.head_dim // 2
        inv = (1.0 / (np.float32(o.theta) ** (np.arange(0, half, 2, dtype=np.float32)
                                               / np.float32(half)))).astype(np.float32)
        self._inv = np.concatenate([inv, inv])  # each axis' columns: the same frequencies
        self._versions: dict[tuple[int, int], "QwenVisionVersion"] = {}
        self._lock = threading.Lock()

    def grid_check(self, h: int, w: int) -> None:
        """Raises ValueError where ``h`` x ``w`` patches are not whole merged blocks."""
        m = self.options.merge
        if h < 1 or w < 1 or h % m or w % m:
            raise ValueError(f"a grid of {h}x{w} patches is not whole {m}x{m} merged blocks")

    def soft(self, h: int, w: int) -> int:
        """Soft tokens of a grid of ``h`` x ``w`` patches."""
        return (h // self.options.merge) * (w // self.options.merge)

    def tables(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin ``(rows, head_dim // 2)`` float32: position ``p``'s angles ``p *
        inv_freq`` (float32 as transformers multiplies them) for both axes' columns."""
        angles = (np.arange(rows, dtype=np.float32)[:, None] * self._inv[None, :]).astype(
            np.float64)
        return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)

    def body(self, rec: Recorder, h: int, w: int):
        """Record the tower over a grid of ``h`` x ``w`` patches: patch rows ``(h * w,
        features)`` float32 to soft tokens ``(soft, out)``."""
        o = self.options
        n = h * w
        unit = o.merge ** 2
        rows = rec.input("patches", (n, o.features), np.float32)
        x = self.patch_embed.proj(rec, rows)
        positions = vision_positions(h, w, o.merge)
        full = (0, n)
        if o.window:
            order, windows = window_order(h, w, o.merge, o.window // o.merge // o.patch)
            gather = (order[:, None] * unit + np.arange(unit)[None, :]).reshape(-1)
            index = rec.hold("const", self.where("window_index"), gather.astype(np.int64))
            x = rec.step("gather_rows", x, index, where=self.path)
            positions = positions[gather]
        else:
            order, windows = np.arange(n // unit), full
        cos, sin = self.tables(max(h, w))
        cos = rec.hold("const", self.where("rope.cos"), cos)
        sin = rec.hold("const", self.where("rope.sin"), sin)
        pos = rec.hold("const", self.where("rope.positions"), positions.astype(np.int64))
        for i, block in enumerate(self.blocks):
            x = block(rec, x, cos, sin, pos, full if i in o.full or not o.window else windows)
        x = self.merger(rec, x)
        if o.window:
            back = rec.hold("const", self.where("window_index.inverse"),
                            np.argsort(order).astype(np.int64))
            x = rec.step("gather_rows", x, back, where=self.path)
        return x

    def version(self, h: int, w: int) -> "QwenVisionVersion":
        """The tower compiled for ``h`` x ``w`` patches, compiled once."""
        self.grid_check(h, w)
        with self._lock:
            if (h, w) not in self._versions:
                self._versions[(h, w)] = QwenVisionVersion(self, h, w)
            return self._versions[(h, w)]


class QwenVisionVersion:
    """The tower compiled for one grid. ``version(rows)``: soft tokens ``(soft, out)``
    float32 (a copy) of patch rows ``(h * w, features)``; ``reference(rows)``: the same
    recording run eagerly in float64.

    Raises (both, before any work):
        ValueError: rows of another shape.
    """

    def __init__(self, tower: QwenVisionTower, h: int, w: int, check: bool = False):
        rec = Recorder(CallSpec(True, h * w))
        out = tower.body(rec, h, w)
        self.shape = rec.inputs["patches"].shape
        self.plan = Plan(rec, out, check=check)
        self._reference = Reference(rec, out, {})
        self._lock = threading.Lock()  # one arena: one call at a time

    def _inputs(self, rows) -> dict:
        rows = np.asarray(rows, np.float32)
        if rows.shape != self.shape:
            raise ValueError(f"patch rows {rows.shape}: this grid's tower takes {self.shape}")
        return {"patches": rows}

    def __call__(self, rows) -> np.ndarray:
        inputs = self._inputs(rows)
        with self._lock:
            return np.array(self.plan.run(inputs, {"rows": self.shape[0]}))

    def reference(self, rows) -> np.ndarray:
        return np.asarray(self._reference.run(self._inputs(rows), {"rows": self.shape[0]}))
