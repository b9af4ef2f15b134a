"""The gated delta rule: a linear-attention state per head, decayed and corrected toward each
token's value, run chunked over a prompt's rows and a row at a time in a decode step.

Per value head ``h`` (of ``Hv``, reading key head ``h // (Hv / Hk)``), with the queries and
keys L2-normalized per head (``l2norm``, eps 1e-6 inside the root, as FLA's) and the
queries times ``scale``, ``g = -exp(A_log) softplus(a + dt_bias)`` and ``beta =
sigmoid(b)``, the state ``S`` ``(Dk, Dv)``::

    S = exp(g[t, h]) S
    S = S + k[t] (outer) ((v[t, h] - S^T k[t]) beta[t, h])
    o[t, h] = S^T q[t]

As transformers' ``torch_recurrent_gated_delta_rule`` (the decode step's) and
``torch_chunk_gated_delta_rule`` (a prompt's: chunks of 64 rows, each chunk's updates
condensed by the UT transform, a unit lower-triangular solve) in models/qwen3_next, the
torch fallback of FLA's kernels, with ``use_qk_l2norm_in_kernel``: Qwen3NextGatedDeltaNet
and Qwen3_5GatedDeltaNet. The reference runs the recurrence above a row at a time.

Not for: delta rules of per-channel decay (Kimi's KDA), or without the gate.
"""

from __future__ import annotations

import numpy as np

from . import native
from .activation import _softplus64
from .base import EPS32, Operator, Tolerance, as64
from .selective_scan import per_head_scale, softplus32

CHUNK = 64  # rows the chunked form takes at once (transformers' chunk_size)
L2_EPS = 1e-6


def _dims(q, v, state, k_heads, v_heads):
    """(n, Hk, Dk, Hv, Dv); None where the shapes do not fit."""
    if len(q) != 2 or len(v) != 2 or len(state) != 3 or k_heads < 1 or v_heads < 1 or \
            v_heads % k_heads or state[0] != v_heads or q[1] != k_heads * state[1] or \
            v[1] != v_heads * state[2] or v[0] != q[0]:
        return None
    return q[0], k_heads, state[1], v_heads, state[2]


