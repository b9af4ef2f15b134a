"""A decoder-only language model: its module tree, its body, and its two compiled versions.

The decode step runs one token (the carried ``token``) at ``position``; the prompt chunk
runs ``prefill_chunk`` ids from ``start``, of which a call runs the first ``rows``. Both
return the logits after their last row and the carried values of the next call: the token
drawn from those logits and ``position + 1``.

Threads: a model is shared by every thread that holds it, and ``CausalLM.lock`` (a
re-entrant lock) serializes what is the model's alone: a call of a compiled version (its
plan's arena and inputs, its native program) or of the float64 reference, which set of KV
caches is bound (``bind``), their growth (``reserve``), the RoPE tables (``fit_rope``), the
cache form (``use_kv_cache``) and compiling a version. Every ``Version`` call takes the
lock itself; its logits are a view of the plan's arena, so a caller that shares the model
reads (or copies) them before the lock is released: ``with lm.lock: logits =
np.array(lm.decode_step(...)[0])``. What is one sequence's is not the model's: each
``runtime.session.Session`` holds its own ``runtime.caches.Caches``, bound for its call.
"""

from __future__ import annotations

import threading
import weakref
from functools import partial
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from iron_spec.operators import OPERATORS, PerCall
from iron_spec.operators.activation import ACTIVATION_PARAMS

from .altup import AltUpOptions, merge, spread
from .caches import Caches
from .blocks.attention import REACH, RELATIVE_TABLE
from .blocks.embedding import Embedding, Sinusoidal
from .blocks.mlp import ActivationParams
from .blocks.norms import Norm, NormOptions
from .blocks.projections import Linear
from .blocks.rope import POSITIONS, QUERIES, RopeOptions, rope_switch, rope_table
from .blocks.shared import tie
from .graph import CallSpec, Handle, Recorder
from .layers import DecoderLayer, HybridLayer, LayerOptions, PerLayerInputOptions
from .module import STATE_DTYPES, Module, Param, State
from .plan import Plan
from .recurrence import DEFAULT_STACK, RecurrenceOptions, Schedule, Stack, run_schedule
from .reference import Reference
from .snapshots import Snapshots


@dataclass(frozen=True)
class CausalOptions:
    """A causal model's whole shape: what the interpreter builds from a spec and config.

    ``layers`` holds one ``LayerOptions`` per layer (layers may differ: sliding windows,
    RoPE tables). ``ropes`` names each RoPE table a layer may read. ``tied``: ``lm_head``
    shares ``embed_tokens``' weight. ``embedding_scale`` multiplies the embedding rows
    (rounded to float32, as transformers' float32 ``normalizer``). ``logit_scale`` multiplies
    the logits (Granite's ``1 / logits_scaling``), then ``logit_softcap`` caps them
    (``final_logit_softcapping``; None: none). ``per_layer_input``: every layer's second
    input (layers of kind ``ple``; None: none). ``positions``: rows of a learned absolute
    position table ``model.embed_positions`` (0: none), row ``p + position_offset`` added
    to the (scaled) token embedding at position ``p``, as transformers' GPT2Model ``wpe``
    and OPTLearnedPositionalEmbedding (offset 2). ``head_bias``: ``lm_head`` has a bias
    (GPTJForCausalLM, PhiForCausalLM). ``embedding_norm``: the embeddings (scaled, positions
    added) pass a norm of ``norm``'s kind before the first layer, ``model.embed_norm``
    (BloomModel's ``word_embeddings_layernorm``, ModernBertDecoderModel's
    ``embeddings.norm``, NanoChatModel's weightless ``norm`` run before the layers too).
    ``sinusoidal``: the position table is computed (``Sinusoidal``), not loaded (None:
    learned). ``final_norm``: ``model.norm`` before ``lm_head`` (false: the last layer's
    output is the head's input, as OpenAIGPTModel); ``final_norm_eps``: its eps where it
    differs from ``norm``'s (JetMoeModel's; None: ``norm``'s). ``head_rows``: ``lm_head``'s rows, the
    logits' width, where fewer than ``vocab_size`` (the embedding's; Apertus1p5's pruned
    ``output_vocab_size``: ids from ``head_rows`` on are read, never drawn; None: all).
    ``head_transform``: a dense layer, an activation and a norm between the final norm and
    ``lm_head`` (``HeadTransformOptions``; None: none). ``altup``: the layers run on
    several residual streams (layers with ``altup``; None: one), spread from the embeddings
    before the first and merged after the last (``runtime.altup``). ``recurrence``: the
    schedule the layers run in, stacks run several times
    (``runtime.recurrence.RecurrenceOptions``; None: each layer once, in order).
    ``max_seq_len``: positions the KV caches
    hold; ``prefill_chunk``: ids a prompt call holds. ``snapshots``: how many of the last
    prompt-chunk boundaries the recurrent states (token mixers other than attention) are
    kept at, beside the prompt's end, for a session to restart from (``runtime.snapshots``).
    ``relative_rows``: rows of the relative position bias table ``model.relative_attention_bias``
    ``(rows, heads)`` the layers with ``attention.relative`` read (0: none). ``prefix``: ids
    prepended to every sequence (a session runs them first, in its first call: CpmAntModel's
    prompt ids; empty: none), at positions ``0 .. len(prefix) - 1``. ``segments``: ``(rows,
    first, rest)``, the segment table ``model.embed_segments`` ``(rows, hidden)``, row
    ``first`` added at the prefix's positions and ``rest`` at every other (CpmAntModel's
    ``segment_embedding``; None: none). ``padding_id``: an id a history may not hold, which
    the model reads as padding, not a token (CpmAntModel's id 0; None: none).
    """

    vocab_size: int
    hidden_size: int
    layers: tuple[LayerOptions, ...]
    norm: NormOptions
    ropes: dict[str, RopeOptions] = field(default_factory=dict)
    tied: bool = False
    embedding_scale: float = 1.0
    logit_scale: float = 1.0
    logit_softcap: float | None = None
    per_layer_input: PerLayerInputOptions | None = None
    positions: int = 0
    position_offset: int = 0
    head_bias: bool = False
    embedding_norm: bool = False
    sinusoidal: "Sinusoidal | None" = None
    final_norm: bool = True
    final_norm_eps: float | None = None
    head_rows: int | None = None
    head_transform: "HeadTransformOptions | None" = None
    altup: AltUpOptions | None = None
    recurrence: "RecurrenceOptions | None" = None
    max_seq_len: int = 2048
    prefill_chunk: int = 256
    snapshots: int = 4
    relative_rows: int = 0
    prefix: tuple[int, ...] = ()
    segments: tuple[int, int, int] | None = None
    padding_id: int | None = None


