"""Sampler: greedy, temperature, top-k, top-p (transformers' warper order), seeded draws."""

import math

import numpy as np
import pytest

from iron_spec.operators import Sampler

LN = np.log


def test_greedy_is_argmax_lowest_id_on_ties():
    s = Sampler()
    assert s.greedy
    assert s(np.array([1.0, 3.0, 3.0, 2.0])) == 1
    assert s(np.array([[-5.0, -1.0, -2.0]])) == 1  # a (1, vocab) row
    np.testing.assert_array_equal(s.probabilities(np.array([1.0, 3.0, 3.0, 2.0])), [0, 1, 0, 0])


def test_temperature_one_is_softmax():
    p = Sampler(temperature=1.0).probabilities(LN([1.0, 2.0, 4.0]))
    np.testing.assert_allclose(p, [1 / 7, 2 / 7, 4 / 7], rtol=1e-14)
    assert p.dtype == np.float64


@pytest.mark.parametrize("temperature,weights", [
    (2.0, [1.0, math.sqrt(2.0), 2.0]),   # logits / 2: [0, ln sqrt 2, ln 2]
    (0.5, [1.0, 4.0, 16.0]),             # logits * 2: [0, ln 4, ln 16]
])
def test_temperature_divides_logits(temperature, weights):
    p = Sampler(temperature=temperature).probabilities(LN([1.0, 2.0, 4.0]))
    np.testing.assert_allclose(p, np.array(weights) / sum(weights), rtol=1e-14)


def test_top_k_keeps_the_k_largest():
    logits = LN([1.0, 2.0, 4.0, 3.0])
    np.testing.assert_allclose(Sampler(1.0, top_k=2).probabilities(logits),
                               [0, 0, 4 / 7, 3 / 7], rtol=1e-14)
    np.testing.assert_allclose(Sampler(1.0, top_k=1).probabilities(logits), [0, 0, 1, 0])


@pytest.mark.parametrize("top_k", [None, 0, 4, 10])
def test_top_k_none_zero_or_large_keeps_all(top_k):
    p = Sampler(1.0, top_k=top_k).probabilities(LN([1.0, 2.0, 4.0, 3.0]))
    np.testing.assert_allclose(p, [0.1, 0.2, 0.4, 0.3], rtol=1e-14)


@pytest.mark.parametrize("top_p,expected", [
    (0.4, [1.0, 0, 0, 0]),                    # the top token alone already reaches 0.4
    (0.75, [0.625, 0.375, 0, 0]),             # 0.5 < 0.75 <= 0.8: two tokens
    (0.81, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0]),
    (0.01, [1.0, 0, 0, 0]),                   # always at least one
    (1.0, [0.5, 0.3, 0.15, 0.05]),
])
def test_top_p_keeps_smallest_set_reaching_p(top_p, expected):
    p = Sampler(1.0, top_p=top_p).probabilities(LN([0.5, 0.3, 0.15, 0.05]))
    np.testing.assert_allclose(p, expected, rtol=1e-12)


def _transformers_top_p(logits, top_p):
    """TopPLogitsWarper: sort ascending, drop tokens whose cumulative probability is
    <= 1 - top_p (the last, most likely, always kept), then softmax what remains."""
    order = np.argsort(logits, kind="stable")
    probs = np.exp(logits[order] - logits[order].max())
    cumulative = np.cumsum(probs / probs.sum())
    remove = cumulative <= 1 - top_p
    remove[-1] = False
    kept = np.full_like(logits, -np.inf)
    kept[order[~remove]] = logits[order[~remove]]
    out = np.exp(kept - kept.max())
    return out / out.sum()


def test_top_p_matches_transformers_warper():
    rng = np.random.default_rng(11)
    for _ in range(200):
        logits = rng.standard_normal(rng.integers(2, 40)) * rng.uniform(0.3, 4.0)
        top_p = rng.uniform(0.05, 0.99)
        np.testing.assert_allclose(Sampler(1.0, top_p=top_p).probabilities(logits),
                                   _transformers_top_p(logits, top_p), rtol=1e-9, atol=1e-15)


def test_top_k_applies_before_top_p():
    # Weights 8:4:2:1. top_k=3 leaves [8, 4, 2] / 14 (cumulative 0.571, 0.857): top_p 0.85
    # keeps two. top-p on the full [8, 4, 2, 1] / 15 (0.533, 0.8, 0.933) would keep three.
    p = Sampler(1.0, top_k=3, top_p=0.85).probabilities(LN([8.0, 4.0, 2.0, 1.0]))
    np.testing.assert_allclose(p, [2 / 3, 1 / 3, 0, 0], rtol=1e-12)


def test_temperature_applies_before_top_p():
    # T = 2 turns 8:4:2:1 into sqrt: 2.83:2:1.41:1 (cumulative 0.39, 0.67, 0.86): top_p 0.7
    # keeps three. Without temperature first, 0.533, 0.8 would keep two.
    p = Sampler(2.0, top_p=0.7).probabilities(LN([8.0, 4.0, 2.0, 1.0]))
    w = np.array([math.sqrt(8.0), 2.0, math.sqrt(2.0), 0.0])
    np.testing.assert_allclose(p, w / w.sum(), rtol=1e-12)


def test_same_seed_same_draws():
    logits = np.random.default_rng(0).standard_normal(50)
    a, b = Sampler(0.8, top_k=20, seed=7), Sampler(0.8, top_k=20, seed=7)
    first = [a(logits) for _ in range(100)]
    assert first == [b(logits) for _ in range(100)]
    assert len(set(first)) > 5  # it does draw, not repeat one token
    c = Sampler(0.8, top_k=20, seed=8)
    assert first != [c(logits) for _ in range(100)]


def test_one_uniform_per_draw_inverse_cdf():
    # Documented: draws come from default_rng(seed), one uniform per token; the token is the
    # first whose cumulative probability exceeds the uniform.
    probs = np.array([0.1, 0.2, 0.4, 0.3])
    s = Sampler(1.0, seed=123)
    uniforms = np.random.default_rng(123).random(50)
    expected = [int(np.argmax(np.cumsum(probs) > u)) for u in uniforms]
    assert [s(LN(probs)) for _ in range(50)] == expected


def test_draw_frequencies_follow_probabilities():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    s = Sampler(1.0, seed=2024)
    n = 20000
    counts = np.bincount([s(LN(probs)) for _ in range(n)], minlength=4)
    chi2 = float(np.sum((counts - n * probs) ** 2 / (n * probs)))
    assert chi2 < 16.27  # chi-square, 3 degrees of freedom, p = 0.001


def test_filtered_tokens_are_never_drawn():
    s = Sampler(1.0, top_k=2, seed=5)
    logits = LN([0.15, 0.35, 0.2, 0.3])  # top 2: ids 1 and 3, renormalized 0.35 : 0.3
    draws = [s(logits) for _ in range(4000)]
    assert set(draws) == {1, 3}
    assert abs(draws.count(1) / 4000 - 0.35 / 0.65) < 0.03  # ~4 standard deviations


@pytest.mark.parametrize("kwargs", [
    {"temperature": -0.1}, {"top_k": -1}, {"top_p": 0.0}, {"top_p": -0.5}, {"top_p": 1.01}])
def test_invalid_arguments_raise(kwargs):
    with pytest.raises(ValueError):
        Sampler(**kwargs)


def test_boundary_arguments_are_valid():
    Sampler(temperature=0.0, top_k=0, top_p=1.0)