class GatedDeltaRule(Operator):
    """``q``, ``k`` ``(n, Hk * Dk)``, ``v`` ``(n, Hv * Dv)``, ``a``, ``b`` ``(n, Hv)`` (the
    decay's and the rate's projections), ``A_log``, ``dt_bias`` ``(Hv,)``, ``state``
    ``(Hv, Dk, Dv)`` (updated in place) give ``o`` ``(n, Hv * Dv)`` float32. Inputs may be
    column views (rows apart).

    Attributes: ``start`` (at 0 the state before the call is zeros), ``k_heads``,
    ``v_heads``, ``scale`` (the queries', None: ``Dk ** -0.5``), ``l2norm`` (queries and keys
    L2-normalized per head first).

    Raises:
        ValueError: shapes that do not fit the heads.
    """

    name = "gated_delta_rule"
    updates = 7

    def shape(self, q, k, v, a, b, A_log, dt_bias, state, start=0, k_heads=1, v_heads=1,
              scale=None, l2norm=True):
        dims = _dims(q, v, state, k_heads, v_heads)
        if dims is None or tuple(k) != tuple(q) or tuple(a) != (q[0], v_heads) or \
                tuple(b) != tuple(a) or tuple(A_log) != (v_heads,) or \
                tuple(dt_bias) != (v_heads,):
            raise ValueError(f"gated_delta_rule of {k_heads} key and {v_heads} value heads "
                             f"takes q, k (n, Hk * Dk), v (n, Hv * Dv), a, b (n, Hv), A_log, "
                             f"dt_bias (Hv,) and state (Hv, Dk, Dv), not {q}, {k}, {v}, {a}, "
                             f"{b}, {A_log}, {dt_bias} and {state}")
        return tuple(v)

    def reference(self, q, k, v, a, b, A_log, dt_bias, state, start=0, k_heads=1, v_heads=1,
                  scale=None, l2norm=True):
        n, Hk, Dk, Hv, Dv = _dims(q.shape, v.shape, state.shape, k_heads, v_heads)
        R = Hv // Hk
        qs = np.repeat(as64(q).reshape(n, Hk, Dk), R, axis=1)
        ks = np.repeat(as64(k).reshape(n, Hk, Dk), R, axis=1)
        if l2norm:
            qs = qs / np.sqrt(np.sum(qs * qs, axis=-1, keepdims=True) + L2_EPS)
            ks = ks / np.sqrt(np.sum(ks * ks, axis=-1, keepdims=True) + L2_EPS)
        qs = qs * (Dk ** -0.5 if scale is None else scale)
        vs = as64(v).reshape(n, Hv, Dv)
        g = -np.exp(as64(A_log)) * _softplus64(as64(a) + as64(dt_bias))
        beta = 1.0 / (1.0 + np.exp(-as64(b)))
        S = np.zeros((Hv, Dk, Dv)) if start == 0 else as64(state).copy()
        out = np.empty((n, Hv, Dv))
        for t in range(n):
            S = S * np.exp(g[t])[:, None, None]
            kv = np.einsum("hkv,hk->hv", S, ks[t])
            delta = (vs[t] - kv) * beta[t][:, None]
            S = S + ks[t][:, :, None] * delta[:, None, :]
            out[t] = np.einsum("hkv,hk->hv", S, qs[t])
        state[...] = S
        return out.reshape(n, Hv * Dv)

    def kernel(self, out, q, k, v, a, b, A, dt_bias, state, scratch=None, start=0, k_heads=1,
               v_heads=1, scale=None, l2norm=True):
        # A is packed as -exp(A_log), float32 as transformers computes it.
        n, Hk, Dk, Hv, Dv = _dims(q.shape, v.shape, state.shape, k_heads, v_heads)
        R = Hv // Hk
        if start == 0:
            state[...] = 0.0
        qs = _normed(q.reshape(n, Hk, Dk), l2norm, R)
        ks = _normed(k.reshape(n, Hk, Dk), l2norm, R)
        qs *= np.float32(Dk ** -0.5 if scale is None else scale)
        g = softplus32(a + dt_bias, np.empty((n, Hv), np.float32))
        g *= A
        beta = np.negative(b, out=np.empty((n, Hv), np.float32))
        np.exp(beta, out=beta)
        beta += np.float32(1.0)
        np.reciprocal(beta, out=beta)
        vs = v.reshape(n, Hv, Dv)
        o = out.reshape(n, Hv, Dv)
        if n == 1:
            _step(o[0], qs[0], ks[0], vs[0], g[0], beta[0], state)
            return
        for lo in range(0, n, CHUNK):
            hi = min(n, lo + CHUNK)
            _chunk(o[lo:hi], qs[lo:hi], ks[lo:hi], vs[lo:hi], g[lo:hi], beta[lo:hi], state)

    def lower(self, out, q, k, v, a, b, A, dt_bias, state, scratch=None, k_heads=1, v_heads=1,
              scale=None, l2norm=True):
        # A decode step's row, value heads on the pool (operators/_cpu_recurrent.h's
        # delta_heads); a prompt's rows run the chunked form above.
        if q.shape[0] != 1 or not native.rows_apart(q, k, v, a, b) or \
                not native.contiguous(out, A, dt_bias, state):
            return None
        Hv, Dk, Dv = state.shape
        return native.Step(native.OP_DELTA, (out, q, k, v, a, b, A, dt_bias, state),
                           (k_heads, Dk, v_heads, Dv, int(l2norm)),
                           (Dk ** -0.5 if scale is None else scale,))

    def pack(self, index, array, **attrs):
        a = np.asarray(array, np.float32)
        return np.ascontiguousarray(-np.exp(a) if index == 5 else a)

    def tolerance(self, q, k, v, a, b, A_log, dt_bias, state, **attrs):
        # The chunked form's triangular solve and its sums over up to 64 rows, in float32.
        return Tolerance(atol=2e-6, rtol=128 * EPS32)

    def scale(self, reference, q, k, v, a, b, A_log, dt_bias, state, v_heads=1, **attrs):
        return per_head_scale(reference, v_heads)

    def state_tolerance(self, q, k, v, a, b, A_log, dt_bias, state, **attrs):
        return Tolerance(atol=2e-6, rtol=128 * EPS32)


