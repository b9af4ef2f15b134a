"""The batched decode step and the engine: every row is its session's own decode step, bit for
bit, so a request served beside others draws what it draws alone.

The judge is the session's own decode step (``Session.logits`` one token at a time), which
``iron-spec check`` holds to transformers' goldens; a batch that reordered one sum would
differ from it in the last bits and fail here.
"""

from __future__ import annotations

import numpy as np
import pytest

import iron_spec
from iron_spec.operators import native
from iron_spec.runtime.batch import BatchDecode, Unbatchable
from iron_spec.runtime.engine import Engine
from iron_spec.runtime.session import Session

pytestmark = pytest.mark.skipif(not native.PROGRAM, reason="the batched step is a native program")


def _decode_side_by_side(lm, lengths, steps, capacity=8, seed=0):
    """Sessions at ``lengths`` decoded ``steps`` times, alone and batched: whether every
    step's logits were equal, bit for bit."""
    rng = np.random.default_rng(seed)
    V = lm.config.vocab_size
    histories = [rng.integers(1, V, n).tolist() for n in lengths]
    alone, batched = [Session(lm) for _ in lengths], [Session(lm) for _ in lengths]
    for s, h in zip(alone + batched, histories + histories):
        s.logits(h[:-1])  # the prompt, through the prompt chunk
    batch = BatchDecode(lm, capacity)
    for _ in range(steps):
        want = [s.logits(h) for s, h in zip(alone, histories)]
        got = batch.step(batched, histories)
        for w, g in zip(want, got):
            if not np.array_equal(w, g):
                return False, float(np.abs(w - g).max())
        for h, logits in zip(histories, got):
            h.append(int(np.argmax(logits)) or 1)
    assert all(s.calls[-1][0] == "decode" for s in batched)
    return True, 0.0


@pytest.mark.parametrize("spec", ["llama3", "gemma3", "qwen3", "gpt2"])
def test_each_row_is_its_sessions_own_decode_step(spec):
    # Sessions at positions up to 17 apart, across several cache growths (the toy's blocks are
    # 16 positions) and gemma3's sliding-window rings.
    lm = iron_spec.load(spec, random_weights=0, toy=True).loaded.lm
    same, err = _decode_side_by_side(lm, (5, 17, 3, 11, 20), steps=40)
    assert same, f"{spec}: a batched row differs from its decode step by {err}"


@pytest.mark.parametrize("lengths", [(3, 5, 4, 6, 2, 7, 5, 4), (3, 60, 4, 5), (6, 6, 6)])
def test_each_row_is_its_decode_step_however_its_attention_shares_the_threads(lengths):
    # A layer's rows' attention runs as one dispatch (operators/_cpu_attend_rows.h): a query
    # owned by one thread, which computes its parts in turn, or split over the threads (a
    # long history beside short ones; the shortest left over when the rows do not share the
    # threads evenly). Either way its bits are its decode step's.
    lm = iron_spec.load("llama3", random_weights=0, toy=True).loaded.lm
    same, err = _decode_side_by_side(lm, lengths, steps=6)
    assert same, f"{lengths}: a batched row differs from its decode step by {err}"


@pytest.mark.parametrize("spec", ["lfm2", "mamba", "qwen3_next", "falcon_h1"])
def test_each_row_carries_its_own_recurrent_state(spec):
    # A short convolution, a selective scan, the gated delta rule (Qwen3-Next's toy with
    # routed experts and a gated shared expert) and attention beside SSD: each row's state is
    # its session's own, stepped as that session's decode step steps it.
    lm = iron_spec.load(spec, random_weights=0, toy=True).loaded.lm
    same, err = _decode_side_by_side(lm, (5, 17, 3), steps=10)
    assert same, f"{spec}: a batched row differs from its decode step by {err}"


@pytest.mark.parametrize("options", [dict(kv_cache="bfloat16"), dict(decode_weights="int8"),
                                     dict(decode_weights="bfloat16-rounded")])
def test_each_row_is_its_decode_step_on_reduced_forms(options):
    lm = iron_spec.load("llama3", random_weights=0, toy=True, **options).loaded.lm
    same, err = _decode_side_by_side(lm, (4, 20, 9), steps=20)
    assert same, f"{options}: differs by {err}"


@pytest.mark.parametrize("weights", ["bfloat16", "float16", "q8_0", "q4_0", "q4_1", "q5_0",
                                     "q5_1"])
