"""One encoder layer's module tree and body: its attention (or Fourier mixing), MLPs,
norms and residuals, the bottleneck around them, and the projections they are built of.

The modules carry the checkpoint's own names, as transformers' BertLayer names its tensors
(``attention.self.query``, ``attention.output.dense``, ``intermediate.dense``, ...).

Not for: the embeddings, the stack of layers and the compiled model (``encoder``).
"""

from __future__ import annotations

from dataclasses import replace

from .blocks.norms import Norm, NormOptions
from .blocks.projections import Linear, fused_qkv
from .encoder_options import MIXINGS, ENCODER_MLP_KINDS, PLACEMENTS, BottleneckOptions, \
    EncoderLayerOptions, PointwiseGroups, RelativeBiasOptions
from .graph import Handle, Recorder
from .module import Module, Param


class PointwiseConv(Module):
    """``nn.Conv1d(in, out, kernel_size=1, groups=groups)`` over the rows: ``weight`` ``(out,
    in / groups)``, stored as Conv1d's ``(out, in / groups, 1)``, and ``bias`` ``(out,)``;
    one ``grouped_linear`` step (``linear`` where one group).

    Raises:
        ValueError: widths that do not split into ``groups``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, groups: int):
        if groups < 1 or in_features % groups or out_features % groups:
            raise ValueError(f"a pointwise convolution of {in_features} to {out_features} "
                             f"channels does not split into {groups} groups")
        self.weight = Param(out_features, in_features // groups)
        self.weight.reshaped = (out_features, in_features // groups, 1)
        self.bias = Param(out_features) if bias else None
        self.groups = groups

    def __call__(self, rec: Recorder, x: Handle) -> Handle:
        w = rec.hold("param", self.where("weight"), self.weight.array)
        b = None if self.bias is None else rec.hold("param", self.where("bias"), self.bias.array)
        if self.groups == 1:
            return rec.step("linear", x, w, b, where=self.path)
        return rec.step("grouped_linear", x, w, b, where=self.path, groups=self.groups)


def projection(in_features: int, out_features: int, bias: bool,
               groups: PointwiseGroups | None, which: str) -> Module:
    """A Linear, or where ``groups`` says the layer's projections are pointwise
    convolutions, the ``PointwiseConv`` of projection ``which``'s groups."""
    if groups is None:
        return Linear(in_features, out_features, bias)
    return PointwiseConv(in_features, out_features, bias, getattr(groups, which))


class SeparableConv(Module):
    """A depthwise convolution over the rows then a pointwise projection and its bias:
    ConvBERT's SeparableConv1D, its tensors stored as torch's Conv1d lays them out
    (``depthwise.weight`` ``(in, 1, kernel)``, ``pointwise.weight`` ``(out, in, 1)``,
    ``bias`` ``(out, 1)``)."""

    def __init__(self, in_features: int, out_features: int, kernel: int):
        self.depthwise = Module()
        self.depthwise.weight = Param(in_features, kernel)
        self.depthwise.weight.reshaped = (in_features, 1, kernel)
        self.pointwise = Module()
        self.pointwise.weight = Param(out_features, in_features)
        self.pointwise.weight.reshaped = (out_features, in_features, 1)
        self.bias = Param(out_features)
        self.bias.reshaped = (out_features, 1)

    def __call__(self, rec: Recorder, x: Handle) -> Handle:
        dw = rec.hold("param", self.where("depthwise.weight"), self.depthwise.weight.array)
        h = rec.step("depthwise_conv", x, dw, where=self.where("depthwise"))
        pw = rec.hold("param", self.where("pointwise.weight"), self.pointwise.weight.array)
        b = rec.hold("param", self.where("bias"), self.bias.array)
        return rec.step("linear", h, pw, b, where=self.where("pointwise"))


