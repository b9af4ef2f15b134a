"""DisentangledAttention against transformers' DisentangledSelfAttention transcribed in
float64 numpy (its table sliced to 2 * min(n, span) rows and clamped there), and the
numpy kernel against the reference."""

import numpy as np
import pytest

from iron_spec.operators import OPERATORS
from iron_spec.operators.disentangled import log_buckets, relative_rows

OP = OPERATORS["disentangled_attention"]


def _transformers(q, k, v, qb, vb, rel, wk, wq, bq, span, types):
    # modeling_deberta.DisentangledSelfAttention.forward and disentangled_att_bias, one
    # text, in float64: q, k, v (heads, n, D); rel the whole table (2 span, E).
    H, n, D = q.shape
    q = q + qb.reshape(H, 1, D)
    v = v + vb.reshape(H, 1, D)
    sf = 1 + len(types)
    q = q / np.sqrt(D * sf)
    scores = q @ k.transpose(0, 2, 1)
    rp = np.arange(n)[:, None] - np.arange(n)[None, :]
    att_span = min(n, span)
    r = rel[span - att_span: span + att_span]
    if "c2p" in types:
        pk = (r @ wk.T).reshape(-1, H, D).transpose(1, 0, 2)
        c2p = q @ pk.transpose(0, 2, 1)
        idx = np.clip(rp + att_span, 0, att_span * 2 - 1)
        scores = scores + np.take_along_axis(c2p, np.broadcast_to(idx, (H, n, n)), axis=-1)
    if "p2c" in types:
        pq = (r @ wq.T + bq).reshape(-1, H, D).transpose(1, 0, 2) / np.sqrt(D * sf)
        idx = np.clip(-rp + att_span, 0, att_span * 2 - 1)
        p2c = k @ pq.transpose(0, 2, 1)
        scores = scores + np.take_along_axis(p2c, np.broadcast_to(idx, (H, n, n)),
                                             axis=-1).transpose(0, 2, 1)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ v).transpose(1, 0, 2).reshape(n, H * D)


def _inputs(n, H, D, span, seed=0):
    g = np.random.default_rng(seed)
    E = H * D
    q, k, v = (g.standard_normal((n, H, D)) for _ in range(3))
    qb, vb = g.standard_normal(E), g.standard_normal(E)
    rel = g.standard_normal((2 * span, E))
    wk, wq, bq = g.standard_normal((E, E)) / 4, g.standard_normal((E, E)) / 4, g.standard_normal(E)
    return q, k, v, qb, vb, rel, wk, wq, bq


@pytest.mark.parametrize("n, span", [(5, 8), (11, 4), (1, 3), (6, 6)],
                         ids=["within", "clamped", "one row", "at the span"])
@pytest.mark.parametrize("types", [["c2p", "p2c"], ["c2p"], ["p2c"], []])
def test_reference_is_transformers(n, span, types):
    H, D = 2, 4
    q, k, v, qb, vb, rel, wk, wq, bq = _inputs(n, H, D, span)
    want = _transformers(q.transpose(1, 0, 2), k.transpose(1, 0, 2), v.transpose(1, 0, 2),
                         qb, vb, rel, wk, wq, bq, span, types)
    pos_key = (rel @ wk.T).reshape(2 * span, H, D) if "c2p" in types else None
    pos_query = (rel @ wq.T + bq).reshape(2 * span, H, D) if "p2c" in types else None
    got = OP.reference(q, k, v, qb, vb, pos_key, pos_query,
                       scale=(D * (1 + len(types))) ** -0.5, span=span)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_relative_rows_hand():
    # span 2: rows clamp(2 + i - j, 0, 3).
    np.testing.assert_array_equal(relative_rows(4, 2), [[2, 1, 0, 0], [3, 2, 1, 0],
                                                        [3, 3, 2, 1], [3, 3, 3, 2]])


def test_kernel_meets_reference(run_kernel):
    H, D, n, span = 2, 4, 9, 4
    q, k, v, qb, vb, rel, wk, wq, bq = _inputs(n, H, D, span, seed=3)
    args = [a.astype(np.float32) for a in (q, k, v, qb, vb, (rel @ wk.T).reshape(2 * span, H, D),
                                           (rel @ wq.T + bq).reshape(2 * span, H, D))]
    attrs = dict(scale=(D * 3) ** -0.5, span=span)
    want = OP.reference(*args, **attrs)
    got = run_kernel(OP, *args, **attrs)
    tol = OP.tolerance(*(a.shape for a in args), **attrs)
    assert np.all(np.abs(got - want) <= tol.bound(OP.scale(want, *args, **attrs)))


def test_shape_refuses_a_table_of_another_span():
    with pytest.raises(ValueError, match="2 \\* span"):
        OP.shape((5, 2, 4), (5, 2, 4), (5, 2, 4), None, None, (6, 2, 4), None, span=4)


def test_log_buckets_hand():
    # 8 buckets (mid 4) up to 16: |d| <= 4 stays; d = 5: 4 + ceil(log(1.25) / log(3.75) * 3)
    # = 4 + ceil(0.506) = 5; d = 15: 4 + ceil(log(3.75) / log(3.75) * 3) = 7; d = 23: 8.
    d = np.array([-23, -15, -5, -4, 0, 3, 4, 5, 15, 23])
    np.testing.assert_array_equal(log_buckets(d, 8, 16), [-8, -7, -5, -4, 0, 3, 4, 5, 7, 8])
    # span 8: row clamp(8 + bucket, 0, 15); distance 23 reads row 15, -23 row 0.
    rows = relative_rows(24, 8, 8, 16)
    assert rows[23, 0] == 15 and rows[0, 23] == 0 and rows[5, 5] == 8
