"""The compiled model against its own float64 reference, and sessions over it.

The reference is independent of the compiled plan in everything but the recording: it runs
each operator's float64 definition, on its own caches. Greedy decoding must draw the same
tokens from both (a drawn token either matches or it does not: no tolerance).
"""

from __future__ import annotations

import numpy as np
import pytest

from iron_spec.spec.build import load_model
from iron_spec.runtime.session import Session
from tests.conftest import SPECS

LLAMA = SPECS / "llama3.yaml"


def greedy_run(lm, prompt: list[int], steps: int, reference: bool) -> list[int]:
    session = Session(lm, reference=reference)
    return list(session.generate(prompt, steps))


@pytest.fixture(scope="module")
def toy():
    return load_model(LLAMA, random_weights=0, toy=True)


def test_toy_compiled_equals_reference_over_32_steps(toy):
    lm = toy.lm
    C = lm.config.prefill_chunk
    prompt = np.random.default_rng(1).integers(0, lm.config.vocab_size, 2 * C + 5).tolist()
    compiled = greedy_run(lm, prompt, 32, reference=False)
    reference = greedy_run(lm, prompt, 32, reference=True)
    assert compiled == reference
    assert len(set(compiled)) > 4, "a toy drawing one token over and over proves little"


def test_toy_logits_close_to_reference(toy):
    lm = toy.lm
    prompt = list(range(3, 3 + lm.config.prefill_chunk + 7))
    got = Session(lm).logits(prompt)
    want = Session(lm, reference=True).logits(prompt)
    # float32 against float64 through two layers: a few float32 ulps of the logits' scale.
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())


def test_chunks_before_the_last_skip_the_head_and_leave_the_caches_as_whole_runs(toy):
    lm = toy.lm
    version, C = lm.prompt_chunk, lm.config.prefill_chunk
    plan = version.plan
    skipped = {plan.steps[i].where for i in range(len(plan.steps)) if i not in plan._for_state}
    assert "lm_head" in skipped and "model.norm" in skipped
    assert all(plan.steps[i].op.writes is None for i in range(len(plan.steps))
               if i not in plan._for_state), "a cache write skipped"
    prompt = np.random.default_rng(4).integers(0, lm.config.vocab_size, 2 * C + 5)
    skipping = np.array(Session(lm).logits(prompt.tolist()))
    ids = np.zeros(C, np.int32)
    for s in range(0, prompt.size, C):  # every chunk run whole, its logits computed
        rows = min(C, prompt.size - s)
        ids[:rows] = prompt[s: s + rows]
        whole, _ = version(ids, start=s, rows=rows)
    np.testing.assert_array_equal(skipping, whole)
    # And against the float64 reference, which runs every step of every chunk on its own
    # caches: the skipped steps fed nothing a later chunk reads.
    want = np.array(Session(lm, reference=True).logits(prompt.tolist()))
    np.testing.assert_allclose(skipping, want, rtol=0, atol=1e-4 * np.abs(want).max())
    assert version(ids, start=0, rows=C, output=False) == (None, None)


@pytest.mark.parametrize("held", [0, 3])
def test_extending_history_reuses_the_cache_bitwise_equal_to_fresh(toy, held):
    lm = toy.lm
    C = lm.config.prefill_chunk
    rng = np.random.default_rng(2)
    history = rng.integers(0, lm.config.vocab_size, 2 * C + held).tolist()
    turn = rng.integers(0, lm.config.vocab_size, C + 6).tolist()
    # Fresh runs first: sessions share the model's caches, one conversation at a time.
    fresh = Session(lm)
    whole = fresh.logits(history + turn).copy()
    nxt = int(np.argmax(whole))
    whole_next = fresh.logits(history + turn + [nxt]).copy()

    chat = Session(lm)
    chat.logits(history)
    chat.calls.clear()
    extended = chat.logits(history + turn)
    # The whole chunks the history filled are not run again: the turn runs from the
    # boundary at or before its first token (only new tokens when the history ends on one).
    assert chat.calls[0] == ("prompt", 2 * C, min(C, held + len(turn)))
    assert sum(rows for _, _, rows in chat.calls) == held + len(turn)
    assert extended.tobytes() == whole.tobytes()
    # One more token is one decode step, as in the fresh session.
    chat.calls.clear()
    assert chat.logits(history + turn + [nxt]).tobytes() == whole_next.tobytes()
    assert chat.calls == [("decode", len(history) + len(turn), 1)]


def test_refused_input_changes_nothing(toy):
    lm = toy.lm
    V, L = lm.config.vocab_size, lm.config.max_seq_len
    prompt = [5, 6, 7, 8]
    other = Session(lm)
    other.logits(prompt)
    fresh = other.logits(prompt + [1]).copy()
    session = Session(lm)
    session.logits(prompt)
    calls = list(session.calls)
    with pytest.raises(IndexError, match=f"token id {V} at position 4 is outside"):
        session.logits(prompt + [V])
    with pytest.raises(IndexError, match="token id -1"):
        session.logits([-1] + prompt)
    with pytest.raises(ValueError, match=f"do not fit max_seq_len {L}"):
        session.logits([1] * (L + 1))
    with pytest.raises(ValueError, match="do not fit"):
        list(session.generate([1] * (L - 2), 4))
    assert session.calls == calls and session.held == len(prompt)
    # Still works, and still holds its conversation: the next token is one decode step.
    session.calls.clear()
    assert session.logits(prompt + [1]).tobytes() == fresh.tobytes()
    assert session.calls == [("decode", 4, 1)]