class SelfAttentionProjections(Module):
    """``query``, ``key`` and ``value`` (BertSelfAttention), or one ``query_key_value``
    (``fused_qkv``), and attention over the call's rows."""

    def __init__(self, E: int, o: EncoderLayerOptions, value_in: int | None = None):
        H, G, D = o.heads, o.kv_heads or o.heads, o.head_dim
        if o.fused_qkv:
            if value_in not in (None, E):
                raise ValueError("values of another width than queries and keys: not from a "
                                 "fused query_key_value")
            self.query_key_value = fused_qkv(E, o)
        else:
            if o.qkv_layout != "blocks":
                raise ValueError(f"qkv_layout {o.qkv_layout!r} orders a fused "
                                 "query_key_value's rows: only with fused_qkv")
            pw = o.pointwise
            self.query = projection(E, H * D, o.bias, pw, "query")
            self.key = projection(E, G * D, o.bias if o.k_bias is None else o.k_bias, pw,
                                  "key")
            self.value = projection(E if value_in is None else value_in, G * D, o.bias, pw,
                                    "value")
        if o.span_conv is not None:
            if o.fused_qkv or G != H or value_in not in (None, E):
                raise ValueError("span-based dynamic convolution heads read separate query, "
                                 "key and value projections of one width, a key head per "
                                 "query head")
            self.key_conv_attn_layer = SeparableConv(E, H * D, o.span_conv)
            self.conv_kernel_layer = Linear(H * D, H * o.span_conv, True)
            self.conv_out_layer = Linear(E, H * D, True)
        if o.qk_norm:
            qk = o.norm if o.qk_norm_bias is None else replace(o.norm, bias=o.qk_norm_bias)
            self.q_norm = Norm(H * D, qk)
            self.k_norm = Norm(G * D, qk)
        self._approximate(o, G)
        if o.global_tokens:
            if o.window is None or G != H or o.fused_qkv or o.qk_norm or o.rope is not None \
                    or o.disentangled is not None or o.span_conv is not None \
                    or o.landmarks is not None or o.lsh_expectation is not None:
                raise ValueError("global tokens sit beside a sliding window over separate "
                                 "query, key and value projections, one key head per query "
                                 "head, without q/k norms, RoPE or another attention")
            self.query_global = Linear(E, H * D, o.bias)
            self.key_global = Linear(E, H * D, o.bias)
            self.value_global = Linear(E, H * D, o.bias)
        d = o.disentangled
        if d is not None:
            if G != H or o.rope is not None or o.window is not None:
                raise ValueError("disentangled attention reads one key head per query head, "
                                 "without RoPE or a window")
            if d.share_att_key and o.fused_qkv:
                raise ValueError("share_att_key projects the relative table by the layer's own "
                                 "key and query: not with a fused query_key_value")
            if d.qv_bias:
                self.q_bias = Param(H * D)
                self.v_bias = Param(H * D)
            if d.c2p and not d.share_att_key:
                self.pos_proj = Linear(E, H * D, d.pos_key_bias)
            if d.p2c and not d.share_att_key:
                self.pos_q_proj = Linear(E, H * D, True)
        self.options = o

    def _approximate(self, o: EncoderLayerOptions, G: int) -> None:
        """Landmark and LSH-expectation attention's checks, and the value convolution's taps
        ``conv.weight`` ``(heads, kernel)``, stored as Conv2d's ``(heads, 1, kernel, 1)``."""
        approximate = o.landmarks is not None or o.lsh_expectation is not None
        if approximate and (o.landmarks is not None and o.lsh_expectation is not None
                            or G != o.heads or o.qk_norm or o.rope is not None
                            or o.window is not None or o.disentangled is not None
                            or o.span_conv is not None):
            raise ValueError("landmark or LSH-expectation attention (one of them) reads one key "
                             "head per query head, without q/k norms, RoPE, a window, "
                             "disentangled or span convolution")
        if o.value_conv is not None:
            if not approximate:
                raise ValueError("a value convolution is added to landmark or LSH-expectation "
                                 "attention's output only")
            self.conv = Module()
            self.conv.weight = Param(o.heads, o.value_conv)
            self.conv.weight.reshaped = (o.heads, 1, o.value_conv, 1)

    def _value_conv(self, rec: Recorder, out: Handle, v: Handle) -> Handle:
        """``out`` ``(rows, heads * head_dim)`` plus each head's values ``v`` ``(rows, heads,
        head_dim)`` convolved over the rows by its taps (``out`` where there are none)."""
        o = self.options
        if o.value_conv is None:
            return out
        n = v.shape[0]
        w = rec.hold("param", self.where("conv.weight"), self.conv.weight.array)
        c = rec.step("depthwise_conv", rec.view(v, (n, o.heads * o.head_dim)), w,
                     where=self.where("conv"), group=o.head_dim)
        return rec.step("add", out, c, where=self.path)

    def _project(self, rec: Recorder, x: Handle, values: Handle | None = None
                 ) -> tuple[Handle, Handle, Handle]:
        o = self.options
        if not o.fused_qkv:
            return self.query(rec, x), self.key(rec, x), self.value(rec, x if values is None
                                                                    else values)
        H, G, D = o.heads, o.kv_heads or o.heads, o.head_dim
        qkv = self.query_key_value(rec, x)
        bounds = (0, H * D, (H + G) * D, (H + 2 * G) * D)
        return tuple(rec.step("columns", qkv, where=self.where(name), begin=a, end=b)
                     for name, a, b in zip(("query", "key", "value"), bounds, bounds[1:]))

    def __call__(self, rec: Recorder, x: Handle, rope: tuple[Handle, Handle] | None,
                 bias: tuple[Handle, RelativeBiasOptions] | None = None,
                 rel: Handle | None = None, values: Handle | None = None,
                 marks: Handle | None = None) -> Handle:
        """Attention of ``x`` ``(rows, width)``'s queries and keys over values projected from
        ``values`` (None: ``x``; MobileBERT's bottleneck feeds the layer's input); ``marks``:
        the call's global tokens ``(rows,)`` int32 where the layer reads them."""
        o, n = self.options, x.shape[0]
        H, G, D = o.heads, o.kv_heads or o.heads, o.head_dim
        q, k, v = self._project(rec, x, values)
        if o.span_conv is not None:
            return self._mixed(rec, x, q, k, v)
        if o.qk_norm:
            q, k = self.q_norm(rec, q), self.k_norm(rec, k)
        q, k, v = rec.view(q, (n, H, D)), rec.view(k, (n, G, D)), rec.view(v, (n, G, D))
        if o.disentangled is not None:
            return self._disentangled(rec, q, k, v, rel)
        if o.global_tokens:
            g = [rec.view(p(rec, x), (n, H, D))
                 for p in (self.query_global, self.key_global, self.value_global)]
            return rec.step("global_window_attention", q, k, v, *g, marks, where=self.path,
                            window=o.window)
        if o.landmarks is not None:
            lm = o.landmarks
            a = rec.step("landmark_attention", q, k, v, where=self.path,
                         landmarks=lm.landmarks, segment=lm.segment, iterations=lm.iterations)
            return self._value_conv(rec, a, v)
        if o.lsh_expectation is not None:
            a = rec.step("lsh_expectation_attention", q, k, v, where=self.path,
                         bits=o.lsh_expectation)
            return self._value_conv(rec, a, v)
        if rope is not None:
            # A call is one text from position 0: row r turns by table row r.
            q = rec.step("rope", q, *rope, where=self.where("query"), start=0,
                         interleaved=o.rope.interleaved)
            k = rec.step("rope", k, *rope, where=self.where("key"), start=0,
                         interleaved=o.rope.interleaved)
        if bias is None:
            return rec.step("self_attention", q, k, v, where=self.path, scale=o.scale,
                            window=o.window)
        table, b = bias
        return rec.step("self_attention", q, k, v, table, where=self.path, scale=o.scale,
                        window=o.window, buckets=b.buckets, max_distance=b.max_distance,
                        bidirectional=b.bidirectional)


    def _mixed(self, rec: Recorder, x: Handle, q: Handle, k: Handle, v: Handle) -> Handle:
        """ConvBertSelfAttention: the attention's heads then the dynamic convolution's,
        ``(rows, 2 * heads * head_dim)``."""
        o, n = self.options, x.shape[0]
        H, D, K = o.heads, o.head_dim, o.span_conv
        a = rec.step("self_attention", rec.view(q, (n, H, D)), rec.view(k, (n, H, D)),
                     rec.view(v, (n, H, D)), where=self.path, scale=o.scale)
        mixed = rec.step("mul", self.key_conv_attn_layer(rec, x), q, where=self.path)
        taps = self.conv_kernel_layer(rec, mixed)
        conv = rec.step("dynamic_conv", taps, self.conv_out_layer(rec, x), where=self.path,
                        heads=H, kernel=K)
        both = rec.step("join_heads", rec.view(a, (n, 1, H * D)), rec.view(conv, (n, 1, H * D)),
                        where=self.path)
        return rec.view(both, (n, 2 * H * D))

    def _disentangled(self, rec: Recorder, q: Handle, k: Handle, v: Handle, rel: Handle
                      ) -> Handle:
        """DisentangledSelfAttention over the relative table ``rel`` ``(2 * span, hidden)``."""
        o, d = self.options, self.options.disentangled
        H, D = o.heads, o.head_dim
        R = 2 * d.span
        held = [rec.hold("param", self.where(name), getattr(self, name).array) if d.qv_bias
                else None for name in ("q_bias", "v_bias")]
        key, query = (self.key, self.query) if d.share_att_key else \
            (getattr(self, "pos_proj", None), getattr(self, "pos_q_proj", None))
        pos_key = rec.view(key(rec, rel), (R, H, D)) if d.c2p else None
        pos_query = rec.view(query(rec, rel), (R, H, D)) if d.p2c else None
        return rec.step("disentangled_attention", q, k, v, *held, pos_key, pos_query,
                        where=self.path, scale=float((D * d.scale_factor) ** -0.5),
                        span=d.span, buckets=d.buckets, max_position=d.max_position)


