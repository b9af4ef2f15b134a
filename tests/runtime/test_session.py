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
@pytest.mark.parametrize("reference", [False, True], ids=["compiled", "reference"])
def test_extending_history_reuses_the_cache_bitwise_equal_to_fresh(toy, held, reference):
    lm = toy.lm
    C = lm.config.prefill_chunk
    rng = np.random.default_rng(2)
    history = rng.integers(0, lm.config.vocab_size, 2 * C + held).tolist()
    turn = rng.integers(0, lm.config.vocab_size, C + 6).tolist()
    fresh = Session(lm, reference=reference)
    whole = fresh.logits(history + turn).copy()
    nxt = int(np.argmax(whole))
    whole_next = fresh.logits(history + turn + [nxt]).copy()

    chat = Session(lm, reference=reference)
    chat.logits(history)
    chat.calls.clear()
    extended = chat.logits(history + turn)
    if reference:
        # numpy's float64 sums of a row depend on the call's other rows: the turn runs
        # from the chunk boundary at or before its first token, as a fresh run's calls.
        assert chat.calls[0] == ("prompt", 2 * C, C) and len(chat.calls) == 2
    else:
        # The native kernels compute each row alone: only the turn's own tokens run.
        assert lm.prompt_chunk.plan.rows_alone
        assert chat.calls == [("prompt", 2 * C + held, C), ("prompt", 3 * C + held, 6)]
    assert chat.reused == chat.calls[0][1]
    assert extended.tobytes() == whole.tobytes()
    # One more token is one decode step, as in the fresh session.
    chat.calls.clear()
    assert chat.logits(history + turn + [nxt]).tobytes() == whole_next.tobytes()
    assert chat.calls == [("decode", len(history) + len(turn), 1)]


@pytest.mark.parametrize("split", [1, 5, 15, 16, 17, 31, 33])
def test_a_prompt_row_is_the_same_bits_whatever_call_holds_it(toy, split):
    # What lets a session resume anywhere: split the prompt's calls at any position (a call
    # of one row too, which a decode step's kernel must not serve) and every logit, and
    # every key and value the caches hold, is a fresh run's.
    lm = toy.lm
    C = lm.config.prefill_chunk
    prompt = np.random.default_rng(7).integers(0, lm.config.vocab_size, 2 * C + 7)
    version = lm.prompt_chunk

    def run(bounds):
        ids = np.zeros(C, np.int32)
        for lo, hi in zip(bounds, bounds[1:]):
            for s in range(lo, hi, C):
                rows = min(C, hi - s)
                ids[:rows] = prompt[s: s + rows]
                logits, _ = version(ids, start=s, rows=rows)
        caches = {name: state.array[:, :prompt.size].copy()
                  for name, state in lm.named_states() if state.kv}
        return np.array(logits), caches

    # Versions called without a session's caches: the bound set holds no one's tokens.
    whole, whole_caches = run([0, prompt.size])
    split_logits, split_caches = run([0, split, prompt.size])
    assert split_logits.tobytes() == whole.tobytes()
    for name, array in whole_caches.items():
        assert split_caches[name].tobytes() == array.tobytes(), name


def test_a_two_turn_chat_runs_only_the_new_turn(toy):
    # A chat: turn 1's prompt, its reply drawn (decode steps), then turn 2 = all that and
    # the new turn's tokens. Turn 2 runs its own tokens only (the reply's last token, which
    # no step read, and the turn's), and its logits are those of a fresh session making the
    # same calls on caches another conversation filled first, bit for bit.
    lm = toy.lm
    rng = np.random.default_rng(3)
    V = lm.config.vocab_size
    first, turn = rng.integers(0, V, 21).tolist(), rng.integers(0, V, 9).tolist()

    def conversation(session):
        reply = list(session.generate(first, 6))
        calls = len(session.calls)
        logits = session.logits(first + reply + turn).copy()
        return reply, session.calls[calls:], logits

    reply, calls, logits = conversation(Session(lm))
    assert calls == [("prompt", len(first) + 5, 1 + len(turn))]
    Session(lm).logits(rng.integers(0, V, 40).tolist())  # another conversation's tokens
    again = Session(lm)
    assert conversation(again)[0] == reply
    assert again.calls[0][:2] == ("prompt", 0) and again.calls[-1] == calls[0]
    assert conversation(Session(lm))[2].tobytes() == logits.tobytes()


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


