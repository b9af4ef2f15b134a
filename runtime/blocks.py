"""The building blocks a model's tree is made of, each recording its steps.

Every block is generic: options (dataclasses) say what it does, never which family it
serves. Semantics follow transformers' ``modeling_llama.py`` (GQA attention, gated MLP)
unless an option says otherwise. Layers, which compose these, are in ``layers``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from iron_spec.operators import rope_switch as rope_switch_of
from iron_spec.operators import rope_table as rope_table_of
from iron_spec.operators import sinusoidal_table
from iron_spec.operators import std_multiplier
from iron_spec.operators.activation import ACTIVATION_PARAMS

from .graph import Handle, Recorder
from .module import Module, Param, State


@dataclass(frozen=True)
class NormOptions:
    """A norm over the last axis (``Norm``). ``kind``: ``rms`` (RMSNorm, as transformers'
    LlamaRMSNorm) or ``layer`` (LayerNorm, as torch.nn.LayerNorm); ``eps`` added to the
    mean square (the variance); ``plus_one`` scales by ``1 + weight`` (Gemma3RMSNorm,
    NemotronLayerNorm1P); ``weight``: false holds no weight (OlmoLayerNorm's non-affine
    ``F.layer_norm``); ``bias`` (LayerNorm and no_norm) adds a ``bias``. ``no_norm``
    normalizes nothing: ``x * weight + bias`` (MobileBERT's NoNorm; ``eps`` unread)."""

    kind: str = "rms"
    eps: float = 1e-6
    plus_one: bool = False
    weight: bool = True
    bias: bool = True


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
    """

    theta: float
    rotary_dim: int
    scaling: dict | None = None
    max_position_embeddings: int = 2048
    interleaved: bool = False
    negated: bool = False
    query_scale: tuple[float, int] | None = None


@dataclass(frozen=True)
class AttentionOptions:
    """Self-attention of one layer.

    ``heads``/``kv_heads``/``head_dim``: transformers' ``num_attention_heads``,
    ``num_key_value_heads``, ``head_dim``. ``bias``: q/k/v biases; ``o_bias``: the output
    projection's. ``rope``: the name of the RoPE table this layer reads (None: no RoPE);
    ``rope_interleaved``: that table's ``interleaved`` (``RopeOptions``).
    ``scale``: the logit scale (None: ``head_dim ** -0.5``). ``window``: transformers'
    ``sliding_window`` (None: full). ``softcap``: attention logit softcap (None: none).
    ``qk_norm``: the layer's norm (``Norm``: RMSNorm or LayerNorm) of queries and keys
    before RoPE, ``head`` over each head's
    ``head_dim`` (Qwen3Attention), ``all`` over the whole projection (Olmo2Attention),
    ``per_head_weights`` over each head's ``head_dim`` with each head's own weights
    (StableLmLayerNormPerHead, ``HeadNorms``), ``per_head_stacked`` the same with those
    weights held as one ``(heads, head_dim)`` tensor (CohereLayerNorm of hidden size
    ``(heads, head_dim)``), None for none; it takes the layer's norm
    options. ``fused_qkv``: one ``qkv_proj`` holds q, k and v, its rows stored as
    ``qkv_layout`` says (``qkv_rows``; ``qkv_shards`` and ``qkv_order`` for layout
    ``shards``). ``v_norm``: values RMS-normed over each head with
    no weight (the layer's eps), as Gemma4TextAttention's ``v_norm``. ``values_from_keys``:
    no ``v_proj``; the values are the key projection's output, before the k norm and RoPE
    (Gemma4TextAttention's ``attention_k_eq_v``). ``kv_from``: the index of an earlier layer
    whose KV cache this layer reads instead of its own; such a layer holds no k/v projections
    nor k norm and writes no cache (transformers' KV sharing, ``num_kv_shared_layers``).
    ``clip_qkv``: q, k and v clamped to ``[-clip_qkv, clip_qkv]`` right after their
    projections, as OlmoAttention (None: none). ``qk_norm_bias``: whether a LayerNorm q/k
    norm holds a bias, where it differs from the layer's norms (StableLmLayerNormPerHead's
    ``bias=False`` beside biased layer norms; None: as the layer's). ``qk_norm_after_rope``:
    a per-head q/k norm runs on the turned queries and keys, not before RoPE
    (HunYuanDenseV1Attention, NanoChatAttention: ``apply_rotary_pos_emb`` then ``q_norm``).
    ``alibi``: per-head ALiBi slopes added to the scores by distance (the attention
    operator's ``alibi``, ``operators.attention.alibi_slopes``; None: none), as
    BloomAttention, MptAttention and FalconAttention with ``alibi``; ``alibi_bf16``: the
    scale of its bfloat16 form (the operator's ``alibi_bf16``, FalconModel's; None: none).
    ``sinks``: each head's learned sink logit ``sinks`` ``(heads,)``, one more term of its
    softmax's denominator (the attention operator's ``sinks``, GraniteSWAAttention's).
    ``latent``: multi-head latent attention's widths (``runtime.latent.LatentOptions``: the
    layer's attention is a ``LatentAttention``, DeepseekV2Attention's); None: none.
    ``differential``: differential attention (``DifferentialOptions``); None: none.
    ``sub_norm``: the attention's output normed by ``attn_sub_norm`` (the layer's norm, over
    ``heads * head_dim``) before ``o_proj``, as BitNetAttention. ``dynamic_mask``: each key
    position's scores gain ``exp(A * softplus(dt_proj(v)))`` per kv head (``A``
    ``(kv_heads,)``, ``dt_proj`` ``(kv_heads, kv_heads * head_dim)`` over the position's
    values, with ``bias``), held beside the cache as ``key_bias`` ``(kv_heads, capacity, 1)``:
    DogeAttention's dynamic mask (its ``prepare_dynamic_mask`` below ``keep_window_size``
    keys, where it keeps every key). ``output_gate``: the attention's output (``heads *
    head_dim``, before ``attn_sub_norm`` and ``o_proj``) times ``sigmoid(gate_proj(x))`` of
    the layer's input ``x`` (``gate_proj`` ``(heads * head_dim, hidden)``, biased with
    ``bias``): the gated attention of HrmTextAttention's and Qwen3-Next's ``gate``.
    ``relative``: a learned relative position bias on the scaled scores, read from the
    model's one table ``model.relative_attention_bias`` (``RELATIVE_TABLE`` among the
    tables a layer is given) as the attention operator's ``relative`` says (``(buckets,
    max_distance, bidirectional, segments)``: T5Attention's ``compute_bias``,
    CpmAntSegmentPositionEmbedding's); None: none. ``sees``: ``own`` (causal) or ``call``
    (a query sees every row of its own call, CpmAntModel's mask; the operator's ``sees``).
    """

    heads: int
    kv_heads: int
    head_dim: int
    bias: bool = False
    o_bias: bool = False
    rope: str | None = "default"
    rope_interleaved: bool = False
    scale: float | None = None
    window: int | None = None
    softcap: float | None = None
    qk_norm: str | None = None
    fused_qkv: bool = False
    v_norm: bool = False
    values_from_keys: bool = False
    kv_from: int | None = None
    qkv_layout: str = "blocks"
    qkv_shards: int = 1
    qkv_order: str = "qkv"
    clip_qkv: float | None = None
    qk_norm_bias: bool | None = None
    qk_norm_after_rope: bool = False
    alibi: tuple[float, ...] | None = None
    alibi_bf16: float | None = None
    sinks: bool = False
    latent: "LatentOptions | None" = None  # noqa: F821 (runtime.latent's)
    differential: "DifferentialOptions | None" = None
    sub_norm: bool = False
    dynamic_mask: bool = False
    output_gate: bool = False
    relative: tuple | None = None
    sees: str = "own"


@dataclass(frozen=True)
class DifferentialOptions:
    """Differential attention (the ``differential_attention`` operator), as transformers'
    DiffLlamaAttention: each head pair's two softmax maps, the second weighted by
    ``exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init`` (the four
    ``(head_dim,)`` params ``self_attn.lambda_q1`` ...), over the pair's values side by side,
    then an RMSNorm of no weight over each pair's ``2 head_dim`` (``eps``: its
    ``groupnorm``'s) times ``1 - lambda_init``. ``lambda_init``: this layer's (DiffLlama's
    ``lambda_init_fn`` of the layer index)."""

    lambda_init: float
    eps: float = 1e-6


LAMBDAS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


QKV_LAYOUTS = ("blocks", "heads", "groups", "shards")


def qkv_rows(layout: str, heads: int, kv_heads: int, head_dim: int, shards: int = 1,
             order: str = "qkv") -> np.ndarray | None:
    """Where a fused q/k/v projection's checkpoint stores each row of the model's ``[q; k;
    v]`` blocks (``Param.rows``: ``model = stored[rows]``), None where it stores them so.

    ``blocks``: ``[q (heads * head_dim); k; v]`` (Phi3Attention; GPT-BigCode's and Falcon's
    multi-query, one kv head). ``heads``: per head ``(heads, 3, head_dim)``, q, k and v of
    each head together (GPTNeoXAttention, PersimmonAttention, FalconAttention without
    multi-query; heads == kv_heads). ``groups``: per kv group ``(kv_heads, heads /
    kv_heads + 2, head_dim)``, the group's query heads then its key and value
    (FalconAttention's ``_split_heads`` under ``new_decoder_architecture``); it is
    ``heads`` with as many groups as heads and ``blocks`` with one. ``shards``: the rows in
    ``shards`` model-parallel blocks, block ``b`` holding the ``b``-th of ``shards`` equal
    pieces of q, k and v (each of its own width) in ``order`` (a permutation of ``qkv``), as
    CodeGenAttention's ``qkv.view(..., mp_num, 3 * local_dim).split(local_dim)`` (mp_num 4,
    order ``qvk``); one shard in order ``qkv`` is ``blocks``.

    Raises:
        ValueError: an unknown layout, ``heads`` with fewer kv heads than heads, or
            ``shards`` with an order other than a permutation of ``qkv`` or a q or k/v
            width that is not a multiple of the shards.
    """
    if layout not in QKV_LAYOUTS:
        raise ValueError(f"qkv_layout {layout!r} is not one of {', '.join(QKV_LAYOUTS)}")
    if layout == "blocks":
        return None
    if layout == "shards":
        return _shard_rows(heads * head_dim, kv_heads * head_dim, shards, order)
    if layout == "heads" and kv_heads != heads:
        raise ValueError(f"qkv_layout heads stores q, k and v of every head together: "
                         f"{heads} heads need as many kv heads, not {kv_heads} (groups "
                         "stores them per kv group)")
    G, R, D = kv_heads, heads // kv_heads, head_dim
    stored = np.arange(G * (R + 2) * D).reshape(G, R + 2, D)
    return np.concatenate([stored[:, :R].reshape(-1), stored[:, R].reshape(-1),
                           stored[:, R + 1].reshape(-1)])


def _shard_rows(q: int, kv: int, shards: int, order: str) -> np.ndarray:
    """``qkv_rows`` of layout ``shards``: q ``q`` rows wide, k and v ``kv`` each."""
    if sorted(order) != ["k", "q", "v"]:
        raise ValueError(f"qkv_order {order!r} is not a permutation of qkv")
    if shards < 1 or q % shards or kv % shards:
        raise ValueError(f"{shards} qkv shards do not split q ({q} rows) and k, v ({kv} rows "
                         "each) into equal pieces")
    width = {"q": q // shards, "k": kv // shards, "v": kv // shards}
    pieces, at = {}, 0
    for b in range(shards):
        for part in order:
            pieces[part, b] = np.arange(at, at + width[part])
            at += width[part]
    return np.concatenate([pieces[part, b] for part in "qkv" for b in range(shards)])


def fused_qkv(in_features: int, o) -> "Linear":
    """One fused q/k/v projection of ``o``'s heads, kv heads and head_dim (``o.bias``), its
    weight's (and bias's) rows read from the checkpoint as ``o.qkv_layout`` stores them
    (``qkv_rows``): the causal and the encoder attention's both."""
    H, G, D = o.heads, o.kv_heads or o.heads, o.head_dim
    proj = Linear(in_features, (H + 2 * G) * D, o.bias)
    rows = qkv_rows(o.qkv_layout, H, G, D, o.qkv_shards, o.qkv_order)
    proj.weight.rows = rows
    if proj.bias is not None:
        proj.bias.rows = rows
    return proj


