"""Reading a causal spec's ``layer`` section into one ``runtime.layers.LayerOptions`` per
layer type: the types under ``layer/pattern``, each type's attention, MLP and norm (read by
their own modules) and the layer's placement, residuals, Laurel branch, AltUp streams,
per-layer inputs and KV sharing; each error at the option's own line.

Not for: the options of attention (``attention``), the MLP (``mlp``), norms (``norms``); the
whole expansion (``interpreter``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from iron_spec.operators.activation import ACTIVATION_PARAMS, ACTIVATIONS
from iron_spec.runtime.altup import AltUpOptions
from iron_spec.runtime.layers import LayerOptions, PerLayerInputOptions

from ..config import Resolved
from ..loader import Spec
from .attention import NO_ATTENTION, attention_options
from .experts import experts_options
from .mixers import mixer_options
from .mlp import mlp_options
from .norms import norm_options
from .reading import LayerReader, _flag, _flag_option, _number, _option, _whole
from .shared import shared_block_options


def _type_text(t: Any) -> str:
    return {True: "true", False: "false"}[t] if isinstance(t, bool) else str(t)


def _layer_types(spec: Spec, r: Resolved, n: int) -> list[Any]:
    """Each layer's type under ``layer/pattern``: config's list (``types``), else every
    ``every``-th layer (layer ``i`` where ``(i + offset) % every == 0``, ``offset`` 1 unless
    given) and every layer from index ``from`` on ``nth``, the others ``other``;
    the last layer ``last`` where that is given; ``[None] * n`` without a pattern.

    A type is a name (``layer_types``' ``"sliding_attention"``), an integer or a boolean (a
    per-layer flag list such as SmolLM3's ``no_rope_layers``, 1 = RoPE): ``options`` is keyed
    by those very values (YAML ``0:``, ``1:``, ``true:``).
    """
    p = ("layer", "pattern")
    if spec.get(*p) is None:
        return [None] * n
    types = _option(spec, r, p + ("types",), None)
    options = spec.get(*p, "options", default={}) or {}
    if types is not None:
        if isinstance(types, str) and len(types) == n:
            types = list(types)  # one character a layer (NemotronH's hybrid_override_pattern)
        if not isinstance(types, list) or len(types) != n or not all(
                isinstance(t, (str, int)) for t in types):
            raise spec.error(p + ("types",), f"layer types {types!r} are not {n} names, "
                             "integers or booleans, one per layer")
        where = p + ("types",)
    else:
        every = _whole(spec, p + ("every",), _option(spec, r, p + ("every",), None))
        start = _whole(spec, p + ("from",), _option(spec, r, p + ("from",), None))
        offset = _whole(spec, p + ("offset",), _option(spec, r, p + ("offset",), 1))
        offset = 1 if offset is None else offset
        listed = _listed(spec, r, p + ("at",), n)
        nth, other = spec.get(*p, "nth"), spec.get(*p, "other")
        if other is None or (every is not None and (nth is None or every < 1)) or (
                (start is not None or listed) and nth is None):
            raise spec.error(p, "without layer types, a pattern needs other (and nth with every "
                                ">= 1, from or at)")
        types = [nth if (every and (i + offset) % every == 0) or (start is not None and i >= start)
                 or i in listed else other for i in range(n)]
        where = p
    last = spec.get(*p, "last")
    if last is not None and types:
        types = types[:-1] + [last]
    unknown = sorted({_type_text(t) for t in types if t not in options})
    if unknown:
        raise spec.error(where, f"layer types {', '.join(unknown)} have no entry under "
                                f"layer/pattern/options (entries: "
                                f"{', '.join(map(_type_text, options)) or 'none'})")
    return types


def _listed(spec: Spec, r: Resolved, at: tuple, n: int) -> set[int]:
    """``layer.pattern.at``: the layer indices a config lists (BambaConfig's
    ``attn_layer_indices``), each of type ``nth``; null or absent: none.

    Raises:
        SpecError: at the option, a value that is not a list of layer indices 0..n - 1.
    """
    value = _option(spec, r, at, None)
    if value is None:
        return set()
    if not isinstance(value, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n for i in value):
        raise spec.error(at, f"layer.pattern.at is {value!r}, not a list of layer indices "
                             f"within 0..{n - 1}")
    return set(value)


def _layer(spec: Spec, r: Resolved, t: Any, per_type: set | None = None) -> LayerOptions:
    """The options of a layer of type ``t``: ``layer/pattern/options/t``'s entries over
    ``layer``'s own; each option path read so (and so settable per type) is added to
    ``per_type``."""
    read = LayerReader(spec, r, t, per_type)
    word, opt, number, flag = read.word, read.opt, read.number, read.flag
    norm = norm_options(spec, r, ("layer", "norm"))
    mixers = mixer_options(spec, read)
    # A layer of another token mixer reads no attention option (nor its config fields).
    attention = attention_options(spec, r, read) if "attention" in mixers["mixer"] \
        else NO_ATTENTION
    if attention.gate_in_query and not attention.output_gate:
        raise spec.error(opt("attention", "gate_in_query")[1], "gate_in_query holds the output "
                         "gate in q_proj: only with attention.output_gate")
    mlp = mlp_options(spec, read, norm)
    experts = experts_options(spec, read, mlp, norm)
    parallel = flag("parallel")
    placement = word("placement", default="pre")[0]
    if parallel and (spec.get("layer", "kind") != "decoder" or placement != "pre"):
        raise spec.error(("layer", "parallel"), "a parallel layer is kind decoder, placement pre "
                         f"(not {spec.get('layer', 'kind')}, {placement})")
    shared_norm, at = opt("shared_norm", default=True)
    # A layer running the model's shared block (Zamba2HybridLayer): the block's options,
    # one set for every such layer (layer.shared_block).
    runs, at_runs = opt("runs_shared_block", default=False)
    shared = shared_block_options(spec, r, norm) if _flag(spec, at_runs, runs) else None
    if shared is not None and (mlp.kind != "none" or experts is not None or parallel or
                               placement != "pre" or mixers["mixer"] == ("none",) or
                               spec.get("layer", "kind") != "decoder"):
        raise spec.error(at_runs, "a layer running the shared block is a pre decoder of its "
                                  "token mixer alone (mlp kind none, no experts), "
                                  "not this layer type")
    return LayerOptions(attention, mlp, norm, kind=spec.get("layer", "kind"), **mixers,
                        residual_scale=number("residual_scale", default=1.0),
                        placement=placement, per_layer_input=_per_layer_input(spec, r),
                        parallel=parallel, shared_norm=_flag(spec, at, shared_norm),
                        residual_weights=flag("residual_weights"),
                        residual_gates=flag("residual_gates"),
                        laurel_rank=_laurel_rank(spec, *opt("laurel", "rank", default=0)),
                        altup=_altup(spec, r), experts=experts, shared_block=shared)


def _laurel_rank(spec: Spec, value: Any, at: tuple) -> int:
    """``layer/laurel/rank``: a whole number, 0 (or null) for no branch."""
    rank = _whole(spec, at, value) or 0
    if rank < 0:
        raise spec.error(at, f"laurel rank {rank} is not a whole number of 0 or more "
                             "(0: no branch)")
    return rank


def _altup(spec: Spec, r: Resolved) -> AltUpOptions | None:
    """``layer/altup`` evaluated: ``inputs`` streams (1 or more), the ``active`` one among
    them, ``correct_scale``; None without it."""
    p = ("layer", "altup")
    if spec.get(*p) is None:
        return None
    inputs = _whole(spec, p + ("inputs",), _option(spec, r, p + ("inputs",), "altup_num_inputs"))
    if inputs is None or inputs < 1:
        raise spec.error(p + ("inputs",), f"altup inputs is {inputs}, not a whole number of "
                                          "streams of 1 or more")
    active = _whole(spec, p + ("active",), _option(spec, r, p + ("active",), 0))
    if active is None or not 0 <= active < inputs:
        raise spec.error(p + ("active",), f"altup active stream {active} is not one of the "
                                          f"{inputs} streams 0..{inputs - 1}")
    return AltUpOptions(inputs=inputs, active=active,
                        correct_scale=_flag_option(spec, r, p + ("correct_scale",), True))


def _per_layer_input(spec: Spec, r: Resolved) -> PerLayerInputOptions | None:
    """``layer/per_layer_input`` evaluated; None without it or where its size is 0."""
    p = ("layer", "per_layer_input")
    if spec.get(*p) is None:
        return None
    size = _whole(spec, p + ("size",), _option(spec, r, p + ("size",), "hidden_size_per_layer_input"))
    if not size:
        return None
    act = _option(spec, r, p + ("act",), "hidden_act")
    if act not in ACTIVATIONS or act in ACTIVATION_PARAMS:
        raise spec.error(p + ("act",), f"activation {act!r} is not one of {', '.join(ACTIVATIONS)} "
                                       "without parameters")

    def number(name: str) -> float:
        return _number(spec, p + (name,), _option(spec, r, p + (name,), 1.0))

    vocab = _whole(spec, p + ("vocab_size",), _option(spec, r, p + ("vocab_size",),
                                                      "vocab_size_per_layer_input"))
    outside = _whole(spec, p + ("outside_row",), _option(spec, r, p + ("outside_row",), None))
    if outside is not None and not 0 <= outside < (vocab or 0):
        raise spec.error(p + ("outside_row",), f"outside_row {outside} is not a row of "
                                               f"embed_tokens_per_layer's {vocab} (0..{vocab - 1})")
    return PerLayerInputOptions(
        size=size, act=act,
        vocab_size=vocab,
        embedding_scale=number("embedding_scale"), projection_scale=number("projection_scale"),
        mix_scale=number("mix_scale"), outside_row=outside)


def _share_kv(spec: Spec, r: Resolved, layers: list[LayerOptions],
              types: list[Any]) -> list[LayerOptions]:
    """``layer/kv_sharing``: the last ``last`` layers read the KV cache of the last layer
    before them of their own type (``layer/pattern``), as transformers' ``kv_sharing_modes``;
    with ``double_mlp``, their MLPs are twice as wide."""
    p = ("layer", "kv_sharing")
    if spec.get(*p) is None:
        return layers
    n = len(layers)
    last = _whole(spec, p + ("last",), _option(spec, r, p + ("last",), 0)) or 0
    if not 0 <= last < n:
        raise spec.error(p + ("last",), f"{last} layers sharing KV caches is not within 0..{n - 1} "
                                        f"(at least the first layer holds its own)")
    double = _flag_option(spec, r, p + ("double_mlp",), False)
    first = n - last
    out = list(layers)
    for i in range(first, n):
        source = max((j for j in range(first) if types[j] == types[i]), default=None)
        if source is None:
            raise spec.error(p + ("last",), f"layer {i} (type {types[i]}) shares a KV cache, but "
                                            f"none of layers 0..{first - 1} is of its type")
        lo = layers[i]
        mlp = replace(lo.mlp, intermediate_size=2 * lo.mlp.intermediate_size) if double else lo.mlp
        out[i] = replace(lo, attention=replace(lo.attention, kv_from=source), mlp=mlp)
    return out


def _first_attention_norm(spec: Spec, r: Resolved, layers: list[LayerOptions]) -> list[LayerOptions]:
    """``layer.first_attention_norm``: false, layer 0 holds no ``input_layernorm`` and its
    attention reads the embeddings as they are (ModernBertDecoderLayer's ``attn_norm``).

    Raises:
        SpecError: at the option, false on a layer other than a decoder placed pre that is
            not parallel.
    """
    at = ("layer", "first_attention_norm")
    if _flag_option(spec, r, at, True):
        return layers
    first = layers[0]
    if first.kind != "decoder" or first.placement != "pre" or first.parallel:
        raise spec.error(at, "a first layer without its attention norm is kind decoder, "
                             f"placement pre, not parallel (not {first.kind}, {first.placement}"
                             f"{', parallel' if first.parallel else ''})")
    return [replace(first, attention_norm=False)] + layers[1:]
