"""Mamba's mixer (MambaMixer; FalconMamba's and Jamba's with their dt/B/C norms): a causal
convolution and the selective scan (``operators.selective_scan``), carrying both states.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph import Handle, Recorder
from ..module import Module, Param, State
from .causal_conv import DECAY_DRAW, CausalConv1d, columns
from .norms import Norm, NormOptions
from .projections import Linear


@dataclass(frozen=True)
class SelectiveScanOptions:
    """Mamba's mixer (MambaMixer): ``in_proj`` ``(2 inner, hidden)`` gives ``x`` and the
    gate ``z``; ``x`` through ``conv1d`` (``conv_kernel`` taps, silu), ``x_proj`` ``(dt_rank
    + 2 state, inner)`` gives dt, B and C, ``dt_proj`` ``(inner, dt_rank)`` (biased) dt's
    step, then the selective scan (``A_log`` ``(inner, state)``, ``D`` ``(inner,)``) gated by
    silu(z), and ``out_proj``. ``bias``: in_proj's and out_proj's (``use_bias``);
    ``conv_bias`` (``use_conv_bias``). ``dtbc_norm``: RMSNorms on dt (before ``dt_proj``),
    B and C: ``weighted`` (JambaMambaMixer's ``dt_layernorm``, ``b_layernorm``,
    ``c_layernorm``), ``weightless`` (FalconMambaMixer's), None; ``eps`` theirs. ``act``: the
    convolution's activation (``hidden_act``: silu)."""

    inner: int
    state: int
    dt_rank: int
    conv_kernel: int = 4
    conv_bias: bool = True
    bias: bool = False
    dtbc_norm: str | None = None
    eps: float = 1e-6
    act: str = "silu"


class SelectiveScanMixer(Module):
    """MambaMixer (and FalconMamba's, Jamba's: ``dtbc_norm``); its states are ``conv1d``'s
    and ``ssm_state`` ``(inner, state)``."""

    def __init__(self, hidden: int, o: SelectiveScanOptions):
        D, N, R = o.inner, o.state, o.dt_rank
        self.in_proj = Linear(hidden, 2 * D, o.bias)
        self.conv1d = CausalConv1d(D, o.conv_kernel, o.conv_bias, act=o.act)
        self.x_proj = Linear(D, R + 2 * N)
        self.dt_proj = Linear(R, D, True)
        self.A_log = Param(D, N, draw=DECAY_DRAW)
        self.D = Param(D)
        self.out_proj = Linear(D, hidden, o.bias)
        if o.dtbc_norm is not None:
            if o.dtbc_norm not in ("weighted", "weightless"):
                raise ValueError(f"selective scan dtbc_norm {o.dtbc_norm!r} is not weighted or weightless")
            n = NormOptions("rms", o.eps, weight=o.dtbc_norm == "weighted")
            self.dt_layernorm, self.b_layernorm, self.c_layernorm = \
                Norm(R, n), Norm(N, n), Norm(N, n)
        self.ssm_state = State(D, N, recurrent=True)
        self.options = o

    def __call__(self, rec: Recorder, x: Handle, ropes=None) -> Handle:
        o = self.options
        h, z = columns(rec, self.in_proj(rec, x), self.where("in_proj"), [o.inner, o.inner])
        h = self.conv1d(rec, h)
        dt, B, C = columns(rec, self.x_proj(rec, h), self.where("x_proj"),
                            [o.dt_rank, o.state, o.state])
        if o.dtbc_norm is not None:
            dt, B, C = self.dt_layernorm(rec, dt), self.b_layernorm(rec, B), self.c_layernorm(rec, C)
        dt = self.dt_proj(rec, dt)
        A = rec.hold("param", self.where("A_log"), self.A_log.array)
        Dp = rec.hold("param", self.where("D"), self.D.array)
        state = rec.state(self.where("ssm_state"), self.ssm_state)
        y = rec.step("selective_scan", h, dt, A, B, C, Dp, z, state, where=self.path,
                     start=rec.call.start)
        return self.out_proj(rec, y)