def test_each_row_is_its_decode_step_on_weights_held_as_stored(weights):
    # Weights held in a checkpoint's form (runtime.holding): the batched GEMV runs the held
    # kernels over every row (gemv_held_batch_run), each row's sums the one-row GEMV's.
    lm = iron_spec.load("llama3", random_weights=0, toy=True, weights=weights).loaded.lm
    batch = BatchDecode(lm, 4)
    gemvs = [e for e in batch._rowwise.values() if e[1][0] == native.OP_GEMV]
    assert gemvs and all(len(e[1][4]) == 4 and e[1][4][2] >= 0 for e in gemvs)  # held forms
    same, err = _decode_side_by_side(lm, (4, 20, 9), steps=12)
    assert same, f"{weights}: differs by {err}"


@pytest.mark.parametrize("spec,weights", [("qwen3_moe", "stored"), ("qwen3_moe", "q8_0"),
                                          ("mixtral", "stored"), ("gemma4", "stored"),
                                          ("dbrx", "stored"), ("granitemoe", "stored"),
                                          ("qwen2_moe", "stored")])
def test_each_row_is_its_decode_step_through_a_mixture_of_experts(spec, weights):
    # The router and the experts lowered once a row (batch.ROW_ONLY): each row's experts
    # are its own, as in its decode step. qwen2_moe's shared-expert gate (a multiply by
    # each row's own sigmoid, no native form over the rows) runs once a row too.
    lm = iron_spec.load(spec, random_weights=0, toy=True, weights=weights).loaded.lm
    same, err = _decode_side_by_side(lm, (4, 20, 9), steps=12)
    assert same, f"{spec} {weights}: differs by {err}"


def test_a_mixture_whose_decode_step_has_no_native_router_is_refused_at_start():
    # PhiMoE's sparsemixer routing stays numpy's: no batched step, said at construction,
    # and the engine decodes its sessions one at a time.
    lm = iron_spec.load("phimoe", random_weights=0, toy=True).loaded.lm
    with pytest.raises(Unbatchable, match=r"mlp\.gate \(router\): no native form at one row"):
        BatchDecode(lm, 4)
    engine = Engine(lm, max_batch=4)
    assert engine.batch is None and "router" in engine.unbatched


def test_a_step_with_no_native_form_at_one_row_is_refused_at_start_not_at_a_call():
    # gpt-oss's attention with sinks runs on numpy in the decode step: found when the
    # batched step is built (it once passed construction and failed every request of the
    # engine's first batched step), and the engine serves each request as it is served alone.
    model = iron_spec.load("gpt_oss", random_weights=0, toy=True)
    with pytest.raises(Unbatchable, match=r"self_attn \(attention\): no native form at one row"):
        BatchDecode(model.loaded.lm, 4)
    prompts = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]
    alone = [model.complete(p, max_new_tokens=6).token_ids for p in prompts]
    together = model.complete(prompts, max_new_tokens=6)
    assert model.engine().batch is None
    assert [c.token_ids for c in together] == alone


def test_sessions_leaving_and_joining_keep_their_rows_and_their_bits():
    # A session keeps its row while it runs, one leaving frees its row for another
    # (BatchDecode._order): the others' steps are not encoded again. Each row is still its
    # session's own decode step, each session given its own logits.
    lm = iron_spec.load("llama3", random_weights=0, toy=True).loaded.lm
    rng = np.random.default_rng(3)
    histories = [rng.integers(1, lm.config.vocab_size, n).tolist() for n in (5, 9, 3, 12, 7)]
    alone, batched = [Session(lm) for _ in histories], [Session(lm) for _ in histories]
    for s, h in zip(alone + batched, histories + histories):
        s.logits(h[:-1])
    batch = BatchDecode(lm, 4)
    for members in [(0, 1, 2, 3), (0, 1, 2, 3), (0, 2, 3), (0, 2, 3, 4), (4, 3, 2), (1, 4)]:
        want = [alone[i].logits(histories[i]) for i in members]
        got = batch.step([batched[i] for i in members], [histories[i] for i in members])
        assert all(np.array_equal(w, g) for w, g in zip(want, got)), members
        if members == (0, 2, 3):  # session 1 left row 1: the last row's session takes it
            assert batch._slots == [id(batched[i]) for i in (0, 3, 2)]
        for i, logits in zip(members, got):
            histories[i].append(int(np.argmax(logits)) or 1)


def test_rows_past_the_capacity_run_in_several_calls():
    lm = iron_spec.load("llama3", random_weights=0, toy=True).loaded.lm
    same, _ = _decode_side_by_side(lm, (3, 4, 5, 6, 7), steps=5, capacity=2)
    assert same


def test_a_session_needing_its_prompt_runs_alone_in_the_same_call():
    lm = iron_spec.load("llama3", random_weights=0, toy=True).loaded.lm
    a, b, fresh = Session(lm), Session(lm), Session(lm)
    a.logits([1, 2, 3])
    b.logits([4, 5])
    got = BatchDecode(lm, 4).step([a, fresh, b], [[1, 2, 3, 7], [9, 9, 9], [4, 5, 6]])
    want = [Session(lm), Session(lm), Session(lm)]
    want[0].logits([1, 2, 3])
    want[2].logits([4, 5])
    expect = [want[0].logits([1, 2, 3, 7]), want[1].logits([9, 9, 9]), want[2].logits([4, 5, 6])]
    assert all(np.array_equal(g, w) for g, w in zip(got, expect))
    assert fresh.calls == [("prompt", 0, 3)]


