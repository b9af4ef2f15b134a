"""A bidirectional encoder: its module tree, its body, and its one compiled version.

One version is compiled over ``max_tokens`` rows; a call runs the first ``rows`` of them (one
text's token ids), every row attending to every row of the call and to nothing else. No
cache, no state: a call depends on its ids alone. The output is the text's pooled embedding
``(hidden,)`` or, with pooling ``none``, the last hidden states ``(rows, hidden)``.

The tree carries the checkpoint's own names, as transformers' BertModel names its tensors
(``embeddings.word_embeddings``, ``encoder.layer.N.attention.self.query``, ...), so a
checkpoint of that layout loads by a plain tree match; other layouts rename onto it.

Not for: generation (``causal``), or several texts in one call (one call per text).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .blocks import Embedding, Linear, Norm, NormOptions, RopeOptions, Sinusoidal, fused_qkv, \
    rope_table
from .graph import CallSpec, Handle, Recorder
from .module import Module, Param
from .plan import Plan
from .reference import Reference

PLACEMENTS = ("post", "pre")
POOLINGS = ("none", "mean", "cls", "pooler")
ENCODER_MLP_KINDS = ("plain", "gated")
MIXINGS = ("attention", "fourier")


@dataclass(frozen=True)
class DisentangledOptions:
    """Disentangled attention (``operators.disentangled``): scores gain a content-to-position
    (``c2p``: queries against ``attention.self.pos_proj`` of the relative table) and a
    position-to-content term (``p2c``: keys against ``attention.self.pos_q_proj``'s), read at
    the row ``clamp(span + i - j, 0, 2 * span - 1)`` of the model's one table
    ``encoder.rel_embeddings`` ``(2 * span, hidden)``, all scaled by ``1 / sqrt(head_dim *
    scale_factor)`` (``1 + len(pos_att_type)``), as DisentangledSelfAttention.
    ``qv_bias``: the projections hold no bias and ``attention.self.q_bias``/``v_bias`` are
    added to the queries and values (its ``in_proj`` without bias). DeBERTa-v2's
    (DisentangledSelfAttention of modeling_deberta_v2): ``buckets`` > 0 maps distances onto
    log buckets up to ``max_position`` (``position_buckets``, ``max_relative_positions``);
    ``share_att_key`` projects the table by the layer's own ``key`` and ``query`` in place
    of ``pos_proj``/``pos_q_proj``; ``pos_key_bias``: ``pos_proj`` holds a bias (its
    ``pos_key_proj``); ``norm_rel``: the table is normed first by ``encoder.rel_norm`` (its
    ``norm_rel_ebd`` ``layer_norm``) in the layers' norm kind."""

    span: int
    c2p: bool = True
    p2c: bool = True
    scale_factor: int = 3
    qv_bias: bool = False
    buckets: int = 0
    max_position: int = 0
    share_att_key: bool = False
    pos_key_bias: bool = False
    norm_rel: bool = False


@dataclass(frozen=True)
class PointwiseGroups:
    """The groups of each of a layer's projections where every one is a kernel-1
    convolution over the rows (``PointwiseConv``), as SqueezeBertModule's Conv1d layers:
    ``query``, ``key``, ``value`` (q_groups, k_groups, v_groups), ``attention_output``
    (post_attention_groups), ``intermediate`` (intermediate_groups) and ``output``
    (output_groups)."""

    query: int = 1
    key: int = 1
    value: int = 1
    attention_output: int = 1
    intermediate: int = 1
    output: int = 1


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


@dataclass(frozen=True)
class BottleneckOptions:
    """A layer run ``size`` wide inside a wider stream, as MobileBertLayer with
    ``use_bottleneck``: ``bottleneck.input`` (dense to ``size``, then the layer's norm) is
    the attention's residual; queries and keys read ``bottleneck.attention``'s own such
    projection where ``shared_query_key`` (``key_query_shared_bottleneck``), values the
    layer's input; where ``attention_input`` (``use_bottleneck_attention``) queries, keys
    and values all read ``bottleneck.input``'s; else all read the layer's input (only where
    ``size`` is the stream's width). After the MLP, ``output.bottleneck`` (dense back to the
    stream's width, then the norm of it plus the layer's input) is the layer's output
    (OutputBottleneck)."""

    size: int
    shared_query_key: bool = True
    attention_input: bool = False


@dataclass(frozen=True)
class EncoderLayerOptions:
    """One encoder layer.

    ``heads``/``kv_heads``/``head_dim``: the attention's. ``bias``: q/k/v biases;
    ``o_bias``: the attention output projection's; ``mlp_bias``: the MLP's input
    projections' (``intermediate``), ``down_bias`` its output projection's (None: as
    ``mlp_bias``). ``act``: the MLP's ``hidden_act`` name. ``mlp_kind``: ``plain``
    (``output.dense(act(intermediate.dense(x)))``, BertIntermediate and BertOutput) or
    ``gated`` (``output.dense(act(intermediate.gate_proj(x)) * intermediate.up_proj(x))``,
    as LlamaMLP; with ``mlp_fused`` one ``intermediate.gate_up_proj`` holds gate then up, as
    ModernBertMLP's ``Wi`` chunked into input and gate). ``scale``: the attention logit
    scale (None: ``head_dim ** -0.5``). ``rope``: the RoPE table queries and keys turn by
    after their projections (None: none), every row at its position in the text (0, 1, ...),
    as transformers' LlamaAttention's ``apply_rotary_pos_emb`` run without a causal mask
    (EuroBertAttention, JinaEmbeddingsV3Attention). ``window``: each row attends only the
    rows at most ``window`` away (None: all), as transformers'
    ``create_bidirectional_sliding_window_mask``. ``placement``: ``post``
    (``norm(x + attn(x))`` then ``norm(x + mlp(x))``, transformers' BertLayer) or ``pre``
    (``x + attn(norm(x))`` then ``x + mlp(norm(x))``, and a final norm after the last layer).
    ``fused_qkv``: one ``attention.self.query_key_value`` projection holds q, k and v, its
    rows stored as ``qkv_layout`` says (``blocks.qkv_rows``), split into its three column
    blocks at each call, as ModernBertAttention's ``Wqkv`` viewed ``(3, heads, head_dim)``.
    ``attention_norm``: under ``pre``, whether the attention reads the normed input; false
    (ModernBertEncoderLayer's ``attn_norm``, an Identity at layer 0) it reads the input as it
    is and the layer holds no ``attention.output.LayerNorm``.
    ``qk_norm``: queries and keys each normed over the whole projection (``heads *
    head_dim``, ``kv_heads * head_dim``) right after it, before RoPE, by the layer's norm
    kind (``attention.self.q_norm``, ``k_norm``), as EsmcAttention's LayerNorm q_norm and
    k_norm; ``qk_norm_bias``: whether those hold a bias where it differs from ``norm``'s
    (None: as ``norm``). ``residual_scale`` multiplies the attention's and the MLP's outputs
    before their residual adds (EsmcLayer's division by ``sqrt(layers / 36)``).
    ``disentangled``: disentangled attention in place of the plain scaled scores
    (``DisentangledOptions``; None: none).
    ``mixing``: how the rows meet: ``attention`` (the above), or ``fourier``: the real part
    of the 2-D DFT over rows and hidden columns (``operators.fourier``), with no projection
    before or after it, only its norm ``attention.output.LayerNorm``, as
    FNetBasicFourierTransform and FNetBasicOutput (the attention options unread).
    ``bottleneck``: the layer runs narrower than the stream (``BottleneckOptions``; None:
    at its width). ``feedforwards``: MLPs in turn after the attention, each ``x`` to
    ``norm(x + mlp(x))``: the first ``feedforwards - 1`` as ``ffn.{i}`` (MobileBERT's
    FFNLayer: ``intermediate.dense``, ``output.dense``, ``output.LayerNorm``), the last the
    layer's own ``intermediate`` and ``output`` (MobileBertLayer's num_feedforward_networks;
    post-norm only).
    ``span_conv``: the kernel of as many span-based dynamic convolution heads as attention
    heads beside them (None: none), as ConvBertSelfAttention: ``key_conv_attn_layer`` (a
    depthwise convolution over the rows, then a pointwise projection to ``heads *
    head_dim`` plus its bias) times the queries gives ``conv_kernel_layer``'s logits, each
    row's and head's ``span_conv`` taps softmaxed, which weigh the rows around it of
    ``conv_out_layer``'s projection (``operators.span_conv``); the attention's output and
    the convolution's, side by side, are what ``attention.output.dense`` reads (``2 * heads
    * head_dim`` wide).
    ``pointwise``: every projection of the layer (query, key, value, the attention's output
    and the MLP's two, plain MLP only) a kernel-1 convolution of its own groups
    (``PointwiseGroups``; None: Linear), as SqueezeBertModule.
    """

    heads: int
    head_dim: int
    intermediate_size: int
    norm: NormOptions
    kv_heads: int | None = None
    act: str = "gelu"
    bias: bool = True
    o_bias: bool = True
    mlp_bias: bool = True
    scale: float | None = None
    placement: str = "post"
    mlp_kind: str = "plain"
    mlp_fused: bool = False
    down_bias: bool | None = None
    rope: RopeOptions | None = None
    window: int | None = None
    fused_qkv: bool = False
    qkv_layout: str = "blocks"
    qkv_shards: int = 1
    qkv_order: str = "qkv"
    attention_norm: bool = True
    qk_norm: bool = False
    qk_norm_bias: bool | None = None
    residual_scale: float = 1.0
    disentangled: DisentangledOptions | None = None
    mixing: str = "attention"
    bottleneck: BottleneckOptions | None = None
    feedforwards: int = 1
    span_conv: int | None = None
    pointwise: PointwiseGroups | None = None


@dataclass(frozen=True)
class PoolingOptions:
    """How a call's hidden states ``(rows, hidden)`` become its embedding.

    ``kind``: ``none`` (the hidden states themselves), ``mean`` (over the call's rows, as
    sentence-transformers' mean pooling under an attention mask of ones), ``cls`` (the first
    row) or ``pooler`` (``tanh(pooler.dense(first row))``, BertModel's ``pooler_output``).
    ``normalize``: divide the result by its L2 norm (sentence-transformers' Normalize).
    """

    kind: str = "mean"
    normalize: bool = False


@dataclass(frozen=True)
class RelativeBiasOptions:
    """A learned relative position bias on every layer's attention scores: one table
    ``encoder.relative_attention_bias`` ``(rows, heads)``, shared by the layers, indexed by
    each key's bucket (``operators.relative.relative_buckets`` of ``buckets``,
    ``max_distance``, ``bidirectional``), as MPNetEncoder's ``compute_position_bias``."""

    rows: int
    buckets: int = 32
    max_distance: int = 128
    bidirectional: bool = True


@dataclass(frozen=True)
class EncoderOptions:
    """An encoder's whole shape: what the declarative layer builds from a spec and config.

    ``positions``: rows of the learned absolute position table (0: none).
    ``position_offset``: row ``p + offset`` serves position ``p`` (RoBERTa's
    ``padding_idx + 1``). ``position_padding``: a padding id (None: none) that, as in
    transformers' RobertaEmbeddings.create_position_ids_from_input_ids, takes row
    ``position_offset - 1`` wherever it occurs and is not counted: a text's ``k``-th other id
    (from 0) takes row ``k + position_offset``.
    ``embedding_size``: the width of the embedding tables and their norm (None: hidden); where
    it differs from ``hidden_size``, ``embeddings_project`` (a Linear with bias) maps the
    normalized embeddings to ``hidden_size``, as transformers' ElectraModel.
    ``token_types``: rows of the token-type table (0: none); a call's types default to 0.
    ``task_types``: rows of the task-type table ``embeddings.task_type_embeddings`` (0:
    none), added after the positions, every token of a call at task 0, as ErnieEmbeddings
    with ``use_task_id`` and its default ``task_type_ids`` (zeros).
    ``token_dropout``: ``(mask_id, ratio)`` (None: none): the word embeddings of id
    ``mask_id`` zeroed and every row scaled by ``(1 - ratio) / (1 - masked / rows)``, before
    anything is added to them, as EsmEmbeddings with ``token_dropout``
    (``operators.token_dropout``).
    ``embedding_norm``: a norm after the embeddings' sum (BertEmbeddings.LayerNorm).
    ``embedding_scale`` multiplies the word embeddings (1.0: none).
    ``norm``: the embedding and final norms' kind and eps; ``final_norm_bias``: whether the
    final norm holds a bias where it differs from ``norm``'s (None: as ``norm``; EsmcModel's
    ``norm`` has none beside biased layer norms). ``pooler``: the tree holds
    ``pooler.dense`` (hidden -> hidden, BertPooler), whether or not ``pooling`` reads it.
    ``layer_order``: the index into ``layers`` each depth runs, in order (None: each layer
    once), so layers share weights across depths, as AlbertTransformer runs layer group
    ``int(i / (num_hidden_layers / num_hidden_groups))`` at depth ``i``.
    ``embeddings_project``: whether the tree holds ``embeddings_project`` (None: where the
    embeddings are narrower than ``hidden_size``; AlbertTransformer's
    ``embedding_hidden_mapping_in`` is there whatever the widths).
    ``max_tokens``: rows the compiled version holds (at most ``positions`` where there is a
    position table). ``relative_bias``: a relative position bias table (None: none).
    ``sinusoidal``: the position table of ``positions`` rows is computed (``Sinusoidal``),
    not loaded (None: the learned ``embeddings.position_embeddings``), as XLMModel's
    ``position_embeddings`` under ``sinusoidal_embeddings``.
    ``languages``: rows of the language table ``embeddings.lang_embeddings`` (0: none), its
    row for each token's language added after the positions, as XLMModel's
    ``lang_embeddings(langs)`` (``n_langs`` where ``use_lang_emb`` and ``n_langs > 1``);
    ``language``: the language of a call that names none (XLMWithLMHeadModel's generation
    feeds ``lang_id`` so).
    ``word_size``: the word table's own width where it alone differs (None: as the other
    tables), mapped to theirs by ``embeddings.embedding_transformation`` (a Linear with
    bias) before anything is added, as MobileBertEmbeddings; ``trigram``: the
    transformation reads each row's next, own and previous word embeddings side by side
    (``operators.trigram``; zeros past the text's ends), its ``trigram_input``.
    """

    vocab_size: int
    hidden_size: int
    layers: tuple[EncoderLayerOptions, ...]
    norm: NormOptions
    positions: int = 0
    position_offset: int = 0
    position_padding: int | None = None
    embedding_size: int | None = None
    token_types: int = 0
    task_types: int = 0
    token_dropout: tuple[int, float] | None = None
    final_norm_bias: bool | None = None
    layer_order: tuple[int, ...] | None = None
    embeddings_project: bool | None = None
    embedding_norm: bool = True
    embedding_scale: float = 1.0
    pooler: bool = False
    pooling: PoolingOptions = field(default_factory=PoolingOptions)
    max_tokens: int = 512
    relative_bias: RelativeBiasOptions | None = None
    sinusoidal: Sinusoidal | None = None
    languages: int = 0
    language: int = 0
    word_size: int | None = None
    trigram: bool = False


class Embeddings(Module):
    """Word, absolute position and token-type embeddings summed, then normalized, as
    transformers' BertEmbeddings (and a task-type embedding before the norm, as
    ErnieEmbeddings; a language embedding after the positions, as XLMModel). A computed
    sinusoidal position table is ``position_table`` ``(positions, width)``, a constant. Word
    embeddings of their own width pass ``embedding_transformation`` first (of a trigram of
    them where the options say), as MobileBertEmbeddings.

    Raises:
        ValueError: ``trigram`` without a ``word_size`` (no transformation to read it).
    """

    def __init__(self, o: EncoderOptions):
        E = o.embedding_size or o.hidden_size
        if o.trigram and o.word_size is None:
            raise ValueError("trigram word embeddings are 3 * word_size wide: they need a "
                             "word_size and its embedding_transformation")
        words = E if o.word_size is None else o.word_size
        self.word_embeddings = Embedding(o.vocab_size, words, o.embedding_scale)
        self.embedding_transformation = None if o.word_size is None else \
            Linear(words * (3 if o.trigram else 1), E, True)
        self.trigram = o.trigram
        self.position_embeddings = Embedding(o.positions, E) \
            if o.positions and o.sinusoidal is None else None
        self.position_table = o.sinusoidal.table(o.positions, E) \
            if o.positions and o.sinusoidal is not None else None
        self.lang_embeddings = Embedding(o.languages, E) if o.languages else None
        self.token_type_embeddings = Embedding(o.token_types, E) if o.token_types else None
        self.task_type_embeddings = Embedding(o.task_types, E) if o.task_types else None
        self.LayerNorm = Norm(E, o.norm) if o.embedding_norm else None
        self.token_dropout = o.token_dropout

    def __call__(self, rec: Recorder, ids: Handle, positions: Handle, types: Handle,
                 tasks: Handle | None = None, langs: Handle | None = None) -> Handle:
        x = self.word_embeddings(rec, ids)
        if self.token_dropout is not None:
            mask_id, ratio = self.token_dropout
            x = rec.step("token_dropout_rescale", x, ids, where=self.path, mask_id=mask_id,
                         ratio=ratio)
        if self.trigram:
            x = rec.step("trigram", x, where=self.where("word_embeddings"))
        if self.embedding_transformation is not None:
            x = self.embedding_transformation(rec, x)
        if self.token_type_embeddings is not None:
            x = rec.step("add", x, self.token_type_embeddings(rec, types), where=self.path)
        if self.position_embeddings is not None:
            x = rec.step("add", x, self.position_embeddings(rec, positions), where=self.path)
        if self.position_table is not None:
            where = self.where("position_table")
            table = rec.hold("const", where, self.position_table)
            x = rec.step("add", x, rec.step("embedding", positions, table, where=where),
                         where=self.path)
        if self.lang_embeddings is not None:
            x = rec.step("add", x, self.lang_embeddings(rec, langs), where=self.path)
        if self.task_type_embeddings is not None:
            x = rec.step("add", x, self.task_type_embeddings(rec, tasks), where=self.path)
        return x if self.LayerNorm is None else self.LayerNorm(rec, x)


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
            self.key = projection(E, G * D, o.bias, pw, "key")
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
                 rel: Handle | None = None, values: Handle | None = None) -> Handle:
        """Attention of ``x`` ``(rows, width)``'s queries and keys over values projected from
        ``values`` (None: ``x``; MobileBERT's bottleneck feeds the layer's input)."""
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
                 values: Handle | None = None) -> Handle:
        """The block's output before its residual add: ``output.dense`` of the attention
        (values from ``values``, None: ``x``), or the Fourier transform of ``x`` ``(rows,
        hidden)``."""
        if self.self is None:
            return rec.step("fourier_mix", x, where=self.path)
        return self.output.dense(rec, self.self(rec, x, rope, bias, rel, values))


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
                 rel: Handle | None = None) -> Handle:
        """``x`` ``(rows, hidden)`` through the layer; ``rope``: the cos and sin tables
        ``(max_tokens, rotary_dim // 2)`` of ``options.rope`` (None where it is None);
        ``bias``: the relative bias table's handle and options (None: none); ``rel``: the
        disentangled attention's relative table ``(2 * span, hidden)`` (None: none)."""
        attn_out, mlp_out = self.attention.output, self.output
        s = self.options.residual_scale
        if self.options.placement == "post":
            return self._post(rec, x, rope, bias, rel)
        h = x if attn_out.LayerNorm is None else attn_out.LayerNorm(rec, x)
        a = self.attention(rec, h, rope, bias, rel)
        x = rec.step("add", x, a, where=self.path, scale=s)
        m = mlp_out.dense(rec, self.intermediate(rec, mlp_out.LayerNorm(rec, x)))
        return rec.step("add", x, m, where=self.path, scale=s)

    def _post(self, rec: Recorder, x: Handle, rope, bias, rel) -> Handle:
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
        a = self.attention(rec, queries, rope, bias, rel, values)
        h = attn_out.LayerNorm(rec, rec.step("add", residual, a, where=self.path, scale=s))
        for ffn in self.ffn or ():
            h = ffn(rec, h)
        m = mlp_out.dense(rec, self.intermediate(rec, h))
        h = mlp_out.LayerNorm(rec, rec.step("add", h, m, where=self.path, scale=s))
        if b is None:
            return h
        wide = mlp_out.bottleneck.dense(rec, h)
        return mlp_out.bottleneck.LayerNorm(rec, rec.step("add", x, wide, where=self.path))