def test_two_sessions_share_one_model(toy):
    lm = toy.lm
    a, b = Session(lm), Session(lm)
    pa, pb = [1, 2, 3, 4, 5], [9, 8, 7]
    la = a.logits(pa).copy()
    b.logits(pb)
    a.calls.clear()
    # b replaced a's tokens in the caches: a runs from its first token again.
    assert a.logits(pa).tobytes() == la.tobytes()
    assert a.calls[0][:2] == ("prompt", 0)


def test_real_checkpoint_compiled_equals_reference(smollm2):
    loaded = load_model(LLAMA, checkpoint=smollm2, max_seq_len=512, prefill_chunk=64)
    prompt = loaded.tokenizer.encode(
        "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, "
        "France. It is named after the engineer Gustave Eiffel, whose company designed and "
        "built the tower from 1887 to 1889. Locally nicknamed 'La dame de fer', it was "
        "constructed as the centerpiece of the 1889 World's Fair.")
    assert len(prompt) > loaded.lm.config.prefill_chunk
    compiled = greedy_run(loaded.lm, prompt, 32, reference=False)
    reference = greedy_run(loaded.lm, prompt, 32, reference=True)
    assert compiled == reference


def test_real_checkpoint_greedy_continuation(smollm2):
    # transformers' own greedy continuation on this checkpoint (float32): " Paris.\n\nThe answer is:".
    loaded = load_model(LLAMA, checkpoint=smollm2, max_seq_len=256)
    tok = loaded.tokenizer
    drawn = list(Session(loaded.lm).generate(tok.encode("The capital of France is"), 8))
    assert tok.decode(drawn) == " Paris.\n\nThe answer is:"


def test_the_same_history_again_runs_nothing_after_a_prompt_and_reruns_after_a_decode(toy):
    lm = toy.lm
    C = lm.config.prefill_chunk
    history = np.random.default_rng(2).integers(0, lm.config.vocab_size, C + 3).tolist()
    fresh = Session(lm).logits(history + [7]).copy()  # one prompt run of the whole history
    session = Session(lm)
    first = session.logits(history).copy()
    session.calls.clear()
    assert session.logits(history).tobytes() == first.tobytes()
    assert session.calls == []
    # After a decode step the logits are not a fresh run's: asked again, the session runs
    # from the last chunk boundary and gives the fresh run's, bit for bit.
    session.logits(history + [7])
    session.calls.clear()
    assert session.logits(history + [7]).tobytes() == fresh.tobytes()
    assert session.calls == [("prompt", C, 4)]
    # A caller may write into what it was given; the session keeps its own copy.
    given = session.logits(history + [7])
    given[:] = 0.0
    assert session.logits(history + [7]).tobytes() == fresh.tobytes()


def test_bfloat16_decode_weights_give_the_float32_decode_bit_for_bit(smollm2):
    # SmolLM2's weights are bfloat16 on disk: held as bfloat16 they are the same values, and
    # the decode step's logits the same bits, at half the bytes a token streams.
    from iron_spec.operators import native
    if native.LIB is None:
        pytest.skip("the decode pool is off or not built")
    f32 = load_model(LLAMA, checkpoint=smollm2, max_seq_len=512)
    bf16 = load_model(LLAMA, checkpoint=smollm2, max_seq_len=512, decode_weights="bfloat16")
    prompt = f32.tokenizer.encode("The capital of France is Paris. The capital of Italy is")
    got = []
    for loaded in (f32, bf16):
        session, history, steps = Session(loaded.lm), list(prompt), []
        session.logits(history)
        for t in (9079, 28, 13):  # three decode steps
            history.append(t)
            steps.append(session.logits(history).copy())
            assert session.calls[-1][0] == "decode"
        got.append(np.concatenate(steps))
    assert got[0].tobytes() == got[1].tobytes()
    assert sum(a.nbytes for a in bf16.lm.packed.values() if a.dtype == np.uint16) > 200e6


def test_bfloat16_decode_weights_refuse_drawn_float32_weights():
    from iron_spec.operators import native
    why = "needs the decode pool" if native.LIB is None else "do not hold exactly in bfloat16"
    with pytest.raises(ValueError, match=why):
        load_model(LLAMA, random_weights=0, toy=True, decode_weights="bfloat16")
    with pytest.raises(ValueError, match="is not one of float32, bfloat16"):
        load_model(LLAMA, random_weights=0, toy=True, decode_weights="int4")


def test_a_prompt_run_interrupted_part_way_resumes_as_a_fresh_run(monkeypatch):
    # Found by trying Ctrl-C mid-prefill: the chunks run before the interrupt had moved a
    # sliding window's ring past the history the session recorded, and the next call resumed
    # over it (gemma3's toy, window 8, chunk 16: logits 0.64 off a fresh run's).
    lm = load_model(SPECS / "gemma3.yaml", random_weights=0, toy=True).lm
    rng = np.random.default_rng(0)
    held = rng.integers(0, 256, 17).tolist()
    history = held[:16] + rng.integers(0, 256, 60).tolist()  # resumes at 16: 4 chunks
    session = Session(lm)
    session.logits(held)
    plan, calls = type(lm.prompt_chunk), []
    run = plan.__call__

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return run(self, *args, **kwargs)

    monkeypatch.setattr(plan, "__call__", interrupted)
    with pytest.raises(KeyboardInterrupt):
        session.logits(history)
    monkeypatch.setattr(plan, "__call__", run)
    assert np.array_equal(session.logits(history), Session(lm).logits(history))