def test_a_refused_history_changes_nothing():
    lm = iron_spec.load("llama3", random_weights=0, toy=True).loaded.lm
    a, b = Session(lm), Session(lm)
    a.logits([1, 2, 3])
    b.logits([4, 5])
    batch = BatchDecode(lm, 4)
    with pytest.raises(IndexError, match="outside the vocabulary"):
        batch.step([a, b], [[1, 2, 3, 4], [4, 5, 10**6]])
    assert a.held == 3 and b.held == 2
    with pytest.raises(ValueError, match="given twice"):
        batch.step([a, a], [[1, 2, 3, 4], [1, 2, 3, 4]])


def test_without_the_native_program_there_is_no_batched_step(monkeypatch):
    lm = iron_spec.load("llama3", random_weights=0, toy=True).loaded.lm
    monkeypatch.setattr(native, "PROGRAM", False)
    with pytest.raises(Unbatchable, match="IRON_SPEC_PROGRAM"):
        BatchDecode(lm, 4)
    engine = Engine(lm, max_batch=4)  # decodes one session at a time instead
    assert engine.batch is None and "IRON_SPEC_PROGRAM" in engine.unbatched


@pytest.mark.parametrize("sampling", [dict(temperature=0), dict(temperature=0.9, top_p=0.9,
                                                                 seed=7, frequency_penalty=0.5)])
def test_a_list_of_prompts_gives_what_each_prompt_gives_alone(sampling):
    model = iron_spec.load("llama3", random_weights=0, toy=True)
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9], list(range(1, 40)), [3]]
    alone = [model.complete(p, max_new_tokens=12, **sampling) for p in prompts]
    together = model.complete(prompts, max_new_tokens=12, **sampling)
    assert [c.token_ids for c in together] == [c.token_ids for c in alone]
    assert [c.finish_reason for c in together] == [c.finish_reason for c in alone]
    assert model.engine().metrics.decode_rows > model.engine().metrics.decode_steps  # batched
    assert model.generate(prompts[:2], max_new_tokens=12, **sampling) == \
        [c.text for c in alone[:2]]


def test_a_finished_requests_session_serves_a_prompt_beginning_the_same_way():
    model = iron_spec.load("llama3", random_weights=0, toy=True)
    engine = model.engine(max_batch=2)
    C = model.loaded.lm.config.prefill_chunk
    prefix = list(range(1, 3 * C + 5))  # three whole chunks and some
    first = model.complete([prefix + [7]], max_new_tokens=3)[0]
    run_before = engine.metrics.prompt_tokens_run
    again = model.complete([prefix + [9]], max_new_tokens=3)[0]
    # The second runs only from where the held session may restart: its one new token where
    # the prompt chunk computes each row alone (the native kernels), else from the last
    # chunk boundary (CausalLM.resume_at).
    alone = model.loaded.lm.prompt_chunk.plan.rows_alone
    want = 1 if alone else len(prefix) + 1 - 3 * C
    assert engine.metrics.prompt_tokens_run - run_before == want
    assert engine.pool.hits == 1
    fresh = iron_spec.load("llama3", random_weights=0, toy=True)
    assert again.token_ids == fresh.complete(prefix + [9], max_new_tokens=3).token_ids
    assert first.token_ids == fresh.complete(prefix + [7], max_new_tokens=3).token_ids


def test_a_dropped_model_is_collected_and_its_engine_thread_ends():
    import gc
    import weakref
    model = iron_spec.load("llama3", random_weights=0, toy=True)
    model.complete([[1, 2, 3], [4, 5]], max_new_tokens=3)  # the engine's thread started
    thread, lm = model.engine()._thread, weakref.ref(model.loaded.lm)
    engine = weakref.ref(model.engine())
    assert thread.is_alive()
    del model
    gc.collect()
    thread.join(30)
    assert not thread.is_alive() and engine() is None and lm() is None


def test_a_request_in_flight_ends_although_its_model_was_dropped():
    import gc
    model = iron_spec.load("llama3", random_weights=0, toy=True)
    want = model.complete([1, 2, 3], max_new_tokens=20).token_ids
    engine = model.engine()
    ticket = engine.submit(model.request([1, 2, 3], max_new_tokens=20))
    thread = engine._thread
    del model, engine
    gc.collect()
    assert ticket.wait(60).token_ids == want
    thread.join(30)
    assert not thread.is_alive()