def _normed(x: np.ndarray, l2norm: bool, R: int) -> np.ndarray:
    """Heads ``(n, Hk, D)`` L2-normalized (``x * rsqrt(sum(x^2) + eps)``, as transformers'
    ``l2norm``), each repeated for the ``R`` value heads reading it: a new array."""
    y = np.repeat(x, R, axis=1) if R > 1 else np.array(x, np.float32)
    if l2norm:
        norm = np.einsum("nhd,nhd->nh", y, y)[:, :, None]
        norm += np.float32(L2_EPS)
        np.sqrt(norm, out=norm)
        y /= norm
    return y


def _step(o, q, k, v, g, beta, S):
    """One row: ``S`` ``(Hv, Dk, Dv)`` decayed and corrected toward ``v``, ``o`` ``(Hv, Dv)``
    read from it by ``q``."""
    S *= np.exp(g)[:, None, None]
    kv = np.matmul(k[:, None, :], S)[:, 0]  # (Hv, Dv)
    delta = (v - kv) * beta[:, None]
    S += k[:, :, None] * delta[:, None, :]
    np.matmul(q[:, None, :], S, out=o[:, None, :])


def _chunk(o, q, k, v, g, beta, S):
    """Rows ``(L, Hv, ...)`` of one chunk in the chunked form, as
    ``torch_chunk_gated_delta_rule``: the chunk's writes condensed by solving ``(I + A) X =
    beta [v, k exp(G)]``, ``A`` the strictly lower ``beta_i k_i . k_j exp(G_i - G_j)`` (``G``
    the decay's running sum over the chunk), then read against the state at the chunk's
    start and carried past it."""
    L = q.shape[0]
    qh, kh, vh = q.transpose(1, 0, 2), k.transpose(1, 0, 2), v.transpose(1, 0, 2)
    G = np.cumsum(g, axis=0).T  # (Hv, L)
    bt = beta.T[:, :, None]
    below = np.tril(np.ones((L, L), bool))
    decay = np.exp(np.where(below, G[:, :, None] - G[:, None, :], -np.inf))  # (Hv, L, L)
    A = np.matmul(kh * bt, kh.transpose(0, 2, 1)) * decay
    rhs = np.concatenate([vh * bt, kh * bt * np.exp(G)[:, :, None]], axis=2)
    # Forward substitution: A's diagonal is read as one (unitriangular), as solve_triangular.
    X = rhs.copy()
    for i in range(1, L):
        X[:, i] -= np.matmul(A[:, i:i + 1, :i], X[:, :i])[:, 0]
    Dv = vh.shape[2]
    u, w = X[:, :, :Dv], X[:, :, Dv:]
    fresh = u - np.matmul(w, S)  # (Hv, L, Dv): what the state does not predict
    scores = np.matmul(qh, kh.transpose(0, 2, 1)) * decay
    y = np.matmul(qh * np.exp(G)[:, :, None], S) + np.matmul(scores, fresh)
    o[...] = y.transpose(1, 0, 2)
    S *= np.exp(G[:, -1])[:, None, None]
    S += np.matmul((kh * np.exp(G[:, -1:] - G)[:, :, None]).transpose(0, 2, 1), fresh)
