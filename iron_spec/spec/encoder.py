"""Expanding a ``model: encoder`` spec into a runtime encoder, and loading it with weights.

The encoder counterpart of ``interpreter`` and ``build``: config fields resolved, the
``layer`` (kind ``encoder``), ``embedding`` and ``pooling`` options evaluated into
``runtime.encoder.EncoderOptions``, the tree built and filled from a checkpoint (strictly;
only the tensors ``checkpoint.unused`` names are left unread, and reported) or drawn
weights. The code reads behaviours, never a family's name.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from tokenizers import Tokenizer as _Tokenizer

from iron_spec.operators.activation import ACTIVATION_PARAMS, ACTIVATIONS
from iron_spec.runtime.blocks.projections import QKV_LAYOUTS
from iron_spec.runtime.blocks.rope import RopeOptions, rope_switch
from iron_spec.runtime.encoder import Encoder
from iron_spec.runtime.encoder_heads import HEAD_POOLS, HeadOptions
from iron_spec.runtime.encoder_options import ENCODER_MLP_KINDS, POOLINGS, EncoderLayerOptions, \
    EncoderOptions, PoolingOptions
from iron_spec.runtime.checkpoint import mark_transposed
from iron_spec.runtime.host import host_budget
from iron_spec.runtime.tokenizer import PIECE, read_tokenizer_json, utf8_text
from iron_spec.runtime.files import read_object
from iron_spec.runtime.values import MAX_INT, token_ids, whole
from iron_spec.runtime.weights import draw_weights

from . import gguf_files
from .build import Loaded, fill_weights, inputs
from .config import Resolved, resolve
from .errors import SpecError
from .interpreter import MAX_LAYERS, traced
from .loader import Spec, load_spec
from .options.attention import _window
from .options.checkpoint import checkpoint_layout
from .options.embedding import _sinusoidal
from .options.encoder import _bottleneck, _disentangled, _feedforwards, _landmarks, _languages, \
    _lsh_expectation, _no_attention_options, _number, _pointwise, _relative_bias, _span_conv, \
    _value_conv, _whole, _word_transform
from .options.layer import _layer_types
from .options.norms import norm_options
from .options.reading import _ABSENT, _flag_option, _option
from .options.rope import rope_options
from .parts import Part
from .schema import validate

# The token ids an encoder reads from config.json: its padding id (RoBERTa's positions count
# around it; transformers' nn.Embedding(padding_idx=...) refuses one outside the table). A
# bos or eos id is a decoder's: nothing here reads it, so one outside the vocabulary (a
# multilingual checkpoint's config shared with its decoder) is no reason to refuse the load.
ENCODER_TOKEN_KEYS = ("pad_token_id",)
REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "head_dim")
# Fields a layer that mixes its rows without attention (layer/mixing) reads nothing from.
ATTENTION_FIELDS = ("num_attention_heads", "head_dim")


@dataclass
class ExpandedEncoder:
    """An encoder spec over one config.json: the resolved fields, the model's options, the
    checkpoint renames and the tensor names read on purpose never."""

    spec: Spec
    resolved: Resolved
    options: EncoderOptions
    renames: dict[str, str]
    unused: tuple[str, ...]
    transposed: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()  # a classification head's, by class index (id2label)


ENCODER_PATTERN_OPTIONS = ("window", "rope")


def _typed_layers(spec: Spec, r: Resolved, base: EncoderLayerOptions, n: int, source: str
                  ) -> tuple[EncoderLayerOptions, ...]:
    """Every layer's options: ``base`` with its attention ``window`` and RoPE table
    (``layer/attention/window`` and ``rope``), each overridden per layer type under
    ``layer/pattern/options/<type>/attention`` (types as ``options.layer._layer_types``: a
    config's ``layer_types``, or every n-th).

    The RoPE table a layer reads: the one ``rope`` names (default ``default`` where the spec
    has a ``rope:`` section; none where it has none), as a causal spec's tables are read
    (``options.rope.rope_options``).

    Raises:
        SpecError: at the option's line, a pattern entry setting anything but those two, a
            table not under ``rope:`` or read by no layer, a rotated width that is odd,
            below 2 or past ``head_dim``, or a window that is no whole number from 1.
    """
    tables = spec.get("rope", default=None) or {}
    a = ("layer", "attention")
    base_name = spec.get(*a, "rope", default="default" if tables else None)
    options = spec.get("layer", "pattern", "options", default={}) or {}
    for t, entry in options.items():
        at = ("layer", "pattern", "options", t)
        extra = [k for k in (entry or {}) if k != "attention"] + [
            k for k in ((entry or {}).get("attention") or {}) if k not in ENCODER_PATTERN_OPTIONS]
        if extra:
            raise spec.error(at, f"an encoder's layer pattern sets attention/window and "
                                 f"attention/rope per type, not {', '.join(map(str, extra))}")
    read: dict[str, RopeOptions] = {}
    built: dict[Any, EncoderLayerOptions] = {}
    out = []
    for t in _layer_types(spec, r, n):
        if t not in built:
            over = ("layer", "pattern", "options", t, "attention")
            name, name_at = base_name, a + ("rope",)
            if t is not None and spec.get(*over, "rope", default=_ABSENT) is not _ABSENT:
                name, name_at = spec.get(*over, "rope"), over + ("rope",)
            window_at = a + ("window",)
            if t is not None and spec.get(*over, "window", default=_ABSENT) is not _ABSENT:
                window_at = over + ("window",)
            window = _window(spec, _option(spec, r, window_at, None), window_at)
            rope = None
            if name is not None:
                if name not in tables:
                    raise spec.error(name_at if spec.get(*name_at) is not None else ("rope",),
                                     f"rope table {name!r} is not under rope: (tables: "
                                     f"{', '.join(tables) or 'none'})")
                rope = read.get(name) or rope_options(spec, r, name, source)
                read[name] = rope
                if rope.rotary_dim < 2 or rope.rotary_dim % 2 or rope.rotary_dim > base.head_dim:
                    raise spec.error(("rope", name, "rotary_dim"), f"rope table {name!r} "
                                     f"rotates {rope.rotary_dim} columns: an even number from "
                                     f"2 to the head_dim ({base.head_dim})")
            built[t] = replace(base, rope=rope, window=window)
        out.append(built[t])
    unread = [t for t in tables if t not in read]
    if unread:
        raise spec.error(("rope", unread[0]), f"rope table {unread[0]!r} is read by no layer")
    return tuple(out)


def _layer_order(spec: Spec, r: Resolved, depth: int) -> tuple[int, ...] | None:
    """``layer/sharing/groups``: the shared layer each of the ``depth`` depths runs, group
    ``int(i / (depth / groups))`` at depth ``i`` as AlbertTransformer's loop; None without
    sharing.

    Raises:
        SpecError: at the option's line, groups that are no whole number within 1..depth.
    """
    at = ("layer", "sharing", "groups")
    if spec.get("layer", "sharing") is None:
        return None
    groups = _option(spec, r, at, None)
    if isinstance(groups, bool) or not isinstance(groups, int) or not 1 <= groups <= depth:
        raise spec.error(at, f"layer/sharing/groups is {groups!r}, not a whole number of "
                             f"shared layers within 1..{depth} (num_hidden_layers)")
    return tuple(int(i / (depth / groups)) for i in range(depth))


def _project(spec: Spec, r: Resolved) -> bool | None:
    """``embedding/project``: whether ``embeddings_project`` is held (None: where the
    widths differ)."""
    at = ("embedding", "project")
    return None if _option(spec, r, at, None) is None else _flag_option(spec, r, at, False)


def _token_dropout(spec: Spec, r: Resolved, vocab: int) -> tuple[int, float] | None:
    """``embedding/token_dropout``: ``(mask_id, ratio)`` where ``enabled`` holds, else None.

    Raises:
        SpecError: at the option's line, ``enabled`` that is not a boolean, a mask id outside
            the vocabulary, or a ratio outside ``[0, 1)``.
    """
    t = ("embedding", "token_dropout")
    if spec.get(*t) is None or not _flag_option(spec, r, t + ("enabled",), True):
        return None
    mask_id = _option(spec, r, t + ("mask_id",), None)
    if isinstance(mask_id, bool) or not isinstance(mask_id, int) or not 0 <= mask_id < vocab:
        raise spec.error(t + ("mask_id",), f"embedding/token_dropout/mask_id is {mask_id!r}, "
                                          f"not a token id within 0..{vocab - 1}")
    ratio = _number(spec, r, t + ("ratio",), None)
    if not 0 <= ratio < 1:
        raise spec.error(t + ("ratio",), f"embedding/token_dropout/ratio is {ratio}, not a "
                                        "share of tokens within [0, 1)")
    return mask_id, ratio


def _labels(spec: Spec, r: Resolved, at: tuple) -> tuple[str, ...]:
    """A classification head's class names by index: the field ``labels`` names (config.json's
    ``id2label``: ``{"0": NAME, ...}``), or transformers' two ``LABEL_0``, ``LABEL_1`` where
    it is absent or null (PretrainedConfig's ``num_labels`` 2).

    Raises:
        SpecError: at the option, a mapping whose keys are not the indices 0..n-1 or whose
            names are not text.
    """
    raw = spec.get(*at, default=None)
    value = None if raw is None else _option(spec, r, at, None)
    if value is None:
        return ("LABEL_0", "LABEL_1")
    ok = isinstance(value, Mapping) and value and all(isinstance(v, str) for v in value.values())
    keys = sorted(str(k) for k in value) if ok else []
    if not ok or keys != sorted(str(i) for i in range(len(value))):
        raise spec.error(at, f"{'.'.join(map(str, at))} is {value!r} (from "
                             f"{r.sources.get(raw, raw)}), not id2label: class names by the "
                             "indices 0..n-1")
    return tuple(str(value[k] if k in value else value[int(k)]) for k in
                 (str(i) for i in range(len(value))))


def head_options(spec: Spec, r: Resolved, part: Part, vocab: int
                 ) -> tuple[HeadOptions, tuple[str, ...]] | tuple[None, tuple]:
    """The task head ``part``'s ``head`` says the checkpoint holds
    (``runtime.encoder_heads.HeadOptions``) and a classification head's class names; (None,
    ()) where the part holds none.

    Raises:
        SpecError: at the option's line, a pool that is no field giving cls, mean or pooler,
            a flag that is no boolean, an activation not built, or labels as
            ``_labels`` refuses.
    """
    if part.head is None:
        return None, ()
    h = part.at + ("head",)
    task = spec.get(*h, "task")
    labels = () if task == "fill-mask" else _labels(spec, r, h + ("labels",))
    pool = _option(spec, r, h + ("pool",), None)
    if pool is not None and pool not in HEAD_POOLS:
        raise spec.error(h + ("pool",), f"head pool is {pool!r}, not one of "
                                        f"{', '.join(HEAD_POOLS)} (a field giving one)")
    act = spec.get(*h, "act", default=None)
    if act is not None:
        act = _option(spec, r, h + ("act",), None)
    try:
        head = HeadOptions(
            task=task, size=vocab if task == "fill-mask" else len(labels), pool=pool,
            dense=_flag_option(spec, r, h + ("dense",), False),
            dense_bias=_flag_option(spec, r, h + ("dense_bias",), True), act=act,
            norm=_flag_option(spec, r, h + ("norm",), False),
            out_bias=_flag_option(spec, r, h + ("out_bias",), True),
            tied=_flag_option(spec, r, h + ("tied",), False))
    except ValueError as e:
        raise spec.error(h, f"parts[{part.index}].head: {e}") from None
    return head, labels


def expand_encoder(spec: Spec, config_json: Mapping[str, Any], *, max_tokens: int | None = None,
                   source: str = "config.json", part: Part | None = None) -> ExpandedEncoder:
    """``_expand_encoder``, its option errors naming the config.json keys their fields read
    (``interpreter.traced``)."""
    try:
        return _expand_encoder(spec, config_json, max_tokens=max_tokens, source=source,
                               part=part)
    except SpecError as e:
        try:
            r = resolve(spec, config_json, source)
        except SpecError:
            raise e from None
        raise traced(spec, r, e, source) from None


def _expand_encoder(spec: Spec, config_json: Mapping[str, Any], *, max_tokens: int | None = None,
                    source: str = "config.json", part: Part | None = None) -> ExpandedEncoder:
    """The encoder ``spec`` describes on ``config_json``'s shape; as ``part`` of a bigger
    checkpoint (``parts``), with that checkpoint's pooler (``pooler``) and task head.

    ``max_tokens`` (ids a call holds) defaults to the spec's ``runtime.max_tokens``, else the
    position table's rows.

    Raises:
        SpecError: a schema violation (the first), a config field that cannot be resolved,
            a required field missing, a layer kind other than ``encoder``, an option the
            encoder does not build (a softcap, an mlp kind other than plain or gated) or
            of the wrong type, a layer pattern or RoPE table as ``_typed_layers`` refuses,
            or no bound on a call's ids.
    """
    problems = validate(spec)
    if problems:
        raise problems[0]
    fields = spec.get("config") or {}
    mixing = spec.get("layer", "mixing", default="attention")
    required = REQUIRED if mixing == "attention" else \
        tuple(f for f in REQUIRED if f not in ATTENTION_FIELDS)
    missing = [f for f in required if f not in fields]
    if missing:
        raise spec.error(("config",), f"config lacks the required fields {', '.join(missing)}")
    r = resolve(spec, config_json, source)
    v = r.values
    if mixing != "attention":
        # No attention reads them: one nominal head over the hidden width where undeclared.
        v = {"num_attention_heads": 1, "head_dim": v["hidden_size"], **v}
        _no_attention_options(spec)
    for name in required + tuple(n for n in ("num_key_value_heads",) if n in fields):
        if isinstance(v[name], bool) or not isinstance(v[name], int):
            raise spec.error(("config", name), f"config/{name} is {v[name]!r}, not a whole "
                             f"number (from {r.sources[name]})")
        top = MAX_LAYERS if name == "num_hidden_layers" else MAX_INT
        if not 1 <= v[name] <= top:
            raise spec.error(("config", name), f"{name} is {v[name]} (from {r.sources[name]}), "
                                               f"not a whole number within 1..{top}")
    layer = ("layer",)
    if spec.get("layer", "kind") != "encoder":
        raise spec.error(layer + ("kind",), f"model encoder takes layer kind 'encoder', not "
                                            f"{spec.get('layer', 'kind')!r}")
    a, m = layer + ("attention",), layer + ("mlp",)
    if spec.get(*a, "softcap") is not None:
        raise spec.error(a + ("softcap",), "an encoder layer builds no attention softcap; leave "
                                           "layer/attention/softcap out (or null)")
    mlp_kind = spec.get(*m, "kind", default="plain")
    if mlp_kind not in ENCODER_MLP_KINDS:
        raise spec.error(m + ("kind",), f"an encoder layer's mlp is one of "
                                        f"{', '.join(ENCODER_MLP_KINDS)}, not {mlp_kind!r}")
    fused = _flag_option(spec, r, m + ("fused",), False)
    if fused and mlp_kind != "gated":
        raise spec.error(m + ("fused",), "mlp/fused holds gate and up in one projection: a "
                                         "gated mlp's (set mlp/kind gated, or leave fused out)")
    act = _option(spec, r, m + ("act",), "hidden_act")
    if act not in ACTIVATIONS or act in ACTIVATION_PARAMS:
        raise spec.error(m + ("act",), f"activation {act!r} is not one of {', '.join(ACTIVATIONS)} "
                                       "without parameters")
    mlp_bias = _flag_option(spec, r, m + ("bias",), False)
    norm = norm_options(spec, r, layer + ("norm",))
    scale = _option(spec, r, a + ("scale",), None)
    fused_qkv = _flag_option(spec, r, a + ("fused_qkv",), False)
    qkv_layout = spec.get(*a, "qkv_layout", default="blocks")
    if qkv_layout not in QKV_LAYOUTS or (qkv_layout != "blocks" and not fused_qkv):
        raise spec.error(a + ("qkv_layout",), f"qkv_layout orders a fused query_key_value's "
                         f"rows: one of {', '.join(QKV_LAYOUTS)}, with attention/fused_qkv "
                         f"(it is {qkv_layout!r})")
    placement = spec.get("layer", "placement", default="post")
    qk_norm = spec.get(*a, "qk_norm", default=None)
    if qk_norm not in (None, "all"):
        raise spec.error(a + ("qk_norm",), f"an encoder layer norms queries and keys over the "
                                          f"whole projection (qk_norm all), not {qk_norm!r}")
    qk_norm_bias = _option(spec, r, a + ("qk_norm_bias",), None)
    if qk_norm_bias is not None:
        qk_norm_bias = _flag_option(spec, r, a + ("qk_norm_bias",), False)
    final_norm_bias = _option(spec, r, layer + ("final_norm_bias",), None)
    if final_norm_bias is not None:
        final_norm_bias = _flag_option(spec, r, layer + ("final_norm_bias",), False)
    first_norm = _flag_option(spec, r, layer + ("first_attention_norm",), True)
    if not first_norm and placement != "pre":
        raise spec.error(layer + ("first_attention_norm",), "a first layer without its "
                         "attention norm reads the embeddings as they are: placement pre only "
                         f"(it is {placement!r})")
    one = EncoderLayerOptions(
        heads=v["num_attention_heads"], head_dim=v["head_dim"],
        kv_heads=v.get("num_key_value_heads"), intermediate_size=v["intermediate_size"],
        norm=norm, act=act, bias=_flag_option(spec, r, a + ("bias",), False),
        o_bias=_flag_option(spec, r, a + ("o_bias",), False),
        k_bias=None if spec.get(*a, "k_bias") is None else
        _flag_option(spec, r, a + ("k_bias",), False),
        mlp_bias=mlp_bias, down_bias=_flag_option(spec, r, m + ("down_bias",), mlp_bias),
        mlp_kind=mlp_kind, mlp_fused=fused,
        scale=None if scale is None else _number(spec, r, a + ("scale",), None),
        placement=placement, fused_qkv=fused_qkv, qkv_layout=qkv_layout,
        qk_norm=qk_norm == "all", qk_norm_bias=qk_norm_bias,
        residual_scale=_number(spec, r, layer + ("residual_scale",), 1.0),
        disentangled=_disentangled(spec, r), mixing=mixing, bottleneck=_bottleneck(spec, r),
        feedforwards=_feedforwards(spec, r), span_conv=_span_conv(spec, r),
        pointwise=_pointwise(spec, r), landmarks=_landmarks(spec, r),
        value_conv=_value_conv(spec, r), lsh_expectation=_lsh_expectation(spec, r),
        global_tokens=_flag_option(spec, r, a + ("global_tokens",), False))
    approximate = [name for name in ("landmarks", "lsh_expectation")
                   if getattr(one, name) is not None]
    if one.value_conv is not None and not approximate:
        raise spec.error(a + ("value_conv",), "a value convolution is added to landmark or "
                                              "LSH-expectation attention's output: set "
                                              "attention/landmarks or lsh_expectation")
    if approximate and (
            len(approximate) > 1 or one.disentangled is not None or one.span_conv is not None
            or scale is not None or qk_norm is not None
            or spec.get(*a, "relative_bias") is not None):
        raise spec.error(a + (approximate[-1],), "landmark and LSH-expectation attention "
                                                 "(one of them) scale queries and keys "
                                                 "alone: not with attention/scale, qk_norm, "
                                                 "disentangled, span_conv, relative_bias or "
                                                 "each other")
    if one.pointwise is not None and (fused_qkv or mlp_kind != "plain"):
        raise spec.error(layer + ("pointwise",), "pointwise convolutions stand for separate "
                                                 "query, key and value projections and a plain "
                                                 "MLP's: not with fused_qkv or a gated mlp")
    if one.span_conv is not None and (one.disentangled is not None or fused_qkv):
        raise spec.error(a + ("span_conv",), "span-based dynamic convolution heads sit beside "
                                             "plain attention over separate query, key and "
                                             "value projections: not with disentangled or "
                                             "fused_qkv")
    if (one.bottleneck is not None or one.feedforwards > 1) and placement != "post":
        raise spec.error(layer + ("bottleneck" if one.bottleneck else "feedforwards",),
                         "a bottleneck and several feedforwards are built post-norm only "
                         f"(placement is {placement!r})")
    if one.disentangled is not None and scale is not None:
        raise spec.error(a + ("scale",), "disentangled attention scales its scores by "
                                         "1 / sqrt(head_dim * (1 + len(types))): leave "
                                         "layer/attention/scale out")
    order = _layer_order(spec, r, v["num_hidden_layers"])
    layers = _typed_layers(spec, r, one, len(set(order)) if order else v["num_hidden_layers"],
                           source)
    if not first_norm:
        layers = (replace(layers[0], attention_norm=False),) + layers[1:]
    if one.global_tokens and (fused_qkv or approximate or qk_norm is not None or any(
            lo.window is None or lo.rope is not None for lo in layers)):
        raise spec.error(a + ("global_tokens",), "global tokens sit beside a sliding window "
                                                 "(attention/window, on every layer) over "
                                                 "separate query, key and value projections: "
                                                 "not with fused_qkv, qk_norm, RoPE, landmarks "
                                                 "or lsh_expectation")
    if any((lo.landmarks is not None or lo.lsh_expectation is not None)
           and (lo.rope is not None or lo.window is not None) for lo in layers):
        raise spec.error(a, "landmark and LSH-expectation attention turn no RoPE and see every "
                            "row: not with attention/rope or a window")
    one = layers[0]
    e, p = ("embedding",), ("pooling",)
    positions = _whole(spec, r, e + ("positions",), 0)
    offset = _whole(spec, r, e + ("position_offset",), 0)
    padding = _option(spec, r, e + ("position_padding",), None)
    if padding is not None:
        padding = _whole(spec, r, e + ("position_padding",), None)
        if offset < 1:
            raise spec.error(e + ("position_padding",), "a padding id takes row position_offset "
                             f"- 1; set embedding/position_offset above 0 (it is {offset})")
    if offset and not positions:
        raise spec.error(e + ("position_offset",), f"position offset {offset} without a position "
                                                   "table (embedding/positions)")
    width = _option(spec, r, e + ("size",), None)
    if width is not None:
        width = _whole(spec, r, e + ("size",), None)
        if width < 1:
            raise spec.error(e + ("size",), "embedding/size is 0, not a width of at least 1")
    kind = spec.get("pooling", "kind", default="mean")
    if kind not in POOLINGS:
        raise spec.error(p + ("kind",), f"pooling {kind!r} is not one of {', '.join(POOLINGS)}")
    pooler = _flag_option(spec, r, p + ("pooler",), False)
    if part is not None and part.pooler is not None:
        pooler = _flag_option(spec, r, part.at + ("pooler",), False)
        if kind == "pooler" and not pooler:
            raise spec.error(part.at + ("pooler",), f"parts[{part.index}] holds no pooler, "
                             "and the spec's pooling reads it (pooling/kind pooler)")
    if kind == "pooler" and not pooler:
        raise spec.error(p + ("kind",), "pooling 'pooler' reads pooler.dense: set pooling/pooler")
    head, labels = (None, ()) if part is None else head_options(spec, r, part, v["vocab_size"])
    held = _option(spec, r, ("runtime", "max_tokens"), None)
    if held is not None:
        held = _whole(spec, r, ("runtime", "max_tokens"), None)
    L = max_tokens or held or positions - offset
    if not L or L < 1:
        raise spec.error(("runtime",) if not positions else e + ("position_offset",),
                         "an encoder with no position table needs runtime/max_tokens, the ids "
                         "a call holds" if not positions else f"position offset {offset} leaves "
                         f"no row of the position table's {positions}")
    for lo in layers:
        if lo.rope is not None:
            # Within the context the model was trained on, where every scaling's table is
            # one for any call's length (dynamic and longrope change only past it).
            L = min(L, lo.rope.max_position_embeddings, rope_switch(lo.rope) or MAX_INT)
    if positions and L > positions - offset:
        raise spec.error(("runtime", "max_tokens"), f"max_tokens {L} is past the position "
                                                    f"table's {positions} rows less offset "
                                                    f"{offset}")
    options = EncoderOptions(
        vocab_size=v["vocab_size"], hidden_size=v["hidden_size"],
        layers=layers, norm=norm,
        positions=positions, position_offset=offset, position_padding=padding,
        embedding_size=width, token_types=_whole(spec, r, e + ("token_types",), 0),
        task_types=_whole(spec, r, e + ("task_types",), 0),
        token_dropout=_token_dropout(spec, r, v["vocab_size"]),
        final_norm_bias=final_norm_bias, layer_order=order,
        embeddings_project=_project(spec, r),
        embedding_norm=_flag_option(spec, r, e + ("norm",), True),
        embedding_scale=_number(spec, r, e + ("scale",), 1.0),
        pooler=pooler,
        pooling=PoolingOptions(kind, _flag_option(spec, r, p + ("normalize",), False)),
        max_tokens=int(L), relative_bias=_relative_bias(spec, r, layers),
        sinusoidal=_sinusoidal(spec, r, positions, width or v["hidden_size"]),
        **_languages(spec, r), **_word_transform(spec, r), head=head)
    renames, transposed, unused = checkpoint_layout(spec, r)
    return ExpandedEncoder(spec, r, options, renames, unused, transposed, labels)


class TextIds:
    """A checkpoint's ``tokenizer.json`` for an encoder: a text's ids with every special
    token the post-processor adds (``[CLS] ... [SEP]``), as transformers'
    ``tokenizer(text)``; no padding (whatever the file sets), truncated to ``max_tokens``.

    Raises:
        FileNotFoundError: no ``tokenizer.json`` in ``directory``.
    """

    def __init__(self, directory: Path | _Tokenizer, max_tokens: int):
        # A directory's tokenizer.json, or a tokenizer built elsewhere (a GGUF file's).
        self._tok = read_tokenizer_json(directory) if isinstance(directory, Path) else directory
        self._tok.no_padding()
        self._tok.enable_truncation(max_tokens)
        self.max_tokens = max_tokens

    def __call__(self, text: str, what: str = "the text") -> tuple[list[int], list[int]]:
        """``text``'s ids and token types.

        Raises:
            ValueError: ``text`` is not UTF-8 text (``utf8_text``, naming it ``what``).
        """
        ids, types, _ = self.encode(text, what)
        return ids, types

    def encode(self, text: str, what: str = "the text") -> tuple[list[int], list[int], bool]:
        """``text``'s ids and token types, and whether it was cut at ``max_tokens`` (the
        tokenizers library keeps the ids cut off as the encoding's ``overflowing``), from
        ``encoding``.

        Raises:
            ValueError: ``text`` is not UTF-8 text (``utf8_text``, naming it ``what``).
        """
        encoded = self.encoding(text, what)
        return encoded.ids, encoded.type_ids, bool(encoded.overflowing)

    def encoding(self, text: str, what: str = "the text"):
        """The tokenizers library's Encoding of ``text`` (ids, type ids, tokens, character
        offsets, special-tokens mask), truncated at ``max_tokens``.

        A long text is tokenized from its start only as far as its ids need (the library
        tokenizes a text whole before it truncates: ~165 bytes of memory a byte): a prefix
        cut before a space, of ``max(PIECE, 64 * max_tokens)`` characters, twice as many
        while it holds fewer than ``max_tokens`` ids, the whole text at last. A prefix past
        ``max_tokens`` ids gives the whole text's first ones, at the same offsets.

        Raises:
            ValueError: ``text`` is not UTF-8 text (``utf8_text``, naming it ``what``).
        """
        utf8_text(text, what)
        n = max(PIECE, 64 * self.max_tokens)
        while len(text) > n:
            cut = text.rfind(" ", n // 2, n)
            encoded = self._tok.encode(text[:cut if cut > 0 else n])
            if encoded.overflowing:
                return encoded
            n *= 2
        return self._tok.encode(text)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """The text ``ids`` decode to, as transformers' ``tokenizer.decode``."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_id(self, token: str) -> int | None:
        """The id of ``token`` in the vocabulary, None where it has none."""
        return self._tok.token_to_id(token)




