"""Mamba2's state-space duality (SSD): a state-space recurrence with one scalar decay per
head, run chunked over a prompt's rows and a row at a time in a decode step.

Per head ``h`` (of ``H``, each ``P`` wide, in group ``g = h // (H / G)`` of the ``G`` groups
whose ``B`` and ``C`` rows it reads, each ``N`` wide), with ``A = -exp(A_log)`` and
``dt = clamp(softplus(dt_raw + dt_bias), dt_min, dt_max)``::

    h[h] = exp(dt[t, h] A[h]) h[h] + dt[t, h] x[t, h] (outer) B[t, g]     (P, N)
    y[t, h] = h[h] C[t, g] + D[h] x[t, h]

As transformers' ``mamba2_chunk_scan`` (models/mamba2, the torch fallback of mamba_ssm's
``mamba_chunk_scan_combined``: the chunked form, its segment sums) and
``mamba2_selective_state_update`` (the decode step's): Mamba2Mixer, and the mixers of Bamba,
GraniteMoeHybrid, NemotronH, FalconH1 and Zamba2. The state ``(H, P, N)`` is carried from
call to call. The chunked form splits a call's rows into chunks of ``CHUNK``: within a
chunk, the rows mix through ``C_i . B_j`` weighed by the decay between them (a masked,
attention-like matrix); across chunks, through the state at each chunk's start. The
reference runs the recurrence above a row at a time.

Not for: Mamba's per-channel, per-entry decay (``selective_scan``).
"""

from __future__ import annotations

import math

import numpy as np

from . import native
from .activation import _softplus64
from .base import EPS32, Operator, Tolerance, as64
from .selective_scan import per_head_scale, softplus32

CHUNK = 64  # rows a prompt's chunked form takes at once


def _dims(x, state, heads, groups, B):
    """(n, H, P, G, N) of an ssd step's shapes; None where they do not fit."""
    if len(x) != 2 or len(state) != 3 or len(B) != 2 or heads < 1 or groups < 1 or \
            heads % groups or state[0] != heads or x[1] != heads * state[1] or \
            B[1] != groups * state[2]:
        return None
    return x[0], heads, state[1], groups, state[2]


