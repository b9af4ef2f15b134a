"""Recurrent state as the runtime's own kind: the states a hybrid's token mixers carry, their
snapshots at prompt-chunk boundaries, and sessions resuming from them bit for bit.

The toys are the specs' own (LFM2: a short convolution beside attention; Qwen3-Next: the
gated delta rule beside gated attention), drawn at seed 0; what is judged is the session's
calls and its logits against a fresh run's, never against themselves alone.
"""

from __future__ import annotations

import numpy as np
import pytest

from iron_spec.spec.build import load_model
from iron_spec.runtime.session import Session
from iron_spec.runtime.snapshots import StateError
from tests.conftest import SPECS


@pytest.fixture(scope="module", params=["lfm2", "qwen3_next"])
def lm(request):
    return load_model(SPECS / f"{request.param}.yaml", random_weights=0, toy=True,
                      prefill_chunk=32).lm


def tokens(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, 256, n).tolist()


def test_the_states_are_recurrent_and_apart_from_the_kv_caches(lm):
    states = lm.recurrent_states
    assert states and all(s.recurrent and s.axis is None for s in states)
    kv = [s for _, s in lm.named_states() if s.kv]
    assert kv and not set(map(id, kv)) & set(map(id, states))


def test_a_chat_turn_runs_its_new_tokens_and_at_most_one_chunk_bitwise(lm):
    C = lm.config.prefill_chunk
    first, reply, turn = tokens(C + 30), tokens(5, 1), tokens(C // 2, 2)
    chat = Session(lm)
    drawn = list(chat.generate(first, 6))  # the reply, decoded one token at a time
    history = first + drawn[:-1] + [drawn[-1]] + reply + turn
    chat.calls.clear()
    resumed = chat.logits(history)
    fresh = Session(lm).logits(history)
    assert resumed.tobytes() == fresh.tobytes()
    starts = [s for kind, s, _ in chat.calls if kind == "prompt"]
    ran = sum(rows for kind, _, rows in chat.calls if kind == "prompt")
    assert starts[0] == (len(first)) // C * C  # the snapshot at the last boundary held
    assert ran <= len(history) - len(first) + C


def test_a_history_that_differs_before_a_snapshot_restarts_earlier(lm):
    C = lm.config.prefill_chunk
    a = tokens(2 * C + 5)
    s = Session(lm)
    s.logits(a)
    assert lm.snapshots.positions("compiled") == [0, C, 2 * C, 2 * C + 5]
    b = a[:C + 3] + tokens(C, 9)  # differs inside the second chunk
    s.calls.clear()
    got = s.logits(b)
    assert s.calls[0][1] == C
    assert got.tobytes() == Session(lm).logits(b).tobytes()


def test_snapshots_keep_the_last_n_boundaries(lm):
    C, keep = lm.config.prefill_chunk, lm.snapshots.keep
    n = (keep + 2) * C + 1
    Session(lm).logits(tokens(n, 3))
    held = lm.snapshots.positions("compiled")
    boundaries = [p for p in held if p and p % C == 0]
    assert boundaries == [k * C for k in range(3, keep + 3)]
    assert held[-1] == n


def test_the_prompts_end_is_kept_when_decoding_moves_on(lm):
    C = lm.config.prefill_chunk
    prompt = tokens(C + 7, 4)
    s = Session(lm)
    list(s.generate(prompt, 3))
    assert len(prompt) in lm.snapshots.positions("compiled")
    assert lm.snapshots.at["compiled"] == len(prompt) + 2


def test_a_call_from_a_position_the_states_do_not_hold_is_refused(lm):
    C = lm.config.prefill_chunk
    Session(lm).logits(tokens(C + 3, 5))
    before = [np.array(s.array) for s in lm.recurrent_states]
    ids = np.zeros(C, np.int32)
    with pytest.raises(StateError, match="hold position"):
        lm.prompt_chunk(ids, start=5, rows=3)
    with pytest.raises(StateError, match="hold position"):
        lm.decode_step(token=1, position=C)
    for s, b in zip(lm.recurrent_states, before):
        np.testing.assert_array_equal(s.array, b)  # a refused call changed nothing


def test_the_reference_keeps_its_own_states_and_snapshots(lm):
    C = lm.config.prefill_chunk
    a = tokens(C + 9, 6)
    ref = Session(lm, reference=True)
    ref.logits(a)
    assert lm.snapshots.positions("reference")[-1] == C + 9
    compiled = Session(lm).logits(a)
    # The reference's states are float64 and its own: the compiled run did not move them.
    assert lm.snapshots.at["reference"] == C + 9
    np.testing.assert_allclose(compiled, ref.logits(a), rtol=1e-4, atol=1e-4)
