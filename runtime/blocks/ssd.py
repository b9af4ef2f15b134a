"""Mamba2's mixer (Mamba2Mixer; Bamba's, GraniteMoeHybrid's, NemotronH's, FalconH1's): a
causal convolution, the SSD scan (``operators.ssd``) and the gated RMSNorm, carrying both
states.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..graph import Handle, Recorder
from ..module import Module, Param, State
from .causal_conv import DECAY_DRAW, DT_BIAS_DRAW, CausalConv1d, columns
from .norms import Norm, NormOptions
from .projections import Linear


@dataclass(frozen=True)
class SSDOptions:
    """Mamba2's mixer (Mamba2Mixer): ``in_proj`` gives the gate ``z`` (``inner``), ``x``,
    ``B``, ``C`` (``inner + 2 groups state``, through ``conv1d``, silu) and dt (``heads``);
    the SSD scan (``heads`` of ``head_dim``, ``groups``, ``state``; ``A_log``, ``D``,
    ``dt_bias`` ``(heads,)``; dt clamped to ``time_step_limit`` ``(dt_min, dt_max)``), then
    ``norm`` and ``out_proj``. ``norm``: ``gate_first`` (Mamba2RMSNormGated,
    ``w norm(y silu(z))``), ``norm_first`` (``w norm(y) silu(z)``: FalconH1's
    ``mamba_norm_before_gate``), or ``none`` (``y silu(z)``, no norm: FalconH1's
    ``mamba_rms_norm`` false); ``norm_groups`` the norm's groups (``n_groups``), ``eps``.
    ``bias`` (``use_bias``) and ``conv_bias`` as Mamba's. ``projection_scales``: ``in_proj``'s output
    times five factors, over z, x, B, C and dt (FalconH1's ``ssm_multipliers``, its
    ``mup_vector``); None: none. ``act``: the convolution's activation (``hidden_act``).
    ``out_bias``: ``out_proj``'s bias where it differs from ``bias`` (FalconH1Mixer's
    ``projectors_bias``; None: ``bias``). ``decode_limit``: the decode step clamps dt to the
    limit too (Mamba2's, Bamba's); false, the prompt chunk alone does (Zamba2's
    ``mamba2_scan_forward`` passes ``time_step_limit`` to its chunked form only: its
    recurrent form, ``mamba2_selective_state_update``, takes no limit)."""

    heads: int
    head_dim: int
    state: int
    groups: int = 1
    conv_kernel: int = 4
    conv_bias: bool = True
    bias: bool = False
    dt_min: float = 0.0
    dt_max: float = math.inf
    norm: str = "gate_first"
    norm_groups: int = 1
    eps: float = 1e-6
    projection_scales: tuple[float, ...] | None = None
    inner: int | None = None
    act: str = "silu"
    out_bias: bool | None = None
    decode_limit: bool = True

    @property
    def width(self) -> int:
        return self.heads * self.head_dim if self.inner is None else self.inner


SSD_NORMS = ("gate_first", "norm_first", "none")


class SSDMixer(Module):
    """Mamba2Mixer (and Bamba's, GraniteMoeHybrid's, NemotronH's, FalconH1's); its states
    are ``conv1d``'s and ``ssm_state`` ``(heads, head_dim, state)``.

    Raises:
        ValueError: heads that do not group, a norm's groups that do not divide the width,
            an unknown norm, an inner width other than heads times head_dim.
    """

    def __init__(self, hidden: int, o: SSDOptions):
        H, P, N, G = o.heads, o.head_dim, o.state, o.groups
        if H < 1 or G < 1 or H % G:
            raise ValueError(f"the SSD's {H} heads do not split into {G} groups")
        if o.width != H * P:
            raise ValueError(f"the SSD's inner width {o.width} is not its {H} heads of {P}")
        if o.norm not in SSD_NORMS:
            raise ValueError(f"ssd norm {o.norm!r} is not one of {', '.join(SSD_NORMS)}")
        if o.norm != "none" and (o.norm_groups < 1 or o.width % o.norm_groups):
            raise ValueError(f"the SSD's norm groups {o.norm_groups} do not divide its width "
                             f"{o.width}")
        if o.projection_scales is not None and len(o.projection_scales) != 5:
            raise ValueError("ssd projection_scales are five factors (z, x, B, C, dt), not "
                             f"{len(o.projection_scales)}")
        W, conv = o.width, o.width + 2 * G * N
        self.in_proj = Linear(hidden, W + conv + H, o.bias)
        self.conv1d = CausalConv1d(conv, o.conv_kernel, o.conv_bias, act=o.act)
        self.dt_bias = Param(H, draw=DT_BIAS_DRAW)
        self.A_log = Param(H, draw=DECAY_DRAW)
        self.D = Param(H)
        if o.norm != "none":
            self.norm = Norm(W, NormOptions("rms", o.eps))
        self.out_proj = Linear(W, hidden, o.bias if o.out_bias is None else o.out_bias)
        self.ssm_state = State(H, P, N, recurrent=True)
        if o.projection_scales is not None:
            z, xs, b, c, dt = o.projection_scales
            self.projection_scales = np.concatenate([
                np.full(W, z), np.full(W, xs), np.full(G * N, b), np.full(G * N, c),
                np.full(H, dt)]).astype(np.float32)
        self.options = o

    def __call__(self, rec: Recorder, x: Handle, ropes=None) -> Handle:
        o = self.options
        W, GN = o.width, o.groups * o.state
        p = self.in_proj(rec, x)
        if o.projection_scales is not None:
            s = rec.hold("const", self.where("projection_scales"), self.projection_scales)
            p = rec.step("mul", p, s, where=self.where("projection_scales"))
        z, xbc, dt = columns(rec, p, self.where("in_proj"), [W, W + 2 * GN, o.heads])
        h, B, C = columns(rec, self.conv1d(rec, xbc), self.where("conv1d"), [W, GN, GN])
        held = [rec.hold("param", self.where(n), getattr(self, n).array)
                for n in ("A_log", "D", "dt_bias")]
        state = rec.state(self.where("ssm_state"), self.ssm_state)
        limited = rec.call.prompt or o.decode_limit
        y = rec.step("ssd", h, dt, held[0], B, C, held[1], held[2], state, where=self.path,
                     start=rec.call.start, heads=o.heads, groups=o.groups,
                     dt_min=o.dt_min if limited else 0.0,
                     dt_max=o.dt_max if limited else math.inf)
        if o.norm == "none":
            y = rec.step("gated_activation", z, y, where=self.path, act="silu")
        else:
            w = rec.hold("param", self.norm.where("weight"), self.norm.weight.array)
            y = rec.step("gated_rms_norm", y, z, w, where=self.norm.path,
                         group=W // o.norm_groups, eps=o.eps, gate_first=o.norm == "gate_first")
        return self.out_proj(rec, y)
