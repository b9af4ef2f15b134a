"""The gated delta rule's mixer (Qwen3NextGatedDeltaNet, Qwen3_5GatedDeltaNet): a causal
convolution over q, k and v, the delta rule (``operators.delta_rule``) and a gated norm per
value head, carrying both states.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph import Handle, Recorder
from ..module import Module, Param, State
from .causal_conv import DECAY_DRAW, DT_BIAS_DRAW, CausalConv1d, columns
from .norms import Norm, NormOptions
from .projections import Linear


@dataclass(frozen=True)
class GatedDeltaOptions:
    """The gated delta rule's mixer (Qwen3NextGatedDeltaNet): q, k (``k_heads`` of
    ``k_head_dim``), v and the gate z (``v_heads`` of ``v_head_dim``), b and a (``v_heads``)
    projected from the input; q, k, v through ``conv1d`` (``conv_kernel`` taps, silu, no
    bias); the delta rule (``A_log``, ``dt_bias`` ``(v_heads,)``, queries and keys
    L2-normed); then ``norm`` per value head, gated by silu(z) after it (weight ``(v_head_dim,)``,
    ``eps``), and ``out_proj``. ``layout``: ``grouped``, Qwen3-Next's ``in_proj_qkvz`` and
    ``in_proj_ba`` holding each key head's q, k, v, z (and b, a) together
    (``fix_query_key_value_ordering``); ``split``, Qwen3.5's ``in_proj_qkv``, ``in_proj_z``,
    ``in_proj_b`` and ``in_proj_a``. ``act``: the convolution's activation (``hidden_act``)."""

    k_heads: int
    v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_kernel: int = 4
    layout: str = "grouped"
    eps: float = 1e-6
    act: str = "silu"


DELTA_LAYOUTS = ("grouped", "split")


def grouped_rows(groups: int, widths: list[int]) -> np.ndarray:
    """The stored row of each model row where a checkpoint holds, for each of ``groups``,
    its parts of ``widths`` together (``[q_0, k_0, v_0, z_0, q_1, ...]``) and the model all
    of each part in turn (``[q_0, q_1, ..., k_0, ...]``): ``Param.rows``."""
    stride = sum(widths)
    out, at = [], 0
    for w in widths:
        out.append((np.arange(groups)[:, None] * stride + at + np.arange(w)).reshape(-1))
        at += w
    return np.concatenate(out)


class GatedDeltaNet(Module):
    """Qwen3NextGatedDeltaNet and Qwen3_5GatedDeltaNet; its states are ``conv1d``'s and
    ``recurrent_state`` ``(v_heads, k_head_dim, v_head_dim)``.

    Raises:
        ValueError: value heads that are no multiple of the key heads, an unknown layout.
    """

    def __init__(self, hidden: int, o: GatedDeltaOptions):
        Hk, Hv, Dk, Dv = o.k_heads, o.v_heads, o.k_head_dim, o.v_head_dim
        if Hk < 1 or Hv % Hk:
            raise ValueError(f"the delta rule's {Hv} value heads do not group over {Hk} key heads")
        if o.layout not in DELTA_LAYOUTS:
            raise ValueError(f"delta rule layout {o.layout!r} is not one of "
                             f"{', '.join(DELTA_LAYOUTS)}")
        K, V, R = Hk * Dk, Hv * Dv, Hv // Hk
        if o.layout == "grouped":
            self.in_proj_qkvz = Linear(hidden, 2 * K + 2 * V)
            self.in_proj_qkvz.weight.rows = grouped_rows(Hk, [Dk, Dk, R * Dv, R * Dv])
            self.in_proj_ba = Linear(hidden, 2 * Hv)
            self.in_proj_ba.weight.rows = grouped_rows(Hk, [R, R])
        else:
            self.in_proj_qkv = Linear(hidden, 2 * K + V)
            self.in_proj_z = Linear(hidden, V)
            self.in_proj_b = Linear(hidden, Hv)
            self.in_proj_a = Linear(hidden, Hv)
        self.conv1d = CausalConv1d(2 * K + V, o.conv_kernel, False, act=o.act)
        self.dt_bias = Param(Hv, draw=DT_BIAS_DRAW)
        self.A_log = Param(Hv, draw=DECAY_DRAW)
        self.norm = Norm(Dv, NormOptions("rms", o.eps))
        self.out_proj = Linear(V, hidden)
        self.recurrent_state = State(Hv, Dk, Dv, recurrent=True)
        self.options = o

    def packs(self) -> list[tuple[Param, ...]]:
        """The split layout's projections of one input, stacked at load (one GEMM)."""
        if self.options.layout != "split":
            return []
        return [(self.in_proj_qkv.weight, self.in_proj_z.weight, self.in_proj_b.weight,
                 self.in_proj_a.weight)]

    def __call__(self, rec: Recorder, x: Handle, ropes=None) -> Handle:
        o = self.options
        K, V, Hv = o.k_heads * o.k_head_dim, o.v_heads * o.v_head_dim, o.v_heads
        if o.layout == "grouped":
            qkv, z = columns(rec, self.in_proj_qkvz(rec, x), self.where("in_proj_qkvz"),
                              [2 * K + V, V])
            b, a = columns(rec, self.in_proj_ba(rec, x), self.where("in_proj_ba"), [Hv, Hv])
        else:
            qkv, z = self.in_proj_qkv(rec, x), self.in_proj_z(rec, x)
            b, a = self.in_proj_b(rec, x), self.in_proj_a(rec, x)
        q, k, v = columns(rec, self.conv1d(rec, qkv), self.where("conv1d"), [K, K, V])
        held = [rec.hold("param", self.where(n), getattr(self, n).array)
                for n in ("A_log", "dt_bias")]
        state = rec.state(self.where("recurrent_state"), self.recurrent_state)
        y = rec.step("gated_delta_rule", q, k, v, a, b, held[0], held[1], state,
                     where=self.path, start=rec.call.start, k_heads=o.k_heads,
                     v_heads=o.v_heads)
        n = y.shape[0]
        w = rec.hold("param", self.norm.where("weight"), self.norm.weight.array)
        y = rec.step("gated_rms_norm", y, z, w, where=self.norm.path, group=o.v_head_dim,
                     eps=o.eps, gate_first=False)
        return self.out_proj(rec, rec.view(y, (n, V)))
