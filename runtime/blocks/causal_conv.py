"""The depthwise causal convolution the state-carrying token mixers share (the seeds'
``CausalConv1d``), its last ``kernel - 1`` rows carried as a recurrent state, and the helpers
those mixers record their steps with.

Not for: the mixers themselves (``short_conv``, ``mamba``, ``mamba2``, ``delta_rule``).
"""

from __future__ import annotations

from ..graph import Handle, Recorder
from ..module import Module, Param, State

#: A decay's draw for toys (``runtime.weights``): ``exp(-exp(A_log) dt)`` in [0.5, 0.99] at
#: dt 1, and ``dt_bias`` so that dt is about 1 (softplus(0.3 .. 0.8) is 0.85 .. 1.17).
DECAY_DRAW = ("log_decay", 0.5, 0.99)
DT_BIAS_DRAW = ("uniform", 0.3, 0.8)


class CausalConv1d(Module):
    """A depthwise causal convolution of ``kernel`` taps over ``channels``, its last
    ``kernel - 1`` rows carried as state (the seeds' ``CausalConv1d``;
    ``operators.causal_conv``): ``weight`` ``(channels, kernel)``, stored as torch's
    ``nn.Conv1d`` ``(channels, 1, kernel)``, ``bias`` ``(channels,)`` where ``bias``, and
    the state ``(kernel - 1, channels)``; ``act`` None or ``silu``."""

    def __init__(self, channels: int, kernel: int, bias: bool, act: str | None = None):
        if kernel < 2:
            raise ValueError(f"a causal convolution of {kernel} taps carries no state: 2 or more")
        self.weight = Param(channels, kernel)
        self.weight.reshaped = (channels, 1, kernel)
        self.bias = Param(channels) if bias else None
        self.state = State(kernel - 1, channels, recurrent=True)
        self.act = act

    def __call__(self, rec: Recorder, x: Handle) -> Handle:
        w = rec.hold("param", self.where("weight"), self.weight.array)
        b = None if self.bias is None else rec.hold("param", self.where("bias"), self.bias.array)
        state = rec.state(self.where("state"), self.state)
        return rec.step("causal_conv", x, w, b, state, where=self.path, start=rec.call.start,
                        act=self.act)


def columns(rec: Recorder, x: Handle, where: str, widths: list[int]) -> list[Handle]:
    """``x``'s columns cut into runs of ``widths``, each a step of its own."""
    out, at = [], 0
    for w in widths:
        out.append(rec.step("columns", x, where=where, begin=at, end=at + w))
        at += w
    return out
