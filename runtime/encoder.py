"""A bidirectional encoder: its module tree, its body, and its one compiled version.

One version is compiled over ``max_tokens`` rows; a call runs the first ``rows`` of them (one
text's token ids), every row attending to every row of the call and to nothing else. No
cache, no state: a call depends on its ids alone. The output is the text's pooled embedding
``(hidden,)`` or, with pooling ``none``, the last hidden states ``(rows, hidden)``.

The tree carries the checkpoint's own names, as transformers' BertModel names its tensors
(``embeddings.word_embeddings``, ``encoder.layer.N.attention.self.query``, ...), so a
checkpoint of that layout loads by a plain tree match; other layouts rename onto it.

Threads: a compiled version is one arena, so every call of a version (and compiling one)
runs under the model's ``Encoder.lock``; its output is a view of the arena, so a caller
sharing the model copies it before the lock is released (``with encoder.lock:
np.array(version(ids))``, as ``iron_spec.library.embedding`` does).

Not for: generation (``causal``), or several texts in one call (one call per text).
"""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np

from iron_spec.operators.landmark import landmark_rows

from .blocks.embedding import Embedding
from .blocks.norms import Norm
from .blocks.projections import Linear
from .blocks.rope import rope_table
from .encoder_heads import EncoderHead
from .encoder_layer import EncoderLayer
# EncoderLayerOptions: the layer's options, named here for the callers that build an Encoder.
from .encoder_options import POOLINGS, EncoderLayerOptions, EncoderOptions, \
    PoolingOptions  # noqa: F401
from .graph import CallSpec, Handle, Recorder
from .module import Module
from .plan import Plan
from .reference import Reference


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
            table), landmark attention's fixed call length past it or differing between
            layers, a ``layer_order`` index outside ``layers``, a default ``language``
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
        fixed = {landmark_rows(lo.landmarks.landmarks, lo.landmarks.segment)
                 for lo in o.layers if lo.landmarks is not None} - {None}
        if len(fixed) > 1 or (fixed and max(fixed) > o.max_tokens):
            raise ValueError(f"landmark attention takes calls of exactly {sorted(fixed)} rows: "
                             f"one length, at most max_tokens {o.max_tokens}")
        #: The rows every call must hold (None: any from 1 to max_tokens).
        self.call_rows = fixed.pop() if fixed else None
        self.embeddings = Embeddings(o)
        width = o.embedding_size or o.hidden_size
        project = width != o.hidden_size if o.embeddings_project is None else o.embeddings_project
        self.embeddings_project = Linear(width, o.hidden_size, True) if project else None
        self.encoder = Stack(o)
        self.pooler = Pooler(o.hidden_size) if o.pooler else None
        self.head = None
        if o.head is not None:
            if o.head.pool == "pooler" and not o.pooler:
                raise ValueError("a head reading the pooler's output needs the pooler "
                                 "(pooler.dense)")
            if o.head.tied and (o.head.size != o.vocab_size or width != o.hidden_size
                                or o.word_size is not None):
                raise ValueError(f"a head tied to the word embeddings scores their "
                                 f"{o.vocab_size} rows of width {o.hidden_size}, not "
                                 f"{o.head.size} rows of embeddings {width} wide")
            self.head = EncoderHead(o.hidden_size, o.head, o.norm)
            if o.head.tied:  # the same Param: a checkpoint's own copy is a tied alias
                self.head.out.weight = self.embeddings.word_embeddings.weight
        self.config = o
        # cos and sin (max_tokens, rotary_dim // 2) of every RoPE table a layer reads: a
        # call's rows are positions 0 .. rows - 1, so the tables never grow.
        # Keyed by repr: a table's options hold its scaling dict, which does not hash.
        self.rope_tables = {repr(lo.rope): rope_table(lo.rope, o.max_tokens)
                            for lo in o.layers if lo.rope is not None}
        self.name_tree()
        self._versions: dict[tuple[PoolingOptions, bool, bool], EncoderVersion] = {}
        self.lock = threading.RLock()  # every version's calls (the module docstring)

    def body(self, rec: Recorder, pooling: PoolingOptions, head: bool = False) -> Handle:
        """Record the model over ``rec``'s capacity: ids, positions and token types
        ``(max_tokens,)`` int32, of which a call runs ``rows``, to the pooled ``(1,
        hidden)`` or, with pooling ``none``, the hidden states ``(rows, hidden)``; with
        ``head``, the head's scores instead (``pooling`` unread): ``(rows, size)`` for a
        per-row head, ``(1, size)`` for a text's classes."""
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
        marks = rec.input("marks", (C,), np.int32, bounded=True) \
            if any(lo.global_tokens for lo in self.config.layers) else None
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
            x = layer(rec, x, None if r is None else ropes[repr(r)], bias, rel, marks)
        if self.encoder.LayerNorm is not None:
            x = self.encoder.LayerNorm(rec, x)
        if head:
            return self._head(rec, x)
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

    def _head(self, rec: Recorder, x: Handle) -> Handle:
        """The head's scores on the final hidden states ``x`` ``(rows, hidden)``: every
        row's, or the pooled row's (``HeadOptions.pool``)."""
        if self.head is None:
            raise ValueError("this model holds no task head (a *ForMaskedLM, "
                             "*ForSequenceClassification or *ForTokenClassification "
                             "checkpoint's)")
        pool = self.head.options.pool
        if pool == "cls":
            x = rec.step("take_row", x, where=self.path, index=0)
        elif pool == "mean":
            x = rec.step("mean_rows", x, where=self.path)
        elif pool == "pooler":
            x = self.pooler(rec, x)
        return self.head(rec, x)

    def version(self, pooling: PoolingOptions | None = None, check: bool = False,
                head: bool = False) -> "EncoderVersion":
        """The version compiled for ``pooling`` (default the options'), or with ``head``
        the head's scores (``body``), compiled once."""
        key = (pooling or self.config.pooling, check, head)
        with self.lock:
            if key not in self._versions:
                self._versions[key] = EncoderVersion(self, key[0], check, head)
            return self._versions[key]