class Output(Module):
    """``dense`` then (post-norm) ``LayerNorm(dense(h) + residual)``: BertSelfOutput and
    BertOutput. Under pre-norm, ``LayerNorm`` normalizes the block's input instead (None
    where ``normed`` is false: the block reads its input as it is). ``dense`` is None where
    ``projected`` is false (FNetBasicOutput: the norm alone)."""

    def __init__(self, in_features: int, E: int, bias: bool, norm: NormOptions,
                 normed: bool = True, projected: bool = True,
                 groups: PointwiseGroups | None = None, which: str = "output"):
        self.dense = projection(in_features, E, bias, groups, which) if projected else None
        self.LayerNorm = Norm(E, norm) if normed else None


class Attention(Module):
    """``self`` (the projections and attention) and ``output`` (dense and its norm); with
    Fourier mixing no ``self`` and an ``output`` of its norm alone.

    Raises:
        ValueError: an unknown ``mixing``.
    """

    def __init__(self, E: int, o: EncoderLayerOptions, value_in: int | None = None):
        if o.mixing not in MIXINGS:
            raise ValueError(f"mixing {o.mixing!r} is not one of {', '.join(MIXINGS)}")
        attends = o.mixing == "attention"
        self.self = SelfAttentionProjections(E, o, value_in) if attends else None
        width = o.heads * o.head_dim * (1 if o.span_conv is None else 2)
        self.output = Output(width, E, o.o_bias, o.norm, o.attention_norm, projected=attends,
                             groups=o.pointwise, which="attention_output")
        self.options = o

    def __call__(self, rec: Recorder, x: Handle, rope: tuple[Handle, Handle] | None,
                 bias: tuple[Handle, RelativeBiasOptions] | None, rel: Handle | None,
                 values: Handle | None = None, marks: Handle | None = None) -> Handle:
        """The block's output before its residual add: ``output.dense`` of the attention
        (values from ``values``, None: ``x``), or the Fourier transform of ``x`` ``(rows,
        hidden)``."""
        if self.self is None:
            return rec.step("fourier_mix", x, where=self.path)
        return self.output.dense(rec, self.self(rec, x, rope, bias, rel, values, marks))


