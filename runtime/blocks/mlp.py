"""The feed-forward block of a layer: its options (``MLPOptions``), the gated or plain MLP
(``MLP``) and the parameters an activation holds (``ActivationParams``). Semantics follow
transformers' ``LlamaMLP`` unless an option says otherwise.

Not for: the activations themselves (``operators.activation``); a mixture of experts (its
router and experts) takes a module of its own beside this one.
"""

from __future__ import annotations

from dataclasses import dataclass

from iron_spec.operators import std_multiplier
from iron_spec.operators.activation import ACTIVATION_PARAMS

from ..graph import Handle, Recorder
from ..module import Module, Param
from .norms import Norm, NormOptions
from .projections import Linear


@dataclass(frozen=True)
class MLPOptions:
    """``kind``: ``gated`` (``down(act(gate(x)) * up(x))``, LlamaMLP) or ``plain``
    (``down(act(up(x)))``); ``act``: an ``ACT2FN`` name (one holding parameters holds them
    in ``act_fn``, ``ActivationParams``); ``bias`` on every projection; ``fused``: one
    ``gate_up_proj`` holds gate then up (Phi3MLP); ``sub_norm``: the norm ``ffn_sub_norm``
    over ``intermediate_size`` of what ``down_proj`` reads (BitNetMLP's; None: none).
    ``activation_sparsity`` (gated, not fused; 0: none): the gate projection's rows cut by
    the gaussian top-k at that sparsity before the activation (``operators.sparsity``), as
    Gemma3nTextMLP where its entry of ``activation_sparsity_pattern`` is above 0.
    ``gate_scale`` (gated, not fused): the gate projection's output times it before the
    activation; ``down_scale``: ``down_proj``'s output times it (FalconH1MLP's
    ``mlp_multipliers``, ``act(gate_proj(x) * gate_multiplier)`` and ``down_proj(...) *
    down_multiplier``)."""

    intermediate_size: int
    kind: str = "gated"
    act: str = "silu"
    bias: bool = False
    fused: bool = False
    sub_norm: NormOptions | None = None
    activation_sparsity: float = 0.0
    gate_scale: float = 1.0
    down_scale: float = 1.0


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
        if o.gate_scale != 1.0 and (o.kind != "gated" or o.fused):
            raise ValueError("gate_scale multiplies a gated MLP's own gate_proj, not a "
                             f"{'fused ' if o.fused else ''}{o.kind} MLP's")
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
            if o.gate_scale != 1.0:
                gate = rec.step("mul", gate, where=self.path, scale=o.gate_scale)
            if o.activation_sparsity:
                gate = rec.step("gaussian_topk", gate, where=self.path,
                                std_multiplier=self.std_multiplier)
            h = rec.step("gated_activation", gate, self.up_proj(rec, x), *params,
                         where=self.path, act=o.act)
        if o.sub_norm is not None:
            h = self.ffn_sub_norm(rec, h)
        y = self.down_proj(rec, h)
        return y if o.down_scale == 1.0 else rec.step("mul", y, where=self.path,
                                                       scale=o.down_scale)


MLP_KINDS = ("gated", "plain", "none")
