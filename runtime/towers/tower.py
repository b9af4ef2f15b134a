"""A vision tower: an image's patch rows to soft tokens in a text model's space.

The seeds' ``Tower``: an encoder whose rows come from a front end. Its tree, as a checkpoint's
tower lays it out once renamed (``TowerOptions``):

- ``embeddings.patch_embedding``: the patch embedding, a ``Conv2d`` whose stride is its
  kernel (``weight`` ``(hidden, channels, patch, patch)``, ``bias``), run as one GEMM of
  the patch rows (``images.patches``) by the weight viewed ``(hidden, channels * patch *
  patch)``; ``embeddings.position_embedding``: a learned position per patch (SigLIP's);
- ``encoder``: the encoder layers and final norm of ``runtime.encoder`` (``Stack``), in the
  encoder vocabulary (SigLIP's and CLIP's layers are pre-norm encoder layers);
- pooling: average pooling over ``pool`` x ``pool`` windows of the patch grid (Gemma 3's
  ``avg_pool``), none where ``pool`` is 1; or a pixel shuffle, each ``shuffle`` x
  ``shuffle`` window's rows side by side in one row (Idefics3Connector's);
- ``projector``: a norm (``projector.norm``: Gemma 3's ``mm_soft_emb_norm``) and a linear
  map to the text model's width (``projector.linear``; Gemma 3's
  ``mm_input_projection_weight`` is stored ``(in, out)``: a transposed Linear).

One version is compiled over the tower's fixed number of patches (an image resized to the
processor's size); a call gives ``(soft, text_hidden)`` float32.

Not for: the image's pixels (``images``), where soft tokens go (``multimodal``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..blocks.norms import Norm, NormOptions
from ..blocks.projections import Linear
from ..encoder import Stack
from ..encoder_options import EncoderOptions
from ..graph import CallSpec, Recorder
from ..module import Module, Param
from ..plan import Plan
from ..reference import Reference


PROJECTORS = ("linear", "mlp")


@dataclass(frozen=True)
class ProjectorOptions:
    """The projector after pooling: ``norm`` (None: none), then for kind ``linear`` one
    ``linear`` ``(text_hidden, hidden)`` (Gemma3MultiModalProjector's), for ``mlp``
    ``linear_1`` ``(text_hidden, hidden)``, the activation ``act`` (an ACT2FN name) and
    ``linear_2`` ``(text_hidden, text_hidden)`` (LlavaMultiModalProjector's); biases where
    ``bias``."""

    norm: NormOptions | None = None
    bias: bool = False
    kind: str = "linear"
    act: str = "gelu"


@dataclass(frozen=True)
class TowerOptions:
    """A vision tower's shape: ``encoder`` (its layers, norm and width, ``hidden_size``),
    ``channels`` and ``patch`` (the patch embedding's kernel and stride; ``patch_bias``:
    its bias), ``image`` (height, width) in pixels, ``pool`` (the average pooling window over
    the patch grid; 1: none), ``projector``, and ``text_hidden``, the text model's width.
    ``class_embedding``: a learned row before the patches (CLIPVisionEmbeddings'), with a
    position of its own; ``pre_norm``: a norm of the encoder's kind on the embeddings
    (CLIP's ``pre_layrnorm``); ``layers_run``: the layers run, the first of them (the
    hidden state LLaVA's ``vision_feature_layer`` selects; None: all); ``final_norm``: the
    encoder's final norm runs after them (SigLIP's ``post_layernorm``; CLIP's reaches only
    its pooled row, so LLaVA's features are not normed); ``drop``: leading rows left out
    before the projector (the class row, ``vision_feature_select_strategy`` default).
    ``shuffle``: each ``shuffle`` x ``shuffle`` window of the patch grid's rows side by side in
    one row before the projector (Idefics3Connector's ``pixel_shuffle`` by ``scale_factor``;
    1: none), the projector then reading ``shuffle ** 2`` times the encoder's width."""

    encoder: EncoderOptions
    channels: int
    patch: int
    image: tuple[int, int]
    pool: int
    projector: ProjectorOptions
    text_hidden: int
    patch_bias: bool = True
    class_embedding: bool = False
    pre_norm: bool = False
    layers_run: int | None = None
    final_norm: bool = True
    drop: int = 0
    shuffle: int = 1

    @property
    def grid(self) -> tuple[int, int]:
        """Patches down and across."""
        return self.image[0] // self.patch, self.image[1] // self.patch

    @property
    def patches(self) -> int:
        """Rows the encoder runs: one per patch."""
        h, w = self.grid
        return h * w

    @property
    def rows(self) -> int:
        """Rows the encoder runs: a class row where there is one, then the patches."""
        return self.patches + self.class_embedding

    @property
    def soft(self) -> int:
        """Soft tokens an image gives: a row per pooling (or shuffle) window, less the rows
        dropped."""
        h, w = self.grid
        k = self.pool * self.shuffle
        return (h // k) * (w // k) + self.class_embedding - self.drop

    @property
    def features(self) -> int:
        """The width of the rows the projector reads."""
        return self.encoder.hidden_size * self.shuffle ** 2


class PatchEmbeddings(Module):
    """``patch_embedding`` (a Conv2d of stride = kernel, run as a Linear over patch rows)
    and ``position_embedding`` ``(patches, hidden)``, added, as SiglipVisionEmbeddings."""

    def __init__(self, o: TowerOptions):
        E, C, p = o.encoder.hidden_size, o.channels, o.patch
        if o.class_embedding:
            self.class_embedding = Param(E)
        self.patch_embedding = Linear(C * p * p, E, o.patch_bias)
        self.patch_embedding.weight.reshaped = (E, C, p, p)
        self.position_embedding = Module()
        self.position_embedding.weight = Param(o.rows, E)


class Projector(Module):
    """``norm`` (where the options hold one) then ``linear`` to the text model's width."""

    def __init__(self, o: TowerOptions):
        p = o.projector
        if p.kind not in PROJECTORS:
            raise ValueError(f"projector kind {p.kind!r} is not one of {', '.join(PROJECTORS)}")
        F = getattr(o, "features", o.encoder.hidden_size)
        self.norm = None if p.norm is None else Norm(F, p.norm)
        if p.kind == "linear":
            self.linear = Linear(F, o.text_hidden, p.bias)
        else:
            self.linear_1 = Linear(F, o.text_hidden, p.bias)
            self.linear_2 = Linear(o.text_hidden, o.text_hidden, p.bias)
        self.options = p

    def __call__(self, rec: Recorder, x):
        if self.norm is not None:
            x = self.norm(rec, x)
        if self.options.kind == "linear":
            return self.linear(rec, x)
        h = rec.step("activation", self.linear_1(rec, x), where=self.path, act=self.options.act)
        return self.linear_2(rec, h)


class Tower(Module):
    """``embeddings``, ``encoder`` and ``projector`` (module docstring).

    Raises:
        ValueError: an image that is not a whole number of patches, a patch grid that the
            pooling windows do not tile, or encoder layers that are not pre-norm (the
            final norm is the encoder's last step).
    """

    def __init__(self, o: TowerOptions):
        h, w = o.grid
        if o.image[0] % o.patch or o.image[1] % o.patch:
            raise ValueError(f"an image of {o.image[0]}x{o.image[1]} pixels is not a whole "
                             f"number of {o.patch}-pixel patches")
        if o.pool < 1 or h % o.pool or w % o.pool or (o.pool > 1 and h != w):
            raise ValueError(f"a {h}x{w} patch grid is not tiled by {o.pool}x{o.pool} "
                             "pooling windows (a square grid where pooled)")
        if any(lo.placement != "pre" for lo in o.encoder.layers):
            raise ValueError("a tower's encoder layers are pre-norm (SigLIP's, CLIP's): "
                             "layer/placement pre")
        if o.layers_run is not None and not 0 <= o.layers_run <= len(o.encoder.layers):
            raise ValueError(f"the features after {o.layers_run} layers: there are "
                             f"{len(o.encoder.layers)}")
        if (o.pool > 1 or o.shuffle > 1) and (o.class_embedding or o.drop):
            raise ValueError("pooling reads the patch grid alone: not with a class row")
        if o.shuffle < 1 or (o.shuffle > 1 and (o.pool > 1 or h != w or h % o.shuffle)):
            raise ValueError(f"a {h}x{w} patch grid is not tiled by {o.shuffle}x{o.shuffle} "
                             "pixel-shuffle windows (a square grid, not pooled too)")
        if not 0 <= o.drop < o.rows:
            raise ValueError(f"{o.drop} rows dropped of {o.rows}")
        self.embeddings = PatchEmbeddings(o)
        self.pre_norm = Norm(o.encoder.hidden_size, o.encoder.norm) if o.pre_norm else None
        self.encoder = Stack(o.encoder)
        self.projector = Projector(o)
        self.options = o
        self.name_tree()
        self._version: TowerVersion | None = None

    def body(self, rec: Recorder):
        """Record the tower: patch rows ``(patches, channels * patch * patch)`` float32 to
        soft tokens ``(soft, text_hidden)``."""
        o = self.options
        C, p = o.channels, o.patch
        rows = rec.input("patches", (o.patches, C * p * p), np.float32)
        e = self.embeddings
        x = e.patch_embedding(rec, rows)
        if o.class_embedding:
            row = rec.hold("param", e.where("class_embedding"), e.class_embedding.array)
            x = rec.step("prepend_row", x, row, where=e.path)
        table = e.position_embedding
        w = rec.hold("param", table.where("weight"), table.weight.array)
        x = rec.step("add", x, w, where=e.path)
        if self.pre_norm is not None:
            x = self.pre_norm(rec, x)
        for layer in self.encoder.layer[:o.layers_run]:
            x = layer(rec, x)
        if self.encoder.LayerNorm is not None and o.final_norm:
            x = self.encoder.LayerNorm(rec, x)
        if o.drop:
            x = rec.step("row_range", x, where=self.path, begin=o.drop)
        if o.pool > 1:
            x = rec.step("average_pool", x, where=self.path, side=o.grid[0], kernel=o.pool)
        if o.shuffle > 1:
            x = rec.step("pixel_shuffle", x, where=self.path, side=o.grid[0], factor=o.shuffle)
        return self.projector(rec, x)

    @property
    def version(self) -> "TowerVersion":
        """The compiled tower, compiled once."""
        if self._version is None:
            self._version = TowerVersion(self)
        return self._version


class TowerVersion:
    """The tower compiled over its patches. ``version(rows)`` gives the soft tokens
    ``(soft, text_hidden)`` float32 (a copy) of patch rows ``(patches, channels * patch *
    patch)``; ``reference(rows)`` runs the same recording eagerly in float64.

    Raises (both, before any work):
        ValueError: rows of another shape.
    """

    def __init__(self, tower: Tower, check: bool = False):
        o = tower.options
        rec = Recorder(CallSpec(True, o.patches))
        out = tower.body(rec)
        self.shape = rec.inputs["patches"].shape
        self.plan = Plan(rec, out, check=check)
        self._reference = Reference(rec, out, {})

    def _inputs(self, rows) -> dict:
        rows = np.asarray(rows, np.float32)
        if rows.shape != self.shape:
            raise ValueError(f"patch rows {rows.shape}: the tower takes {self.shape}")
        return {"patches": rows}

    def __call__(self, rows) -> np.ndarray:
        return np.array(self.plan.run(self._inputs(rows), {"rows": self.shape[0]}))

    def reference(self, rows) -> np.ndarray:
        return np.asarray(self._reference.run(self._inputs(rows), {"rows": self.shape[0]}))