@dataclass(frozen=True)
class MLPOptions:
    """``kind``: ``gated`` (``down(act(gate(x)) * up(x))``, LlamaMLP) or ``plain``
    (``down(act(up(x)))``); ``act``: an ``ACT2FN`` name (one holding parameters holds them
    in ``act_fn``, ``ActivationParams``); ``bias`` on every projection; ``fused``: one
    ``gate_up_proj`` holds gate then up (Phi3MLP); ``sub_norm``: the norm ``ffn_sub_norm``
    over ``intermediate_size`` of what ``down_proj`` reads (BitNetMLP's; None: none).
    ``activation_sparsity`` (gated, not fused; 0: none): the gate projection's rows cut by
    the gaussian top-k at that sparsity before the activation (``operators.sparsity``), as
    Gemma3nTextMLP where its entry of ``activation_sparsity_pattern`` is above 0."""

    intermediate_size: int
    kind: str = "gated"
    act: str = "silu"
    bias: bool = False
    fused: bool = False
    sub_norm: NormOptions | None = None
    activation_sparsity: float = 0.0


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
    ``laurel_rank`` (above 0; not parallel, with an attention norm): a low-rank branch on
    the attention norm's output ``h``, ``h + post_laurel_norm(linear_right(linear_left(h)))``,
    added to the attention's residual sum and the whole times ``2 ** -0.5``
    (``runtime.altup.Laurel``, Gemma3nTextLaurelBlock). ``altup``: the layer runs on one of
    several residual streams (``AltUpOptions``; None: one stream)."""

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
    laurel_rank: int = 0
    altup: "AltUpOptions | None" = None


@dataclass(frozen=True)
class AltUpOptions:
    """Alternating updates: ``inputs`` residual streams, the layer running on stream
    ``active`` and the others predicted before it and corrected after it by per-token
    coefficients from a router (``runtime.altup.AltUp``), as transformers' Gemma3nTextAltUp
    (``altup_num_inputs``, ``altup_active_idx``); ``correct_scale``: the corrected active
    stream times ``correct_output_scale`` before it feeds the per-layer input
    (``altup_correct_scale``)."""

    inputs: int
    active: int = 0
    correct_scale: bool = True


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


class Linear(Module):
    """torch.nn.Linear: ``weight`` ``(out, in)``, optional ``bias`` ``(out,)``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        self.weight = Param(out_features, in_features)
        self.bias = Param(out_features) if bias else None

    def __call__(self, rec: Recorder, x: Handle) -> Handle:
        w = rec.hold("param", self.where("weight"), self.weight.array)
        b = None if self.bias is None else rec.hold("param", self.where("bias"), self.bias.array)
        return rec.step("linear", x, w, b, where=self.path)


