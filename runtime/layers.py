"""The layers a decoder stacks, composed of ``blocks``: attention and MLP, each with its norms
placed before, after or around it, and its residual add; one layer's options
(``LayerOptions``) and the per-layer inputs it may gate in (``PerLayerInputOptions``).

Not for: the blocks themselves (``blocks``) or the model around the layers (``causal``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .altup import AltUp, AltUpOptions, Laurel, stream
from .blocks.attention import Attention, AttentionOptions
from .blocks.delta_rule import GatedDeltaNet, GatedDeltaOptions
from .blocks.experts import ExpertsOptions, MoE
from .blocks.selective_scan import SelectiveScanMixer, SelectiveScanOptions
from .blocks.ssd import SSDMixer, SSDOptions
from .blocks.mlp import MLP, MLPOptions
from .blocks.norms import Norm, NormOptions
from .blocks.projections import Linear
from .blocks.shared import SharedBlock, SharedBlockOptions
from .blocks.short_conv import ShortConv, ShortConvOptions
from .graph import Handle, Recorder
from .latent import LatentAttention
from .module import Module, Param

PLACEMENTS = ("pre", "post", "sandwich", "post_residual")
KINDS = ("decoder", "sandwich", "ple")
#: What a layer's token mixer may be (``LayerOptions.mixer``): attention (``blocks.attention``),
#: one carrying a state (``blocks.short_conv``, ``selective_scan``, ``ssd``, ``delta_rule``), or
#: none (a layer of its MLP alone).
MIXER_KINDS = ("attention", "short_conv", "selective_scan", "ssd", "gated_delta", "none")
#: The attribute each mixer is held under in a layer (its checkpoint names' part).
MIXER_NAMES = {"attention": "self_attn", "short_conv": "conv", "selective_scan": "ssm",
               "ssd": "ssm", "gated_delta": "linear_attn"}


@dataclass(frozen=True)
class LayerOptions:
    """One layer. ``kind``: ``decoder`` (norms placed by ``placement``) or ``sandwich``
    (``placement`` ``sandwich``). ``placement``: ``pre`` (``x + attn(norm(x))``, then
    ``x + mlp(norm(x))``, LlamaDecoderLayer), ``post`` (``x + norm(attn(x))``, then
    ``x + norm(mlp(x))``, Olmo2DecoderLayer) or ``sandwich`` (``x + norm(attn(norm(x)))``,
    then ``x + norm(mlp(norm(x)))``, Gemma2DecoderLayer). ``residual_scale`` multiplies each
    block's output before its residual add (1.0: none). ``ple``: a ``sandwich`` layer, then
    a per-layer input gated in (``per_layer_input``; None: none), then the whole output
    times a learned ``layer_scalar`` (Gemma4TextDecoderLayer).

    ``parallel`` (kind ``decoder``, placement ``pre``): attention and MLP both read the
    layer's input and one residual add sums them, ``x + (attn(n1(x)) + mlp(n2(x)))``
    (GPTNeoXLayer with ``use_parallel_residual``, GPTJBlock, PhiDecoderLayer,
    CohereDecoderLayer, FalconDecoderLayer with ``parallel_attn``); ``shared_norm``: n1 and
    n2 are one ``input_layernorm`` (GPT-J, Phi, Cohere), else n2 is
    ``post_attention_layernorm`` (GPT-NeoX's names). ``attention_norm`` false (a ``pre``
    decoder, not parallel): no ``input_layernorm``, the attention reads the layer's input as
    it is (ModernBertDecoderLayer's ``attn_norm``, an Identity at layer 0).
    ``residual_weights`` (not parallel): each residual add weighs the stream per channel,
    ``w * x + block(x)``, by ``input_residual`` (the attention's) and
    ``post_attention_residual`` (the MLP's), ``(hidden,)`` each (DogeDecoderLayer).
    ``residual_gates`` (not parallel): each residual add blends the block's output ``b`` and
    the stream ``x`` per channel, ``sigmoid(w) * b + sqrt(1 + sigmoid(w)) * exp(-softplus(w)
    / 2) * x``, by ``attention_residual_gate.weight`` and ``feedforward_residual_gate.weight``
    ``(hidden,)`` (ErgoResidualGate).
    ``laurel_rank`` (above 0; not parallel, with an attention norm): a low-rank branch on
    the attention norm's output ``h``, ``h + post_laurel_norm(linear_right(linear_left(h)))``,
    added to the attention's residual sum and the whole times ``2 ** -0.5``
    (``runtime.altup.Laurel``, Gemma3nTextLaurelBlock). ``altup``: the layer runs on one of
    several residual streams (``AltUpOptions``; None: one stream). ``experts``: a mixture of
    experts in place of the MLP, or beside it (``runtime.blocks.experts``; None: the dense
    MLP alone).

    ``mixer``: the layer's token mixers (``MIXER_KINDS``), summed where more
    than one (FalconH1DecoderLayer's Mamba2 beside its attention): ``attention``, a state
    carrying mixer whose options are the field of its name (``short_conv``,
    ``selective_scan``: Mamba's; ``ssd``: Mamba2's; ``gated_delta``), or ``none``, a layer of its MLP alone (NemotronHBlock's
    MLP layers), whose norm is then ``input_layernorm``. An MLP of kind ``none`` leaves the
    layer its mixer alone (MambaBlock, NemotronH's mixer layers). ``mixer_scales``: each
    mixer's input and output times ``(in, out)`` (FalconH1's ``attention_in_multiplier``,
    ``attention_out_multiplier``, ``ssm_in_multiplier``, ``ssm_out_multiplier``); None: 1.

    ``shared_block``: the layer runs the model's shared transformer block first (its options,
    ``runtime.blocks.shared``; None: it does not): a ``HybridLayer`` around a pre decoder of
    its mixer alone, ``x + mixer(input_layernorm(x + shared_linear(block(x, embeddings))))``,
    as Zamba2HybridLayer then Zamba2MambaDecoderLayer."""

    attention: AttentionOptions
    mlp: MLPOptions
    norm: NormOptions
    kind: str = "decoder"
    residual_scale: float = 1.0
    placement: str = "pre"
    per_layer_input: "PerLayerInputOptions | None" = None
    parallel: bool = False
    shared_norm: bool = True
    attention_norm: bool = True
    residual_weights: bool = False
    residual_gates: bool = False
    laurel_rank: int = 0
    altup: "AltUpOptions | None" = None
    experts: ExpertsOptions | None = None
    mixer: tuple[str, ...] = ("attention",)
    mixer_scales: tuple[tuple[float, float], ...] | None = None
    short_conv: ShortConvOptions | None = None
    selective_scan: SelectiveScanOptions | None = None
    ssd: SSDOptions | None = None
    gated_delta: GatedDeltaOptions | None = None
    shared_block: SharedBlockOptions | None = None


@dataclass(frozen=True)
class PerLayerInputOptions:
    """Per-layer inputs: a second input for every layer, ``size`` wide, drawn from the token
    and the model's embeddings, as transformers' Gemma4TextModel ``get_per_layer_inputs`` and
    ``project_per_layer_inputs``.

    The model holds ``embed_tokens_per_layer`` ``(vocab_size, layers * size)`` (rows times
    ``embedding_scale``), ``per_layer_model_projection`` ``(layers * size, hidden)`` (its
    output times ``projection_scale``, then ``per_layer_projection_norm`` over each layer's
    ``size``); a layer's input is ``(projection + embedding) * mix_scale``, its slice of the
    ``layers * size``. A layer gates it in: ``x + norm(per_layer_projection(act(
    per_layer_input_gate(x)) * input))`` (``act`` a ``hidden_act`` name). ``outside_row``:
    the row of ``embed_tokens_per_layer`` an id past its ``vocab_size`` reads
    (Gemma3nTextModel.get_per_layer_inputs reads row 0; None: such an id is refused).
    """

    size: int
    vocab_size: int
    act: str = "gelu_pytorch_tanh"
    embedding_scale: float = 1.0
    projection_scale: float = 1.0
    mix_scale: float = 1.0
    outside_row: int | None = None


class DecoderLayer(Module):
    """Attention then MLP, each added to the residual, norms placed by ``o.placement``.

    Param names are transformers': ``pre`` has ``input_layernorm`` and (before the MLP)
    ``post_attention_layernorm`` (LlamaDecoderLayer); ``post`` has ``post_attention_layernorm``
    and ``post_feedforward_layernorm`` on the blocks' outputs (Olmo2DecoderLayer);
    ``sandwich`` has all four of ``input_layernorm``, ``post_attention_layernorm``,
    ``pre_feedforward_layernorm`` and ``post_feedforward_layernorm`` (Gemma2DecoderLayer);
    ``post_residual`` norms each residual sum, ``n = post_attention_layernorm(x + attn(x))``
    then ``post_feedforward_layernorm(n + mlp(n))``, as OpenAIGPT's ``Block`` (``ln_1``,
    ``ln_2``) and BertLayer.

    A per-layer input (``o.per_layer_input``, kinds ``sandwich`` and ``ple``) is gated in
    after the MLP: ``x + post_per_layer_input_norm(per_layer_projection(act(
    per_layer_input_gate(x)) * input))``. Kind ``ple`` is ``sandwich`` with the per-layer
    input and then the output times ``layer_scalar`` ``(1,)``, as Gemma4TextDecoderLayer.

    ``laurel`` (``o.laurel_rank``, ``runtime.altup.Laurel``): after the attention's residual
    add, ``(x + laurel(h)) * 2 ** -0.5``, ``h`` the attention norm's output, as
    Gemma3nTextDecoderLayer's ``attn_laurel``. ``altup`` (``o.altup``): the layer takes and
    returns the streams ``(n, K, E)``: ``altup.predict`` them, run the blocks on the active
    prediction, ``altup.correct`` the predictions by their output; the per-layer input is
    then gated from the corrected active stream (times ``correct_output_scale``) and added to
    streams 1 onward, as Gemma3nTextDecoderLayer.forward.

    ``parallel`` (kind ``decoder``, placement ``pre``): ``x + (attn(input_layernorm(x)) +
    mlp(n(x)))``, ``n`` the same ``input_layernorm`` where ``shared_norm`` (PhiDecoderLayer,
    GPTJBlock), else ``post_attention_layernorm`` (GPTNeoXLayer with
    ``use_parallel_residual``). transformers sums in other orders (GPT-NeoX ``m + a + x``,
    Cohere ``x + a + m``): float32 rounding of one add apart.

    ``attention_norm`` false (``pre``, not parallel): no ``input_layernorm``, the attention
    reads ``x`` as it is (ModernBertDecoderLayer's ``attn_norm``, an Identity at layer 0).

    ``experts`` (``o.experts``): ``mlp`` is the mixture of experts (``runtime.blocks.experts
    .MoE``) reading what the MLP would; with ``beside`` (a sandwich layer), the dense ``mlp``
    and the mixture ``moe`` both read the residual stream, each through norms of its own:
    ``post_feedforward_layernorm_1(mlp(pre_feedforward_layernorm(x))) +
    post_feedforward_layernorm_2(moe(pre_feedforward_layernorm_2(x)))`` (its router reading
    ``x`` itself), then ``post_feedforward_layernorm``, as Gemma4TextDecoderLayer with
    ``enable_moe_block``.

    Raises:
        ValueError: an unknown kind or placement, ``per_layer_input`` on another kind,
            ``parallel`` on a layer other than a ``pre`` decoder, or a layer without its
            attention norm other than a ``pre`` decoder that is not parallel.
    """

    def __init__(self, hidden_size: int, o: LayerOptions, max_seq_len: int):
        if o.kind not in KINDS:
            raise ValueError(f"layer kind {o.kind!r} is not one of {', '.join(KINDS)}")
        if o.per_layer_input is not None and o.kind not in ("sandwich", "ple"):
            raise ValueError(f"layer kind {o.kind!r} takes no per-layer input (kinds sandwich "
                             "and ple do)")
        placement = "sandwich" if o.kind in ("sandwich", "ple") else o.placement
        if placement not in PLACEMENTS:
            raise ValueError(f"norm placement {placement!r} is not one of {', '.join(PLACEMENTS)}")
        if o.parallel and (o.kind != "decoder" or placement != "pre"):
            raise ValueError(f"a parallel layer is a decoder placed pre, not kind {o.kind!r} "
                             f"placed {placement!r}")
        if not o.attention_norm and (placement != "pre" or o.parallel):
            raise ValueError("a layer without its attention norm is a decoder placed pre, not "
                             f"placed {placement!r}{' and parallel' if o.parallel else ''}")
        E, n = hidden_size, o.norm
        held = placement not in ("post", "post_residual") and o.attention_norm
        self.input_layernorm = Norm(E, n) if held else None
        self._mixers(E, o, max_seq_len, placement)
        shared = (o.parallel and o.shared_norm) or o.mlp.kind == "none" or o.mixer == ("none",)
        self.post_attention_layernorm = None if shared else Norm(E, n)
        self.pre_feedforward_layernorm = Norm(E, n) if placement == "sandwich" else None
        x = o.experts
        self.mlp = MoE(E, x, n) if x is not None and not x.beside else \
            MLP(E, o.mlp) if o.mlp.kind != "none" else None
        if x is not None and x.beside:
            if placement != "sandwich":
                raise ValueError("experts beside the MLP have their norms around both: a "
                                 f"sandwich layer, not placed {placement!r}")
            self.moe = MoE(E, x, n)
            self.pre_feedforward_layernorm_2 = Norm(E, n)
            self.post_feedforward_layernorm_1 = Norm(E, n)
            self.post_feedforward_layernorm_2 = Norm(E, n)
        self.post_feedforward_layernorm = Norm(E, n) if placement != "pre" else None
        p = o.per_layer_input
        if p is not None:
            self.per_layer_input_gate = Linear(E, p.size)
            self.per_layer_projection = Linear(p.size, E)
            self.post_per_layer_input_norm = Norm(E, n)
        if o.kind == "ple":
            self.layer_scalar = Param(1, gain=True)
        if o.laurel_rank:
            if not held or o.parallel:
                raise ValueError("laurel branches off the attention norm's output: a layer "
                                 "holding input_layernorm, not parallel")
            self.laurel = Laurel(E, o.laurel_rank, n)
        if o.altup is not None:
            self.altup = AltUp(E, o.altup, n)
        if o.residual_weights:
            if o.parallel or placement == "post_residual":
                raise ValueError("residual weights weigh each block's residual add: not in a "
                                 f"parallel layer nor placed {placement!r}")
            self.input_residual = Param(E, gain=True)
            self.post_attention_residual = Param(E, gain=True)
        if o.residual_gates:
            if o.parallel or placement == "post_residual" or o.residual_weights:
                raise ValueError("residual gates blend each block's residual add: not in a "
                                 f"parallel layer nor placed {placement!r}, nor with residual "
                                 "weights")
            self.attention_residual_gate = ResidualGate(E)
            self.feedforward_residual_gate = ResidualGate(E)
        self.placement = placement
        self.options = o

    def _mixers(self, E: int, o: LayerOptions, max_seq_len: int, placement: str) -> None:
        """The layer's token mixers, each under its name (``MIXER_NAMES``);
        ``self_attn`` None where attention is not among them.

        Raises:
            ValueError: an unknown mixer, one named twice, ``none`` beside another, a
                mixer without its options, or a layer of neither mixer nor MLP, or of only
                one of them placed other than a pre decoder that is not parallel.
        """
        kinds = o.mixer
        unknown = [k for k in kinds if k not in MIXER_KINDS]
        if unknown or not kinds or len(set(kinds)) != len(kinds) or \
                ("none" in kinds and len(kinds) > 1):
            raise ValueError(f"layer mixers {list(kinds)} are not distinct ones of "
                             f"{', '.join(MIXER_KINDS)} (none alone)")
        alone = kinds == ("none",) or o.mlp.kind == "none"
        if alone and (kinds == ("none",) and o.mlp.kind == "none"):
            raise ValueError("a layer of no mixer and no MLP does nothing")
        if alone and (placement != "pre" or o.parallel or o.kind != "decoder"):
            raise ValueError("a layer of its mixer or its MLP alone is a decoder placed pre, "
                             "not parallel")
        if o.mixer_scales is not None and len(o.mixer_scales) != len(kinds):
            raise ValueError(f"{len(o.mixer_scales)} mixer scales for {len(kinds)} mixers")
        attention = Attention if o.attention.latent is None else LatentAttention
        self.self_attn = attention(E, o.attention, max_seq_len, o.norm) \
            if "attention" in kinds else None
        build = {"short_conv": ShortConv, "selective_scan": SelectiveScanMixer, "ssd": SSDMixer,
                 "gated_delta": GatedDeltaNet}
        for kind in kinds:
            if kind in build:
                options = getattr(o, kind)
                if options is None:
                    raise ValueError(f"a {kind} mixer needs its options (layer {kind})")
                setattr(self, MIXER_NAMES[kind], build[kind](E, options))

    def _mix(self, rec: Recorder, h: Handle, ropes) -> Handle:
        """The token mixers on ``h``, each's input and output scaled (``mixer_scales``),
        summed in the order given."""
        o, out = self.options, None
        for i, kind in enumerate(o.mixer):
            scale_in, scale_out = (1.0, 1.0) if o.mixer_scales is None else o.mixer_scales[i]
            x = h if scale_in == 1.0 else rec.step("mul", h, where=self.path, scale=scale_in)
            y = getattr(self, MIXER_NAMES[kind])(rec, x, ropes)
            if scale_out != 1.0:
                y = rec.step("mul", y, where=self.path, scale=scale_out)
            out = y if out is None else rec.step("add", out, y, where=self.path)
        return out

    def __call__(self, rec: Recorder, x: Handle, ropes, per_layer: Handle | None = None,
                 embeddings: Handle | None = None) -> Handle:
        """The attention then the MLP, each around its norms and added to ``x``; for kind
        ``ple``, then ``per_layer`` ``(n, size)`` gated in and the sum times the scalar.
        ``embeddings``: the model's (read by a ``HybridLayer``'s shared block; unread here)."""
        if self.options.altup is not None:
            return self._altup(rec, x, ropes, per_layer)
        x = self._blocks(rec, x, ropes)
        if self.options.per_layer_input is not None:
            x = self.residual(rec, x, self._per_layer(rec, x, per_layer))
        if self.options.kind == "ple":
            scalar = rec.hold("param", self.where("layer_scalar"), self.layer_scalar.array)
            x = rec.step("mul", x, scalar, where=self.path)
        return x

    def _per_layer(self, rec: Recorder, x: Handle, per_layer: Handle) -> Handle:
        """``post_per_layer_input_norm(per_layer_projection(act(per_layer_input_gate(x)) *
        per_layer))`` ``(n, E)``, what the per-layer input adds."""
        g = rec.step("gated_activation", self.per_layer_input_gate(rec, x), per_layer,
                     where=self.path, act=self.options.per_layer_input.act)
        return self.post_per_layer_input_norm(rec, self.per_layer_projection(rec, g))

    def _altup(self, rec: Recorder, streams: Handle, ropes, per_layer: Handle | None) -> Handle:
        active = self.options.altup.active
        predictions = self.altup.predict(rec, streams)
        x = self._blocks(rec, stream(rec, predictions, active, self.path), ropes)
        corrected = self.altup.correct(rec, predictions, x)
        if self.options.per_layer_input is None:
            return corrected
        first = self.altup.scale_corrected(rec, stream(rec, corrected, active, self.path))
        # Streams 1 onward, whichever is active (transformers' corrected_predictions[1:]).
        return rec.step("add_to_streams", corrected, self._per_layer(rec, first, per_layer),
                        where=self.path, begin=1)

    def _blocks(self, rec: Recorder, x: Handle, ropes) -> Handle:
        if self.options.mixer == ("none",):  # the MLP alone, on the layer's input norm
            return self.residual(rec, x, self.mlp(rec, self.input_layernorm(rec, x)))
        if self.options.parallel:
            h = self.input_layernorm(rec, x)
            a = self._mix(rec, h, ropes)
            n2 = self.post_attention_layernorm
            m = self.mlp(rec, h if n2 is None else n2(rec, x))
            return self.residual(rec, x, rec.step("add", a, m, where=self.path))
        if self.placement == "post_residual":
            x = self.post_attention_layernorm(rec, self.residual(rec, x, self._mix(rec, x, ropes)))
            return self.post_feedforward_layernorm(rec, self.residual(rec, x, self.mlp(rec, x)))
        pre = self.placement == "pre"
        before_attn = self.input_layernorm
        after_attn = None if pre else self.post_attention_layernorm
        before_mlp = self.post_attention_layernorm if pre else self.pre_feedforward_layernorm
        after_mlp = self.post_feedforward_layernorm
        h = before_attn(rec, x) if before_attn else x
        a = self._mix(rec, h, ropes)
        x = self.residual(rec, x, after_attn(rec, a) if after_attn else a, "input_residual")
        if self.options.laurel_rank:
            x = rec.step("mul", rec.step("add", x, self.laurel(rec, h), where=self.path),
                         where=self.path, scale=2 ** -0.5)
        if self.mlp is None:  # the mixer alone
            return x
        m = self.mlp(rec, before_mlp(rec, x) if before_mlp else x)
        if self.options.experts is not None and self.options.experts.beside:
            m = self._beside(rec, x, m)
        return self.residual(rec, x, after_mlp(rec, m) if after_mlp else m,
                             "post_attention_residual")

    def _beside(self, rec: Recorder, x: Handle, m: Handle) -> Handle:
        """The dense MLP's output ``m`` and the mixture's on the residual ``x``, each
        normed, summed (``experts.beside``)."""
        m = self.post_feedforward_layernorm_1(rec, m)
        e = self.moe(rec, self.pre_feedforward_layernorm_2(rec, x), router_input=x)
        e = self.post_feedforward_layernorm_2(rec, e)
        return rec.step("add", m, e, where=self.path)

    def residual(self, rec: Recorder, x: Handle, y: Handle, weight: str | None = None) -> Handle:
        """``x + scale * y``; where the layer holds residual weights, ``x`` first times the
        param ``weight`` names (``residual_weights``: ``input_residual * residual +
        hidden_states``, DogeDecoderLayer's)."""
        if weight is not None and self.options.residual_weights:
            w = rec.hold("param", self.where(weight), getattr(self, weight).array)
            x = rec.step("mul", x, w, where=self.where(weight))
        if weight is not None and self.options.residual_gates:
            gate = (self.attention_residual_gate if weight == "input_residual"
                    else self.feedforward_residual_gate)
            on_branch, on_stream = gate.coefficients()
            where = gate.path
            y = rec.step("mul", y, rec.hold("const", f"{where}.branch", on_branch), where=where)
            x = rec.step("mul", x, rec.hold("const", f"{where}.stream", on_stream), where=where)
        return rec.step("add", x, y, where=self.path, scale=self.options.residual_scale)


class HybridLayer(Module):
    """A layer that runs the model's shared transformer block before its own mixer, as
    transformers' Zamba2HybridLayer: ``shared_block`` (this use of it,
    ``runtime.blocks.shared.SharedBlock``), ``shared_linear`` ``(hidden, hidden)`` (its
    ``linear``) and ``decoder``, the layer's own pre decoder of its mixer alone
    (Zamba2MambaDecoderLayer, its ``mamba_decoder``): ``x + mixer(input_layernorm(x + t))``,
    ``t = shared_linear(shared_block(x, embeddings))`` added to the mixer's input, not to its
    residual. ``shared_use``: this use's index among the block's uses and the uses of its
    weight set (``runtime.causal.shared_use``). ``self_attn`` is None (the decoder's mixer
    is no attention); ``options`` are the layer's.

    Raises:
        ValueError: the decoder is not a pre decoder of its mixer alone (mlp kind none, no
            experts), or ``o`` has no shared block.
    """

    def __init__(self, hidden_size: int, o: LayerOptions, max_seq_len: int,
                 shared_use: tuple[int, tuple[int, ...]]):
        if o.shared_block is None:
            raise ValueError("a hybrid layer runs the shared block: its options hold none")
        if o.kind != "decoder" or o.placement != "pre" or o.parallel or o.mlp.kind != "none" \
                or o.experts is not None or o.mixer == ("none",) or not o.attention_norm:
            raise ValueError("a layer running the shared block is a pre decoder of its mixer "
                             "alone (mlp kind none, no experts)")
        use, uses = shared_use
        self.shared_block = SharedBlock(hidden_size, o.shared_block, max_seq_len, uses, use)
        self.shared_linear = Linear(hidden_size, hidden_size)
        self.decoder = DecoderLayer(hidden_size, replace(o, shared_block=None), max_seq_len)
        self.self_attn = None
        self.options = o

    def __call__(self, rec: Recorder, x: Handle, ropes, per_layer: Handle | None = None,
                 embeddings: Handle | None = None) -> Handle:
        """``x`` ``(n, hidden)`` and the model's ``embeddings`` ``(n, hidden)`` to the
        layer's output ``(n, hidden)``."""
        t = self.shared_linear(rec, self.shared_block(rec, x, embeddings, ropes))
        d = self.decoder
        h = d.input_layernorm(rec, rec.step("add", x, t, where=self.path))
        return d.residual(rec, x, d._mix(rec, h, ropes))


class ResidualGate(Module):
    """ErgoResidualGate's learned ``weight`` ``(hidden,)`` and the two per-channel factors it
    gives a residual add: ``sigmoid(w)`` on the block's output, ``sqrt(1 + sigmoid(w)) *
    exp(-softplus(w) / 2)`` on the stream (computed in float64 from the weight as loaded,
    held as float32 constants; recomputed where the weight changes)."""

    def __init__(self, size: int):
        super().__init__()
        self.weight = Param(size)
        self._factors: tuple[bytes, np.ndarray, np.ndarray] | None = None

    def coefficients(self) -> tuple[np.ndarray, np.ndarray]:
        w = self.weight.array
        key = w.tobytes()
        if self._factors is None or self._factors[0] != key:
            w64 = w.astype(np.float64)
            branch = 1.0 / (1.0 + np.exp(-w64))
            softplus = np.logaddexp(0.0, w64)
            stream = np.sqrt(1.0 + branch) * np.exp(-0.5 * softplus)
            self._factors = (key, branch.astype(np.float32), stream.astype(np.float32))
        return self._factors[1], self._factors[2]
