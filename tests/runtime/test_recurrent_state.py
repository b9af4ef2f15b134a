"""Recurrent state as the runtime's own kind: the states a hybrid's token mixers carry, their
snapshots at prompt-chunk boundaries, and sessions resuming from them bit for bit.

The toys are the specs' own (LFM2: a short convolution beside attention; Qwen3-Next: the
gated delta rule beside gated attention, routed experts on three layers; Nemotron-H: Mamba2's
SSD, attention, an MLP layer and a mixture layer; Zamba2: SSD layers, three of them running a
shared transformer block of two weight sets), drawn at seed 0; what is judged is the session's
calls and its logits against a fresh run's, never against themselves alone.
"""

from __future__ import annotations

import numpy as np
import pytest

from iron_spec.spec.build import load_model
from iron_spec.runtime.session import Session
from iron_spec.runtime.snapshots import StateError
from tests.conftest import SPECS


@pytest.fixture(scope="module", params=["lfm2", "qwen3_next", "nemotron_h", "zamba2"])
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
    # Turn 1's prompt, its reply drawn by decode steps, then turn 2 = all that and the new
    # turn. Where the prompt chunk computes each row alone (LFM2: every step native), the
    # live states hold the reply's end and turn 2 runs its own tokens only (the reply's last
    # token, which no step read, and the turn's); where not (Qwen3-Next: the delta rule's
    # chunked form runs from the call's start), from the last boundary turn 1's prompt
    # crossed. Its logits are those of a fresh session making the same calls after another
    # conversation, bit for bit.
    C = lm.config.prefill_chunk
    first, reply, turn = tokens(C + 30), tokens(5, 1), tokens(C // 2, 2)

    def conversation(session):
        drawn = list(session.generate(first, 6))  # the reply, one token at a time
        session.calls.clear()
        history = first + drawn + reply + turn
        return session.logits(history).copy(), list(session.calls), len(history)

    resumed, calls, n = conversation(Session(lm))
    at = len(first) + 5 if lm.prompt_chunk.plan.rows_alone else len(first) // C * C
    assert calls[0][:2] == ("prompt", at)
    assert sum(rows for _, _, rows in calls) == n - at <= n - len(first) + C
    Session(lm).logits(tokens(2 * C + 3, 8))  # another conversation's tokens and states
    fresh, _, _ = conversation(Session(lm))
    assert resumed.tobytes() == fresh.tobytes()


def test_the_last_token_again_after_decode_steps_runs_from_a_snapshot(lm):
    # After a decode step (whose logits are not kept) the same history again runs that step
    # again where the states have a copy of the position before it (the prompt's end), and
    # a prompt call from the latest position they allow where not: a recurrent state
    # cannot step back.
    C = lm.config.prefill_chunk
    prompt = tokens(C + 5, 10)
    s = Session(lm)
    s.logits(prompt)
    once = s.logits(prompt + [3]).copy()
    s.calls.clear()
    assert s.logits(prompt + [3]).tobytes() == once.tobytes()
    assert s.calls == [("decode", C + 5, 1)]
    s.logits(prompt + [3, 4])
    s.calls.clear()
    again = s.logits(prompt + [3, 4])
    at = C + 5 if lm.prompt_chunk.plan.rows_alone else C  # else from the boundary
    assert s.calls == [("prompt", at, C + 7 - at)]
    np.testing.assert_allclose(again, Session(lm).logits(prompt + [3, 4]), rtol=1e-4, atol=1e-4)


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
    session = Session(lm)
    compiled = session.logits(a)
    # The reference's states are float64 and its own: the compiled run did not move them.
    # Each session's caches hold their own recurrent states and snapshots.
    assert ref.caches.snapshots.at["reference"] == C + 9
    assert session.caches.snapshots.at == {"compiled": C + 9, "reference": 0}
    # float32 against float64: an error of the logits' own scale (a tied head's toy, Zamba2's,
    # gives logits of std 9: KL 2e-11 there, 2e-4 apart at most).
    expected = ref.logits(a)
    scale = max(1.0, float(np.std(expected)))
    np.testing.assert_allclose(compiled, expected, rtol=1e-4, atol=1e-4 * scale)


def test_two_sessions_never_share_recurrent_states_or_snapshots(lm):
    # Each session's caches hold its recurrent states (bound for its calls as its KV caches
    # are) and the snapshots of them: a session resumes from its own, never from states
    # another conversation ran since, and its logits are a fresh session's making the same
    # calls, bit for bit.
    C = lm.config.prefill_chunk
    a, b = tokens(2 * C + 5, 11), tokens(2 * C + 9, 12)
    first, other = Session(lm), Session(lm)
    first.logits(a)
    other.logits(b)  # moves the model's bound states and takes its own snapshots

    def fresh(history, before):
        s = Session(lm)
        s.logits(before)
        s.calls.clear()
        return s.logits(history).copy(), list(s.calls)

    # One more token: a decode step from first's own live states.
    first.calls.clear()
    more = first.logits(a + [7]).copy()
    assert first.calls == [("decode", 2 * C + 5, 1)]
    assert (more.tobytes(), first.calls) == (lambda r: (r[0].tobytes(), r[1]))(fresh(a + [7], a))
    # A history that differs inside the second chunk: restored from first's snapshot at C.
    other.logits(b + [1, 2])
    changed = a[:C + 3] + tokens(C, 13)
    first.calls.clear()
    got = first.logits(changed).copy()
    assert first.calls[0][1] == C
    want, calls = fresh(changed, a + [7])
    assert got.tobytes() == want.tobytes() and calls == first.calls
    assert first.caches.snapshots is not other.caches.snapshots
    assert other.caches.snapshots.positions("compiled") == [0, C, 2 * C, 2 * C + 11]


def test_a_hybrid_model_dropped_is_freed_without_the_garbage_collector():
    # Its snapshots read the states without pointing back at the model (a bound method
    # would: a Gemma 3 model then lived on beside the next one, 3.7 GB where 2.6 GB).
    import gc
    import weakref
    gc.collect()
    gc.disable()
    try:
        lm = load_model(SPECS / "lfm2.yaml", random_weights=0, toy=True).lm
        Session(lm).logits(tokens(40))
        Session(lm, reference=True).logits(tokens(40))
        dropped, state = weakref.ref(lm), weakref.ref(lm.recurrent_states[0].array)
        del lm
        assert dropped() is None and state() is None
    finally:
        gc.enable()
