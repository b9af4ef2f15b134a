"""Reading a layer's mixture of experts (``layer/experts``) into
``runtime.blocks.experts.ExpertsOptions``: the experts' count, width and form, the router,
the shared experts and the block's own extras; and which layers hold it (``layers``, an
expression over the config fields and ``layer``, the layer's index). Each error at the
option's own line.

Not for: the dense MLP (``mlp``), whose options are the experts' defaults; the layer around
them (``layer``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from iron_spec.operators.activation import ACTIVATION_PARAMS, ACTIVATIONS
from iron_spec.operators.experts import GATE_UP, KINDS as EXPERT_KINDS
from iron_spec.operators.router import GROUP_SCORES, NORMALIZE, SCORES, SELECTS, WEIGHTS
from iron_spec.runtime.blocks.experts import PARAMS, ExpertsOptions, RouterOptions
from iron_spec.runtime.blocks.mlp import MLPOptions
from iron_spec.runtime.blocks.norms import NormOptions

from ..config import Resolved, evaluate_option
from ..loader import Spec
from .reading import LayerReader, _flag, _number

E = ("experts",)
LAYER_INDEX = "layer"  # the name ``experts.layers`` reads a layer's index by


def _word(spec: Spec, read: LayerReader, path: tuple, default: Any, allowed: tuple) -> Any:
    value, at = read.word(*path, default=default)
    if value not in allowed:
        raise spec.error(at, f"{'.'.join(map(str, at[1:]))} is {value!r}, not one of "
                             f"{', '.join(map(str, allowed))}")
    return value


def experts_options(spec: Spec, read: LayerReader, mlp: MLPOptions,
                    norm: NormOptions) -> ExpertsOptions | None:
    """The mixture of experts of a layer (``layer/experts``, per type as ``read`` reads
    it), each expert's and the shared experts' MLP defaulting to the layer's ``mlp``; None
    without it.

    Raises:
        SpecError: at the option, a count, width or top-k that is no whole number above 0, a
            word outside its choices (score, select, weights, normalize, group score, params,
            gate_up, kind), an activation no operator has, groups that do not split the
            experts, a clamp on an expert other than gated.
    """
    if read.word(*E)[0] is None:
        return None
    word, opt, whole, flag, number = read.word, read.opt, read.whole, read.flag, read.number

    def positive(path: tuple, default: Any) -> int:
        value = whole(*path, default=default)
        if value is None or value < 1:
            raise spec.error(word(*path, default=default)[1],
                             f"{'.'.join(path)} is {value!r}, not a whole number above 0")
        return value

    count = positive(E + ("count",), None)
    kind = _word(spec, read, E + ("mlp", "kind"), mlp.kind, ("gated", "plain"))
    act, at = opt(*E, "mlp", "act")
    act = mlp.act if act is None else act
    if act not in ACTIVATIONS or act in ACTIVATION_PARAMS:
        raise spec.error(at, f"activation {act!r} is not one of {', '.join(ACTIVATIONS)} "
                             "without parameters")
    clamp = word(*E, "mlp", "clamp")[0]
    limit = alpha = None
    up_offset = 0.0
    if clamp is not None:
        if kind != "gated":
            raise spec.error(word(*E, "mlp", "clamp")[1], "a clamp limits a gated expert's "
                                                          f"halves, not a {kind} expert's")
        limit = number(*E, "mlp", "clamp", "limit")
        alpha = number(*E, "mlp", "clamp", "alpha")
        up_offset = number(*E, "mlp", "clamp", "up_offset", default=0.0) or 0.0
    k = positive(E + ("router", "top_k"), "num_experts_per_tok")
    router = _router(spec, read, count, k, norm)
    shared_size = whole(*E, "shared", "intermediate_size", default=0) or 0
    shared = None
    if shared_size:
        shared_act, at = opt(*E, "shared", "mlp", "act")
        shared_act = mlp.act if shared_act is None else shared_act
        if shared_act not in ACTIVATIONS:
            raise spec.error(at, f"activation {shared_act!r} is not one of "
                                 f"{', '.join(ACTIVATIONS)}")
        shared = MLPOptions(intermediate_size=shared_size,
                            kind=_word(spec, read, E + ("shared", "mlp", "kind"), mlp.kind,
                                       ("gated", "plain")),
                            act=shared_act, bias=flag(*E, "shared", "mlp", "bias"),
                            fused=flag(*E, "shared", "mlp", "fused"))
    return ExpertsOptions(
        count=count, intermediate_size=positive(E + ("intermediate_size",), mlp.intermediate_size),
        router=router, kind=kind, act=act, bias=flag(*E, "mlp", "bias"),
        gate_up=_word(spec, read, E + ("mlp", "gate_up"), "halves", GATE_UP),
        limit=limit, alpha=alpha, up_offset=up_offset,
        weight_input=flag(*E, "weight_input"), out_norm=flag(*E, "out_norm"),
        params=_word(spec, read, E + ("params",), "per_expert", PARAMS),
        flat=flag(*E, "flat"), shared_size=shared_size, shared=shared,
        shared_gate=flag(*E, "shared", "gate"), shared_norm=flag(*E, "shared", "norm"),
        routed_scale=number(*E, "routed_scale", default=1.0),
        output_bias=flag(*E, "output_bias"), beside=flag(*E, "beside"))


def _router(spec: Spec, read: LayerReader, count: int, k: int, norm: NormOptions) -> RouterOptions:
    R = E + ("router",)
    word, opt, whole, flag, number = read.word, read.opt, read.whole, read.flag, read.number
    if k > count:
        raise spec.error(word(*R, "top_k", default="num_experts_per_tok")[1],
                         f"top_k {k} is more than the {count} experts")
    groups = None
    if word(*R, "groups")[0] is not None:
        n = whole(*R, "groups", "count")
        keep = whole(*R, "groups", "keep")
        if n is not None and n > 1 or keep is not None and keep != n:
            at = word(*R, "groups", "count")[1]
            if not n or n < 1 or count % n or not keep or not 1 <= keep <= n:
                raise spec.error(at, f"{n} groups keeping {keep} do not split {count} experts "
                                     f"(a whole number of groups dividing them, keeping 1..{n})")
            if keep * (count // n) < k:
                raise spec.error(at, f"{keep} of {n} groups hold {keep * (count // n)} experts, "
                                     f"fewer than top_k {k}")
            groups = (n, keep)
    normalize = word(*R, "normalize")[0]
    if normalize is True:
        normalize = "sum"
    elif normalize is False:
        normalize = None
    if normalize not in NORMALIZE:
        raise spec.error(word(*R, "normalize")[1], f"router normalize is {normalize!r}, not one "
                         "of sum, p, true, false or null")
    sparsemixer = number(*R, "sparsemixer")
    if sparsemixer is not None and k != 2:
        raise spec.error(word(*R, "sparsemixer")[1], f"sparsemixer chooses 2 experts, not "
                                                     f"top_k {k}")
    input_norm = word(*R, "input_norm")[0] is not None
    return RouterOptions(
        top_k=k, score=_word(spec, read, R + ("score",), "softmax", SCORES),
        select=_word(spec, read, R + ("select",), "scores", SELECTS),
        weights=_word(spec, read, R + ("weights",), "scores", WEIGHTS),
        groups=groups,
        group_score=_word(spec, read, R + ("groups", "score"), "top2", GROUP_SCORES),
        normalize=normalize, norm_eps=number(*R, "norm_eps", default=0.0) or 0.0,
        norm_min=number(*R, "norm_min", default=0.0) or 0.0,
        norm_p=number(*R, "norm_p", default=1.0) or 1.0,
        scale=number(*R, "scale", default=1.0), sparsemixer=sparsemixer,
        bias=flag(*R, "bias"), selection_bias=flag(*R, "selection_bias"),
        selection_bias_row=flag(*R, "selection_bias_row"),
        expert_scale=flag(*R, "expert_scale"), input_norm=input_norm,
        input_scale=(number(*R, "input_norm", "scale", default=1.0) if input_norm else 1.0),
        eps=norm.eps)


def experts_layers(spec: Spec, resolved: list[Resolved], layers: list) -> list:
    """Each layer's options with its mixture kept where ``layer/experts/layers`` (an
    expression over the layer's fields and ``layer``, its index; default every layer) holds,
    else dropped (the layer's dense MLP). transformers' ``mlp_only_layers`` and
    ``decoder_sparse_step`` (Qwen2MoeDecoderLayer), ``first_k_dense_replace``
    (DeepseekV3DecoderLayer), ``moe_layers`` (Llama4TextDecoderLayer) all say it.

    Raises:
        SpecError: at the option, a value that is not true or false for some layer.
    """
    at = ("layer", "experts", "layers")
    raw = spec.get(*at, default=True)
    out = []
    for i, (r, lo) in enumerate(zip(resolved, layers)):
        if lo.experts is None:
            out.append(lo)
            continue
        fields = Resolved({**r.values, LAYER_INDEX: i}, {**r.sources, LAYER_INDEX: "the layer's index"},
                          r.read)
        on = evaluate_option(spec, at, raw, fields, "true or false")
        if not isinstance(on, bool):
            raise spec.error(at, f"experts.layers is {on!r} at layer {i}"
                                 f"{f' (from {raw!r})' if isinstance(raw, str) else ''}, not "
                                 "true or false")
        out.append(lo if on else replace(lo, experts=None))
    return out
