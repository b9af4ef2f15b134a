"""Mamba's selective scan: a diagonal state-space recurrence whose step, input and output
maps depend on the token.

Per channel ``d`` (of ``D``) and state entry ``s`` (of ``N``), with ``A = -exp(A_log)``
``(D, N)`` and ``dt = softplus(dt_raw)`` (``dt_raw`` is ``dt_proj``'s output, its bias
in it)::

    h[d, s] = exp(dt[t, d] A[d, s]) h[d, s] + dt[t, d] B[t, s] x[t, d]
    y[t, d] = (sum_s h[d, s] C[t, s] + Dskip[d] x[t, d]) * silu(z[t, d])

As transformers' ``mamba_selective_scan`` and ``mamba_selective_state_update`` (models/
mamba, the torch fallback of mamba_ssm's ``selective_scan_fn``): MambaMixer, FalconMamba's
and Jamba's (their dt/B/C norms run before, as steps of their own). The state ``h``
``(D, N)`` is carried from call to call. The recurrence has no matrix form to chunk (each
channel and entry decays at its own rate), so a prompt chunk runs it a row at a time as a
decode step does, over every channel and entry at once.

Not for: Mamba2's scalar decay per head (``ssd``).
"""

from __future__ import annotations

import numpy as np

from . import native
from .activation import _softplus64
from .base import EPS32, Operator, Tolerance, as64


def softplus32(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """torch's softplus (threshold 20) in float32 into ``out``: ``log1p(exp(x))``, ``x``
    itself above 20."""
    np.minimum(x, np.float32(20.0), out=out)
    np.exp(out, out=out)
    np.log1p(out, out=out)
    np.copyto(out, x, where=x > np.float32(20.0))
    return out


class SelectiveScan(Operator):
    """``x``, ``dt`` ``(n, D)``, ``A_log`` ``(D, N)``, ``B``, ``C`` ``(n, N)``, ``Dskip``
    ``(D,)``, ``z`` ``(n, D)`` or None (no gate), ``state`` ``(D, N)`` (updated in place)
    give ``y`` ``(n, D)`` float32. Inputs may be column views (rows apart).

    Attribute ``start``: the call's first position (at 0 the state before it is zeros).

    Raises:
        ValueError: shapes that do not fit.
    """

    name = "selective_scan"
    updates = 7

    def shape(self, x, dt, A_log, B, C, Dskip, z, state, start=0):
        n, D = x if len(x) == 2 else (None, None)
        N = A_log[1] if len(A_log) == 2 else None
        if n is None or tuple(dt) != (n, D) or tuple(A_log) != (D, N) or \
                tuple(B) != (n, N) or tuple(C) != (n, N) or tuple(Dskip) != (D,) or \
                (z is not None and tuple(z) != (n, D)) or tuple(state) != (D, N):
            raise ValueError(f"selective_scan takes x, dt (n, D), A_log (D, N), B, C (n, N), "
                             f"D (D,), z (n, D) and state (D, N), not {x}, {dt}, {A_log}, {B}, "
                             f"{C}, {Dskip}, {z} and {state}")
        return tuple(x)

    def reference(self, x, dt, A_log, B, C, Dskip, z, state, start=0):
        x, B, C = as64(x), as64(B), as64(C)
        dt = _softplus64(as64(dt))
        A = -np.exp(as64(A_log))
        h = np.zeros(state.shape) if start == 0 else as64(state).copy()
        out = np.empty(x.shape)
        for t in range(x.shape[0]):
            h = np.exp(dt[t, :, None] * A) * h + (dt[t] * x[t])[:, None] * B[t]
            out[t] = h @ C[t] + as64(Dskip) * x[t]
        if z is not None:
            z = as64(z)
            out *= z / (1.0 + np.exp(-z))
        state[...] = h
        return out

    def kernel(self, out, x, dt, A, B, C, Dskip, z, state, scratch=None, start=0):
        # A is packed as -exp(A_log) (float32, as transformers' A = -exp(A_log.float())).
        n, D = x.shape
        N = A.shape[1]
        if start == 0:
            state[...] = 0.0
        delta = scratch[: n * D].reshape(n, D)
        softplus32(dt, delta)
        dA = scratch[n * D: n * D + D * N].reshape(D, N)
        for t in range(n):
            np.multiply(delta[t, :, None], A, out=dA)
            np.exp(dA, out=dA)
            state *= dA
            state += (delta[t] * x[t])[:, None] * B[t]
            np.dot(state, C[t], out=out[t])
        out += Dskip * x
        if z is not None:
            gate = scratch[: n * D].reshape(n, D)  # delta's room, read no more
            np.negative(z, out=gate)
            np.exp(gate, out=gate)
            gate += np.float32(1.0)
            np.divide(z, gate, out=gate)
            out *= gate

    def lower(self, out, x, dt, A, B, C, Dskip, z, state, scratch=None):
        # Each channel's recurrence over the rows, channels on the pool
        # (operators/_cpu_recurrent.h's scan_chans).
        if not native.rows_apart(x, dt, B, C, z) or not native.contiguous(out, A, Dskip, state):
            return None
        n, D = x.shape
        return native.Step(native.OP_SCAN, (out, x, dt, A, B, C, Dskip, z, state),
                           (n, D, A.shape[1]), rows=0)

    def pack(self, index, array, start=0):
        a = np.asarray(array, np.float32)
        if index == 2:
            return np.ascontiguousarray(-np.exp(a))
        return np.ascontiguousarray(a)

    def scratch(self, x, dt, A_log, B, C, Dskip, z, state, start=0):
        return x[0] * x[1] + A_log[0] * A_log[1]

    def tolerance(self, x, dt, A_log, B, C, Dskip, z, state, start=0):
        # Each state entry sums a decayed history in float32: a few ulps per step at most,
        # the decays below 1 keeping the sum of the terms' magnitudes bounded.
        return Tolerance(atol=2e-6, rtol=64 * EPS32)

    def scale(self, reference, x, dt, A_log, B, C, Dskip, z, state, start=0):
        # Per row, the magnitude of every term the output sums (the state's whole history
        # bounded by its largest entry's): |y| + the row's RMS.
        r = np.abs(reference)
        return r + np.sqrt(np.mean(r * r, axis=-1, keepdims=True))

    def state_tolerance(self, x, dt, A_log, B, C, Dskip, z, state, start=0):
        return Tolerance(atol=2e-6, rtol=64 * EPS32)


def per_head_scale(reference: np.ndarray, heads: int) -> np.ndarray:
    """A recurrent mixer's error scale: each element's magnitude plus its row's RMS within
    its head, so a head whose outputs are small (a fast decay) is judged at its own size."""
    r = np.abs(reference).reshape(reference.shape[0], heads, -1)
    rms = np.sqrt(np.mean(r * r, axis=(1, 2), keepdims=True))
    return (r + rms).reshape(reference.shape)