def _sentence_length(directory: Path) -> int | None:
    """sentence-transformers' ``max_seq_length`` (sentence_bert_config.json), if saved.

    Raises:
        FileError: the file is not a JSON object (named), as sentence-transformers refuses
            it; a ``max_seq_length`` that is not a whole number >= 1 (the file and key named).
    """
    path = directory / "sentence_bert_config.json"
    if not path.exists() and not path.is_symlink():
        return None
    value = read_object(path, what="sentence_bert_config.json").get("max_seq_length")
    return None if value is None else whole(value, f"{path}: max_seq_length", at_least=1)


def _fits(spec: Spec, o: EncoderOptions, source: str) -> None:
    """Refuse an encoder whose weights alone (float32: embedding tables, every layer's
    projections) would not fit this host's memory budget, before any is allocated (numpy
    maps zeros lazily, so a table of 2**31 rows would be taken and then filled)."""
    E = o.hidden_size
    tables = (o.vocab_size + o.positions + o.token_types + o.task_types) * E
    layers = sum(E * lo.head_dim * (lo.heads + 2 * (lo.kv_heads or lo.heads)) + lo.heads *
                 lo.head_dim * E + (3 if lo.mlp_kind == "gated" else 2) * E *
                 lo.intermediate_size for lo in o.layers)
    head = 0 if o.head is None else E * (E * o.head.dense + o.head.size * (not o.head.tied))
    need = 4 * (tables + layers + head)
    if need > host_budget():
        raise spec.error(("config",), f"the encoder on {source} would hold {need / 2**30:.1f} "
                                      f"GiB of weights, past this host's "
                                      f"{host_budget() / 2**30:.1f} GiB budget")