@dataclass(frozen=True)
class HeadTransformOptions:
    """The head's transform: ``norm(act(dense(x)))`` on the final hidden state before
    ``lm_head``, ``dense`` ``(hidden, hidden)`` with a bias where ``bias``, ``act`` an
    ``ACT2FN`` name, the norm of the layers' kind and eps (ModernBertDecoderPredictionHead:
    ``classifier_bias``, ``classifier_activation``, a LayerNorm with ``norm_bias``)."""

    act: str = "gelu"
    bias: bool = False


class HeadTransform(Module):
    """``dense`` (Linear), the activation (``act_fn`` where it holds parameters) and
    ``norm``: ``x`` ``(n, hidden)`` float32 to ``norm(act(dense(x)))`` of the same shape, as
    transformers' ModernBertDecoderPredictionHead.forward."""

    def __init__(self, hidden_size: int, o: HeadTransformOptions, norm: NormOptions):
        self.dense = Linear(hidden_size, hidden_size, o.bias)
        if o.act in ACTIVATION_PARAMS:
            self.act_fn = ActivationParams(o.act)
        self.norm = Norm(hidden_size, norm)
        self.options = o

    def __call__(self, rec: Recorder, x: Handle) -> Handle:
        params = self.act_fn(rec) if hasattr(self, "act_fn") else []
        h = rec.step("activation", self.dense(rec, x), *params, where=self.path,
                     act=self.options.act)
        return self.norm(rec, h)


class Table:
    """A table by position (a RoPE table's cos or sin) holding the rows of the positions
    any set of caches has held (``CausalLM.reserve``): ``array`` ``(rows, columns)`` float32
    is replaced as it grows; ``shape`` is the most it holds (``max_seq_len`` rows)."""

    def __init__(self, shape: tuple[int, int]):
        self.shape = shape
        self.array = np.zeros((0, shape[1]), np.float32)


