"""An axial-RoPE vision tower (Gemma 4's): patch rows at their (x, y) places to soft tokens.

As transformers 5.25's ``Gemma4VisionModel`` and ``Gemma4MultimodalEmbedder``
(models/gemma4/modeling_gemma4.py), its tree named as the checkpoint's (under
``model.vision_tower``, the ``.linear`` of its ClippableLinears renamed away by the spec):

- ``patch_embedder.input_proj`` ``(hidden, patch * patch * 3)``: each patch's pixels (rows
  as ``AspectPatchProcessor`` cuts them, channels last) taken to ``2 * (x - 0.5)`` and
  projected, no bias; ``patch_embedder.position_embedding_table`` ``(2, positions, hidden)``:
  the row of the patch's column in table 0 plus that of its row in table 1;
- ``encoder.layers``: sandwich-normed layers (RMSNorm scaling by ``w``, not ``1 + w``):
  ``input_layernorm``, q/k/v projections without bias, q and k normed per head
  (``q_norm``, ``k_norm``), v normed per head without weight, queries and keys turned by
  axial 2-D RoPE (a head's first half by the patch's column, its second by its row, each
  half against half with ``head_dim // 4`` frequencies of ``rope_theta``), attention of every
  patch to every patch scaled by 1, ``o_proj``, ``post_attention_layernorm``, the residual;
  ``pre_feedforward_layernorm``, a gated MLP (``gate_proj``, ``up_proj``, ``down_proj``),
  ``post_feedforward_layernorm``, the residual. No final norm;
- pooling: each ``pool`` x ``pool`` window of the patch grid averaged (``Gemma4VisionPooler``
  by positions: windows row-major), times ``sqrt(hidden)``; with ``standardize``,
  ``(x - std_bias) * std_scale``;
- ``embed_vision``: RMSNorm without weight, then ``embedding_projection`` to the text
  model's width (``Gemma4MultimodalEmbedder``).

An image's grid follows its aspect ratio (the processor's resize), so a version is compiled
per grid (``rows`` x ``cols`` patches) and kept. The processor pads patches to its budget
with position (-1, -1); transformers masks them out of attention and pooling, so only the
image's own patches are run here (the same soft tokens).

Not for: the pixels (``aspect_images``), where soft tokens go (``multimodal``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from iron_spec.operators import rope_inv_freq

from ..blocks.norms import Norm, NormOptions
from ..blocks.projections import Linear
from ..graph import CallSpec, Recorder
from ..module import Module, Param
from ..plan import Plan
from ..reference import Reference


@dataclass(frozen=True)
class AxialTowerOptions:
    """The tower's shape (``Gemma4VisionConfig``'s names): ``hidden_size``, ``layers``,
    ``heads``, ``kv_heads``, ``head_dim``, ``intermediate_size``, ``eps`` (every RMSNorm's),
    ``act`` (the MLP gate's ACT2FN name), ``patch`` (pixels a side), ``pool``
    (``pooling_kernel_size``), ``positions`` (``position_embedding_size``), ``rope_theta``,
    ``standardize``, and ``text_hidden``, the text model's width."""

    hidden_size: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    eps: float
    act: str
    patch: int
    pool: int
    positions: int
    rope_theta: float
    text_hidden: int
    standardize: bool = False

    @property
    def patch_width(self) -> int:
        """A patch row's width: its pixels, three channels each."""
        return 3 * self.patch * self.patch


class _Attention(Module):
    def __init__(self, o: AxialTowerOptions):
        E, H, G, D = o.hidden_size, o.heads, o.kv_heads, o.head_dim
        self.q_proj = Linear(E, H * D)
        self.k_proj = Linear(E, G * D)
        self.v_proj = Linear(E, G * D)
        self.o_proj = Linear(H * D, E)
        rms = NormOptions("rms", o.eps)
        self.q_norm = Norm(D, rms)
        self.k_norm = Norm(D, rms)
        self.v_norm = Norm(D, NormOptions("rms", o.eps, weight=False))
        self.options = o

    def __call__(self, rec: Recorder, x, cos, sin):
        o = self.options
        n, H, G, D = x.shape[0], o.heads, o.kv_heads, o.head_dim

        def turned(h, heads):
            # Each head's two halves as rows of their own, so row r of the tables (the
            # patch's column for a first half, its row for a second) turns it.
            h = rec.view(h, (n * heads * 2, 1, D // 2))
            return rec.view(rec.step("rope", h, cos[heads], sin[heads], where=self.path,
                                     start=0), (n, heads, D))

        q = self.q_norm(rec, rec.view(self.q_proj(rec, x), (n, H, D)))
        k = self.k_norm(rec, rec.view(self.k_proj(rec, x), (n, G, D)))
        v = self.v_norm(rec, rec.view(self.v_proj(rec, x), (n, G, D)))
        a = rec.step("self_attention", turned(q, H), turned(k, G), v, where=self.path, scale=1.0)
        return self.o_proj(rec, a)


class _MLP(Module):
    def __init__(self, o: AxialTowerOptions):
        E, F = o.hidden_size, o.intermediate_size
        self.gate_proj = Linear(E, F)
        self.up_proj = Linear(E, F)
        self.down_proj = Linear(F, E)
        self.act = o.act

    def __call__(self, rec: Recorder, x):
        h = rec.step("gated_activation", self.gate_proj(rec, x), self.up_proj(rec, x),
                     where=self.path, act=self.act)
        return self.down_proj(rec, h)


class _Layer(Module):
    def __init__(self, o: AxialTowerOptions):
        rms = NormOptions("rms", o.eps)
        E = o.hidden_size
        self.input_layernorm = Norm(E, rms)
        self.self_attn = _Attention(o)
        self.post_attention_layernorm = Norm(E, rms)
        self.pre_feedforward_layernorm = Norm(E, rms)
        self.mlp = _MLP(o)
        self.post_feedforward_layernorm = Norm(E, rms)

    def __call__(self, rec: Recorder, x, cos, sin):
        a = self.self_attn(rec, self.input_layernorm(rec, x), cos, sin)
        x = rec.step("add", x, self.post_attention_layernorm(rec, a), where=self.path)
        m = self.mlp(rec, self.pre_feedforward_layernorm(rec, x))
        return rec.step("add", x, self.post_feedforward_layernorm(rec, m), where=self.path)


class AxialTower(Module):
    """``patch_embedder``, ``encoder.layers``, (``std_bias``, ``std_scale``) and
    ``embed_vision`` (module docstring). ``version(grid)`` is the tower compiled for a grid
    of ``(rows, cols)`` patches.

    Raises:
        ValueError: a head_dim that the axial RoPE cannot split (a multiple of 4), or a
            pooling window under 1.
    """

    def __init__(self, o: AxialTowerOptions):
        if o.head_dim % 4:
            raise ValueError(f"head_dim {o.head_dim}: axial RoPE turns each half of a head "
                             "half against half, a multiple of 4")
        if o.pool < 1:
            raise ValueError(f"pooling_kernel_size {o.pool}: a window of at least 1")
        E = o.hidden_size
        self.patch_embedder = Module()
        self.patch_embedder.input_proj = Linear(o.patch_width, E)
        self.patch_embedder.position_embedding_table = Param(2, o.positions, E)
        self.encoder = Module()
        self.encoder.layers = [_Layer(o) for _ in range(o.layers)]
        if o.standardize:
            self.std_bias = Param(E)
            self.std_scale = Param(E)
        self.embed_vision = Module()
        self.embed_vision.embedding_pre_projection_norm = Norm(
            E, NormOptions("rms", o.eps, weight=False))
        self.embed_vision.embedding_projection = Linear(E, o.text_hidden)
        self.options = o
        self.name_tree()
        self._versions: dict[tuple[int, int], AxialTowerVersion] = {}
        self._lock = threading.Lock()

    def soft(self, grid: tuple[int, int]) -> int:
        """Soft tokens a grid of ``(rows, cols)`` patches gives."""
        return (grid[0] // self.options.pool) * (grid[1] // self.options.pool)

    def tables(self, grid: tuple[int, int], heads: int) -> tuple[np.ndarray, np.ndarray]:
        """The axial RoPE tables ``(rows * cols * heads * 2, head_dim // 4)`` float32: for
        patch ``i`` (row-major), head ``h``, half ``s``, the row ``(i * heads + h) * 2 + s``
        holds the angles of the patch's column (``s`` 0) or row (``s`` 1), as
        ``Gemma4VisionRotaryEmbedding`` forms them (float32 position times float32 inverse
        frequencies over ``head_dim // 2``)."""
        o = self.options
        inv, _ = rope_inv_freq(o.head_dim // 2, o.rope_theta)
        rows, cols = grid
        y, x = np.divmod(np.arange(rows * cols), cols)
        pos = np.stack([x, y], axis=1).astype(np.float32)  # (n, 2): column, row
        angles = pos[:, None, :, None] * inv[None, None, None, :]  # (n, 1, 2, D/4)
        angles = np.broadcast_to(angles, (rows * cols, heads, 2, inv.size)).astype(np.float32)
        angles = angles.reshape(-1, inv.size)
        return (np.cos(angles.astype(np.float64)).astype(np.float32),
                np.sin(angles.astype(np.float64)).astype(np.float32))

    def positions(self, grid: tuple[int, int]) -> np.ndarray:
        """The position rows ``(rows * cols, hidden)`` float32 the patches add: table 0's row
        of each patch's column plus table 1's of its row (``_position_embeddings``).

        Raises:
            ValueError: a grid wider or taller than the table.
        """
        rows, cols = grid
        table = self.patch_embedder.position_embedding_table.array
        if max(rows, cols) > table.shape[1]:
            raise ValueError(f"a grid of {rows}x{cols} patches: the position table holds "
                             f"{table.shape[1]} places a side (position_embedding_size)")
        y, x = np.divmod(np.arange(rows * cols), cols)
        return (table[0][x] + table[1][y]).astype(np.float32)

    def body(self, rec: Recorder, grid: tuple[int, int]):
        """Record the tower for ``grid``: patch rows ``(rows * cols, patch * patch * 3)``
        float32 (already ``2 * (x - 0.5)``) to soft tokens ``(soft, text_hidden)``."""
        o = self.options
        n = grid[0] * grid[1]
        x = rec.input("patches", (n, o.patch_width), np.float32)
        x = self.patch_embedder.input_proj(rec, x)
        pos = self.positions(grid)
        x = rec.step("add", x, rec.hold("const", "patch_embedder.positions", pos),
                     where=self.patch_embedder.path)
        cos, sin = {}, {}
        for heads in {o.heads, o.kv_heads}:
            c, s = self.tables(grid, heads)
            cos[heads] = rec.hold("const", f"encoder.rope.cos{heads}", c)
            sin[heads] = rec.hold("const", f"encoder.rope.sin{heads}", s)
        for layer in self.encoder.layers:
            x = layer(rec, x, cos, sin)
        if o.pool > 1:
            x = rec.step("average_pool", x, where=self.path, side=grid[0], kernel=o.pool,
                         width=grid[1])
        x = rec.step("mul", x, where=self.path, scale=float(o.hidden_size ** 0.5))
        if o.standardize:
            bias = rec.hold("param", self.where("std_bias"), self.std_bias.array)
            scale = rec.hold("param", self.where("std_scale"), self.std_scale.array)
            x = rec.step("mul", rec.step("add", x, bias, where=self.path, scale=-1.0), scale,
                         where=self.path)
        e = self.embed_vision
        return e.embedding_projection(rec, e.embedding_pre_projection_norm(rec, x))

    def version(self, grid: tuple[int, int]) -> "AxialTowerVersion":
        """The tower compiled for ``grid``, compiled once.

        Raises:
            ValueError: a grid the pooling windows do not tile.
        """
        grid = (int(grid[0]), int(grid[1]))
        if grid[0] % self.options.pool or grid[1] % self.options.pool:
            raise ValueError(f"a {grid[0]}x{grid[1]} patch grid is not tiled by "
                             f"{self.options.pool}x{self.options.pool} pooling windows")
        with self._lock:
            if grid not in self._versions:
                self._versions[grid] = AxialTowerVersion(self, grid)
            return self._versions[grid]


class AxialTowerVersion:
    """The tower compiled over one grid. ``version(pixels)`` gives the soft tokens
    ``(soft, text_hidden)`` float32 (a copy) of pixel rows ``(rows * cols, patch * patch *
    3)`` in [0, 1] as the processor gives them; ``reference(pixels)`` runs the same
    recording eagerly in float64.

    Raises (both, before any work):
        ValueError: rows of another shape.
    """

    def __init__(self, tower: AxialTower, grid: tuple[int, int], check: bool = False):
        rec = Recorder(CallSpec(True, grid[0] * grid[1]))
        out = tower.body(rec, grid)
        self.grid = grid
        self.shape = rec.inputs["patches"].shape
        self.plan = Plan(rec, out, check=check)
        self._reference = Reference(rec, out, {})
        self._lock = threading.Lock()  # one arena: one call at a time

    def _inputs(self, pixels) -> dict:
        pixels = np.asarray(pixels, np.float32)
        if pixels.shape != self.shape:
            raise ValueError(f"pixel rows {pixels.shape}: the tower's {self.grid[0]}x"
                             f"{self.grid[1]} grid takes {self.shape}")
        # Gemma4VisionPatchEmbedder's own rescale, in float32 as it computes it.
        return {"patches": np.float32(2) * (pixels - np.float32(0.5))}

    def __call__(self, pixels) -> np.ndarray:
        inputs = self._inputs(pixels)
        with self._lock:
            return np.array(self.plan.run(inputs, {"rows": self.shape[0]}))

    def reference(self, pixels) -> np.ndarray:
        return np.asarray(self._reference.run(self._inputs(pixels), {"rows": self.shape[0]}))