class SSD(Operator):
    """``x`` ``(n, H * P)``, ``dt`` ``(n, H)`` (before ``dt_bias`` and softplus), ``A_log``
    ``(H,)``, ``B``, ``C`` ``(n, G * N)``, ``D`` ``(H,)``, ``dt_bias`` ``(H,)``, ``state``
    ``(H, P, N)`` (updated in place) give ``y`` ``(n, H * P)`` float32 (the ``D`` skip
    added, no gate). Inputs may be column views (rows apart).

    Attributes: ``start`` (at 0 the state before the call is zeros), ``heads`` H,
    ``groups`` G, ``dt_min``, ``dt_max`` (transformers' ``time_step_limit``; (0, inf) clamps
    nothing a softplus gives).

    Raises:
        ValueError: shapes that do not fit the heads and groups.
    """

    name = "ssd"
    updates = 7

    def shape(self, x, dt, A_log, B, C, D, dt_bias, state, start=0, heads=1, groups=1,
              dt_min=0.0, dt_max=math.inf):
        dims = _dims(x, state, heads, groups, B)
        if dims is None or tuple(dt) != (x[0], heads) or tuple(C) != tuple(B) or \
                B[0] != x[0] or tuple(A_log) != (heads,) or tuple(D) != (heads,) or \
                tuple(dt_bias) != (heads,):
            raise ValueError(f"ssd of {heads} heads in {groups} groups takes x (n, H * P), dt "
                             f"(n, H), A_log, D, dt_bias (H,), B, C (n, G * N) and state (H, P, "
                             f"N), not {x}, {dt}, {A_log}, {B}, {C}, {D}, {dt_bias} and {state}")
        if not dt_min <= dt_max:
            raise ValueError(f"ssd: time_step_limit ({dt_min}, {dt_max}) is no interval")
        return tuple(x)

    def reference(self, x, dt, A_log, B, C, D, dt_bias, state, start=0, heads=1, groups=1,
                  dt_min=0.0, dt_max=math.inf):
        n, H, P, G, N = _dims(x.shape, state.shape, heads, groups, B.shape)
        R = H // G
        xs = as64(x).reshape(n, H, P)
        Bs = np.repeat(as64(B).reshape(n, G, N), R, axis=1)
        Cs = np.repeat(as64(C).reshape(n, G, N), R, axis=1)
        delta = np.clip(_softplus64(as64(dt) + as64(dt_bias)), dt_min, dt_max)
        A = -np.exp(as64(A_log))
        h = np.zeros((H, P, N)) if start == 0 else as64(state).copy()
        out = np.empty((n, H, P))
        for t in range(n):
            h = np.exp(delta[t] * A)[:, None, None] * h + \
                (delta[t, :, None] * xs[t])[:, :, None] * Bs[t][:, None, :]
            out[t] = np.einsum("hpn,hn->hp", h, Cs[t]) + as64(D)[:, None] * xs[t]
        state[...] = h
        return out.reshape(n, H * P)

    def kernel(self, out, x, dt, A, B, C, D, dt_bias, state, scratch=None, start=0, heads=1,
               groups=1, dt_min=0.0, dt_max=math.inf):
        # A is packed as -exp(A_log), float32 as transformers computes it.
        n, H, P, G, N = _dims(x.shape, state.shape, heads, groups, B.shape)
        if start == 0:
            state[...] = 0.0
        delta = softplus32(dt + dt_bias, np.empty((n, H), np.float32))
        np.clip(delta, np.float32(dt_min), np.float32(dt_max), out=delta)
        xs = x.reshape(n, H, P)
        Bs, Cs = B.reshape(n, G, N), C.reshape(n, G, N)
        y = out.reshape(n, H, P)
        if n == 1:
            _step(y[0], xs[0], delta[0], A, Bs[0], Cs[0], state, H // G)
        else:
            for lo in range(0, n, CHUNK):
                hi = min(n, lo + CHUNK)
                _chunk(y[lo:hi], xs[lo:hi], delta[lo:hi], A, Bs[lo:hi], Cs[lo:hi], state,
                       H // G)
        y += D[:, None] * xs

    def lower(self, out, x, dt, A, B, C, D, dt_bias, state, scratch=None, heads=1, groups=1,
              dt_min=0.0, dt_max=math.inf):
        # A decode step's row, heads on the pool (operators/_cpu_recurrent.h's ssd_heads);
        # a prompt's rows run the chunked form above.
        if x.shape[0] != 1 or not native.rows_apart(x, dt, B, C) or \
                not native.contiguous(out, A, D, dt_bias, state):
            return None
        H, P, N = state.shape
        return native.Step(native.OP_SSD, (out, x, dt, A, B, C, D, dt_bias, state),
                           (H, P, N, groups), (dt_min, dt_max))

    def pack(self, index, array, **attrs):
        a = np.asarray(array, np.float32)
        return np.ascontiguousarray(-np.exp(a) if index == 2 else a)

    def tolerance(self, x, dt, A_log, B, C, D, dt_bias, state, **attrs):
        # A chunk sums up to CHUNK rows' terms through C.B products of N terms each, the
        # decays below 1: float32's rounding of sums that long, against their magnitude.
        return Tolerance(atol=2e-6, rtol=64 * EPS32)

    def scale(self, reference, x, dt, A_log, B, C, D, dt_bias, state, heads=1, **attrs):
        return per_head_scale(reference, heads)

    def state_tolerance(self, x, dt, A_log, B, C, D, dt_bias, state, **attrs):
        return Tolerance(atol=2e-6, rtol=64 * EPS32)


def _step(y, x, delta, A, B, C, state, R):
    """One row: ``state`` ``(H, P, N)`` decayed and written, ``y`` ``(H, P)`` read from it
    (before the ``D`` skip). ``B``, ``C`` ``(G, N)``, head ``h`` reading group ``h // R``."""
    H = state.shape[0]
    Bh = np.repeat(B, R, axis=0) if R > 1 else B
    Ch = np.repeat(C, R, axis=0) if R > 1 else C
    state *= np.exp(delta * A)[:, None, None]
    state += (delta[:, None] * x)[:, :, None] * Bh[:, None, :]
    np.matmul(state, Ch.reshape(H, -1, 1), out=y.reshape(H, -1, 1))


def _chunk(y, x, delta, A, B, C, state, R):
    """Rows ``(L, ...)`` of one chunk in the chunked form: ``y`` ``(L, H, P)`` written
    (before the ``D`` skip) and ``state`` carried past them, as ``mamba2_chunk_scan``'s
    diagonal blocks (``Y_diag``), its state at the chunk's start read out (``Y_off``) and
    its chunk state (``states``)."""
    L, H, P = x.shape
    Bh = np.repeat(B, R, axis=1).transpose(1, 0, 2) if R > 1 else B.transpose(1, 0, 2)
    Ch = np.repeat(C, R, axis=1).transpose(1, 0, 2) if R > 1 else C.transpose(1, 0, 2)
    cum = np.cumsum(delta * A, axis=0).T  # (H, L): the log decay from the chunk's start
    xdt = (x * delta[:, :, None]).transpose(1, 0, 2)  # (H, L, P)
    # Within the chunk: row i reads row j <= i through C_i . B_j, decayed between them.
    gap = cum[:, :, None] - cum[:, None, :]
    causal = np.tril(np.ones((L, L), bool))
    weights = np.matmul(Ch, Bh.transpose(0, 2, 1)) * np.exp(np.where(causal, gap, -np.inf))
    out = np.matmul(weights, xdt)
    # The state at the chunk's start, decayed to each row and read by its C.
    out += np.exp(cum)[:, :, None] * np.matmul(Ch, state.transpose(0, 2, 1))
    y[...] = out.transpose(1, 0, 2)
    # The state past the chunk: the old one decayed over it, each row's write decayed from
    # its row to the chunk's end.
    tail = np.exp(cum[:, -1:] - cum)  # (H, L)
    state *= np.exp(cum[:, -1])[:, None, None]
    state += np.matmul((xdt * tail[:, :, None]).transpose(0, 2, 1), Bh)
