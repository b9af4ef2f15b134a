"""A transformer block whose weights several layers share (``SharedBlock``): one attention and
one MLP held once and run at several depths, each depth with its own KV cache and its own
low-rank adapters on the shared projections, as transformers' Zamba2 (``modeling_zamba2.py``:
``Zamba2AttentionDecoderLayer``, ``Zamba2Attention``, ``Zamba2MLP``, ``Zamba2HybridLayer``).

The block reads the layer's hidden state beside the model's embeddings, side by side
(``torch.concatenate([hidden_states, original_hidden_states], -1)``: ``2 * hidden`` wide into
its first norm and its q/k/v projections); its attention's output (``hidden`` wide) is normed
and run through the MLP, with no residual add inside the block. The layer that runs it adds
what a linear of its own makes of the block's output to its input before its own mixer
(``runtime.layers.DecoderLayer``).

Not for: which layers run the block and which weight set each use reads (``runtime.causal``'s
``Decoder``: uses in layer order, use ``u`` reading set ``u % blocks``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph import Handle, Recorder
from ..module import Module, Param
from .attention import Attention, AttentionOptions
from .mlp import MLP, MLPOptions
from .norms import Norm, NormOptions
from .projections import Linear


@dataclass(frozen=True)
class SharedBlockOptions:
    """The shared transformer block (``layer.shared_block``).

    ``blocks``: the weight sets, used in turn by the layers that run the block, use ``u``
    (counted over those layers in order) reading set ``u % blocks`` (Zamba2Config's
    ``num_mem_blocks``; ``Zamba2Model.get_layers``' ``cycle``). ``attention``: its attention,
    of input ``2 * hidden`` (q/k/v ``(heads * head_dim, 2 * hidden)``), ``o_proj`` back to
    ``hidden``. ``mlp``: its MLP (Zamba2MLP: ``gate_up_proj`` fused, gate then up).
    ``norm``: both its norms' options (``input_layernorm`` over ``2 * hidden``,
    ``post_attention_layernorm`` over ``hidden``; Zamba2's ``pre_ff_layernorm``).
    ``attention_adapter``: the rank of each use's adapters on q, k and v (0: none;
    Zamba2Config's ``adapter_rank`` where ``use_shared_attention_adapter``), each
    ``up(down(x))`` added to the projection's output, ``down`` ``(rank, 2 * hidden)`` and
    ``up`` ``(heads * head_dim, rank)``; ``mlp_adapter``: the rank of each use's adapter on
    ``gate_up_proj`` (0: none; Zamba2MLP always holds one of ``adapter_rank``).
    ``tied``: the uses of a set share its weights (held once, under the first use's names);
    false: each use holds weights of its own, as transformers builds Zamba2 where
    ``tie_word_embeddings`` is false (``PreTrainedModel.get_expanded_tied_weights_keys``
    returns no ties at all then, the shared blocks' included).
    """

    blocks: int
    attention: AttentionOptions
    mlp: MLPOptions
    norm: NormOptions
    attention_adapter: int = 0
    mlp_adapter: int = 0
    tied: bool = True


class Adapter(Module):
    """A low-rank map ``up(down(x))``: params ``0.weight`` ``(rank, in)`` and ``1.weight``
    ``(out, rank)`` (transformers' ``nn.Sequential(nn.Linear(in, rank, bias=False),
    nn.Linear(rank, out, bias=False))``)."""

    def __init__(self, in_features: int, rank: int, out_features: int):
        setattr(self, "0", Linear(in_features, rank))
        setattr(self, "1", Linear(rank, out_features))

    def __call__(self, rec: Recorder, x: Handle) -> Handle:
        return getattr(self, "1")(rec, getattr(self, "0")(rec, x))


class Adapters(Module):
    """One ``Adapter`` per use of a weight set, named by the use's index among all the
    block's uses (transformers' ``linear_q_adapter_list.{use}``, which holds an
    ``nn.Identity`` at the other sets' uses: no params, never run)."""

    def __init__(self, uses: tuple[int, ...], in_features: int, rank: int, out_features: int):
        for u in uses:
            setattr(self, str(u), Adapter(in_features, rank, out_features))

    def __call__(self, rec: Recorder, x: Handle, use: int) -> Handle:
        return getattr(self, str(use))(rec, x)


class SharedAttention(Attention):
    """The block's attention (``Attention``, its own KV cache per use) reading ``2 *
    hidden`` columns, ``o_proj`` back to ``hidden``, each of q, k and v plus this use's
    adapter of it (``q_adapters`` ...; ``Zamba2Attention.forward``: ``query_states +
    linear_q_adapter_list[use](hidden_states)``).

    Raises:
        ValueError: adapters where the kv heads are not the heads (the adapters' outputs are
            the query's width, which transformers adds to k and v too).
    """

    def __init__(self, hidden_size: int, o: AttentionOptions, max_seq_len: int,
                 norm: NormOptions, uses: tuple[int, ...], use: int, rank: int):
        super().__init__(2 * hidden_size, o, max_seq_len, norm)
        width = o.heads * o.head_dim
        self.o_proj = Linear(width, hidden_size, o.o_bias)
        if rank:
            if o.kv_heads != o.heads or o.fused_qkv:
                raise ValueError(f"adapters on q, k and v add {width} columns to each: as many "
                                 f"kv heads as heads ({o.kv_heads} of {o.heads}), q/k/v apart")
            for name in ("q_adapters", "k_adapters", "v_adapters"):
                setattr(self, name, Adapters(uses, 2 * hidden_size, rank, width))
        self.use, self.rank, self.source = use, rank, True

    def packs(self) -> list[tuple[Param, ...]]:
        # A use reading another's weights (``tie``) leaves them stacked as the source has.
        # With adapters, q, k and v stay apart: each then one contiguous output the adapter's
        # add reads in the native program (the stacked product's column views are not).
        return super().packs() if self.source and not self.rank else []

    def _project(self, rec: Recorder, x: Handle):
        q, k, v = super()._project(rec, x)
        if not self.rank:
            return q, k, v
        return tuple(rec.step("add", h, getattr(self, f"{name}_adapters")(rec, x, self.use),
                              where=self.where(f"{name}_adapters"))
                     for name, h in zip("qkv", (q, k, v)))


class SharedMLP(MLP):
    """The block's MLP (``MLP``: gated, ``gate_up_proj`` fused), ``gate_up_proj``'s output plus
    this use's adapter of it (``gate_up_adapters``; ``Zamba2MLP.forward``: ``gate_up_state +
    gate_up_proj_adapter_list[use](hidden_state)``), then ``down_proj(act(gate) * up)``.

    Without an adapter (``rank`` 0) it is the ``MLP`` its options say (ZambaMLP's
    ``gate_proj``, ``up_proj`` apart).

    Raises:
        ValueError: an adapter on an MLP other than gated and fused, or scaled or sparse
            (what transformers' block has not).
    """

    def __init__(self, hidden_size: int, o: MLPOptions, uses: tuple[int, ...], use: int,
                 rank: int):
        if rank and (o.kind != "gated" or not o.fused or o.sub_norm is not None or
                     o.activation_sparsity or o.down_scale != 1.0):
            raise ValueError("a shared block's MLP adapter adds to a fused gate_up_proj: a gated "
                             "MLP with fused: true, without sub_norm, sparsity or "
                             "scales")
        super().__init__(hidden_size, o)
        if rank:
            self.gate_up_adapters = Adapters(uses, hidden_size, rank, 2 * o.intermediate_size)
        self.use, self.rank = use, rank

    def __call__(self, rec: Recorder, x: Handle) -> Handle:
        if not self.rank:
            return super().__call__(rec, x)
        o = self.options
        params = self.act_fn(rec) if hasattr(self, "act_fn") else []
        gate_up = self.gate_up_proj(rec, x)
        gate_up = rec.step("add", gate_up, self.gate_up_adapters(rec, x, self.use),
                           where=self.where("gate_up_adapters"))
        h = rec.step("gated_activation", gate_up, None, *params, where=self.path, act=o.act)
        return self.down_proj(rec, h)


class SharedBlock(Module):
    """One use of the shared block: ``input_layernorm`` ``(2 * hidden)``, ``self_attn``
    (``SharedAttention``), ``post_attention_layernorm`` ``(hidden)`` and ``mlp``
    (``SharedMLP``); ``x`` and the embeddings ``(n, hidden)`` float32 to ``(n, hidden)``:
    ``mlp(post_attention_layernorm(self_attn(input_layernorm([x, embeddings]))))``, as
    ``Zamba2AttentionDecoderLayer.forward``.

    ``use``: this use's index among all the block's uses; ``uses``: the uses of its weight
    set (whose adapters it holds, as transformers' block holds every use's of its set).
    Each use is a module of its own (its KV cache); ``tie`` makes a use read the weights of
    its set's first use, so they are held once."""

    def __init__(self, hidden_size: int, o: SharedBlockOptions, max_seq_len: int,
                 uses: tuple[int, ...], use: int):
        self.input_layernorm = Norm(2 * hidden_size, o.norm)
        self.self_attn = SharedAttention(hidden_size, o.attention, max_seq_len, o.norm, uses,
                                         use, o.attention_adapter)
        self.post_attention_layernorm = Norm(hidden_size, o.norm)
        self.mlp = SharedMLP(hidden_size, o.mlp, uses, use, o.mlp_adapter)
        self.options = o

    def __call__(self, rec: Recorder, x: Handle, embeddings: Handle, ropes) -> Handle:
        n, E = x.shape
        # [x, embeddings] side by side: each row's hidden state, then its embedding.
        both = rec.step("join_heads", rec.view(x, (n, 1, E)), rec.view(embeddings, (n, 1, E)),
                        where=self.path)
        h = self.input_layernorm(rec, rec.view(both, (n, 2 * E)))
        a = self.self_attn(rec, h, ropes)
        return self.mlp(rec, self.post_attention_layernorm(rec, a))


def tie(use: Module, source: Module) -> None:
    """Make ``use`` (a module of ``source``'s structure) read ``source``'s params: every
    ``Param`` of ``use`` becomes the one of ``source`` at the same place, so the weights are
    held once and reached under each use's names (a tied name: ``runtime.checkpoint.place``
    fills it from the first). States (KV caches) stay each use's own.

    Raises:
        ValueError: the two differ in structure (a param or module one has and the other not).
    """
    for name, value in list(vars(source).items()):
        mine = vars(use).get(name)
        if isinstance(value, Param):
            if not isinstance(mine, Param) or mine.shape != value.shape:
                raise ValueError(f"cannot tie {use.path or type(use).__name__}.{name}: no param "
                                 f"{value.shape} there")
            setattr(use, name, value)
        elif isinstance(value, Module):
            if not isinstance(mine, Module):
                raise ValueError(f"cannot tie {name}: {type(use).__name__} has no module there")
            tie(mine, value)
    if isinstance(use, SharedAttention):
        use.source = False