class Stack(Module):
    """``layer`` (the list of layers), under pre-norm the final ``LayerNorm``, with a
    relative bias its table ``relative_attention_bias`` ``(rows, heads)``, and with
    disentangled attention its relative table ``rel_embeddings`` ``(2 * span, hidden)``
    (DebertaEncoder's), normed by ``rel_norm`` where the options say (DebertaV2Encoder's
    ``LayerNorm`` under ``norm_rel_ebd``).

    Raises:
        ValueError: layers of disentangled attention over different spans (one table).
    """

    def __init__(self, o: EncoderOptions):
        self.layer = [EncoderLayer(o.hidden_size, lo) for lo in o.layers]
        b = o.relative_bias
        if b is not None:
            self.relative_attention_bias = Embedding(b.rows, o.layers[0].heads)
        tables = {(lo.disentangled.span, lo.disentangled.norm_rel) for lo in o.layers
                  if lo.disentangled is not None}
        if len(tables) > 1:
            raise ValueError(f"one relative table serves every layer: spans and norms "
                             f"{sorted(tables)}")
        span, normed = tables.pop() if tables else (0, False)
        self.rel_embeddings = Embedding(2 * span, o.hidden_size) if span else None
        self.rel_norm = Norm(o.hidden_size, o.norm) if normed else None
        pre = bool(o.layers) and o.layers[-1].placement == "pre"
        final = o.norm if o.final_norm_bias is None else replace(o.norm, bias=o.final_norm_bias)
        self.LayerNorm = Norm(o.hidden_size, final) if pre else None


