"""Reading a layer's MLP options (``layer/mlp``) into ``runtime.blocks.mlp.MLPOptions``: kind,
activation, widths, fused and sparse forms; each error at the option's own line.

Not for: the layer around it (``layer``); a mixture of experts (its router and experts)
takes a module of its own beside this one.
"""

from __future__ import annotations

from typing import Any

from iron_spec.operators.activation import ACTIVATIONS
from iron_spec.runtime.blocks.mlp import MLPOptions
from iron_spec.runtime.blocks.norms import NormOptions

from ..loader import Spec
from .reading import LayerReader, _number


# The options of a layer without an MLP (kind none: its token mixer alone): nothing read.
NO_MLP = MLPOptions(intermediate_size=0, kind="none")


def mlp_options(spec: Spec, read: LayerReader, norm: NormOptions) -> MLPOptions:
    """The MLP of a layer (``layer/mlp``, per type as ``read`` reads it): its kind,
    activation, widths, scales and flags, its ``sub_norm`` the layer's ``norm``; kind
    ``none``, ``NO_MLP``.

    Raises:
        SpecError: at the option, an activation no operator has, or activation sparsity on
            an MLP other than gated and unfused.
    """
    word, opt, whole, flag, number = read.word, read.opt, read.whole, read.flag, read.number
    if word("mlp", "kind", default="gated")[0] == "none":
        return NO_MLP
    act, at = opt("mlp", "act", default="hidden_act")
    if act not in ACTIVATIONS:
        raise spec.error(at, f"activation {act!r} is not one of {', '.join(ACTIVATIONS)}")
    mlp = MLPOptions(intermediate_size=whole("mlp", "intermediate_size", default="intermediate_size"),
                     kind=word("mlp", "kind", default="gated")[0], act=act,
                     bias=flag("mlp", "bias"), fused=flag("mlp", "fused"),
                     sub_norm=norm if flag("mlp", "sub_norm") else None,
                     activation_sparsity=_sparsity(
                         spec, *opt("mlp", "activation_sparsity", default=0.0)),
                     gate_scale=number("mlp", "gate_scale", default=1.0),
                     down_scale=number("mlp", "down_scale", default=1.0))
    if mlp.gate_scale != 1.0 and (mlp.kind != "gated" or mlp.fused):
        raise spec.error(opt("mlp", "gate_scale")[1], "gate_scale multiplies a gated MLP's own "
                         f"gate_proj, not a {'fused ' if mlp.fused else ''}{mlp.kind} MLP's")
    if mlp.activation_sparsity and (mlp.kind != "gated" or mlp.fused):
        raise spec.error(opt("mlp", "activation_sparsity")[1], "activation_sparsity cuts a "
                         f"gated MLP's own gate_proj, not a {'fused ' if mlp.fused else ''}"
                         f"{mlp.kind} MLP's")
    return mlp


def _sparsity(spec: Spec, value: Any, at: tuple) -> float:
    """``layer/mlp/activation_sparsity``: a share within [0, 1) (0 or null: no cut)."""
    share = _number(spec, at, value)
    if share is None:
        return 0.0
    if not 0.0 <= share < 1.0:
        raise spec.error(at, f"activation_sparsity is {share}, not a share within [0, 1) "
                             "(0: no cut; 0.95 cuts 95% of a normal row)")
    return share