@dataclass(frozen=True)
class Sinusoidal:
    """A fixed sinusoidal position table in place of a learned one, computed by
    ``operators.positions.sinusoidal_table`` with these ``theta``, ``denominator`` (None:
    half the width), ``zero_row`` (None: none) and ``interleaved`` (sines and cosines in
    alternate columns): CTRL's ``positional_encoding``, XGLMSinusoidalPositionalEmbedding,
    XLM's ``create_sinusoidal_embeddings`` (interleaved)."""

    theta: float = 10000.0
    denominator: float | None = None
    zero_row: int | None = None
    interleaved: bool = False

    def table(self, rows: int, width: int) -> np.ndarray:
        """The table ``(rows, width)`` float32 (``sinusoidal_table``'s errors)."""
        return sinusoidal_table(rows, width, self.theta, self.denominator, self.zero_row,
                                self.interleaved)


class Embedding(Module):
    """torch.nn.Embedding: ``weight`` ``(vocab, hidden)``, rows times ``scale``; an id
    outside the table reads row ``outside`` (None: refused before the call)."""

    def __init__(self, vocab_size: int, hidden_size: int, scale: float = 1.0,
                 outside: int | None = None):
        self.weight = Param(vocab_size, hidden_size)
        self.scale = scale
        self.outside = outside

    def __call__(self, rec: Recorder, ids: Handle) -> Handle:
        w = rec.hold("param", self.where("weight"), self.weight.array)
        if self.outside is None:
            return rec.step("embedding", ids, w, where=self.path, scale=self.scale)
        return rec.step("embedding", ids, w, where=self.path, scale=self.scale,
                        outside=self.outside)