class Intermediate(Module):
    """``act(dense(x))``, BertIntermediate; gated (``mlp_kind``), ``act(gate_proj(x)) *
    up_proj(x)`` (LlamaMLP's, before its down projection), gate and up in one
    ``gate_up_proj`` where ``mlp_fused``.

    Raises:
        ValueError: an unknown ``mlp_kind``.
    """

    def __init__(self, E: int, o: EncoderLayerOptions):
        if o.mlp_kind not in ENCODER_MLP_KINDS:
            raise ValueError(f"mlp kind {o.mlp_kind!r} is not one of {', '.join(ENCODER_MLP_KINDS)}")
        M = o.intermediate_size
        if o.pointwise is not None and o.mlp_kind != "plain":
            raise ValueError("pointwise convolutions project a plain MLP only")
        if o.mlp_kind == "plain":
            self.dense = projection(E, M, o.mlp_bias, o.pointwise, "intermediate")
        elif o.mlp_fused:
            self.gate_up_proj = Linear(E, 2 * M, o.mlp_bias)
        else:
            self.gate_proj = Linear(E, M, o.mlp_bias)
            self.up_proj = Linear(E, M, o.mlp_bias)
        self.options = o

    def __call__(self, rec: Recorder, x: Handle) -> Handle:
        o = self.options
        if o.mlp_kind == "plain":
            return rec.step("activation", self.dense(rec, x), where=self.path, act=o.act)
        if o.mlp_fused:
            return rec.step("gated_activation", self.gate_up_proj(rec, x), None,
                            where=self.path, act=o.act)
        return rec.step("gated_activation", self.gate_proj(rec, x), self.up_proj(rec, x),
                        where=self.path, act=o.act)


