"""An encoder's options: what the declarative layer builds from a spec and config, one
frozen dataclass per part (the layer, its attention's variants, pooling, the whole model).

Not for: the module tree (``encoder_layer``, ``encoder``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .blocks.embedding import Sinusoidal
from .blocks.norms import NormOptions
from .blocks.rope import RopeOptions
from .encoder_heads import HeadOptions

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
class LandmarkOptions:
    """Landmark (Nystrom) attention in place of the plain scaled scores
    (``operators.landmark``), as NystromformerSelfAttention: ``landmarks`` segment means of
    queries and keys over ``segment`` rows (``num_landmarks``, ``segment_means_seq_len``;
    equal: exact softmax attention at any length, else every call exactly ``segment``
    rows) and the pseudo-inverse by ``iterations`` steps (6)."""

    landmarks: int
    segment: int
    iterations: int = 6


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
    ``o_bias``: the attention output projection's; ``k_bias``: the key projection's where
    it differs from ``bias`` (WhisperAttention's ``k_proj`` has none; None: as ``bias``);
    ``mlp_bias``: the MLP's input
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
    rows stored as ``qkv_layout`` says (``blocks.projections.qkv_rows``), split into its three column
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
    ``landmarks``: landmark (Nystrom) attention in place of the plain scaled scores
    (``LandmarkOptions``; None: none). ``lsh_expectation``: in place of the softmax, each
    key weighs a query by the expected collisions of that many random-hyperplane hash bits
    (``operators.lsh_expectation``; None: none), as YosoSelfAttention with
    ``use_expectation``. ``value_conv``: an odd kernel (None: none), with either: each
    head's values convolved over the rows by its own taps ``attention.self.conv.weight``
    ``(heads, 1, kernel, 1)`` (a Conv2d of kernel ``(kernel, 1)``, ``groups=heads``, centred,
    zeros past the ends), added to the attention's output, as NystromformerSelfAttention's
    ``conv``.
    ``global_tokens``: beside the sliding ``window``, the call's global tokens (its
    ``global_attention_mask``): every row also sees them, and their rows see every row
    through ``attention.self.query_global``, ``key_global`` and ``value_global``
    (``operators.global_attention``), as LongformerSelfAttention.
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
    k_bias: bool | None = None
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
    landmarks: LandmarkOptions | None = None
    lsh_expectation: int | None = None
    value_conv: int | None = None
    global_tokens: bool = False


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
    ``head``: the task head a ``*ForMaskedLM``, ``*ForSequenceClassification`` or
    ``*ForTokenClassification`` checkpoint holds (``encoder_heads.HeadOptions``; None: none).
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
    head: HeadOptions | None = None