class Pooler(Module):
    """``tanh(dense(first row))``, as transformers' BertPooler."""

    def __init__(self, E: int):
        self.dense = Linear(E, E, True)

    def __call__(self, rec: Recorder, x: Handle) -> Handle:
        first = rec.step("take_row", x, where=self.path, index=0)
        return rec.step("tanh", self.dense(rec, first), where=self.path)


class Encoder(Module):
    """``embeddings``, ``encoder`` (the layers) and an optional ``pooler``, as BertModel
    (and ``embeddings_project`` where the embeddings are narrower, as ElectraModel).

    ``version(pooling)`` compiles the body once per pooling (the spec's by default) over
    ``max_tokens`` rows.

    Raises:
        ValueError: ``max_tokens`` is not in ``[1, positions]`` (where there is a position
            table), a ``layer_order`` index outside ``layers``, a default ``language``
            outside the language table, or pooling ``pooler`` without a pooler.
    """

    def __init__(self, o: EncoderOptions):
        top = o.positions - o.position_offset
        if o.position_offset < 0 or (o.position_padding is not None and o.position_offset < 1):
            raise ValueError(f"position offset {o.position_offset} is below "
                             f"{0 if o.position_padding is None else 1} (with a padding id, the "
                             "padding takes row offset - 1)")
        if o.max_tokens < 1 or (o.positions and o.max_tokens > top):
            raise ValueError(f"max_tokens {o.max_tokens} is not within 1..{top if o.positions else 'any'}"
                             f", the position table's {o.positions} rows past offset "
                             f"{o.position_offset}")
        if o.languages and not 0 <= o.language < o.languages:
            raise ValueError(f"default language {o.language} is outside the language table's "
                             f"0..{o.languages - 1}")
        if o.layer_order is not None and any(not 0 <= i < len(o.layers) for i in o.layer_order):
            raise ValueError(f"layer order {list(o.layer_order)} runs layers outside the "
                             f"{len(o.layers)} held")
        self.embeddings = Embeddings(o)
        width = o.embedding_size or o.hidden_size
        project = width != o.hidden_size if o.embeddings_project is None else o.embeddings_project
        self.embeddings_project = Linear(width, o.hidden_size, True) if project else None
        self.encoder = Stack(o)
        self.pooler = Pooler(o.hidden_size) if o.pooler else None
        self.config = o
        # cos and sin (max_tokens, rotary_dim // 2) of every RoPE table a layer reads: a
        # call's rows are positions 0 .. rows - 1, so the tables never grow.
        # Keyed by repr: a table's options hold its scaling dict, which does not hash.
        self.rope_tables = {repr(lo.rope): rope_table(lo.rope, o.max_tokens)
                            for lo in o.layers if lo.rope is not None}
        self.name_tree()
        self._versions: dict[tuple[PoolingOptions, bool], EncoderVersion] = {}

    def body(self, rec: Recorder, pooling: PoolingOptions) -> Handle:
        """Record the model over ``rec``'s capacity: ids, positions and token types
        ``(max_tokens,)`` int32, of which a call runs ``rows``, to the pooled ``(1,
        hidden)`` or, with pooling ``none``, the hidden states ``(rows, hidden)``."""
        if pooling.kind not in POOLINGS:
            raise ValueError(f"pooling {pooling.kind!r} is not one of {', '.join(POOLINGS)}")
        C = rec.call.capacity
        ids = rec.input("ids", (C,), np.int32, bounded=True)
        positions = rec.input("positions", (C,), np.int32, bounded=True)
        types = rec.input("types", (C,), np.int32, bounded=True)
        tasks = rec.input("tasks", (C,), np.int32, bounded=True) if self.config.task_types \
            else None
        langs = rec.input("langs", (C,), np.int32, bounded=True) if self.config.languages \
            else None
        x = self.embeddings(rec, ids, positions, types, tasks, langs)
        if self.embeddings_project is not None:
            x = self.embeddings_project(rec, x)
        ropes = {r: (rec.hold("const", f"rope.{i}.cos", cos), rec.hold("const", f"rope.{i}.sin", sin))
                 for i, (r, (cos, sin)) in enumerate(self.rope_tables.items())}
        bias = None
        if self.config.relative_bias is not None:
            table = self.encoder.relative_attention_bias
            bias = (rec.hold("param", table.where("weight"), table.weight.array),
                    self.config.relative_bias)
        rel = None
        if self.encoder.rel_embeddings is not None:
            table = self.encoder.rel_embeddings
            rel = rec.hold("param", table.where("weight"), table.weight.array)
            if self.encoder.rel_norm is not None:
                rel = self.encoder.rel_norm(rec, rel)
        order = self.config.layer_order or range(len(self.encoder.layer))
        for layer in (self.encoder.layer[i] for i in order):
            r = layer.options.rope
            x = layer(rec, x, None if r is None else ropes[repr(r)], bias, rel)
        if self.encoder.LayerNorm is not None:
            x = self.encoder.LayerNorm(rec, x)
        if pooling.kind == "mean":
            x = rec.step("mean_rows", x, where=self.path)
        elif pooling.kind == "cls":
            x = rec.step("take_row", x, where=self.path, index=0)
        elif pooling.kind == "pooler":
            if self.pooler is None:
                raise ValueError("pooling 'pooler' needs a pooler (pooler.dense); this model "
                                 "has none")
            x = self.pooler(rec, x)
        if pooling.normalize:
            x = rec.step("l2_normalize", x, where=self.path)
        return x

    def version(self, pooling: PoolingOptions | None = None, check: bool = False
                ) -> "EncoderVersion":
        """The version compiled for ``pooling`` (default the options'), compiled once."""
        key = (pooling or self.config.pooling, check)
        if key not in self._versions:
            self._versions[key] = EncoderVersion(self, key[0], check)
        return self._versions[key]