class Decoder(Module):
    """``embed_tokens``, ``layers`` and the final ``norm`` (where ``final_norm``), as a
    checkpoint's ``model``; with learned positions also ``embed_positions`` ``(positions,
    hidden)`` (sinusoidal ones: a computed ``position_table`` of that shape, no param); with
    an embedding
    norm also ``embed_norm``; with per-layer
    inputs also ``embed_tokens_per_layer``, ``per_layer_model_projection`` and
    ``per_layer_projection_norm`` (transformers' Gemma4TextModel); with AltUp streams also
    ``altup_projections`` and ``altup_unembed_projections`` (Gemma3nTextModel).

    Raises:
        ValueError: a layer's ``kv_from`` is not an earlier layer holding a cache of its
            shape; the position table holds fewer than ``max_seq_len`` rows from its offset.
    """

    def __init__(self, o: CausalOptions):
        E = o.hidden_size
        self.embed_tokens = Embedding(o.vocab_size, E, o.embedding_scale)
        if o.positions:
            if o.position_offset < 0 or o.max_seq_len > o.positions - o.position_offset:
                raise ValueError(f"a context of {o.max_seq_len} positions does not fit the "
                                 f"position table's {o.positions} rows from offset "
                                 f"{o.position_offset}")
            if o.sinusoidal is None:
                self.embed_positions = Embedding(o.positions, E)
            else:
                self.position_table = o.sinusoidal.table(o.positions, E)
        if o.embedding_norm:
            self.embed_norm = Norm(E, o.norm)
        if o.segments is not None:
            self.embed_segments = Embedding(o.segments[0], E)
        if o.relative_rows:
            self.relative_attention_bias = Param(o.relative_rows, o.layers[0].attention.heads)
        r = o.recurrence
        own = r is None or any(name == DEFAULT_STACK for name, _ in r.stacks)
        self.layers = [self._layer(o, i) for i in range(len(o.layers))] if own else []
        readers: dict[int, list[int]] = {}
        for i, layer in enumerate(self.layers):
            j = layer.options.attention.kv_from
            if j is not None:
                if not 0 <= j < i:
                    raise ValueError(f"layer {i} reads the KV cache of layer {j}, not an earlier one")
                readers.setdefault(j, []).append(i)
        for i, layer in enumerate(self.layers):
            if layer.self_attn is None:
                continue
            self._hold_window(layer.self_attn, [self.layers[r].self_attn for r in readers.get(i, [])],
                              o.prefill_chunk, o.max_seq_len)
        for j, rs in readers.items():
            for i in rs:
                self.layers[i].self_attn.share(self.layers[j].self_attn)
        self._tie_shared(o)
        self.norm = Norm(E, _final(o)) if o.final_norm else None
        if r is not None:
            self._recurrence(o, r)
        p = o.per_layer_input
        if p is not None:
            width = len(o.layers) * p.size
            self.embed_tokens_per_layer = Embedding(p.vocab_size, width, p.embedding_scale,
                                                    p.outside_row)
            self.per_layer_model_projection = Linear(E, width)
            self.per_layer_projection_norm = Norm(p.size, o.norm)
        if o.altup is not None:
            K = o.altup.inputs
            self.altup_projections = [Linear(E, E) for _ in range(1, K)]
            self.altup_unembed_projections = [Linear(E, E) for _ in range(1, K)]

    def _layer(self, o: CausalOptions, i: int) -> DecoderLayer | HybridLayer:
        """Layer ``i`` as the options say, its sliding-window cache a ring where it may be;
        a ``HybridLayer`` where it runs the shared block."""
        if o.layers[i].shared_block is not None:
            return HybridLayer(o.hidden_size, o.layers[i], o.max_seq_len, shared_use(o, i))
        layer = DecoderLayer(o.hidden_size, o.layers[i], o.max_seq_len)
        if o.recurrence is not None and layer.self_attn is not None:
            self._hold_window(layer.self_attn, [], o.prefill_chunk, o.max_seq_len)
        return layer

    def _tie_shared(self, o: CausalOptions) -> None:
        """Each use of the shared block (``LayerOptions.shared_block``) past its weight
        set's first reads that first use's weights (``runtime.blocks.shared.tie``): held
        once, as transformers ties ``layers.{i}.shared_transformer`` to the first use's.

        Raises:
            ValueError: the layers running the block disagree on its options.
        """
        runs = [i for i, lo in enumerate(o.layers) if lo.shared_block is not None]
        if not runs or not self.layers:
            return
        if len({o.layers[i].shared_block for i in runs}) != 1:
            raise ValueError("the layers running the shared block give it different options")
        blocks = o.layers[runs[0]].shared_block.blocks
        if not o.layers[runs[0]].shared_block.tied:
            return
        for u, i in enumerate(runs):
            if u >= blocks:
                tie(self.layers[i].shared_block, self.layers[runs[u % blocks]].shared_block)

    def _recurrence(self, o: CausalOptions, r: RecurrenceOptions) -> None:
        """The stacks other than ``layers`` (``model.<name>``), the learned initial states
        (``model.<state>``) and the schedule's repeated runs (``model.schedule.loops``).

        Raises:
            ValueError: layers reading another's KV cache, per-layer inputs or AltUp streams
                (a run's layer index is no depth; a state is one stream), a stack or state named as another of the model's
                parts, or what ``Schedule`` refuses.
        """
        if o.per_layer_input is not None or o.altup is not None or any(
                lo.attention.kv_from is not None or lo.shared_block is not None
                for lo in o.layers):
            raise ValueError("a recurrent schedule runs layers several times: not with KV "
                             "sharing, a shared block, per-layer inputs or AltUp streams")
        stacks = {DEFAULT_STACK: self.layers} if self.layers else {}
        for name, final in r.stacks:
            if name == DEFAULT_STACK:
                continue
            if hasattr(self, name):
                raise ValueError(f"stack {name!r} is named as a part of the model already")
            stack = Stack([self._layer(o, i) for i in range(len(o.layers))],
                          Norm(o.hidden_size, _final(o)) if final else None)
            setattr(self, name, stack)
            stacks[name] = stack.layers
        for name, init in r.states:
            if init == "learned":
                if hasattr(self, name):
                    raise ValueError(f"state {name!r} is named as a part of the model already")
                setattr(self, name, Param(o.hidden_size))
        self.schedule = Schedule(r, stacks, {n: getattr(self, n) for n in stacks
                                             if n != DEFAULT_STACK},
                                 lambda i: self._layer(o, i), o.final_norm)

    @staticmethod
    def _hold_window(attn, readers, chunk: int, max_seq_len: int) -> None:
        """A sliding-window layer's cache as a ring of ``window + chunk - 1`` positions (all
        a prompt chunk's queries see: the window before its first row and its own rows),
        where that is shorter than the context and every layer reading it sees no further
        back (``operators.attention``); else the cache holds every position."""
        o = attn.options
        if o.kv_from is not None or o.window is None:
            return
        ring = o.window + chunk - 1
        if ring >= max_seq_len or any(r.options.window is None or r.options.window > o.window
                                      for r in readers):
            return
        G, D = o.kv_heads, o.head_dim
        attn.keys = State(G, ring, D, axis=1, initial=0, ring=ring, kv=attn.keys.kv)
        attn.values = State(G, ring, D, axis=1, initial=0, ring=ring, kv=attn.values.kv)
        if o.dynamic_mask:
            attn.key_bias = State(G, ring, 1, axis=1, initial=0, ring=ring)

    def per_layer_inputs(self, rec: Recorder, ids: Handle, x: Handle,
                         o: PerLayerInputOptions) -> list[Handle]:
        """Each layer's input ``(n, size)`` from ``ids`` and the embeddings ``x``:
        ``(norm(projection(x) * projection_scale) + embedding(ids)) * mix_scale``, as
        Gemma4TextModel's ``project_per_layer_inputs``, split by layer."""
        n, L, P = x.shape[0], len(self.layers), o.size
        tokens = self.embed_tokens_per_layer(rec, ids)
        projected = rec.step("mul", self.per_layer_model_projection(rec, x), where=self.path,
                             scale=o.projection_scale)
        normed = self.per_layer_projection_norm(rec, rec.view(projected, (n, L, P)))
        mixed = rec.step("add", rec.view(normed, (n, L * P)), tokens, where=self.path)
        mixed = rec.step("mul", mixed, where=self.path, scale=o.mix_scale)
        return [rec.step("columns", mixed, where=f"{self.path}.layers.{i}", begin=i * P,
                         end=(i + 1) * P) for i in range(L)]


