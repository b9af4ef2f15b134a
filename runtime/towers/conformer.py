"""A conformer audio tower (Gemma 4's): a sound's log-mel frames to soft tokens.

As transformers 5.25's ``Gemma4AudioModel`` (the Universal Speech Model's encoder) and
``Gemma4MultimodalEmbedder`` (models/gemma4/modeling_gemma4.py), its tree named as the
checkpoint's under ``model.audio_tower`` (``Gemma4ClippableLinear`` kept as it is: a
``linear`` and, with ``use_clipped_linears``, the scalar bounds ``input_min``,
``input_max``, ``output_min``, ``output_max`` that clip its input and output):

- ``subsample_conv_projection``: ``layer0`` and ``layer1``, each a bias-free 3x3
  ``conv`` of stride 2 and padding 1 over (time, mel) (``operators.conv.Conv2d``, channels
  last), a bias-free LayerNorm over its channels (``norm``, eps ``rms_norm_eps``) and ReLU;
  then each time row's (mel, channel) values side by side through ``input_proj_linear``;
- ``layers``: conformer blocks of a half-step feed-forward (``feed_forward1``: clip to
  ``gradient_clipping``, RMSNorm, ``ffw_layer_1`` to 4x, the activation, ``ffw_layer_2``,
  clip, RMSNorm, times ``residual_weight``, the residual), attention (clip, ``norm_pre_attn``,
  ``self_attn``, clip, ``norm_post_attn``, the residual), a light convolution (``lconv1d``:
  RMSNorm, ``linear_start`` to 2x, GLU, a causal depthwise ``depthwise_conv1d`` of
  ``conv_kernel_size`` taps, clip, ``conv_norm``, the activation, ``linear_end``, the
  residual), a second feed-forward (``feed_forward2``), clip and ``norm_out``. The layers'
  RMSNorms take eps 1e-6 whatever the config says (Gemma4RMSNorm's default, as
  transformers builds them), ``lconv1d``'s ``rms_norm_eps``; every RMSNorm scales by ``w``;
- ``self_attn``: queries times ``head_dim ** -0.5 / ln 2`` and ``softplus(per_dim_scale)``,
  keys times ``ln(1 + e) / ln 2``, local attention with relative logits from
  ``relative_k_proj`` of a sinusoidal table and a softcap (``operators.local_attention``),
  ``post``;
- ``output_proj`` (with bias) to ``output_proj_dims``; ``embed_audio``: RMSNorm without
  weight, ``embedding_projection`` to the text model's width.

transformers runs a batch's padded frames and masks them (the convolutions' inputs, the
keys); only the sound's own frames are run here, which gives its soft tokens the same
values (a padded frame reaches no kept row but as a zero the convolutions read past the
end). A version is compiled per count of frames, the last few kept.

Not for: the log-mel frames (``semicausal_log_mel``), where soft tokens go (``multimodal``).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ..blocks.norms import Norm, NormOptions
from ..blocks.projections import Linear
from ..graph import CallSpec, Recorder
from ..module import Module, Param
from ..plan import Plan
from ..reference import Reference

#: Gemma4RMSNorm's default eps, which the layers' norms keep (transformers passes no eps).
LAYER_EPS = 1e-6


@dataclass(frozen=True)
class ConformerOptions:
    """The tower's shape (``Gemma4AudioConfig``'s names): ``hidden_size``, ``layers``,
    ``heads``, ``head_dim``, ``act`` (an ACT2FN name), ``eps`` (``rms_norm_eps``),
    ``channels`` (``subsampling_conv_channels``), ``mels`` (the frames' width),
    ``conv_kernel`` (``conv_kernel_size``), ``residual_weight``, ``chunk``, ``left`` and
    ``right`` (``attention_chunk_size``, ``attention_context_left``,
    ``attention_context_right``), ``logit_cap``, ``clip`` (``gradient_clipping``),
    ``clipped`` (``use_clipped_linears``), ``output`` (``output_proj_dims``) and
    ``text_hidden``, the text model's width."""

    hidden_size: int
    layers: int
    heads: int
    head_dim: int
    act: str
    eps: float
    channels: tuple[int, int]
    mels: int
    conv_kernel: int
    residual_weight: float
    chunk: int
    left: int
    right: int
    logit_cap: float
    clip: float
    clipped: bool
    output: int
    text_hidden: int

    @property
    def positions(self) -> int:
        """Rows of the relative position table: ``context_size // 2 + 1``
        (Gemma4AudioRelPositionalEncoding)."""
        return (self.chunk + self.left - 1 + self.right) // 2 + 1

    @property
    def bins(self) -> int:
        """Mel rows left after the two stride-2 convolutions."""
        return _halved(_halved(self.mels))


def _halved(n: int) -> int:
    """Rows a 3-tap convolution of stride 2 and padding 1 leaves of ``n``."""
    return (n + 2 - 3) // 2 + 1


class ClippableLinear(Module):
    """Gemma4ClippableLinear: ``linear`` (no bias) and, where ``clipped``, the scalar bounds
    clipping its input (``input_min``, ``input_max``) and output (``output_min``,
    ``output_max``); an infinite bound clips nothing."""

    def __init__(self, in_features: int, out_features: int, clipped: bool):
        self.linear = Linear(in_features, out_features)
        self.clipped = clipped
        if clipped:
            for name in ("input_min", "input_max", "output_min", "output_max"):
                # Drawn (a toy without a checkpoint) so they clip: between 0.5 and 3 off 0.
                low = name.endswith("_min")
                bound = Param(draw=("uniform", -3.0, -0.5) if low else ("uniform", 0.5, 3.0))
                bound.infinite = True  # transformers' own init: +-inf, clipping nothing
                setattr(self, name, bound)

    def _clip(self, rec: Recorder, x, low: str, high: str):
        lo, hi = float(getattr(self, low).array), float(getattr(self, high).array)
        if lo == -math.inf and hi == math.inf:
            return x
        return rec.step("clip", x, where=self.path, low=lo, high=hi)

    def __call__(self, rec: Recorder, x):
        if self.clipped:
            x = self._clip(rec, x, "input_min", "input_max")
        x = self.linear(rec, x)
        if self.clipped:
            x = self._clip(rec, x, "output_min", "output_max")
        return x


def _clamp(rec: Recorder, x, o: ConformerOptions, where: str):
    """torch.clamp to +-gradient_clipping (none where float32 holds nothing past it)."""
    if o.clip >= float(np.finfo(np.float32).max):
        return x
    return rec.step("clamp", x, where=where, limit=o.clip)


class _SubsampleLayer(Module):
    def __init__(self, c_in: int, c_out: int, eps: float):
        self.conv = Module()
        self.conv.weight = Param(c_out, c_in, 3, 3)
        self.norm = Norm(c_out, NormOptions("layer", eps, bias=False))

    def __call__(self, rec: Recorder, x):
        w = rec.hold("param", self.conv.where("weight"), self.conv.weight.array)
        x = rec.step("conv2d", x, w, where=self.conv.path, stride=2, padding=1)
        rows, cols, c = x.shape
        x = self.norm(rec, rec.view(x, (rows * cols, c)))
        x = rec.step("activation", x, where=self.path, act="relu")
        return rec.view(x, (rows, cols, c))


class _Subsample(Module):
    def __init__(self, o: ConformerOptions):
        c0, c1 = o.channels
        self.layer0 = _SubsampleLayer(1, c0, o.eps)
        self.layer1 = _SubsampleLayer(c0, c1, o.eps)
        # transformers sizes the projection by channels[0] // 4 mel rows, which the frames'
        # mel_bins give only where they agree (ConformerTower refuses the others).
        self.input_proj_linear = Linear((c0 // 4) * c1, o.hidden_size)

    def __call__(self, rec: Recorder, x):
        x = self.layer1(rec, self.layer0(rec, x))
        rows, cols, c = x.shape
        return self.input_proj_linear(rec, rec.view(x, (rows, cols * c)))


class _FeedForward(Module):
    def __init__(self, o: ConformerOptions):
        E = o.hidden_size
        self.ffw_layer_1 = ClippableLinear(E, 4 * E, o.clipped)
        self.ffw_layer_2 = ClippableLinear(4 * E, E, o.clipped)
        self.pre_layer_norm = Norm(E, NormOptions("rms", LAYER_EPS))
        self.post_layer_norm = Norm(E, NormOptions("rms", LAYER_EPS))
        self.options = o

    def __call__(self, rec: Recorder, x):
        o = self.options
        h = self.pre_layer_norm(rec, _clamp(rec, x, o, self.path))
        h = rec.step("activation", self.ffw_layer_1(rec, h), where=self.path, act=o.act)
        h = self.post_layer_norm(rec, _clamp(rec, self.ffw_layer_2(rec, h), o, self.path))
        return rec.step("add", x, h, where=self.path, scale=o.residual_weight)


class _Attention(Module):
    def __init__(self, o: ConformerOptions):
        E, H, D = o.hidden_size, o.heads, o.head_dim
        self.q_proj = ClippableLinear(E, H * D, o.clipped)
        self.k_proj = ClippableLinear(E, H * D, o.clipped)
        self.v_proj = ClippableLinear(E, H * D, o.clipped)
        self.post = ClippableLinear(H * D, E, o.clipped)
        self.relative_k_proj = Linear(E, H * D)
        self.per_dim_scale = Param(D)
        self.options = o

    def __call__(self, rec: Recorder, x, table):
        o = self.options
        n, H, D = x.shape[0], o.heads, o.head_dim
        # Gemma4AudioAttention's scales, in its order: q * q_scale * softplus(per_dim_scale)
        # (F.softplus in float32: log1p(exp(x)), x itself past 20), k * k_scale.
        p = self.per_dim_scale.array.astype(np.float32)
        softplus = np.where(p > 20, p, np.log1p(np.exp(np.minimum(p, 20)))).astype(np.float32)
        q = rec.step("mul", self.q_proj(rec, x), where=self.path,
                     scale=(D ** -0.5) / math.log(2))
        q = rec.step("mul", rec.view(q, (n, H, D)),
                     rec.hold("const", self.where("softplus"), softplus), where=self.path)
        k = rec.step("mul", self.k_proj(rec, x), where=self.path,
                     scale=math.log(1 + math.e) / math.log(2))
        v = self.v_proj(rec, x)
        rel = self.relative_k_proj(rec, table)
        a = rec.step("local_attention", q, rec.view(k, (n, H, D)), rec.view(v, (n, H, D)),
                     rec.view(rel, (table.shape[0], H, D)), where=self.path,
                     behind=o.left - 2, ahead=max(o.right - 1, 0), origin=o.left - 1,
                     cap=o.logit_cap)
        return self.post(rec, a)


class _LightConv(Module):
    def __init__(self, o: ConformerOptions):
        E = o.hidden_size
        self.linear_start = ClippableLinear(E, 2 * E, o.clipped)
        self.linear_end = ClippableLinear(E, E, o.clipped)
        self.depthwise_conv1d = Module()
        self.depthwise_conv1d.weight = Param(E, o.conv_kernel)
        self.depthwise_conv1d.weight.reshaped = (E, 1, o.conv_kernel)
        self.pre_layer_norm = Norm(E, NormOptions("rms", o.eps))
        self.conv_norm = Norm(E, NormOptions("rms", o.eps))
        self.options = o

    def __call__(self, rec: Recorder, x):
        o, E = self.options, self.options.hidden_size
        h = self.linear_start(rec, self.pre_layer_norm(rec, x))
        # GLU: the first half times the sigmoid of the second.
        a = rec.step("columns", h, where=self.path, begin=0, end=E)
        b = rec.step("columns", h, where=self.path, begin=E, end=2 * E)
        h = rec.step("gated_activation", b, a, where=self.path, act="sigmoid")
        conv = self.depthwise_conv1d
        w = rec.hold("param", conv.where("weight"), conv.weight.array)
        # Left-padded by kernel - 1 zeros (Gemma4AudioCausalConv1d): a fresh state.
        state = rec.hold("const", conv.where("state"),
                         np.zeros((o.conv_kernel - 1, E), np.float32))
        h = rec.step("causal_conv", h, w, None, state, where=conv.path, start=0)
        h = self.conv_norm(rec, _clamp(rec, h, o, self.path))
        h = rec.step("activation", h, where=self.path, act=o.act)
        return rec.step("add", x, self.linear_end(rec, h), where=self.path)


class _Layer(Module):
    def __init__(self, o: ConformerOptions):
        E = o.hidden_size
        self.feed_forward1 = _FeedForward(o)
        self.feed_forward2 = _FeedForward(o)
        self.self_attn = _Attention(o)
        self.lconv1d = _LightConv(o)
        rms = NormOptions("rms", LAYER_EPS)
        self.norm_pre_attn = Norm(E, rms)
        self.norm_post_attn = Norm(E, rms)
        self.norm_out = Norm(E, rms)
        self.options = o

    def __call__(self, rec: Recorder, x, table):
        o = self.options
        x = self.feed_forward1(rec, x)
        a = self.self_attn(rec, self.norm_pre_attn(rec, _clamp(rec, x, o, self.path)), table)
        x = rec.step("add", x, self.norm_post_attn(rec, _clamp(rec, a, o, self.path)),
                     where=self.path)
        x = self.feed_forward2(rec, self.lconv1d(rec, x))
        return self.norm_out(rec, _clamp(rec, x, o, self.path))


class ConformerTower(Module):
    """``subsample_conv_projection``, ``layers``, ``output_proj`` and ``embed_audio``
    (module docstring). ``version(frames)`` is the tower compiled for ``frames`` frames of
    sound.

    Raises:
        ValueError: a window holding no key (``attention_context_left`` below 2 with no
            right context), a depthwise kernel under 2, or mel bins that the subsampling's
            projection does not take (``channels[0] // 4`` rows after two stride-2
            convolutions).
    """

    #: Versions kept (each one frame count's plan): a version's arena is about 47 KiB a
    #: frame (140 MiB for 30 s of sound at the released widths, most of it the subsampling's
    #: maps) and compiles in tens of milliseconds, so few are kept.
    KEEP = 2

    def __init__(self, o: ConformerOptions):
        if o.left < 2 and o.right < 1:
            raise ValueError(f"attention_context_left {o.left} and attention_context_right "
                             f"{o.right}: a row's window holds no key")
        if o.conv_kernel < 2:
            raise ValueError(f"conv_kernel_size {o.conv_kernel}: a causal convolution of 2 "
                             "taps or more")
        if o.bins != o.channels[0] // 4:
            raise ValueError(f"{o.mels} mel bins leave {o.bins} after the subsampling's two "
                             f"stride-2 convolutions, and its projection takes "
                             f"subsampling_conv_channels[0] // 4 = {o.channels[0] // 4}")
        E = o.hidden_size
        self.subsample_conv_projection = _Subsample(o)
        self.layers = [_Layer(o) for _ in range(o.layers)]
        self.output_proj = Linear(E, o.output, bias=True)
        self.embed_audio = Module()
        self.embed_audio.embedding_pre_projection_norm = Norm(
            o.output, NormOptions("rms", o.eps, weight=False))
        self.embed_audio.embedding_projection = Linear(o.output, o.text_hidden)
        self.options = o
        self.name_tree()
        self._versions: OrderedDict[int, ConformerVersion] = OrderedDict()
        self._lock = threading.Lock()

    def soft(self, frames: int) -> int:
        """Soft tokens ``frames`` frames of sound give (two stride-2 convolutions)."""
        return _halved(_halved(frames)) if frames > 0 else 0

    def table(self) -> np.ndarray:
        """The sinusoidal table ``(positions, hidden)`` float32 relative_k_proj reads: row
        ``j`` the sines then cosines of position ``positions - 1 - j`` by ``hidden // 2``
        timescales from 1 to 10000, in float32 as Gemma4AudioRelPositionalEncoding forms
        them."""
        o = self.options
        half = o.hidden_size // 2
        step = math.log(10000.0) / max(half - 1, 1)
        inv = np.exp(np.arange(half, dtype=np.float32) * np.float32(-step)).astype(np.float32)
        pos = np.arange(o.positions - 1, -1, -1, dtype=np.float32)[:, None]
        t = pos * inv[None, :]
        return np.concatenate([np.sin(t), np.cos(t)], axis=1).astype(np.float32)

    def body(self, rec: Recorder, frames: int):
        """Record the tower for ``frames`` frames ``(frames, mels)`` float32 to soft tokens
        ``(soft, text_hidden)``."""
        o = self.options
        x = rec.input("features", (frames, o.mels), np.float32)
        x = self.subsample_conv_projection(rec, rec.view(x, (frames, o.mels, 1)))
        table = rec.hold("const", "rel_pos_enc.table", self.table())
        for layer in self.layers:
            x = layer(rec, x, table)
        x = self.output_proj(rec, x)
        e = self.embed_audio
        return e.embedding_projection(rec, e.embedding_pre_projection_norm(rec, x))

    def version(self, frames: int) -> "ConformerVersion":
        """The tower compiled for ``frames`` frames (the last ``KEEP`` counts' kept).

        Raises:
            ValueError: no frame.
        """
        frames = int(frames)
        if frames < 1:
            raise ValueError(f"{frames} frames of sound: at least 1")
        with self._lock:
            if frames in self._versions:
                self._versions.move_to_end(frames)
            else:
                self._versions[frames] = ConformerVersion(self, frames)
                while len(self._versions) > self.KEEP:
                    self._versions.popitem(last=False)
            return self._versions[frames]


class ConformerVersion:
    """The tower compiled over one count of frames. ``version(features)`` gives the soft
    tokens ``(soft, text_hidden)`` float32 (a copy) of the sound's frames ``(frames, mels)``
    (the extractor's valid rows); ``reference(features)`` runs the same recording eagerly in
    float64.

    Raises (both, before any work):
        ValueError: frames of another shape.
    """

    def __init__(self, tower: ConformerTower, frames: int, check: bool = False):
        rec = Recorder(CallSpec(True, frames))
        out = tower.body(rec, frames)
        self.shape = rec.inputs["features"].shape
        self.plan = Plan(rec, out, check=check)
        self._reference = Reference(rec, out, {})
        self._lock = threading.Lock()  # one arena: one call at a time

    def _inputs(self, features) -> dict:
        features = np.asarray(features, np.float32)
        if features.shape != self.shape:
            raise ValueError(f"log-mel frames {features.shape}: this version takes "
                             f"{self.shape}")
        return {"features": np.ascontiguousarray(features)}

    def __call__(self, features) -> np.ndarray:
        inputs = self._inputs(features)
        with self._lock:
            return np.array(self.plan.run(inputs, {"rows": self.shape[0]}))

    def reference(self, features) -> np.ndarray:
        return np.asarray(self._reference.run(self._inputs(features), {"rows": self.shape[0]}))