class EncoderVersion:
    """The encoder compiled over ``max_tokens`` rows for one pooling.

    ``version(ids, types=None, langs=None)`` runs one text: ``ids`` ``(rows,)`` with ``1 <=
    rows <= max_tokens``, ``types`` its token types (default zeros, as BertModel's),
    ``langs`` its language (a model with a language table only): one id for every token, or
    one per token ``(rows,)``, as XLMModel's ``langs``; None: the options' ``language``. It
    returns the
    embedding ``(hidden,)`` float32, or the hidden states ``(rows, hidden)`` with pooling
    ``none``: a view, valid until the next call. ``reference(...)`` runs the same recording
    eagerly in float64.

    Raises (both, before any work):
        ValueError: no ids, more than ``max_tokens``, an id outside ``[0, vocab)``, a type
            outside the token-type table, types of another length, a language outside the
            language table, languages of another length, or languages for a model without
            a language table.
    """

    def __init__(self, model: Encoder, pooling: PoolingOptions, check: bool):
        o = model.config
        rec = Recorder(CallSpec(True, o.max_tokens))
        out = model.body(rec, pooling)
        self.pooling, self.max_tokens = pooling, o.max_tokens
        self.plan = Plan(rec, out, check=check)
        self._reference = Reference(rec, out, {})
        self._options = o
        # Made once: a call feeds views of them, allocating nothing (but where a padding id
        # occurs in a text with position_padding, which counts around it).
        self._positions = np.arange(o.max_tokens, dtype=np.int32) + np.int32(o.position_offset)
        self._zeros = np.zeros(o.max_tokens, np.int32)

    def _inputs(self, ids, types, langs=None) -> tuple[dict, dict]:
        ids = np.asarray(ids)
        n, o = ids.shape[0] if ids.ndim == 1 else -1, self._options
        if ids.ndim != 1 or not 1 <= n <= self.max_tokens:
            raise ValueError(f"{ids.shape} ids: a call takes 1..{self.max_tokens} ids, one text")
        if ids.min() < 0 or ids.max() >= o.vocab_size:
            raise ValueError(f"token id {int(ids.max() if ids.max() >= o.vocab_size else ids.min())}"
                             f" is outside the vocabulary 0..{o.vocab_size - 1}")
        if types is None:
            types = self._zeros[:n]
        else:
            types = np.asarray(types)
            if types.shape != (n,):
                raise ValueError(f"{types.shape} token types for {n} ids")
            if types.min() < 0 or types.max() >= max(o.token_types, 1):
                raise ValueError(f"token type {int(types.max())} is outside 0.."
                                 f"{max(o.token_types, 1) - 1}")
        inputs = {"ids": ids, "positions": self.positions(ids), "types": types}
        if o.task_types:
            inputs["tasks"] = self._zeros[:n]
        if o.languages:
            inputs["langs"] = self._langs(langs, n)
        elif langs is not None:
            raise ValueError("languages given to a model without a language table "
                             "(embeddings.lang_embeddings)")
        return inputs, {"rows": n}

    def _langs(self, langs, n: int) -> np.ndarray:
        """Each of ``n`` tokens' language id ``(n,)`` int32 from a call's ``langs``."""
        o = self._options
        langs = np.asarray(o.language if langs is None else langs)
        if langs.ndim == 0:
            langs = np.full(n, langs)
        if langs.shape != (n,) or not np.issubdtype(langs.dtype, np.integer):
            raise ValueError(f"{langs.shape} languages of {langs.dtype} for {n} ids: one "
                             "language id, or a whole number per id")
        if langs.min() < 0 or langs.max() >= o.languages:
            bad = int(langs.max() if langs.max() >= o.languages else langs.min())
            raise ValueError(f"language {bad} is outside the language table's 0.."
                             f"{o.languages - 1}")
        return langs.astype(np.int32, copy=False)

    def positions(self, ids: np.ndarray) -> np.ndarray:
        """The position-table row of each of ``ids`` ``(rows,)``: ``p + position_offset`` at
        position ``p``, or with ``position_padding`` as transformers'
        RobertaEmbeddings.create_position_ids_from_input_ids (``cumsum(mask) * mask +
        padding_idx``, ``mask = ids != padding_idx``, where ``padding_idx = offset - 1``)."""
        o, n = self._options, ids.shape[0]
        if o.position_padding is None or not (ids == o.position_padding).any():
            return self._positions[:n]
        mask = (ids != o.position_padding).astype(np.int32)
        return (np.cumsum(mask, dtype=np.int32) * mask + np.int32(o.position_offset - 1))

    def _out(self, y: np.ndarray) -> np.ndarray:
        return y.reshape(-1) if self.pooling.kind != "none" else y

    def __call__(self, ids, types=None, langs=None) -> np.ndarray:
        inputs, call = self._inputs(ids, types, langs)
        return self._out(self.plan.run(inputs, call))

    def reference(self, ids, types=None, langs=None) -> np.ndarray:
        inputs, call = self._inputs(ids, types, langs)
        return self._out(self._reference.run(inputs, call))
