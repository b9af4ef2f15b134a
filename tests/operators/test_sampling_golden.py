"""Each sampling rule against transformers' own logits processors on the same logits.

The expected scores were recorded from transformers 5.24 by ``sampling_golden/record.py``
(``GenerationMixin._get_logits_processor`` on each case's GenerationConfig, so the order is
transformers' too); this test needs neither torch nor transformers.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from iron_spec.operators.sampling import Sampler, presence_penalty

GOLDEN = np.load(Path(__file__).parent / "sampling_golden" / "processors.npz")
CASES = sorted({k.split(".")[0] for k in GOLDEN.files if k.startswith("case")},
               key=lambda c: int(c[4:]))
TIES = 3  # the row of coarse values, many of them equal


def sampler(settings: dict) -> Sampler:
    """Our sampler for a GenerationConfig's settings (do_sample false: greedy)."""
    return Sampler(temperature=settings.get("temperature", 1.0) if settings.get("do_sample") else 0.0,
                   top_k=settings.get("top_k"), top_p=settings.get("top_p", 1.0),
                   min_p=settings.get("min_p"),
                   repetition_penalty=settings.get("repetition_penalty", 1.0), seed=0)


@pytest.mark.parametrize("case", CASES)
def test_scores_are_transformers_processors(case):
    settings = json.loads(str(GOLDEN[f"{case}.settings"]))
    expected = GOLDEN[f"{case}.scores"].astype(np.float64)
    s = sampler(settings)
    for r, (row, want) in enumerate(zip(GOLDEN["logits"], expected)):
        got = s.scores(row, seen=GOLDEN["history"])
        kept = np.isfinite(want)
        if r == TIES and "top_p" in settings:
            # Tokens tied at top-p's boundary: which of them go is torch.sort's order, which
            # is unstable (arbitrary among equals); the same number go, and only tied ones.
            ours = np.isfinite(got)
            assert ours.sum() == kept.sum(), case
            assert set(row[ours & ~kept]) == set(row[kept & ~ours]), case
            kept &= ours
        else:
            # The same tokens removed (-inf), and the same values where kept.
            np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want), err_msg=case)
        np.testing.assert_allclose(got[kept], want[kept], rtol=2e-6, atol=1e-6, err_msg=case)


def test_the_cases_exercise_every_warper_in_transformers_order():
    # The order the cases were recorded in is transformers' own (_get_logits_processor).
    assert str(GOLDEN["case8.processors"]).split() == [
        "RepetitionPenaltyLogitsProcessor", "TemperatureLogitsWarper", "TopKLogitsWarper",
        "TopPLogitsWarper", "MinPLogitsWarper"]
    # Something was removed in every sampling case, so a mask mismatch would show.
    for case in CASES:
        if json.loads(str(GOLDEN[f"{case}.settings"])).get("do_sample"):
            assert np.isneginf(GOLDEN[f"{case}.scores"]).any(axis=1).all(), case


def test_a_tie_at_the_kth_score_is_kept_as_transformers():
    # Tokens tied with the 6th largest all stay (TopKLogitsWarper removes only those below).
    want = GOLDEN["case3.scores"][TIES]
    assert np.isfinite(want).sum() > 6
    got = sampler({"do_sample": True, "top_k": 6}).scores(GOLDEN["logits"][TIES])
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))


def test_greedy_takes_the_argmax_of_the_penalized_scores():
    # transformers' greedy search applies its processors (the repetition penalty), then argmax.
    for case in ("case0", "case1"):
        settings = json.loads(str(GOLDEN[f"{case}.settings"]))
        s = sampler(settings)
        for row, want in zip(GOLDEN["logits"], GOLDEN[f"{case}.scores"]):
            assert s(row, seen=GOLDEN["history"]) == int(np.argmax(want))


def test_presence_penalty_subtracts_once_per_distinct_drawn_token():
    # The OpenAI API's definition (vLLM's apply_penalties: logits -= presence * output_mask),
    # by hand: tokens 1 and 3 were drawn (3 twice), each loses 0.5 once; the prompt's do not.
    logits = np.array([1.0, 2.0, -1.0, 0.5])
    got = presence_penalty(logits, [3, 1, 3], 0.5)
    np.testing.assert_array_equal(got, [1.0, 1.5, -1.0, 0.0])
    s = Sampler(repetition_penalty=2.0, presence_penalty=0.5)
    # Repetition first (over the whole sequence: the prompt's token 2 too), then presence.
    np.testing.assert_array_equal(s.scores(logits, seen=[2, 3, 1, 3], generated=[3, 1, 3]),
                                  [1.0, 0.5, -2.0, -0.25])