class CausalLM(Module):
    """``model`` (a Decoder), ``head_transform`` (where the options hold one) and ``lm_head``;
    compiled into a decode step and a prompt chunk.

    Raises:
        ValueError: ``prefill_chunk`` is not in ``[1, max_seq_len]``; ``head_rows`` outside
            ``1..vocab_size`` or other than it with a tied head.
    """

    def __init__(self, o: CausalOptions):
        if not 1 <= o.prefill_chunk <= o.max_seq_len:
            raise ValueError(f"prefill_chunk {o.prefill_chunk} is not within 1..max_seq_len "
                             f"{o.max_seq_len}")
        if o.prefix and not len(o.prefix) < min(o.prefill_chunk, o.max_seq_len):
            # The first call holds the prefix and at least one id of the text after it.
            raise ValueError(f"a prefix of {len(o.prefix)} ids leaves no room for a token in a "
                             f"prompt chunk of {o.prefill_chunk} ids within max_seq_len "
                             f"{o.max_seq_len}")
        rows = o.vocab_size if o.head_rows is None else o.head_rows
        if not 1 <= rows <= o.vocab_size or (o.tied and rows != o.vocab_size):
            raise ValueError(f"an lm_head of {rows} rows beside an embedding of {o.vocab_size}: "
                             f"1..{o.vocab_size} rows, all of them where tied")
        self.model = Decoder(o)
        if o.head_transform is not None:
            self.head_transform = HeadTransform(o.hidden_size, o.head_transform, o.norm)
        self.lm_head = Linear(o.hidden_size, rows, o.head_bias)
        if o.tied:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.config = o
        # Each table by name; a table scaling its queries also holds the queries' own
        # (blocks.rope.QUERIES), the keys turning by it unscaled.
        self.tables = {}
        for name, r in o.ropes.items():
            self.tables[name] = replace(r, query_scale=None)
            if r.query_scale is not None:
                self.tables[name + QUERIES] = r
        # cos and sin, each (rows, rotary_dim // 2), rows as the caches grow (reserve).
        self.rope_tables = {name: (Table((o.max_seq_len, r.rotary_dim // 2)),
                                   Table((o.max_seq_len, r.rotary_dim // 2)))
                            for name, r in self.tables.items()}
        self.rope_length = 1  # the sequence length the tables are for (fit_rope)
        # Tables whose rows turn by positions of their own per section (M-RoPE), and how
        # many position axes a row has: every version then takes each row's positions.
        self.sections = {name: r.sections for name, r in self.tables.items() if r.sections}
        axes = {len(s) for s in self.sections.values()}
        if len(axes) > 1:
            raise ValueError(f"RoPE tables with sections of {sorted(axes)} axes: one count of "
                             "position axes per model")
        self.axes = axes.pop() if axes else 0
        self.name_tree()
        self._holdable()
        self._versions: dict[tuple, "Version"] = {}
        # The KV caches grow in blocks of a prompt chunk's positions (reserve).
        self.block = o.prefill_chunk
        self.reserved = 0  # positions every bound cache holds now (a ring: up to its own)
        self._table_rows = 0  # rows the RoPE tables hold: the most any caches reserved
        # Weights and tables in their kernels' form, shared by every compiled version.
        self.packed: dict[tuple, np.ndarray] = {}
        # What runs on the model is serialized by it (the module docstring says what).
        self.lock = threading.RLock()
        # Each state once (a layer reading another's cache holds none of its own).
        self._states = list({id(s): s for _, s in self.named_states()}.values())
        # The cache form's generation (use_kv_cache), and the set of caches bound now (a
        # session's while it runs; at first the model's own).
        self._epoch = 0
        self.caches = Caches()
        self.caches.epoch = self._epoch
        # The decode step's weights: float32 or a reduced form (operators.formats); each
        # compiles a decode step of its own, so a bench can switch between them.
        self.decode_weights = "float32"
        # The prompt chunk's projection weights: float32, or bfloat16 tiles (x rounded to
        # bfloat16 too: operators/_cpu_tiles.h); a prompt chunk of its own each.
        self.prefill_weights = "float32"
        self.kv_cache = "float32"  # what the KV caches hold (use_kv_cache)
        # What loading held the weights as (runtime.holding.WEIGHTS): check's gate follows a
        # conversion's rounding.
        self.weights = "stored"
        # Whether a prompt chunk's GEMMs round x (weights held as bfloat16 or Q8_0: x
        # rounded to bfloat16 or 8 bits, as llama.cpp's GEMMs; operators/_cpu_held_gemm.h):
        # check's gate follows.
        self.prompt_rounds = False
        # The states carried position to position (recurrent token mixers); the positions a
        # run may restart them from are each set of caches' own (snapshots).
        self.recurrent_states = [s for _, s in self.named_states() if s.recurrent]
        self.reserve(1)

    @property
    def snapshots(self) -> Snapshots:
        """The snapshots of the recurrent states of the bound set of caches
        (``Caches.snapshots``, made at its first use): the recurrent states are a set's
        arrays as the KV caches are, so each session restores only states it ran itself."""
        caches = self.caches
        if caches.snapshots is None:
            # Given the states and the set's reference dict, not a bound method: the set
            # would point at the model, a cycle living until the collector's rare full pass.
            caches.snapshots = Snapshots(
                partial(recurrent_arrays, self.recurrent_states, caches.reference),
                self.config.prefill_chunk, self.config.snapshots)
        return caches.snapshots

    def _holdable(self) -> None:
        """Mark the matrices loading may hold as stored (``Param.holdable``,
        ``runtime.holding``): every projection's (the linear operator reads any held form)
        and every token table the embedding operator gathers from; not a position or segment
        table, which other operators add (add_rows, segment_rows) and which read float32."""
        todo: list[Module] = [self]
        while todo:
            m = todo.pop()
            if isinstance(m, (Linear, Embedding)):
                m.weight.holdable = True
            todo += [child for _, child in m.children()]
        for name in ("embed_positions", "embed_segments"):
            table = getattr(self.model, name, None)
            if table is not None:
                table.weight.holdable = False

    def use_kv_cache(self, dtype: str) -> None:
        """Hold every attention layer's keys and values as ``dtype`` from now on:
        ``float32``, or ``bfloat16``, each value rounded to the nearest bfloat16 as it is
        written (ties to even, as torch's ``.to(torch.bfloat16)`` and llama.cpp's ``-ctk
        bf16``) and read back exactly, half the bytes a deep decode step reads. Layers whose
        kernels read float32 only (differential attention) keep float32, and where no layer
        can hold ``dtype``, ``kv_cache`` stays ``float32`` (what the caches hold: check
        judges by its gate, bench names its side by it). The caches then
        hold nothing (no session's tokens), and every compiled version is compiled afresh
        at its next call, on the new caches; the float64 ``reference()`` keeps its own.

        Raises:
            TypeError: ``dtype`` is not a str (None, say), named as ``kv_cache``.
            ValueError: ``dtype`` is neither.
        """
        if not isinstance(dtype, str):
            raise TypeError(f"kv_cache is {dtype!r}; it is one of "
                            f"{', '.join(map(repr, STATE_DTYPES))}")
        if dtype not in STATE_DTYPES:
            raise ValueError(f"kv_cache={dtype!r} is not one of {', '.join(STATE_DTYPES)}")
        with self.lock:
            held = [s for _, s in self.named_states() if s.kv]
            for s in held:
                s.use(dtype)
            self.kv_cache = dtype if held else "float32"
            self._versions.clear()
            # Every set of caches, the bound one too, holds nothing from now on; the others
            # are emptied as they are bound (their arrays are of the old form).
            self._epoch += 1
            self.caches.empty(self._epoch)

    @property
    def reference_states(self) -> dict[int, np.ndarray]:
        """The float64 reference's caches of the bound set (``Caches.reference``)."""
        return self.caches.reference

    def bind(self, caches: Caches) -> None:
        """Make ``caches`` the set every compiled version and the reference run on, the set
        bound before keeping its arrays; a set never bound (or of an older cache form) is
        made afresh, holding nothing. The plans' steps over the caches are bound to the new
        arrays (``Plan.rebind``): a few milliseconds on a real model, paid where the set
        changes, not on every call."""
        with self.lock:
            if caches is self.caches:
                return
            old = self.caches
            old.arrays, old.reserved = [s.array for s in self._states], self.reserved
            if caches.epoch != self._epoch:
                caches.empty(self._epoch)
            if caches.arrays is None:
                arrays, reserved = [s.emptied() for s in self._states], 0
            else:
                arrays, reserved = caches.arrays, caches.reserved
            for s, a in zip(self._states, arrays):
                s.array = a
            caches.arrays = None
            self.caches, self.reserved = caches, reserved
            if not reserved:
                self._grow(1)
            owners = {id(s) for s in self._states}
            for version in self._versions.values():
                version.plan.rebind(owners)

    def reserve(self, positions: int) -> None:
        """Make every KV cache hold at least ``positions`` positions (a ring at most its
        own), and the RoPE tables as many rows: they grow by whole blocks of ``block``
        positions, and by at least a quarter of what they hold, so copying the held
        positions costs at most ~5 times the cache's final size over a sequence, while a
        cache is never more than a quarter and a block past what the sequence needs. Every
        compiled version is bound to the new memory.

        Raises:
            ValueError: ``positions`` past ``max_seq_len``.
        """
        with self.lock:
            changed, tables = self._grow(positions)
            if changed or tables:
                owners = None if tables else {id(s) for s in self._states}
                for version in self._versions.values():
                    version.plan.rebind(owners)

    def _grow(self, positions: int) -> tuple[bool, bool]:
        """``reserve``'s growth, the plans not bound again; whether any cache, and whether
        the RoPE tables, were replaced."""
        if positions <= self.reserved:
            return False, False
        L = self.config.max_seq_len
        if positions > L:
            raise ValueError(f"{positions} positions do not fit max_seq_len {L}")
        grown = self._blocks(positions, self.reserved)
        changed = [s.grow(grown) for s in self._states]
        self.reserved = grown
        return any(changed), self._grow_tables(grown)

    def _blocks(self, positions: int, reserved: int) -> int:
        """Positions a set of caches holding ``reserved`` grows to, to hold ``positions``:
        whole blocks, and at least a quarter more (``reserve``)."""
        B = self.block
        grown = max(positions, reserved + reserved // 4)
        return min(self.config.max_seq_len, -(-grown // B) * B)

    def reserve_caches(self, caches: Caches, positions: int) -> None:
        """``reserve`` for ``caches``, bound or not (a batched decode step's sessions:
        ``runtime.batch``): a set not bound grows its own arrays, as it would bound; the RoPE
        tables grow for it too, every compiled version bound to them again.

        Raises:
            ValueError: ``positions`` past ``max_seq_len``, or a set holding no arrays of
                this cache form (never bound).
        """
        with self.lock:
            if caches is self.caches:
                self.reserve(positions)
                return
            if caches.arrays is None or caches.epoch != self._epoch:
                raise ValueError("these caches hold nothing of this model's cache form: "
                                 "bind them (run a prompt on their session) first")
            if positions <= caches.reserved:
                return
            if positions > self.config.max_seq_len:
                raise ValueError(f"{positions} positions do not fit max_seq_len "
                                 f"{self.config.max_seq_len}")
            grown = self._blocks(positions, caches.reserved)
            caches.arrays = [s.grown(a, grown) for s, a in zip(self._states, caches.arrays)]
            caches.reserved = grown
            if self._grow_tables(grown):
                owners = {id(t) for pair in self.rope_tables.values() for t in pair}
                for version in self._versions.values():
                    version.plan.rebind(owners)

    def _grow_tables(self, grown: int) -> bool:
        """The RoPE tables holding ``grown`` rows; whether they were replaced."""
        if grown <= self._table_rows:  # another set of caches grew them so far already
            return False
        # The tables computed afresh (their rows are a prefix of the whole context's), and
        # their packed forms dropped while the old arrays live, so no id is reused.
        stale = set()
        for name, r in self.tables.items():
            tables = self.rope_tables[name]
            new = rope_table(r, grown, self.rope_length)
            stale |= {id(t.array) for t in tables}
            for key in [k for k in self.packed if k[0] in stale]:
                del self.packed[key]
            for t, array in zip(tables, new):
                t.array = array
        self._table_rows = grown
        return bool(stale)

    def cache_bytes(self) -> tuple[int, int]:
        """Bytes the bound KV caches hold now, and the most they can grow to (at
        ``max_seq_len``; a sliding-window ring at its own size)."""
        states = [s for _, s in self.named_states()]
        return sum(s.nbytes for s in states), sum(s.most_bytes for s in states)

    def resume_at(self, start: int, written: int, kind: str = "compiled") -> int:
        """The earliest position every state of the model allows a run to restart from, to
        run the tokens from ``start`` on, once the caches hold positions ``0 .. written``
        (exclusive): the latest position at or before ``start`` that each allows.

        A KV cache allows every position it holds. A sliding window's ring allows ``start``
        where it still holds the window before it (positions written since replaced the
        oldest), else only 0. The prompt chunk's arithmetic (``kind``: the ``compiled``
        versions' or the float64 ``reference``'s) allows any position where its rows are
        computed alone (``Plan.rows_alone``: the native kernels), else only a multiple of
        ``prefill_chunk``, where a fresh run's calls begin too. A state carried position to
        position (a recurrent one: ``runtime.snapshots``) allows 0 and the positions it has
        a copy of, which ``restore`` brings back before the run. From any position allowed,
        a run writes and returns what a fresh run making the same calls does, bit for bit."""
        every = 1
        if kind == "reference" or not self.prompt_chunk.plan.rows_alone:
            every = self.config.prefill_chunk
            start = start // every * every
        if self.recurrent_states:
            start = self.snapshots.restart(kind, start, every)
        for _, s in self.named_states():
            if s.ring is not None and start > 0:
                window = s.ring - self.config.prefill_chunk + 1
                if written - max(0, start - window + 1) > s.ring:
                    return 0
        return start

    def rope_regime(self, length: int) -> tuple[bool, ...]:
        """Which table each RoPE table that switches (``rope_switch``) turns a sequence of
        ``length`` tokens by: keys a set of caches holds were turned by the tables of one
        regime, and a sequence of another must run them again."""
        return tuple(length <= switch for switch in
                     (rope_switch(r) for r in self.tables.values()) if switch is not None)
    def restore(self, position: int, kind: str = "compiled") -> None:
        """Make the recurrent states (where the model has any) those after ``position``, a
        position ``resume_at`` gave, before a run from there.

        Raises:
            snapshots.StateError: no snapshot of ``position``.
        """
        if self.recurrent_states:
            self.snapshots.restore(kind, position)

    def restores(self, position: int, kind: str = "compiled") -> bool:
        """Whether ``restore(position, kind)`` can make the recurrent states those after
        ``position`` (always, where the model has none)."""
        return not self.recurrent_states or position in self.snapshots.positions(kind)

    def fit_rope(self, length: int) -> bool:
        """Make the RoPE tables those transformers turns a sequence of ``length`` tokens by
        (a ``longrope`` table past its original context: ``rope_switch``), in place, with
        their kernels' packed forms, so every compiled version reads them without a new
        allocation. Returns whether any table changed: KV caches written under the other
        tables (``rope_regime``) hold keys turned by them, and must be recomputed."""
        with self.lock:
            return self._fit_rope(length)

    def _fit_rope(self, length: int) -> bool:
        changed = []
        for name, r in self.tables.items():
            switch = rope_switch(r)
            if switch is None or (self.rope_length <= switch) == (length <= switch):
                continue
            tables = self.rope_tables[name]
            for t, new in zip(tables, rope_table(r, len(tables[0].array), length)):
                np.copyto(t.array, new)
                changed.append(t.array)
        self.rope_length = length
        if not changed:  # every decode step asks: the packed forms walked only on a switch
            return False
        ids = {id(a): a for a in changed}
        for key, packed in self.packed.items():
            if key[0] in ids:  # (id(array), operator, input index, ...): runtime.plan
                np.copyto(packed, OPERATORS[key[1]].pack(key[2], ids[key[0]]))
        return bool(changed)

    def body(self, rec: Recorder) -> Handle:
        """Record the model for ``rec``'s call: ids to the logits ``(1, vocab)`` of the last row."""
        c = rec.call
        ids = rec.input("ids", (c.capacity,), np.int32, bounded=c.prompt or c.batch)
        ropes = {name: (rec.state(f"rope.{name}.cos", cos, "const"),
                        rec.state(f"rope.{name}.sin", sin, "const"))
                 for name, (cos, sin) in self.rope_tables.items()}
        if self.sections:
            # M-RoPE: each row's positions by axis, given per call (Version: a text's, equal,
            # by default; runtime.towers.multimodal's Placement: an image's by its grid).
            given = rec.input(POSITIONS, (c.capacity, self.axes), np.int32, bounded=c.prompt)
            ropes[POSITIONS] = (given, dict(self.sections))
        x = self.model.embed_tokens(rec, ids)
        if c.soft:
            # The placeholder rows take a tower's soft tokens, as masked_scatter does to the
            # (scaled) embeddings (runtime.towers.multimodal).
            soft = rec.input("soft", (c.capacity, x.shape[1]), np.float32, bounded=True)
            mask = rec.input("mask", (c.capacity,), np.int32, bounded=True)
            x = rec.step("place_rows", x, soft, mask, where=self.model.path)
        if c.reach:
            ropes[REACH] = rec.input("reach", (c.capacity,), np.int32, bounded=True)
        o = self.config
        if o.segments is not None:
            table = self.model.embed_segments
            w = rec.hold("param", table.where("weight"), table.weight.array)
            x = rec.step("segment_rows", x, w, where=table.path, start=c.start,
                         prefix=len(o.prefix), first=o.segments[1], rest=o.segments[2])
        if o.relative_rows:
            where = self.model.where("relative_attention_bias")
            ropes[RELATIVE_TABLE] = rec.hold("param", where,
                                             self.model.relative_attention_bias.array)
        if o.positions:
            if o.sinusoidal is None:
                table = self.model.embed_positions
                w = rec.hold("param", table.where("weight"), table.weight.array)
                where = table.path
            else:
                where = self.model.where("position_table")
                w = rec.hold("const", where, self.model.position_table)
            x = rec.step("add_rows", x, w, where=where,
                         start=replace(c.start, offset=c.start.offset + o.position_offset))
        if o.embedding_norm:
            x = self.model.embed_norm(rec, x)
        embeddings = x  # what a shared block reads beside each layer's input (Zamba2Model's)
        per_layer = [None] * len(self.model.layers)
        if o.per_layer_input is not None:
            per_layer = self.model.per_layer_inputs(rec, ids, x, o.per_layer_input)
        if c.hidden and (o.altup is not None or o.recurrence is not None):
            raise ValueError("hidden states of a model whose layers run on several streams "
                             "(AltUp) or on a recurrent schedule are not one per layer")
        if o.altup is not None:
            x = spread(rec, self.model, x)
        if o.recurrence is not None:
            x = run_schedule(rec, self.model, self.model.schedule, x, ropes)
        for layer, extra in zip(self.model.layers if o.recurrence is None else [], per_layer):
            if c.hidden:  # each layer's input: the embeddings, then each layer's output
                rec.kept.append(x)
            x = layer(rec, x, ropes, extra, embeddings)
        if o.altup is not None:
            x = merge(rec, self.model, x)
        if c.prompt and not c.every_row:
            x = rec.step("take_row", x, where=self.model.path, index=c.last_row)
        if self.model.norm is not None:
            x = self.model.norm(rec, x)
        if c.hidden:  # the last, after the final norm (transformers' last_hidden_state)
            rec.kept.append(x)
        if o.head_transform is not None:
            x = self.head_transform(rec, x)
        logits = self.lm_head(rec, x)
        if o.logit_scale != 1.0:
            logits = rec.step("mul", logits, where="lm_head", scale=o.logit_scale)
        if o.logit_softcap is not None:
            logits = rec.step("softcap", logits, where="lm_head", cap=o.logit_softcap)
        return logits

    def version(self, prompt: bool, check: bool = False, every_row: bool = False) -> "Version":
        """The compiled decode step (``prompt=False``) or prompt chunk, compiled once;
        ``every_row``: the prompt chunk giving every row's logits and keeping the hidden
        states (``Version.forward``)."""
        # Keyed by the decode weights too where they are reduced: a bench switches between
        # them by decode_weights, each decode step compiled once.
        weights = self.prefill_weights if prompt else self.decode_weights
        key = (prompt, check) if weights == "float32" else (prompt, check, weights)
        key += ("every_row",) if every_row else ()
        with self.lock:  # compiled once, though two threads ask at once
            if key not in self._versions:
                self._versions[key] = Version(self, prompt, check, every_row=every_row)
            return self._versions[key]

    @property
    def decode_step(self) -> "Version":
        return self.version(False)

    @property
    def prompt_chunk(self) -> "Version":
        return self.version(True)


#: The form a prompt chunk's projection weights take (``Operator.pack_reduced``), by
#: ``CausalLM.prefill_weights``.
PROMPT_FORMS = {"float32": "float32", "bfloat16": "bfloat16-tiles"}


class Version:
    """One compiled shape of a CausalLM, called with its carried and per-call values.

    ``version(ids, token=..., position=..., start=..., rows=...)`` returns ``(logits,
    carry)``: logits ``(vocab,)`` float32 (a view of the plan's arena, valid until the next
    call of the version: read it under ``lm.lock`` where threads share the model) and
    ``carry``, the next decode step's keyword arguments. With ``output=False`` (a prompt's
    chunk before its last, whose logits nobody reads) it returns ``(None, None)``, having
    run only the steps the caches depend on: the same caches, bit for bit.
    ``reference(...)`` runs the same recording eagerly in float64 on its own caches.

    ``caches``: the set of KV caches to run on (``runtime.caches.Caches``, bound for the
    call: a session's); None runs on the set bound now, which then holds no tokens a
    session may resume from (``Caches.forget``): it was written behind its back.
    """

    def __init__(self, lm: CausalLM, prompt: bool, check: bool, soft: bool = False,
                 reach: bool = False, every_row: bool = False):
        C = lm.config.prefill_chunk if prompt else 1
        call = CallSpec(prompt, C, start=PerCall("start" if prompt else "position"),
                        soft=soft, reach=reach, every_row=every_row, hidden=every_row)
        rec = Recorder(call)
        out = lm.body(rec)
        self.prompt, self.capacity, self.every_row = prompt, C, every_row
        # The model holds its versions: a reference back is weak, so no cycle keeps a
        # dropped model's arrays alive until the collector's rare full pass.
        self.lm = weakref.proxy(lm)
        self.plan = Plan(rec, out, check=check, packed=lm.packed,
                         weights=PROMPT_FORMS[lm.prefill_weights] if prompt
                         else lm.decode_weights)
        weak = self.lm
        self._reference = Reference(rec, out, lambda: weak.caches.reference)
        self.vocab_size, self.max_seq_len = lm.config.vocab_size, lm.config.max_seq_len

    def _call(self, runner, ids, token, position, start, rows, sampler, output=True,
              extra=None, caches=None, kind="compiled"):
        with self.lm.lock:
            return self._locked(runner, ids, token, position, start, rows, sampler, output,
                                extra, caches, kind)

    def _locked(self, runner, ids, token, position, start, rows, sampler, output, extra,
                caches, kind):
        # Checked before anything runs, so a refused call leaves every cache as it was.
        V, L = self.vocab_size, self.max_seq_len
        if self.prompt:
            if ids is None or start is None or rows is None:
                raise TypeError("a prompt chunk takes ids, start and rows")
            rows = _index(rows, "rows", 1, self.capacity)
            start = _index(start, "start", 0, L - rows)
            ids = token_ids(ids, V, "ids")
            if ids.shape != (self.capacity,):
                raise ValueError(f"ids hold {ids.size} ids, not the chunk's {self.capacity}")
            bad = np.flatnonzero((ids[:rows] < 0) | (ids[:rows] >= V))
            if bad.size:
                raise IndexError(f"ids[{int(bad[0])}] = {int(ids[bad[0]])} is outside the "
                                 f"vocabulary 0..{V - 1}")
            in_per_layer_table(self.lm.config, ids[:rows], "ids[{}]")
            call = {"start": start, "rows": rows, "position": start + rows - 1}
            inputs = {"ids": ids.astype(np.int32), **self._extra(extra, start)}
        else:
            if token is None or position is None:
                raise TypeError("a decode step takes token and position")
            token = _index(token, "token", 0, V - 1, IndexError)
            in_per_layer_table(self.lm.config, np.asarray([token]), "token")
            position = _index(position, "position", 0, L - 1)
            call = {"start": position, "rows": 1, "position": position}
            inputs = {"ids": np.asarray([token], np.int32), **self._extra(extra, position)}
        if caches is None:
            self.lm.caches.forget()
        else:
            self.lm.bind(caches)
        self.lm.reserve(call["position"] + 1)
        recurrent = self.lm.snapshots if self.lm.recurrent_states else None
        if recurrent is not None:
            recurrent.before(kind, call["start"], self.prompt)
        if not output:
            runner(inputs, call, output=False)
            if recurrent is not None:
                recurrent.after(kind, call["start"], call["rows"], self.prompt)
            return None, None
        if self.every_row:  # every row's logits (rows, vocab) and the hidden states
            if runner != self.plan.run:
                raise ValueError("the float64 reference keeps no hidden states")
            logits = runner(inputs, call)
            return logits.reshape(call["rows"], -1), self.plan.kept(call["rows"])
        logits = runner(inputs, call).reshape(-1)
        if recurrent is not None:
            recurrent.after(kind, call["start"], call["rows"], self.prompt)
        draw = sampler if sampler is not None else greedy
        return logits, {"token": drawn(draw(logits), V), "position": call["position"] + 1}

    def _extra(self, extra, start: int) -> dict:
        """A call's inputs beside its ids (a prompt chunk's ``soft``, ``mask``, ``reach``;
        M-RoPE's ``positions``: those its recording takes), each of the shape and dtype it
        was recorded with; M-RoPE's positions, where not given, a text's from ``start``
        (every axis at the row's position).

        Raises:
            ValueError: one missing, one the call does not take, or of another shape.
        """
        extra = dict(extra or {})
        want = {k: h for k, h in self.plan.recorder.inputs.items() if k != "ids"}
        if POSITIONS in want and POSITIONS not in extra:
            n, axes = want[POSITIONS].shape
            extra[POSITIONS] = np.repeat(np.arange(start, start + n, dtype=np.int32)[:, None],
                                         axes, axis=1)
        if set(extra) != set(want):
            raise ValueError(f"a prompt chunk of this version takes {sorted(want) or 'ids alone'}"
                             f" beside its ids, not {sorted(extra) or 'none'}")
        out = {}
        for k, h in want.items():
            a = np.asarray(extra[k], h.dtype)
            if a.shape != h.shape:
                raise ValueError(f"{k} is {a.shape}, not the chunk's {h.shape}")
            out[k] = a
        return out

    def __call__(self, ids=None, *, token=None, position=None, start=None, rows=None,
                 sampler: Callable[[np.ndarray], int] | None = None, output: bool = True,
                 extra: dict | None = None, caches: Caches | None = None):
        return self._call(self.plan.run, ids, token, position, start, rows, sampler, output,
                          extra, caches)

    def reference(self, ids=None, *, token=None, position=None, start=None, rows=None,
                  sampler: Callable[[np.ndarray], int] | None = None, output: bool = True,
                  extra: dict | None = None, caches: Caches | None = None):
        return self._call(self._reference.run, ids, token, position, start, rows, sampler,
                          output, extra, caches, kind="reference")


def shared_use(o: CausalOptions, i: int) -> tuple[int, tuple[int, ...]] | None:
    """Layer ``i``'s use of the shared block: its index among the layers running it (in
    order) and the uses of its weight set (``u % blocks``), as ``Zamba2Model.get_layers``
    counts them; None where the layer runs none."""
    if o.layers[i].shared_block is None:
        return None
    runs = [j for j, lo in enumerate(o.layers) if lo.shared_block is not None]
    u, blocks = runs.index(i), o.layers[i].shared_block.blocks
    return u, tuple(v for v in range(len(runs)) if v % blocks == u % blocks)


def recurrent_arrays(states: list[State], mirrors: dict[int, np.ndarray],
                     kind: str) -> list[np.ndarray]:
    """The arrays of recurrent ``states``: the compiled versions' (``kind`` ``compiled``)
    or the float64 reference's own copies, kept in ``mirrors`` by the state's id
    (``reference``; made as zeros where none is yet)."""
    if kind == "compiled":
        return [s.array for s in states]
    return [mirrors.setdefault(id(s), np.zeros(s.shape, np.float64)) for s in states]


def in_per_layer_table(config: CausalOptions, ids: np.ndarray, where: str) -> None:
    """Refuse an id of ``ids`` (within the vocabulary) past the rows of the per-layer-input
    table where the model has one smaller than the vocabulary and no ``outside_row`` to
    read for such an id: said here, before anything runs, not by numpy's bare IndexError
    (the float64 reference) nor mid-plan (the native gather).

    Raises:
        IndexError: the first such id, named by ``where`` (``{}`` its index), with the
            table's size and the option that would serve it.
    """
    p, V = config.per_layer_input, config.vocab_size
    if p is None or p.outside_row is not None or p.vocab_size >= V:
        return
    bad = np.flatnonzero(np.asarray(ids) >= p.vocab_size)
    if bad.size:
        raise IndexError(
            f"token id {int(ids[bad[0]])} ({where.format(int(bad[0]))}) is outside the "
            f"per-layer-input table model.embed_tokens_per_layer, {p.vocab_size} rows "
            f"(per_layer_input.vocab_size) of the vocabulary's {V}, and the spec gives no "
            "layer.per_layer_input.outside_row, the row such an id reads "
            "(get_per_layer_inputs' torch.where(in_table, input_ids, 0): outside_row: 0)")


def _index(value, name: str, lo: int, hi: int, error=ValueError) -> int:
    """``value`` as an int, where it is an integer (not a boolean) within ``lo..hi``.

    Raises:
        TypeError: not an integer. ``error`` (ValueError, or IndexError for an id): outside.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} is {value!r} ({type(value).__name__}), not an integer")
    if not lo <= value <= hi:
        raise error(f"{name} {int(value)} is outside {lo}..{hi}")
    return int(value)


def token_ids(ids, V: int, what: str = "tokens") -> np.ndarray:
    """``ids`` as an int64 array, where every one is an integer (a bool is no id, though
    numpy and Python count it as 1).

    Raises:
        TypeError: an id that is not an integer (named with its index).
    """
    if isinstance(ids, np.ndarray):
        if ids.dtype.kind not in "iu":
            raise TypeError(f"{what} are {ids.dtype} values, not integer token ids")
        return ids.astype(np.int64).reshape(-1) if ids.ndim == 1 else ids.astype(np.int64)
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise TypeError(f"{what} is {type(ids).__name__}, not a sequence of token ids")
    ids = list(ids)
    for i, t in enumerate(ids):
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
            raise TypeError(f"{what}[{i}] is {t!r} ({type(t).__name__}), not an integer token id")
    return np.asarray(ids, np.int64)


def drawn_ids(config: CausalOptions, rng: np.random.Generator, n: int) -> list[int]:
    """``n`` ids drawn uniformly from ``config``'s vocabulary by ``rng`` (a toy's prompt, a
    bench's), never its padding id, which a history may not hold (the ids from it on drawn
    one higher, so a model without one draws what it always drew)."""
    pad = config.padding_id
    ids = rng.integers(0, config.vocab_size - (pad is not None), n)
    return (ids + (ids >= pad) if pad is not None else ids).tolist()


def drawn(token, V: int) -> int:
    """A sampler's draw, where it is a token id (an integer within ``0..V - 1``).

    Raises:
        ValueError: anything else (a sampler returning -1, 7.9 or True is refused, not used).
    """
    if isinstance(token, (bool, np.bool_)) or not isinstance(token, (int, np.integer)) \
            or not 0 <= token < V:
        raise ValueError(f"the sampler drew {token!r}, not a token id within 0..{V - 1}")
    return int(token)


def greedy(logits: np.ndarray) -> int:
    """The id of the largest logit (the lowest id on ties), as transformers' argmax."""
    return int(np.argmax(logits))


def _final(o: CausalOptions) -> NormOptions:
    """The final norm's options: the layers', with ``final_norm_eps`` where given."""
    return o.norm if o.final_norm_eps is None else replace(o.norm, eps=o.final_norm_eps)
