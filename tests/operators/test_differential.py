"""Differential attention: two softmax maps per head pair, the second weighted by lambda."""

import math

import numpy as np
import pytest

from iron_spec.operators import DifferentialAttention
from iron_spec.operators.differential import lambda_full

OP = DifferentialAttention()


def test_one_pair_by_hand(run_kernel):
    # Head 0's scores [0, ln 3] give P0 = [1/4, 3/4], head 1's [0, 0] P1 = [1/2, 1/2]; the
    # pair's values are kv heads 0 and 1 side by side: [0, 8] then [4, 0]. Zero lambda
    # vectors give lambda = 1 - 1 + 0.5, so [3, 2] - 0.5 [2, 4] = [2, 0].
    q = np.array([[[math.log(3.0)], [0.0]]])
    keys = np.array([[[0.0], [1.0]], [[5.0], [7.0]]])
    values = np.array([[[0.0], [4.0]], [[8.0], [0.0]]])
    zeros = [np.zeros(1)] * 4
    attrs = dict(start=1, scale=1.0, lambda_init=0.5)
    np.testing.assert_allclose(OP.reference(q, keys, values, *zeros, **attrs), [[[2.0, 0.0]]],
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(run_kernel(OP, q, keys, values, *zeros, **attrs),
                               [[[2.0, 0.0]]], atol=1e-6)


def test_lambda_by_hand():
    # exp(1 * 0.5 + 2 * 0.25) - exp(0) + 0.2 = e - 1 + 0.2
    got = lambda_full(np.array([1.0, 2.0]), np.array([0.5, 0.25]), np.zeros(2), np.zeros(2), 0.2)
    assert got == pytest.approx(math.e - 0.8, rel=1e-15)


def _two_calls(q, keys, values, lambdas, start, lambda_init):
    """transformers' DiffLlamaAttention in numpy: the value heads' two halves each repeated
    to every kv head, one softmax attention over each, joined on the last axis, then the
    heads' first half minus lambda times their second (an independent form of the pairs)."""
    n, H, D = q.shape
    G = keys.shape[0]
    t = start + n
    k = np.repeat(keys[:, :t].astype(np.float64), H // G, axis=0)
    s = np.einsum("nhd,htd->hnt", q.astype(np.float64), k) * D ** -0.5
    s = np.where(np.arange(t)[None, :] <= np.arange(start, t)[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    v = values[:, :t].astype(np.float64)
    outs = []
    for half in (v[: G // 2], v[G // 2:]):
        vr = np.repeat(np.concatenate([half, half]), H // G, axis=0)  # repeat, then repeat_kv
        outs.append(np.einsum("hnt,htd->nhd", p, vr))
    out = np.concatenate(outs, axis=-1)
    lq1, lk1, lq2, lk2 = (x.astype(np.float64) for x in lambdas)
    lam = np.exp(np.sum(lq1 * lk1)) - np.exp(np.sum(lq2 * lk2)) + lambda_init
    return out[:, : H // 2] - lam * out[:, H // 2:]


@pytest.mark.parametrize("n,H,G,D,start,L", [
    (1, 8, 4, 16, 9, 16),   # decode
    (7, 8, 4, 16, 0, 16),   # a prompt
    (5, 4, 2, 8, 3, 12),    # part of a prompt
    (70, 4, 4, 8, 2, 80),   # more rows than a block, one query head per kv head
])
def test_reference_and_kernel_are_transformers_two_calls(check_kernel, randn, n, H, G, D,
                                                         start, L):
    q = randn(n, H, D, scale=2.0)
    keys, values = randn(G, L, D, scale=2.0), randn(G, L, D)
    lambdas = [randn(D, scale=0.3) for _ in range(4)]
    got, ref = check_kernel(OP, q, keys, values, *lambdas, start=start, lambda_init=0.35)
    np.testing.assert_allclose(ref, _two_calls(q, keys, values, lambdas, start, 0.35),
                               rtol=1e-12, atol=1e-12)


def test_a_ring_and_a_window_read_as_attention_does(check_kernel, randn):
    # A ring of 8 rows holding positions 6 .. 13 (rows p % 8) against the same cache laid out
    # in order: the same output.
    n, H, G, D, start, window = 3, 4, 2, 8, 11, 5
    q = randn(n, H, D)
    keys, values = randn(G, 14, D), randn(G, 14, D)
    ring = 8
    rk, rv = np.zeros((G, ring, D)), np.zeros((G, ring, D))
    for p in range(14 - ring, 14):
        rk[:, p % ring], rv[:, p % ring] = keys[:, p], values[:, p]
    lambdas = [randn(D, scale=0.3) for _ in range(4)]
    attrs = dict(start=start, window=window, lambda_init=0.5)
    got, ref = check_kernel(OP, q, rk, rv, *lambdas, ring=ring, **attrs)
    np.testing.assert_allclose(ref, OP.reference(q, keys, values, *lambdas, **attrs),
                               rtol=1e-12, atol=1e-12)


def test_unpaired_heads_are_refused():
    with pytest.raises(ValueError, match="even number of heads and of kv heads"):
        OP.shape((1, 3, 8), (3, 4, 8), (3, 4, 8), (8,), (8,), (8,), (8,))
    with pytest.raises(ValueError, match="not of head_dim 8"):
        OP.shape((1, 4, 8), (2, 4, 8), (2, 4, 8), (4,), (8,), (8,), (8,))