class Norm(Module):
    """The norm ``options`` names over the last axis of ``size`` (``x`` ``(n, size)``, or
    ``(n, heads, size)`` for a q/k norm per head): ``rms`` runs operators.RMSNorm (as
    transformers' LlamaRMSNorm; Gemma3RMSNorm with ``plus_one``), ``layer`` runs
    operators.LayerNorm (as torch.nn.LayerNorm; NemotronLayerNorm1P with ``plus_one``),
    ``no_norm`` runs operators' ``affine``, ``x * weight + bias`` (MobileBERT's NoNorm).

    Params: ``weight`` ``(size,)``, and for ``layer`` or ``no_norm`` with ``bias`` also
    ``bias`` ``(size,)``.
    With ``options.weight`` false none is held and the normed values are the output, as
    transformers' OlmoLayerNorm (``F.layer_norm(x, shape, None, None)``) and Gemma4RMSNorm
    ``with_scale=False`` (a constant of ones stands for the weight: times one is exact).

    Raises:
        ValueError: a kind other than ``rms``, ``layer`` or ``no_norm``, or ``no_norm``
            without its weight or with ``plus_one``.
    """

    def __init__(self, size: int | tuple[int, int], options: NormOptions):
        if options.kind not in NORM_KINDS:
            raise ValueError(f"norm kind {options.kind!r} is not one of {', '.join(NORM_KINDS)}")
        if options.kind == "no_norm" and (not options.weight or options.plus_one):
            raise ValueError("a no_norm norm is x * weight + bias: it holds its weight, "
                             "multiplied as it is (no weight: false, no plus_one)")
        # (heads, size): each head's own weights in one tensor, as CohereLayerNorm((H, D)).
        shape = tuple(size) if isinstance(size, tuple) else (size,)
        # A weight that multiplies as it is (not 1 + weight) is drawn around 1.
        self.weight = Param(*shape, gain=not options.plus_one) if options.weight else None
        if not options.weight:
            self.ones = np.ones(shape, np.float32)
        self.bias = Param(*shape) if options.kind in ("layer", "no_norm") and options.bias \
            else None
        self.options = options

    def __call__(self, rec: Recorder, x: Handle) -> Handle:
        o = self.options
        if self.weight is not None:
            w = rec.hold("param", self.where("weight"), self.weight.array)
            plus_one = o.plus_one
        else:
            w, plus_one = rec.hold("const", self.where("ones"), self.ones), False
        if o.kind == "rms":
            return rec.step("rms_norm", x, w, where=self.path, eps=o.eps, plus_one=plus_one)
        b = None if self.bias is None else rec.hold("param", self.where("bias"), self.bias.array)
        if o.kind == "no_norm":
            return rec.step("affine", x, w, b, where=self.path)
        return rec.step("layer_norm", x, w, b, where=self.path, eps=o.eps, plus_one=plus_one)