class EncoderVersion:
    """The encoder compiled over ``max_tokens`` rows for one pooling.

    ``version(ids, types=None, langs=None, global_attention_mask=None)`` runs one text:
    ``ids`` ``(rows,)`` with ``1 <= rows <= max_tokens``, ``types`` its token types (default
    zeros, as BertModel's), ``langs`` its language (a model with a language table only): one
    id for every token, or one per token ``(rows,)``, as XLMModel's ``langs``; None: the
    options' ``language``; ``global_attention_mask`` ``(rows,)`` 0 or 1 (a model whose
    layers read global tokens only; None: none global), as LongformerModel's. It
    returns the
    embedding ``(hidden,)`` float32, or the hidden states ``(rows, hidden)`` with pooling
    ``none``, or where compiled for the head its scores (``(rows, size)``, or ``(size,)``
    for a text's classes): a view, valid until the next call. ``reference(...)`` runs the same recording
    eagerly in float64.

    Raises (both, before any work):
        ValueError: no ids, more than ``max_tokens`` (other than ``call_rows`` where the
            model fixes it), an id outside ``[0, vocab)``, a type
            outside the token-type table, types of another length, a language outside the
            language table, languages of another length, or languages for a model without
            a language table, or a global attention mask of another length, of other
            values than 0 and 1, or for a model that reads none.
    """

    def __init__(self, model: Encoder, pooling: PoolingOptions, check: bool,
                 head: bool = False):
        o = model.config
        rec = Recorder(CallSpec(True, o.max_tokens))
        out = model.body(rec, pooling, head)
        self.pooling, self.max_tokens = pooling, o.max_tokens
        # Whether a call gives a matrix (a row of each id): the hidden states, or a per-row
        # head's scores.
        self.rowwise = o.head.per_row if head else pooling.kind == "none"
        self.lock = model.lock
        self.plan = Plan(rec, out, check=check)
        self._reference = Reference(rec, out, {})
        self._options, self.call_rows = o, model.call_rows
        self._marks = any(lo.global_tokens for lo in o.layers)
        # Made once: a call feeds views of them, allocating nothing (but where a padding id
        # occurs in a text with position_padding, which counts around it).
        self._positions = np.arange(o.max_tokens, dtype=np.int32) + np.int32(o.position_offset)
        self._zeros = np.zeros(o.max_tokens, np.int32)

    def _inputs(self, ids, types, langs=None, global_attention_mask=None) -> tuple[dict, dict]:
        ids = np.asarray(ids)
        n, o = ids.shape[0] if ids.ndim == 1 else -1, self._options
        if ids.ndim != 1 or not 1 <= n <= self.max_tokens:
            raise ValueError(f"{ids.shape} ids: a call takes 1..{self.max_tokens} ids, one text")
        if self.call_rows is not None and n != self.call_rows:
            raise ValueError(f"{n} ids: landmark attention's segment means take exactly "
                             f"{self.call_rows} ids a call (segment_means_seq_len), one text")
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
        if self._marks:
            inputs["marks"] = self._global_marks(global_attention_mask, n)
        elif global_attention_mask is not None:
            raise ValueError("a global attention mask given to a model whose attention reads "
                             "no global tokens (attention.global_tokens)")
        return inputs, {"rows": n}

    def _global_marks(self, mask, n: int) -> np.ndarray:
        """A call's global tokens ``(n,)`` int32 from its ``global_attention_mask``."""
        if mask is None:
            return self._zeros[:n]
        mask = np.asarray(mask)
        if mask.shape != (n,) or not np.isin(mask, (0, 1)).all():
            raise ValueError(f"a global attention mask of shape {mask.shape} for {n} ids: one "
                             "0 or 1 per id")
        return mask.astype(np.int32)

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
        return y if self.rowwise else y.reshape(-1)

    def __call__(self, ids, types=None, langs=None, global_attention_mask=None) -> np.ndarray:
        inputs, call = self._inputs(ids, types, langs, global_attention_mask)
        with self.lock:
            return self._out(self.plan.run(inputs, call))

    def reference(self, ids, types=None, langs=None, global_attention_mask=None
                  ) -> np.ndarray:
        inputs, call = self._inputs(ids, types, langs, global_attention_mask)
        with self.lock:
            return self._out(self._reference.run(inputs, call))