class Projected(Module):
    """``LayerNorm(dense(x))``, no residual: MobileBERT's BottleneckLayer."""

    def __init__(self, in_features: int, out_features: int, norm: NormOptions):
        self.dense = Linear(in_features, out_features, True)
        self.LayerNorm = Norm(out_features, norm)

    def __call__(self, rec: Recorder, x: Handle) -> Handle:
        return self.LayerNorm(rec, self.dense(rec, x))


class Bottleneck(Module):
    """``input`` (the layer's input narrowed) and, where queries and keys share one of their
    own, ``attention``: MobileBERT's Bottleneck."""

    def __init__(self, E: int, b: BottleneckOptions, norm: NormOptions):
        self.input = Projected(E, b.size, norm)
        # Held wherever queries and keys share it, as transformers builds it, though
        # attention_input then reads bottleneck.input's projection alone.
        self.attention = Projected(E, b.size, norm) if b.shared_query_key else None


class FeedForward(Module):
    """``x`` to ``output.LayerNorm(x + output.dense(intermediate(x)))``, one MLP with its
    residual and norm: MobileBERT's FFNLayer (an extra one before the layer's own)."""

    def __init__(self, W: int, o: EncoderLayerOptions):
        self.intermediate = Intermediate(W, o)
        self.output = Output(o.intermediate_size, W,
                             o.mlp_bias if o.down_bias is None else o.down_bias, o.norm,
                             groups=o.pointwise)

    def __call__(self, rec: Recorder, x: Handle) -> Handle:
        m = self.output.dense(rec, self.intermediate(rec, x))
        return self.output.LayerNorm(rec, rec.step("add", x, m, where=self.path))


