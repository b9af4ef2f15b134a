"""``Model.forward``/``logits``/``hidden_states``: every position's logits against transformers'
goldens (the toys' and SmolLM2's, teacher-forced log-probabilities), the hidden states
against hand computations (the embedding rows; the head over the last)."""

from __future__ import annotations

import numpy as np
import pytest

import iron_spec
from iron_spec.operators.sampling import log_softmax
from tests.conftest import ROOT, checkpoint

GOLDENS = ROOT / "tests" / "goldens"


def kl_against_golden(model, golden) -> np.ndarray:
    """KL(transformers || ours) at each of the golden's steps, from ``model.logits``."""
    with np.load(golden, allow_pickle=False) as g:
        tokens, P = g["tokens"].tolist(), int(g["prompt_len"])
        top_ids, top = g["top_ids"], g["top_logprobs64"]
    ours = model.logits(tokens)
    assert ours.shape[0] == len(tokens)
    kl = []
    for i in range(top.shape[0]):
        lp = log_softmax(ours[P - 1 + i])[top_ids[i]]
        p = np.exp(top[i])
        kl.append(float((p * (top[i] - lp)).sum()))  # over the golden's top tokens
    return np.array(kl)


@pytest.mark.parametrize("spec", ["llama3", "gemma3", "qwen3"])
def test_every_positions_logits_are_transformers(spec):
    model = iron_spec.load(spec, random_weights=0, toy=True)
    kl = kl_against_golden(model, GOLDENS / spec / "toy-seed0.npz")
    assert kl.mean() < 1e-6 and kl.max() < 1e-5  # the float32 gate


def test_every_positions_logits_on_smollm2():
    model = iron_spec.load("llama3", checkpoint("smollm2-135m-instruct"), max_seq_len=512)
    kl = kl_against_golden(model, GOLDENS / "llama3" / "smollm2-135m-instruct.npz")
    assert kl.mean() < 1e-6 and kl.max() < 1e-5


def test_hidden_states_as_transformers_gives_them():
    model = iron_spec.load("llama3", random_weights=0, toy=True)
    ids = [3, 17, 99, 4, 250, 8]
    f = model.forward(ids, output_hidden_states=True)
    lm = model.loaded.lm
    assert len(f.hidden_states) == len(lm.model.layers) + 1
    assert all(h.shape == (6, lm.config.hidden_size) for h in f.hidden_states)
    # the first: the embedding rows themselves (llama's embedding is unscaled)
    assert np.array_equal(f.hidden_states[0], lm.model.embed_tokens.weight.array[ids])
    # the last is after the final norm: the head over it gives the logits
    head = lm.lm_head.weight.array.astype(np.float64)
    assert np.allclose(f.hidden_states[-1] @ head.T, f.logits, rtol=1e-5, atol=1e-5)
    assert np.array_equal(model.logits(ids), f.logits)
    assert model.forward(ids).hidden_states is None


def test_forward_refuses_what_does_not_fit():
    model = iron_spec.load("llama3", random_weights=0, toy=True)
    with pytest.raises(ValueError, match="do not fit max_seq_len"):
        model.logits([1] * (model.max_seq_len + 1))
    with pytest.raises(IndexError, match="outside the vocabulary"):
        model.logits([1, 10**6])