def load_encoder(spec: Spec | str | Path, *, checkpoint: str | Path | None = None,
                 random_weights: int | None = None, toy: bool = False,
                 max_tokens: int | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 allow_unread_config: bool = False) -> Loaded:
    """The encoder of ``spec`` on a checkpoint's config and weights, or drawn ones.

    ``max_tokens`` defaults to the spec's, capped by sentence-transformers'
    ``max_seq_length`` where the checkpoint saves one (texts are truncated there, as
    sentence-transformers truncates them). ``allow_unread_config``: load although
    config.json holds keys the spec neither reads nor ignores.

    Raises:
        FileNotFoundError: the spec, checkpoint or config.json is missing.
        SpecError: the spec is invalid, does not fit the config, or leaves a config.json
            key unaccounted for (every such key named).
        CheckpointError: the weights do not fit the model (every tensor named).
        ValueError: no weights source, or ``--toy`` with a checkpoint.
    """
    spec = spec if isinstance(spec, Spec) else load_spec(spec)
    config_json, source, directory, part = inputs(spec, checkpoint, random_weights, toy,
                                                  allow_unread_config)
    if directory is not None and max_tokens is None:
        max_tokens = _sentence_length(directory)
    within = None if part is None else part.part
    expanded = expand_encoder(spec, config_json, source=source, part=within)
    for key in ENCODER_TOKEN_KEYS:
        token_ids(config_json.get(key), f"{source}: {key}", expanded.options.vocab_size)
    if max_tokens is not None and max_tokens < expanded.options.max_tokens:
        expanded = expand_encoder(spec, config_json, max_tokens=max_tokens, source=source,
                                  part=within)
    _fits(spec, expanded.options, source)
    model = Encoder(expanded.options)
    mark_transposed(model, expanded.transposed)
    report, ckpt = fill_weights(model, directory, random_weights, draw_weights,
                                expanded.renames, expanded.unused, progress, spec, config_json,
                                fields=expanded.resolved.values, part=part)
    tokenizer = None
    if directory is not None and gguf_files.is_gguf(directory):
        tokenizer = TextIds(gguf_files.tokenizer(directory).library, expanded.options.max_tokens)
    elif directory is not None and (directory / "tokenizer.json").exists():
        tokenizer = TextIds(directory, expanded.options.max_tokens)
    return Loaded(model, tokenizer, expanded, report, directory, config_json,
                  random_weights, ckpt, part)
