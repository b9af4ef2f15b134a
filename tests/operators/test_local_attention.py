"""Local attention with relative logits and a softcap (``operators.local_attention``) against
transformers 5.25's Gemma4AudioAttention (its blockwise form, recorded by
tests/checkpoints/make_gemma4_towers.py: ``record_local_attention``), and its kernel against
its reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from iron_spec.operators import OPERATORS
from tests.operators.conftest import _check_kernel, _run_kernel

GOLDEN = Path(__file__).resolve().parents[1] / "goldens" / "towers" / "gemma4" / \
    "gemma4-audio-attention.npz"
op = OPERATORS["local_attention"]


@pytest.fixture(scope="module")
def golden():
    return dict(np.load(GOLDEN))


def window(left: int, right: int, cap: float) -> dict:
    """Gemma4AudioAttention's window and softcap as the operator's attributes."""
    return dict(behind=left - 2, ahead=max(right - 1, 0), origin=left - 1, cap=cap)


@pytest.mark.parametrize("case", range(4))
def test_equals_gemma4_audio_attention(golden, case):
    # As published (12, 13, 0); a right context, whose relative rows transformers' shift
    # reads past the row's own; a chunk longer than the left context; a sound of one chunk.
    chunk, left, right, cap, _ = golden["cases"][case]
    q, k, v, rel = (golden[f"{case}.{x}"] for x in ("q", "k", "v", "rel"))
    attrs = window(int(left), int(right), float(cap))
    got = _run_kernel(op, q, k, v, rel, **attrs)
    want = golden[f"{case}.out"]
    assert np.abs(got - want).max() <= 1e-6
    assert np.abs(op.reference(q, k, v, rel, **attrs) - want).max() <= 1e-6


def test_kernel_meets_its_reference():
    rng = np.random.default_rng(0)
    n, H, D, P = 29, 3, 8, 9
    q, k, v = (rng.normal(size=(n, H, D)).astype(np.float32) for _ in range(3))
    rel = rng.normal(size=(P, H, D)).astype(np.float32)
    for attrs in (dict(behind=6, ahead=0, origin=7, cap=2.0),
                  dict(behind=2, ahead=3, origin=2, cap=None),
                  dict(behind=40, ahead=40, origin=4, cap=0.5)):  # wider than the rows
        _check_kernel(op, q, k, v, rel, **attrs)


def test_a_row_sees_its_window_alone():
    # Values one-hot by row: each output row is its attention weights, zero outside the
    # window (rows 2 before .. 1 after), summing to 1.
    n, behind, ahead = 7, 2, 1
    rng = np.random.default_rng(1)
    q = rng.normal(size=(n, 1, n)).astype(np.float32)
    k = rng.normal(size=(n, 1, n)).astype(np.float32)
    v = np.eye(n, dtype=np.float32)[:, None, :]
    rel = rng.normal(size=(4, 1, n)).astype(np.float32)
    p = _run_kernel(op, q, k, v, rel, behind=behind, ahead=ahead, origin=2, cap=1.0)
    i, j = np.indices((n, n))
    outside = (i - j > behind) | (j - i > ahead)
    assert np.all(p[outside] == 0.0)
    assert np.allclose(p.sum(axis=1), 1.0, atol=1e-6)
    # Row 4's weight of key 3 by hand: logits q.k + q.rel[origin - 1], capped.
    logits = {j_: float(q[4, 0] @ k[j_, 0] + (q[4, 0] @ rel[2 - (4 - j_), 0]
                                              if 0 <= 2 - (4 - j_) < 4 else 0.0))
              for j_ in (2, 3, 4, 5)}
    capped = {j_: np.tanh(x) for j_, x in logits.items()}
    total = sum(np.exp(x) for x in capped.values())
    assert p[4, 3] == pytest.approx(np.exp(capped[3]) / total, rel=1e-5)


def test_an_empty_window_is_refused():
    with pytest.raises(ValueError, match="holds no key"):
        op.shape((4, 1, 2), (4, 1, 2), (4, 1, 2), (3, 1, 2), behind=-1, ahead=0)