class EncoderLayer(Module):
    """One layer: attention and MLP, each with its residual and norm (``placement``); with a
    bottleneck (post-norm), run ``bottleneck.size`` wide between ``bottleneck`` and
    ``output.bottleneck``, and ``feedforwards - 1`` MLPs ``ffn`` before its own.

    Raises:
        ValueError: an unknown placement, heads that do not group into kv heads, no
            attention norm under post-norm placement, a bottleneck or several feedforwards
            under pre-norm or a residual scale, or queries and keys reading the whole
            stream through a bottleneck narrower than it.
    """

    def __init__(self, E: int, o: EncoderLayerOptions):
        if o.placement not in PLACEMENTS:
            raise ValueError(f"placement {o.placement!r} is not one of {', '.join(PLACEMENTS)}")
        if not o.attention_norm and o.placement != "pre":
            raise ValueError("a layer without its attention norm reads its input as it is: "
                             "placement pre only")
        if o.heads % (o.kv_heads or o.heads):
            raise ValueError(f"{o.heads} attention heads do not group into {o.kv_heads} kv heads")
        b = o.bottleneck
        if (b is not None or o.feedforwards != 1) and (o.placement != "post"
                                                       or o.residual_scale != 1.0):
            raise ValueError("a bottleneck and several feedforwards are built post-norm, "
                             "without a residual scale")
        if o.feedforwards < 1:
            raise ValueError(f"{o.feedforwards} feedforwards: at least the layer's own")
        W = E if b is None else b.size
        if b is not None and not (b.attention_input or b.shared_query_key) and W != E:
            raise ValueError(f"queries and keys read the {E}-wide input, projected from the "
                             f"bottleneck's {W}: only where the widths agree")
        value_in = E if b is not None and not b.attention_input else None
        self.bottleneck = None if b is None else Bottleneck(E, b, o.norm)
        self.attention = Attention(W, o, value_in)
        self.ffn = [FeedForward(W, o) for _ in range(o.feedforwards - 1)] or None
        self.intermediate = Intermediate(W, o)
        self.output = Output(o.intermediate_size, W,
                             o.mlp_bias if o.down_bias is None else o.down_bias, o.norm,
                             groups=o.pointwise)
        if b is not None:
            self.output.bottleneck = Output(W, E, True, o.norm)
        self.options = o

    def __call__(self, rec: Recorder, x: Handle, rope: tuple[Handle, Handle] | None = None,
                 bias: tuple[Handle, RelativeBiasOptions] | None = None,
                 rel: Handle | None = None, marks: Handle | None = None) -> Handle:
        """``x`` ``(rows, hidden)`` through the layer; ``rope``: the cos and sin tables
        ``(max_tokens, rotary_dim // 2)`` of ``options.rope`` (None where it is None);
        ``bias``: the relative bias table's handle and options (None: none); ``rel``: the
        disentangled attention's relative table ``(2 * span, hidden)`` (None: none);
        ``marks``: the call's global tokens ``(rows,)`` int32 (None: the model reads none)."""
        attn_out, mlp_out = self.attention.output, self.output
        s = self.options.residual_scale
        if self.options.placement == "post":
            return self._post(rec, x, rope, bias, rel, marks)
        h = x if attn_out.LayerNorm is None else attn_out.LayerNorm(rec, x)
        a = self.attention(rec, h, rope, bias, rel, marks=marks)
        x = rec.step("add", x, a, where=self.path, scale=s)
        m = mlp_out.dense(rec, self.intermediate(rec, mlp_out.LayerNorm(rec, x)))
        return rec.step("add", x, m, where=self.path, scale=s)

    def _post(self, rec: Recorder, x: Handle, rope, bias, rel, marks=None) -> Handle:
        """Post-norm: ``norm(r + attn(q))`` then ``norm(a + mlp(a))`` per feedforward, where
        without a bottleneck ``r`` and ``q`` are ``x``; with one, as MobileBertLayer: ``r``
        is ``bottleneck.input(x)``, the attention's queries and keys read ``bottleneck.attention(x)``
        (values ``x``), or ``r`` for all three, and the result widens back by
        ``output.bottleneck``: ``norm(x + dense(h))``."""
        attn_out, mlp_out, b = self.attention.output, self.output, self.options.bottleneck
        s = self.options.residual_scale
        queries, values, residual = x, None, x
        if b is not None:
            residual = self.bottleneck.input(rec, x)
            if b.attention_input:
                queries = residual
            elif b.shared_query_key:
                queries, values = self.bottleneck.attention(rec, x), x
        a = self.attention(rec, queries, rope, bias, rel, values, marks)
        h = attn_out.LayerNorm(rec, rec.step("add", residual, a, where=self.path, scale=s))
        for ffn in self.ffn or ():
            h = ffn(rec, h)
        m = mlp_out.dense(rec, self.intermediate(rec, h))
        h = mlp_out.LayerNorm(rec, rec.step("add", h, m, where=self.path, scale=s))
        if b is None:
            return h
        wide = mlp_out.bottleneck.dense(rec, h)
        return mlp_out.bottleneck.LayerNorm(rec, rec.step("add", x, wide, where=self.path))
