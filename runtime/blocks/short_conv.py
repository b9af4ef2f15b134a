"""LFM2's gated short convolution (Lfm2ShortConv), a token mixer carrying its convolution's
last rows in place of a KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph import Handle, Recorder
from ..module import Module
from .causal_conv import CausalConv1d, columns
from .projections import Linear


@dataclass(frozen=True)
class ShortConvOptions:
    """A gated short convolution (Lfm2ShortConv): ``in_proj`` ``(3 hidden, hidden)`` gives
    ``B``, ``C`` and ``x``; ``out_proj(C * conv(B * x))``, the convolution of ``kernel``
    taps (``conv_L_cache``) and no activation; ``bias`` on the projections and the
    convolution (``conv_bias``)."""

    kernel: int
    bias: bool = False


class ShortConv(Module):
    """Lfm2ShortConv: ``in_proj``, ``conv`` (``CausalConv1d`` over ``hidden`` channels) and
    ``out_proj``; ``x`` ``(n, hidden)`` to ``(n, hidden)``."""

    def __init__(self, hidden: int, o: ShortConvOptions):
        self.in_proj = Linear(hidden, 3 * hidden, o.bias)
        self.conv = CausalConv1d(hidden, o.kernel, o.bias)
        self.out_proj = Linear(hidden, hidden, o.bias)
        self.hidden = hidden

    def __call__(self, rec: Recorder, x: Handle, ropes=None) -> Handle:
        E = self.hidden
        B, C, h = columns(rec, self.in_proj(rec, x), self.where("in_proj"), [E, E, E])
        h = self.conv(rec, rec.step("mul", B, h, where=self.path))
        return self.out_proj(rec, rec.step("mul", C, h, where=self.path))
