"""Self-attention, the token mixer of a decoder layer: its options (``AttentionOptions``,
``DifferentialOptions``) and the block (``Attention``): q/k/v/o projections, q/k norms, RoPE,
its KV cache and the attention operator over it. Semantics follow transformers'
``modeling_llama.py`` (GQA) unless an option says otherwise.

Not for: multi-head latent attention (``runtime.latent``), an encoder's attention
(``runtime.encoder_layer``); token mixers with a recurrent state (short convolutions, SSMs,
the gated delta rule) each take a module of their own beside this one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..graph import Handle, Recorder
from ..module import Module, Param, State
from .experts import Router, RouterOptions
from .norms import HeadNorms, Norm, NormOptions
from .projections import Linear, fused_qkv
from .rope import POSITIONS, QUERIES


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
    ``clip_after_norm`` (with ``qk_norm`` ``all``): the clamp follows the q and k norms
    instead, as OlmoeAttention's ``q_norm(q_proj(x))`` then ``clamp_``.
    ``clip_qkv``: q, k and v clamped to ``[-clip_qkv, clip_qkv]`` right after their
    projections, as OlmoAttention (None: none). ``qk_norm_bias``: whether a LayerNorm q/k
    norm holds a bias, where it differs from the layer's norms (StableLmLayerNormPerHead's
    ``bias=False`` beside biased layer norms; None: as the layer's). ``qk_norm_weight``:
    whether the q/k norms hold a weight where it differs from the layer's norms
    (Llama4TextAttention's ``Llama4TextWeightlessRMSNorm``: none; None: as the layer's).
    ``qk_norm_after_rope``:
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
    ``bias``): the gated attention of HrmTextAttention's.
    ``gate_in_query`` (with ``output_gate``): the gate's rows are the query projection's,
    ``q_proj`` ``(2 heads * head_dim, hidden)`` holding each head's queries then its gate
    (Qwen3NextAttention's ``torch.chunk(q_proj(x).view(..., head_dim * 2), 2)``,
    MiniCPM5MoeAttention's q_gate_proj ``view(..., 2 * head_dim).chunk(2)``), its rows
    regrouped at load into every query then every gate; no ``gate_proj``.
    ``relative``: a learned relative position bias on the scaled scores, read from the
    model's one table ``model.relative_attention_bias`` (``RELATIVE_TABLE`` among the
    tables a layer is given) as the attention operator's ``relative`` says (``(buckets,
    max_distance, bidirectional, segments)``: T5Attention's ``compute_bias``,
    CpmAntSegmentPositionEmbedding's); None: none. ``sees``: ``own`` (causal) or ``call``
    (a query sees every row of its own call, CpmAntModel's mask; the operator's ``sees``).
    ``reach``: where a prompt chunk's rows may see past their own position (an image's rows,
    ``runtime.towers``), this layer lets them (``attention_reach``); false: the layer stays
    causal, as Gemma4Model's full-attention layers under ``use_bidirectional_attention``
    ``vision`` (``create_masks_for_vision_model``).
    ``chunk``: chunked attention, each query seeing the keys of its own ``chunk`` positions
    alone (the attention operator's ``chunk``: Llama4TextAttention's layers of layer type
    ``chunked_attention``, ``create_chunked_causal_mask`` of ``attention_chunk_size``); None:
    none. ``temperature``: ``(attn_scale, floor_scale)``, each query times ``1 + attn_scale *
    log1p(floor((p + 1) / floor_scale))`` at its position ``p`` after RoPE and the q norm
    (Llama4TextAttention's ``attn_temperature_tuning``, the operator's ``temperature``);
    None: none. ``experts``: a mixture of attention heads (``AttentionExpertsOptions``,
    JetMoeMoA): each row's query and output projections are its routed experts', keys and
    values one ``kv_proj``; None: none.
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
    clip_after_norm: bool = False
    qk_norm_bias: bool | None = None
    qk_norm_weight: bool | None = None
    qk_norm_after_rope: bool = False
    alibi: tuple[float, ...] | None = None
    alibi_bf16: float | None = None
    sinks: bool = False
    latent: "LatentOptions | None" = None  # noqa: F821 (runtime.latent's)
    differential: "DifferentialOptions | None" = None
    sub_norm: bool = False
    dynamic_mask: bool = False
    output_gate: bool = False
    gate_in_query: bool = False
    relative: tuple | None = None
    sees: str = "own"
    reach: bool = True
    chunk: int | None = None
    temperature: tuple[float, float] | None = None
    experts: "AttentionExpertsOptions | None" = None


@dataclass(frozen=True)
class AttentionExpertsOptions:
    """A mixture of attention heads, as transformers' JetMoeAttention with its JetMoeMoA:
    ``count`` experts, each a query projection ``(kv_heads * head_dim, hidden)`` and an
    output projection ``(hidden, kv_heads * head_dim)``; a router (JetMoeTopKGating: the
    ``top_k`` largest logits, weights their softmax) picks ``top_k`` of them a row. Each
    chosen expert's queries are ``kv_heads`` heads over the one ``kv_proj``'s keys and values
    (its rows k then v, ``chunk(2)``), the row's heads ``top_k`` slots of them, slot-major
    (query head ``s * kv_heads + g`` reads kv head ``g``: ``key_states.repeat(1, top_k, 1,
    1)``, the attention operator's ``kv_tiled``); each slot's attention output through its
    expert's output projection times its weight, summed, plus ``bias`` ``(hidden,)``. The
    attention's ``heads`` are ``top_k * kv_heads`` (JetMoeConfig's ``num_attention_heads``).
    Params as transformers names them under the attention: ``experts.router.layer.weight``
    ``(count, hidden)``, ``experts.input_linear.weight`` ``(count, kv_heads * head_dim,
    hidden)``, ``experts.output_linear.weight`` ``(count, hidden, kv_heads * head_dim)``,
    ``experts.bias``, ``kv_proj.weight`` ``(2 kv_heads * head_dim, hidden)``."""

    count: int
    top_k: int


class AttentionExperts(Module):
    """``AttentionExpertsOptions``' params: the router and the experts' stacked projections."""

    def __init__(self, hidden_size: int, width: int, o: AttentionExpertsOptions):
        self.router = Module()
        self.router.layer = Router(hidden_size, o.count, RouterOptions(
            top_k=o.top_k, score="logits", select="logits", weights="softmax"))
        self.input_linear = Module()
        self.input_linear.weight = Param(o.count, width, hidden_size)
        self.output_linear = Module()
        self.output_linear.weight = Param(o.count, hidden_size, width)
        self.bias = Param(hidden_size)


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
        if o.experts is not None:
            self._routed(hidden_size, o, max_seq_len)
            return
        if o.fused_qkv:
            self.qkv_proj = fused_qkv(hidden_size, o)
        elif o.qkv_layout != "blocks":
            raise ValueError(f"qkv_layout {o.qkv_layout!r} orders a fused qkv_proj's rows: "
                             "only with fused_qkv")
        else:
            self.q_proj = Linear(hidden_size, (2 if o.gate_in_query else 1) * H * D, o.bias)
            if o.gate_in_query:
                # Stored per head, query then gate; held as every query, then every gate.
                rows = np.concatenate([(np.arange(H)[:, None] * 2 * D + part * D +
                                        np.arange(D)).reshape(-1) for part in (0, 1)])
                self.q_proj.weight.rows = rows
                if self.q_proj.bias is not None:
                    self.q_proj.bias.rows = rows
            if own:
                self.k_proj = Linear(hidden_size, G * D, o.bias)
            if own and not o.values_from_keys:
                self.v_proj = Linear(hidden_size, G * D, o.bias)
        self.o_proj = Linear(H * D, hidden_size, o.o_bias)
        if o.qk_norm_bias is not None:
            norm = replace(norm, bias=o.qk_norm_bias)
        if o.qk_norm_weight is not None:
            norm = replace(norm, weight=o.qk_norm_weight)
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
        if (o.chunk is not None or o.temperature is not None) and (
                o.differential is not None or o.sees != "own"):
            raise ValueError("chunked attention and a query temperature are the attention "
                             "operator's: not with differential attention or sees call")
        if o.differential is not None:
            if H % 2 or G % 2 or o.sinks or o.alibi is not None or o.softcap is not None:
                raise ValueError(f"differential attention pairs heads: an even number of heads "
                                 f"and kv heads ({H}, {G}), and no sinks, alibi or softcap")
            for name in LAMBDAS:
                setattr(self, name, Param(D))
            # The head norm's weight: none, times 1 - lambda_init (its output's scale).
            self.head_scale = np.full(2 * D, 1.0 - o.differential.lambda_init, np.float32)
        if o.gate_in_query and (o.fused_qkv or not o.output_gate):
            raise ValueError("gate_in_query is an output gate held in q_proj: with output_gate, "
                             "not a fused qkv_proj")
        if o.output_gate and not o.gate_in_query:
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

    def _routed(self, hidden_size: int, o: AttentionOptions, max_seq_len: int) -> None:
        """A mixture of attention heads' params and cache (``AttentionExpertsOptions``).

        Raises:
            ValueError: heads other than top_k * kv_heads, or an option the mixture's
                attention is not built with (q/k norms, fused or shared k/v, gates, sinks,
                ALiBi, latent or differential attention, a dynamic mask, a relative bias).
        """
        e, G, D = o.experts, o.kv_heads, o.head_dim
        if o.heads != e.top_k * G:
            raise ValueError(f"a mixture of attention heads has top_k * kv_heads = "
                             f"{e.top_k} * {G} heads, not {o.heads}")
        if o.qk_norm is not None or o.fused_qkv or o.kv_from is not None or \
                o.values_from_keys or o.output_gate or o.sinks or o.alibi is not None or \
                o.latent is not None or o.differential is not None or o.dynamic_mask or \
                o.sub_norm or o.v_norm or o.relative is not None or o.clip_qkv is not None:
            raise ValueError("a mixture of attention heads is built with RoPE, a window, a "
                             "chunk, a scale and a softcap alone (no q/k norms, fused or "
                             "shared k/v, gates, sinks, ALiBi, latent, differential or "
                             "relative attention, dynamic masks, sub norms or clamps)")
        self.experts = AttentionExperts(hidden_size, G * D, e)
        self.kv_proj = Linear(hidden_size, 2 * G * D, o.bias)
        self.options = o
        self.keys = State(G, max_seq_len, D, axis=1, initial=0, kv=True)
        self.values = State(G, max_seq_len, D, axis=1, initial=0, kv=True)
        self.shared = None

    def _routed_call(self, rec: Recorder, x: Handle, ropes) -> Handle:
        """JetMoeAttention's forward: the router's choice, each slot's queries by its expert
        (``experts`` linear, ``slots`` each), keys and values by ``kv_proj``, RoPE, attention
        with the kv heads tiled over the slots, each slot's output by its expert's output
        projection weighted and summed (``slots`` sum), plus ``bias``."""
        o, n = self.options, x.shape[0]
        G, D, K = o.kv_heads, o.head_dim, o.experts.top_k
        ex = self.experts
        routing = ex.router.layer(rec, x)
        w_q = rec.hold("param", ex.where("input_linear.weight"), ex.input_linear.weight.array)
        q = rec.step("experts", x, routing, w_q, None, None, None, None,
                     where=ex.where("input_linear"),
                     kind="linear", slots="each")
        kv = self.kv_proj(rec, x)
        k, v = (rec.view(rec.step("columns", kv, where=self.where("kv_proj"), begin=a,
                                  end=a + G * D), (n, G, D)) for a in (0, G * D))
        if o.rope is not None:
            k = self._turn(rec, k, ropes[o.rope], "k", ropes)
        q = self._queries(rec, rec.view(q, (n, K * G * D)), ropes)
        start = rec.call.start
        keys = rec.state(self.where("keys"), self.keys)
        values = rec.state(self.where("values"), self.values)
        rec.step("kv_write", k, keys, where=self.where("keys"), start=start, ring=self.keys.ring)
        rec.step("kv_write", v, values, where=self.where("values"), start=start,
                 ring=self.values.ring)
        a = self._attend(rec, q, self.keys, self.values, None, ropes)
        w_o = rec.hold("param", ex.where("output_linear.weight"),
                       ex.output_linear.weight.array)
        y = rec.step("experts", rec.view(a, (n, K, G * D)), routing, w_o, None, None, None, None,
                     where=ex.where("output_linear"), kind="linear", slots="sum")
        b = rec.hold("param", ex.where("bias"), ex.bias.array)
        return rec.step("add", y, b, where=ex.where("bias"))

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
        if o.fused_qkv or o.kv_from is not None or o.experts is not None:
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
        if o.experts is not None:
            return self._routed_call(rec, x, ropes)
        G, D = o.kv_heads, o.head_dim
        start = rec.call.start
        q, k, v = self._project(rec, x)
        if o.gate_in_query:
            HD = o.heads * o.head_dim
            q, gate = (rec.step("columns", q, where=self.where("q_proj"), begin=b, end=b + HD)
                       for b in (0, HD))
        else:
            gate = self.gate_proj(rec, x) if o.output_gate else None
        normed = o.clip_after_norm and o.clip_qkv is not None
        if normed:  # the whole projections' norms first, then the clamp (OlmoeAttention)
            q, k = self.q_norm(rec, q), self.k_norm(rec, k)
        if o.clip_qkv is not None:
            q, k, v = (None if h is None else rec.step("clamp", h, where=self.where(name),
                                                        limit=o.clip_qkv)
                       for name, h in zip("qkv", (q, k, v)))
        if o.kv_from is not None:
            return self._attend(rec, self._queries(rec, q, ropes, normed), *self.shared, gate,
                                ropes)
        if o.dynamic_mask:
            A = rec.hold("param", self.where("A"), self.A.array)
            mask = rec.step("dynamic_mask", self.dt_proj(rec, v), A, where=self.where("A"))
            key_bias = rec.state(self.where("key_bias"), self.key_bias)
            rec.step("kv_write", rec.view(mask, (n, G, 1)), key_bias,
                     where=self.where("key_bias"), start=start, ring=self.key_bias.ring)
        if o.qk_norm == "all" and not normed:
            k = self.k_norm(rec, k)
        k, v = rec.view(k, (n, G, D)), rec.view(v, (n, G, D))
        if o.qk_norm in PER_HEAD_QK_NORMS and not o.qk_norm_after_rope:
            k = self.k_norm(rec, k)
        if o.v_norm:
            v = self.v_norm(rec, v)
        if o.rope is not None:
            k = self._turn(rec, k, ropes[o.rope], "k", ropes)
        if o.qk_norm_after_rope:
            k = self.k_norm(rec, k)
        q = self._queries(rec, q, ropes, normed)
        keys = rec.state(self.where("keys"), self.keys)
        values = rec.state(self.where("values"), self.values)
        rec.step("kv_write", k, keys, where=self.where("keys"), start=start, ring=self.keys.ring)
        rec.step("kv_write", v, values, where=self.where("values"), start=start,
                 ring=self.values.ring)
        return self._attend(rec, q, self.keys, self.values, gate, ropes)

    def _turn(self, rec: Recorder, x: Handle, table: tuple[Handle, Handle], which: str,
              ropes) -> Handle:
        """``x`` ``(n, heads, head_dim)`` turned by ``table`` (cos, sin): at the call's
        positions, or where the table has sections (M-RoPE), at each row's own positions
        (``POSITIONS``)."""
        o = self.options
        given = ropes.get(POSITIONS)
        if given is not None and o.rope in given[1]:
            return rec.step("rope_sections", x, *table, given[0], where=self.where(which),
                            sections=given[1][o.rope], interleaved=o.rope_interleaved)
        return rec.step("rope", x, *table, where=self.where(which), start=rec.call.start,
                        interleaved=o.rope_interleaved)

    def _queries(self, rec: Recorder, q: Handle, ropes, normed: bool = False) -> Handle:
        """The projected queries ``(n, H * D)`` normed (unless ``normed`` already) and
        turned: ``(n, H, D)``."""
        o, n = self.options, q.shape[0]
        if o.qk_norm == "all" and not normed:
            q = self.q_norm(rec, q)
        q = rec.view(q, (n, o.heads, o.head_dim))
        if o.qk_norm in PER_HEAD_QK_NORMS and not o.qk_norm_after_rope:
            q = self.q_norm(rec, q)
        if o.rope is not None:
            q = self._turn(rec, q, ropes.get(o.rope + QUERIES, ropes[o.rope]), "q", ropes)
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
            if ropes is not None and REACH in ropes and o.reach:
                raise ValueError(f"{self.path}: rows reaching past their own position (an "
                                 "image's) are not built with differential attention")
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
            if o.chunk is not None:
                bias["chunk"] = o.chunk
            if o.temperature is not None:
                bias["temperature"] = o.temperature
            if o.experts is not None:
                bias["kv_tiled"] = True
            while extra and extra[-1] is None:
                extra.pop()
            if ropes is not None and REACH in ropes and o.reach:
                if extra or bias:
                    raise ValueError(f"{self.path}: rows reaching past their own position "
                                     "(an image's) are not built beside sinks, a dynamic "
                                     "mask, a relative bias, ALiBi, chunks, a temperature "
                                     "or another key reach")
                a = rec.step("attention_reach", q, keys, values, ropes[REACH], where=self.path,
                             start=start, scale=o.scale, window=o.window, softcap=o.softcap,
                             ring=ring)
            else:
                a = rec.step("attention", q, keys, values, *extra,
                             where=self.path, start=start,
                             scale=o.scale, window=o.window, softcap=o.softcap, ring=ring,
                             **bias)
        if o.experts is not None:  # each slot's output projection is its expert's
            return a
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


QK_NORMS = (None, "head", "all", "per_head_weights", "per_head_stacked")
PER_HEAD_QK_NORMS = ("head", "per_head_weights", "per_head_stacked")


# Among the tables every layer is given (beside RoPE's): the relative position bias table.
RELATIVE_TABLE = "relative_attention_bias"
# And a prompt chunk's last key position each row sees (``operators.soft_tokens``'
# attention_reach), where its rows may see past their own (an image's, runtime.towers).
REACH = "reach"