class HeadNorms(Module):
    """One norm per head over its ``size`` columns, each with weights of its own: ``norms``
    a list of ``heads`` ``Norm``s (``norms.{h}.weight`` ``(size,)``, and ``.bias`` where the
    options hold one), as transformers' StableLmLayerNormPerHead. Their weights are rows of
    one ``(heads, size)`` array, so one step norms ``x`` ``(n, heads, size)``: row ``h`` of
    every token by head ``h``'s weights.

    Raises:
        ValueError: options holding no weight (heads would not differ: use one ``Norm``), or
            of kind ``no_norm``.
    """

    def __init__(self, heads: int, size: int, options: NormOptions):
        if not options.weight:
            raise ValueError("norms per head with no weight are one norm: use qk_norm head")
        if options.kind == "no_norm":
            raise ValueError("norms per head are rms or layer norms, not no_norm")
        self.norms = [Norm(size, options) for _ in range(heads)]
        self.weights = self._stack([n.weight for n in self.norms])
        first = self.norms[0].bias
        self.biases = None if first is None else self._stack([n.bias for n in self.norms])
        self.options = options

    @staticmethod
    def _stack(params: list[Param]) -> np.ndarray:
        # Filled in place at load (Param.fill), each param a row of the stacked array.
        stacked = np.empty((len(params),) + params[0].shape, np.float32)
        for i, p in enumerate(params):
            p.array = stacked[i]
        return stacked

    def __call__(self, rec: Recorder, x: Handle) -> Handle:
        o = self.options
        w = rec.hold("param", self.where("norms.weight"), self.weights)
        if o.kind == "rms":
            return rec.step("rms_norm", x, w, where=self.path, eps=o.eps, plus_one=o.plus_one)
        b = None if self.biases is None else rec.hold("param", self.where("norms.bias"),
                                                      self.biases)
        return rec.step("layer_norm", x, w, b, where=self.path, eps=o.eps, plus_one=o.plus_one)


