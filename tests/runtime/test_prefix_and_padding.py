"""A causal model's prefix ids and refused padding id (``embedding.prefix``,
``embedding.padding_id``), on CPM-Ant's toy: transformers' CpmAntModel prepends
``prompt_length`` prompt ids to every sequence and reads id 0 as left padding."""

from __future__ import annotations

import pytest

from iron_spec.spec.build import load_model
from iron_spec.runtime.session import Session
from tests.conftest import SPECS


@pytest.fixture(scope="module")
def lm():
    return load_model(SPECS / "cpmant.yaml", random_weights=0, toy=True).lm


def test_the_prefix_is_cpmants_prompt_ids_and_runs_in_the_first_call(lm):
    # CpmAntModel.forward: arange(vocab_size + 2 * prompt_length, vocab_size + 3 *
    # prompt_length) of the toy's vocab_size 256 and prompt_length 4.
    assert lm.config.prefix == (264, 265, 266, 267)
    session = Session(lm)
    session.logits([5] * 20)
    C = lm.config.prefill_chunk
    # The prefix and the first C - 4 ids in one call, then the rest: positions count it.
    assert session.calls == [("prompt", 0, C), ("prompt", C, 24 - C)]
    assert session.held == 24


def test_a_history_holding_the_padding_id_is_refused_before_anything_runs(lm):
    session = Session(lm)
    session.logits([5, 6, 7])
    with pytest.raises(IndexError, match=r"token id 0 at position 2 is the padding id "
                                         r"\(embedding.padding_id\)"):
        session.logits([5, 6, 0, 7])
    assert session.held == 7  # what it held: the prefix and the three ids


def test_the_prefix_counts_in_the_context(lm):
    L = lm.config.max_seq_len
    Session(lm).check([5] * (L - 4))
    with pytest.raises(ValueError, match=f"{L - 3} tokens after a prefix of 4 ids do not fit "
                                         f"max_seq_len {L}"):
        Session(lm).check([5] * (L - 3))


def test_a_drawn_padding_id_ends_the_generation(lm):
    # A sampler drawing id 0: the next step would read it as padding, so the text ends.
    assert list(Session(lm).generate([5, 6, 7], 4, sampler=lambda logits: 0)) == [0]
    assert list(Session(lm).generate([5, 6, 7], 3, sampler=lambda logits: 9)) == [9, 9, 9]