def test_two_sessions_share_one_model_each_on_its_own_caches(toy):
    lm = toy.lm
    a, b = Session(lm), Session(lm)
    pa, pb = [1, 2, 3, 4, 5], [9, 8, 7]
    la = a.logits(pa).copy()
    lb = b.logits(pb).copy()
    a.calls.clear()
    # b ran on caches of its own: a's still hold a's tokens, and its next token is one
    # decode step; both as a session alone on the model gives them, bit for bit.
    assert a.held == len(pa) and b.held == len(pb)
    alone = Session(lm)
    alone.logits(pa)
    assert a.logits(pa + [6]).tobytes() == alone.logits(pa + [6]).tobytes()
    assert a.calls == [("decode", len(pa), 1)]
    assert la.tobytes() == Session(lm).logits(pa).tobytes()
    assert b.logits(pb).tobytes() == lb.tobytes()


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


def test_the_same_history_again_runs_nothing_after_a_prompt_and_its_decode_step_after_one(toy):
    lm = toy.lm
    C = lm.config.prefill_chunk
    history = np.random.default_rng(2).integers(0, lm.config.vocab_size, C + 3).tolist()
    session = Session(lm)
    first = session.logits(history).copy()
    session.calls.clear()
    assert session.logits(history).tobytes() == first.tobytes()
    assert session.calls == []
    # After a decode step (whose logits are not kept), asked again: that decode step again,
    # which writes the same keys and values and gives the same logits, bit for bit.
    decoded = session.logits(history + [7]).copy()
    session.calls.clear()
    assert session.logits(history + [7]).tobytes() == decoded.tobytes()
    assert session.calls == [("decode", C + 3, 1)]
    # A shorter history than the caches hold runs its last token again, as a prompt row.
    session.calls.clear()
    assert session.logits(history).tobytes() == first.tobytes()
    assert session.calls == [("prompt", C + 2, 1)]
    # A caller may write into what it was given; the session keeps its own copy.
    given = session.logits(history)
    given[:] = 0.0
    assert session.logits(history).tobytes() == first.tobytes()


def test_bfloat16_decode_weights_give_the_float32_decode_bit_for_bit(smollm2):
    # SmolLM2's weights are bfloat16 on disk: held as bfloat16 they are the same values, and
    # the decode step's logits the same bits, at half the bytes a token streams.
    from iron_spec.operators import native
    if native.LIB is None:
        pytest.skip("the decode pool is off or not built")
    f32 = load_model(LLAMA, checkpoint=smollm2, max_seq_len=512, weights="float32")
    bf16 = load_model(LLAMA, checkpoint=smollm2, max_seq_len=512, decode_weights="bfloat16",
                      weights="float32")
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


def test_on_numpys_blas_a_session_resumes_at_the_chunk_boundary_bitwise_equal_to_fresh():
    # IRON_SPEC_GEMM=blas: OpenBLAS sums a row by how many rows its call holds, so the
    # prompt chunk's rows are not computed alone and the model allows only chunk boundaries,
    # where a fresh run's calls begin. Read at import: a process of its own.
    import os
    import subprocess
    import sys
    code = (
        "import numpy as np\n"
        "from iron_spec.spec.build import load_model\n"
        "from iron_spec.runtime.session import Session\n"
        f"lm = load_model({str(LLAMA)!r}, random_weights=0, toy=True).lm\n"
        "C = lm.config.prefill_chunk\n"
        "prompt = np.random.default_rng(5).integers(0, lm.config.vocab_size, 2 * C + 3).tolist()\n"
        "fresh = Session(lm).logits(prompt).copy()\n"
        "s = Session(lm)\n"
        "s.logits(prompt[:C + 5])\n"
        "s.calls.clear()\n"
        "print(lm.prompt_chunk.plan.rows_alone, s.logits(prompt).tobytes() == fresh.tobytes(),\n"
        "      s.calls[0][:2] == ('prompt', C))\n")
    env = dict(os.environ, IRON_SPEC_GEMM="blas")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["False", "True", "True"], out.stderr


def test_a_session_given_the_models_caches_reuses_their_arrays_and_trusts_nothing_held(toy):
    # What bench does: each measurement a fresh session, on the caches the runs before grew.
    lm = toy.lm
    C = lm.config.prefill_chunk
    history = np.random.default_rng(5).integers(0, lm.config.vocab_size, 3 * C).tolist()
    first = Session(lm)
    want = first.logits(history).copy()
    arrays, reserved = [s.array for _, s in lm.named_states()], lm.reserved
    again = Session(lm, caches=lm.caches)
    assert again.held == 0 and first.held == 0  # the set's record is nobody's now
    assert again.logits(history).tobytes() == want.tobytes()
    assert again.calls[0][:2] == ("prompt", 0)  # run whole, not resumed
    assert lm.reserved == reserved
    assert all(s.array is a for (_, s), a in zip(lm.named_states(), arrays))