class Attention(Module):
    """q/k/v/o projections, optional q/k norms, RoPE, a KV cache ``(kv_heads, max_seq_len,
    head_dim)`` each for keys and values, and causal attention over it up to the call's last
    position."""

    def __init__(self, hidden_size: int, o: AttentionOptions, max_seq_len: int,
                 norm: NormOptions = NormOptions()):
        if o.heads % o.kv_heads:
            raise ValueError(f"{o.heads} attention heads do not group into {o.kv_heads} kv heads")
        if o.qk_norm not in QK_NORMS:
            raise ValueError(f"qk_norm {o.qk_norm!r} is not one of {', '.join(map(str, QK_NORMS))}")
        if o.fused_qkv and (o.values_from_keys or o.kv_from is not None):
            raise ValueError("a fused qkv_proj holds its own keys and values: not with "
                             "values_from_keys or kv_from")
        if o.qk_norm_after_rope and o.qk_norm not in PER_HEAD_QK_NORMS:
            raise ValueError(f"qk_norm_after_rope norms each turned head: qk_norm "
                             f"{o.qk_norm!r} is not one of {', '.join(PER_HEAD_QK_NORMS)}")
        H, G, D = o.heads, o.kv_heads, o.head_dim
        own = o.kv_from is None
        if o.fused_qkv:
            self.qkv_proj = fused_qkv(hidden_size, o)
        elif o.qkv_layout != "blocks":
            raise ValueError(f"qkv_layout {o.qkv_layout!r} orders a fused qkv_proj's rows: "
                             "only with fused_qkv")
        else:
            self.q_proj = Linear(hidden_size, H * D, o.bias)
            if own:
                self.k_proj = Linear(hidden_size, G * D, o.bias)
            if own and not o.values_from_keys:
                self.v_proj = Linear(hidden_size, G * D, o.bias)
        self.o_proj = Linear(H * D, hidden_size, o.o_bias)
        if o.qk_norm_bias is not None:
            norm = replace(norm, bias=o.qk_norm_bias)
        if o.qk_norm == "per_head_stacked":
            self.q_norm = Norm((H, D), norm)
            if own:
                self.k_norm = Norm((G, D), norm)
        elif o.qk_norm == "per_head_weights":
            self.q_norm = HeadNorms(H, D, norm)
            if own:
                self.k_norm = HeadNorms(G, D, norm)
        elif o.qk_norm is not None:
            self.q_norm = Norm(D if o.qk_norm == "head" else H * D, norm)
            if own:
                self.k_norm = Norm(D if o.qk_norm == "head" else G * D, norm)
        if o.v_norm and own:
            self.v_norm = Norm(D, NormOptions("rms", norm.eps, weight=False))
        if o.sinks:
            self.sinks = Param(H)
        if o.differential is not None:
            if H % 2 or G % 2 or o.sinks or o.alibi is not None or o.softcap is not None:
                raise ValueError(f"differential attention pairs heads: an even number of heads "
                                 f"and kv heads ({H}, {G}), and no sinks, alibi or softcap")
            for name in LAMBDAS:
                setattr(self, name, Param(D))
            # The head norm's weight: none, times 1 - lambda_init (its output's scale).
            self.head_scale = np.full(2 * D, 1.0 - o.differential.lambda_init, np.float32)
        if o.output_gate:
            self.gate_proj = Linear(hidden_size, H * D, o.bias)
        if o.sub_norm:
            self.attn_sub_norm = Norm(H * D, norm)
        if o.dynamic_mask:
            if not own:
                raise ValueError("a dynamic mask is computed from the layer's own values: not "
                                 "with kv_from")
            # Drawn around 1 (a gain), so a toy's mask varies by key.
            self.A = Param(G, gain=True)
            self.dt_proj = Linear(G * D, G, o.bias)
        self.options = o
        if own:
            # Positions along axis 1, grown as the sequence does (CausalLM.reserve).
            # Differential attention's kernels read float32 caches only.
            kv = o.differential is None
            self.keys = State(G, max_seq_len, D, axis=1, initial=0, kv=kv)
            self.values = State(G, max_seq_len, D, axis=1, initial=0, kv=kv)
        if o.dynamic_mask:
            self.key_bias = State(G, max_seq_len, 1, axis=1, initial=0)
        else:
            self.shared: tuple[State, State] | None = None  # set by share()

    def share(self, source: "Attention") -> None:
        """Read ``source``'s KV cache (``kv_from``'s layer) instead of holding one.

        Raises:
            ValueError: ``source`` reads another's cache itself, or its cache's shape
                (kv heads, head_dim) is not this layer's.
        """
        o, s = self.options, source.options
        if s.kv_from is not None or (s.kv_heads, s.head_dim) != (o.kv_heads, o.head_dim):
            raise ValueError(f"a layer of {o.kv_heads} kv heads of {o.head_dim} cannot read the "
                             f"cache of one of {s.kv_heads} of {s.head_dim}"
                             + (" that reads another's" if s.kv_from is not None else ""))
        self.shared = (source.keys, source.values)

    def packs(self) -> list[tuple[Param, ...]]:
        """The projections of one input, stacked at load (``runtime.module.pack``)."""
        o = self.options
        if o.fused_qkv or o.kv_from is not None:
            return []
        if o.values_from_keys:
            return [(self.q_proj.weight, self.k_proj.weight)]
        return [(self.q_proj.weight, self.k_proj.weight, self.v_proj.weight)]

    def _project(self, rec: Recorder, x: Handle) -> tuple[Handle, Handle | None, Handle | None]:
        o = self.options
        if o.kv_from is not None:
            return self.q_proj(rec, x), None, None
        if o.values_from_keys:
            q, k = self.q_proj(rec, x), self.k_proj(rec, x)
            return q, k, k
        if not o.fused_qkv:
            return self.q_proj(rec, x), self.k_proj(rec, x), self.v_proj(rec, x)
        H, G, D = o.heads, o.kv_heads, o.head_dim
        qkv = self.qkv_proj(rec, x)
        bounds = (0, H * D, (H + G) * D, (H + 2 * G) * D)
        return tuple(rec.step("columns", qkv, where=self.where(name), begin=a, end=b)
                     for name, a, b in zip("qkv", bounds, bounds[1:]))

    def __call__(self, rec: Recorder, x: Handle, ropes: dict[str, tuple[Handle, Handle]]) -> Handle:
        o, n = self.options, x.shape[0]
        G, D = o.kv_heads, o.head_dim
        start = rec.call.start
        q, k, v = self._project(rec, x)
        gate = self.gate_proj(rec, x) if o.output_gate else None
        if o.clip_qkv is not None:
            q, k, v = (None if h is None else rec.step("clamp", h, where=self.where(name),
                                                        limit=o.clip_qkv)
                       for name, h in zip("qkv", (q, k, v)))
        if o.kv_from is not None:
            return self._attend(rec, self._queries(rec, q, ropes), *self.shared, gate, ropes)
        if o.dynamic_mask:
            A = rec.hold("param", self.where("A"), self.A.array)
            mask = rec.step("dynamic_mask", self.dt_proj(rec, v), A, where=self.where("A"))
            key_bias = rec.state(self.where("key_bias"), self.key_bias)
            rec.step("kv_write", rec.view(mask, (n, G, 1)), key_bias,
                     where=self.where("key_bias"), start=start, ring=self.key_bias.ring)
        if o.qk_norm == "all":
            k = self.k_norm(rec, k)
        k, v = rec.view(k, (n, G, D)), rec.view(v, (n, G, D))
        if o.qk_norm in PER_HEAD_QK_NORMS and not o.qk_norm_after_rope:
            k = self.k_norm(rec, k)
        if o.v_norm:
            v = self.v_norm(rec, v)
        if o.rope is not None:
            cos, sin = ropes[o.rope]
            k = rec.step("rope", k, cos, sin, where=self.where("k"), start=start,
                         interleaved=o.rope_interleaved)
        if o.qk_norm_after_rope:
            k = self.k_norm(rec, k)
        q = self._queries(rec, q, ropes)
        keys = rec.state(self.where("keys"), self.keys)
        values = rec.state(self.where("values"), self.values)
        rec.step("kv_write", k, keys, where=self.where("keys"), start=start, ring=self.keys.ring)
        rec.step("kv_write", v, values, where=self.where("values"), start=start,
                 ring=self.values.ring)
        return self._attend(rec, q, self.keys, self.values, gate, ropes)

    def _queries(self, rec: Recorder, q: Handle, ropes) -> Handle:
        """The projected queries ``(n, H * D)`` normed and turned: ``(n, H, D)``."""
        o, n = self.options, q.shape[0]
        if o.qk_norm == "all":
            q = self.q_norm(rec, q)
        q = rec.view(q, (n, o.heads, o.head_dim))
        if o.qk_norm in PER_HEAD_QK_NORMS and not o.qk_norm_after_rope:
            q = self.q_norm(rec, q)
        if o.rope is not None:
            cos, sin = ropes.get(o.rope + QUERIES, ropes[o.rope])
            q = rec.step("rope", q, cos, sin, where=self.where("q"), start=rec.call.start,
                         interleaved=o.rope_interleaved)
        if o.qk_norm_after_rope:
            q = self.q_norm(rec, q)
        return q

    def _attend(self, rec: Recorder, q: Handle, keys: State, values: State,
                gate: Handle | None = None, ropes=None) -> Handle:
        """Attention of ``q`` over the cache ``keys``, ``values`` up to the call's last
        position, times ``sigmoid(gate)`` where there is one (``output_gate``), through
        ``o_proj``; ``ropes``: the model-wide tables (the relative bias table's handle under
        ``RELATIVE_TABLE`` where ``relative``)."""
        o, start = self.options, rec.call.start
        ring = keys.ring
        keys = rec.state(self.where("keys"), keys)
        values = rec.state(self.where("values"), values)
        bias = {} if o.alibi is None else {"alibi": o.alibi}
        if o.alibi_bf16 is not None:
            bias["alibi_bf16"] = o.alibi_bf16
        if o.differential is not None:
            a = self._differential(rec, q, keys, values, ring)
        else:
            extra = [rec.hold("param", self.where("sinks"), self.sinks.array) if o.sinks
                     else None]
            extra.append(rec.state(self.where("key_bias"), self.key_bias) if o.dynamic_mask
                         else None)
            if o.relative is not None:
                extra.append(ropes[RELATIVE_TABLE])
                bias["relative"] = o.relative
            if o.sees != "own":
                bias["sees"] = o.sees
            while extra and extra[-1] is None:
                extra.pop()
            a = rec.step("attention", q, keys, values, *extra,
                         where=self.path, start=start,
                         scale=o.scale, window=o.window, softcap=o.softcap, ring=ring, **bias)
        if gate is not None:
            # sigmoid(gate) * a: the gated MLP's step with sigmoid for its activation.
            a = rec.step("gated_activation", gate, rec.view(a, gate.shape),
                         where=self.where("gate_proj"), act="sigmoid")
        if o.sub_norm:
            a = self.attn_sub_norm(rec, a)
        return self.o_proj(rec, a)

    def _differential(self, rec: Recorder, q: Handle, keys: Handle, values: Handle,
                      ring: int | None) -> Handle:
        """Differential attention of ``q`` over the cache, each pair's output RMS-normed and
        scaled (``DifferentialOptions``): ``(n, heads * head_dim)``."""
        o, n = self.options, q.shape[0]
        d = o.differential
        lambdas = [rec.hold("param", self.where(name), getattr(self, name).array)
                   for name in LAMBDAS]
        a = rec.step("differential_attention", q, keys, values, *lambdas, where=self.path,
                     start=rec.call.start, scale=o.scale, window=o.window, ring=ring,
                     lambda_init=d.lambda_init)
        w = rec.hold("const", self.where("head_scale"), self.head_scale)
        a = rec.step("rms_norm", a, w, where=self.where("groupnorm"), eps=d.eps, plus_one=False)
        return rec.view(a, (n, o.heads * o.head_dim))


class ActivationParams(Module):
    """The parameters an activation holds, named as transformers' activation module names
    them (``act_fn.alpha_p`` ... of XIELUActivation, ``act_fn.weight`` of nn.PReLU;
    ``operators.activation.ACTIVATION_PARAMS``); none for most activations."""

    def __init__(self, act: str):
        self.names = tuple(name for name, _ in ACTIVATION_PARAMS.get(act, ()))
        for name, shape in ACTIVATION_PARAMS.get(act, ()):
            setattr(self, name, Param(*shape))

    def __call__(self, rec: Recorder) -> list[Handle]:
        """The parameters' handles, in the order the activation operators take them."""
        return [rec.hold("param", self.where(n), getattr(self, n).array) for n in self.names]


class MLP(Module):
    """The feed-forward block: ``down_proj(act(gate_proj(x)) * up_proj(x))`` (gated, gate
    and up fused in ``gate_up_proj`` where ``fused``) or ``down_proj(act(up_proj(x)))``;
    with ``activation_sparsity``, ``gate_proj(x)`` cut by the gaussian top-k first.

    Raises:
        ValueError: an unknown kind, or activation sparsity outside [0, 1) or on an MLP
            other than gated and unfused.
    """

    def __init__(self, hidden_size: int, o: MLPOptions):
        if o.kind not in MLP_KINDS:
            raise ValueError(f"mlp kind {o.kind!r} is not one of {', '.join(MLP_KINDS)}")
        if o.activation_sparsity:
            if o.kind != "gated" or o.fused:
                raise ValueError("activation sparsity cuts a gated MLP's own gate_proj, not a "
                                 f"{'fused ' if o.fused else ''}{o.kind} MLP's")
            self.std_multiplier = std_multiplier(o.activation_sparsity)
        M = o.intermediate_size
        if o.kind == "gated" and o.fused:
            self.gate_up_proj = Linear(hidden_size, 2 * M, o.bias)
        elif o.kind == "gated":
            self.gate_proj = Linear(hidden_size, M, o.bias)
        if not (o.kind == "gated" and o.fused):
            self.up_proj = Linear(hidden_size, M, o.bias)
        self.down_proj = Linear(M, hidden_size, o.bias)
        if o.act in ACTIVATION_PARAMS:
            self.act_fn = ActivationParams(o.act)
        if o.sub_norm is not None:
            self.ffn_sub_norm = Norm(M, o.sub_norm)
        self.options = o

    def packs(self) -> list[tuple[Param, ...]]:
        """The projections of one input, stacked at load (``runtime.module.pack``)."""
        o = self.options
        return [(self.gate_proj.weight, self.up_proj.weight)] if o.kind == "gated" and not o.fused else []

    def __call__(self, rec: Recorder, x: Handle) -> Handle:
        o = self.options
        params = self.act_fn(rec) if hasattr(self, "act_fn") else []
        if o.kind == "plain":
            h = rec.step("activation", self.up_proj(rec, x), *params, where=self.path, act=o.act)
        elif o.fused:
            h = rec.step("gated_activation", self.gate_up_proj(rec, x), None, *params,
                         where=self.path, act=o.act)
        else:
            gate = self.gate_proj(rec, x)
            if o.activation_sparsity:
                gate = rec.step("gaussian_topk", gate, where=self.path,
                                std_multiplier=self.std_multiplier)
            h = rec.step("gated_activation", gate, self.up_proj(rec, x), *params,
                         where=self.path, act=o.act)
        if o.sub_norm is not None:
            h = self.ffn_sub_norm(rec, h)
        return self.down_proj(rec, h)


QK_NORMS = (None, "head", "all", "per_head_weights", "per_head_stacked")
PER_HEAD_QK_NORMS = ("head", "per_head_weights", "per_head_stacked")
NORM_KINDS = ("rms", "layer", "no_norm")
MLP_KINDS = ("gated", "plain")


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
# Among the tables every layer is given (beside RoPE's): the relative position bias table.
RELATIVE_TABLE = "relative_attention_bias"


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
