"""Bad calls through the Python API refused as the command line refuses them, before
anything runs, the session left bit for bit as it was (issue 13): token ids that are not
integers (a bool is no id), ids outside the vocabulary, positions outside the context, a
sampler drawing what is no token id, sampler settings out of range."""

from __future__ import annotations

import re

import numpy as np
import pytest

from iron_spec.spec.build import load_model
from iron_spec.operators import Sampler
from iron_spec.runtime.session import Session
from tests.bad.corpus import LLAMA


@pytest.fixture(scope="module")
def toy():
    return load_model(LLAMA, random_weights=0, toy=True)


@pytest.fixture()
def warm(toy):
    """A session holding a short history, its logits after it, and that history."""
    session = Session(toy.lm)
    history = [5, 17, 42, 99, 3]
    return session, session.logits(history).copy(), history


def unchanged(session, logits, history, calls):
    """Nothing ran, and the held history gives the very same logits (bit for bit)."""
    assert len(session.calls) == calls
    assert session.held == len(history)
    assert np.array_equal(session.logits(history), logits)
    assert len(session.calls) == calls  # asked again for the same history: nothing runs


V = 256  # the toy's vocabulary
HISTORIES = [
    ("bool_id", [5, True, 7], TypeError, "tokens[1] is True (bool)"),
    ("all_bools", [True, False], TypeError, "tokens[0] is True (bool)"),
    ("numpy_bools", np.array([True, False]), TypeError, "bool values"),
    ("float_id", [5, 2.7], TypeError, "tokens[1] is 2.7 (float)"),
    ("float_array", np.array([1.0, 2.0]), TypeError, "float64 values"),
    ("text_id", [5, "7"], TypeError, "tokens[1] is '7' (str)"),
    ("a_string", "hello", TypeError, "tokens is str"),
    ("none_id", [None], TypeError, "tokens[0] is None"),
    ("negative_id", [5, -1], IndexError, "token id -1 at position 1 is outside"),
    ("past_vocab", [5, V], IndexError, f"token id {V} at position 1 is outside"),
    ("huge_id", [2**40], IndexError, f"token id {2**40} at position 0"),
    ("empty", [], ValueError, "non-empty"),
    ("nested", [[1, 2]], TypeError, "tokens[0] is [1, 2]"),
]


@pytest.mark.parametrize("case, tokens, error, says", HISTORIES, ids=[h[0] for h in HISTORIES])
def test_a_bad_history_is_refused_and_nothing_changes(warm, case, tokens, error, says):
    session, logits, history = warm
    calls = len(session.calls)
    with pytest.raises(error) as e:
        session.logits(tokens)
    assert says in str(e.value), e.value
    with pytest.raises(error):
        list(session.generate(tokens, 2))
    unchanged(session, logits, history, calls)


def test_a_history_past_the_context_is_refused(warm, toy):
    session, logits, history = warm
    L = toy.lm.config.max_seq_len
    calls = len(session.calls)
    with pytest.raises(ValueError, match=f"do not fit max_seq_len {L}"):
        session.logits([1] * (L + 1))
    with pytest.raises(ValueError, match="and 10 more to draw"):
        list(session.generate([1] * (L - 5), 11))
    unchanged(session, logits, history, calls)


@pytest.mark.parametrize("max_tokens, error", [(0, ValueError), (-3, ValueError),
                                               (2.5, TypeError), (True, TypeError)])
def test_a_bad_max_tokens_is_refused(warm, max_tokens, error):
    session, logits, history = warm
    calls = len(session.calls)
    with pytest.raises(error):
        list(session.generate(history, max_tokens))
    unchanged(session, logits, history, calls)


DRAWS = [("minus_one", -1), ("fraction", 7.9), ("past_vocab", V), ("boolean", True),
         ("none", None), ("text", "3"), ("numpy_float", np.float32(4.0))]


@pytest.mark.parametrize("case, draw", DRAWS, ids=[d[0] for d in DRAWS])
def test_a_sampler_drawing_no_token_id_is_refused(warm, case, draw):
    session, logits, history = warm
    with pytest.raises(ValueError, match=re.escape(f"the sampler drew {draw!r}, not a token "
                                                   f"id within 0..{V - 1}")):
        list(session.generate(history + [8], 3, sampler=lambda logits: draw))
    # The history it refused to extend is not held: asked again, it runs afresh.
    assert session.held <= len(history) + 1
    assert np.array_equal(session.logits(history), logits)


DECODE = [
    ("token_minus_one", dict(token=-1, position=5), IndexError, "token -1 is outside 0..255"),
    ("token_past_vocab", dict(token=V, position=5), IndexError, "token 256 is outside"),
    ("token_bool", dict(token=True, position=5), TypeError, "token is True (bool)"),
    ("token_float", dict(token=3.0, position=5), TypeError, "token is 3.0 (float)"),
    ("position_negative", dict(token=3, position=-1), ValueError, "position -1 is outside"),
    ("position_past_context", dict(token=3, position=10**6), ValueError,
     "position 1000000 is outside"),
    ("position_text", dict(token=3, position="5"), TypeError, "position is '5' (str)"),
]


@pytest.mark.parametrize("case, kwargs, error, says", DECODE, ids=[d[0] for d in DECODE])
def test_a_bad_decode_step_is_refused_before_it_runs(warm, toy, case, kwargs, error, says):
    session, logits, history = warm
    for run in (toy.lm.decode_step, toy.lm.decode_step.reference):
        with pytest.raises(error) as e:
            run(**kwargs)
        assert says in str(e.value), e.value
    unchanged(session, logits, history, len(session.calls))


def test_bad_prompt_chunk_calls_are_refused_before_they_run(warm, toy):
    session, logits, history = warm
    chunk = toy.lm.prompt_chunk
    C = chunk.capacity
    ids = np.zeros(C, np.int32)
    bad = ids.copy()
    bad[2] = V
    for kwargs, error, says in [
            (dict(ids=bad, start=0, rows=3), IndexError, f"ids[2] = {V} is outside"),
            (dict(ids=ids, start=0, rows=C + 1), ValueError, f"rows {C + 1} is outside"),
            (dict(ids=ids, start=-1, rows=1), ValueError, "start -1 is outside"),
            (dict(ids=ids[:3], start=0, rows=3), ValueError, f"not the chunk's {C}"),
            (dict(ids=ids.astype(bool), start=0, rows=3), TypeError, "bool values")]:
        with pytest.raises(error) as e:
            chunk(**kwargs)
        assert says in str(e.value), e.value
    unchanged(session, logits, history, len(session.calls))


SAMPLERS = [
    ("temperature_negative", dict(temperature=-0.5), "temperature"),
    ("temperature_nan", dict(temperature=float("nan")), "temperature"),
    ("temperature_infinite", dict(temperature=float("inf")), "temperature"),
    ("top_k_negative", dict(top_k=-2), "top_k"),
    ("top_p_zero", dict(top_p=0.0), "top_p"),
    ("top_p_past_one", dict(top_p=1.01), "top_p"),
]


@pytest.mark.parametrize("case, kwargs, says", SAMPLERS, ids=[s[0] for s in SAMPLERS])
def test_a_sampler_out_of_range_is_refused(case, kwargs, says):
    with pytest.raises(ValueError, match=says):
        Sampler(**kwargs)


@pytest.mark.parametrize("temperature", [1e-320, 5e-324, 1e-300, 1e-30, 1e-8, 1e300])
def test_sampling_stays_finite_for_any_temperature_accepted(temperature):
    logits = np.array([1.0, 3.5, -2.0, 3.5 - 1e-6, 0.0], np.float32)
    s = Sampler(temperature=temperature, seed=0)
    p = s.probabilities(logits)
    assert np.isfinite(p).all() and abs(p.sum() - 1.0) < 1e-12, p
    draws = {s(logits) for _ in range(20)}
    if temperature < 1e-8:  # at the limit: the largest logit (1 over 3), never the last id
        assert draws == {1}, draws
    if temperature == 1e300:  # at the other limit: every token alike
        assert np.allclose(p, 0.2)


# The library's own calls (iron_spec.load(...).generate): each argument of the wrong type
# or value is refused naming it, before anything runs (found by a fresh user's trial).
LIBRARY = [
    ("bool_among_ids", dict(prompt=[True, 2]), TypeError, "not booleans"),
    ("bool_ids", dict(prompt=[True, False]), TypeError, "list of bool"),
    ("float_ids", dict(prompt=[1.5]), TypeError, "list of float"),
    ("no_ids", dict(prompt=[]), ValueError, "no token ids"),
    ("seed_fraction", dict(temperature=1, seed=1.5), TypeError, "seed 1.5"),
    ("seed_bool", dict(temperature=1, seed=True), TypeError, "seed True"),
    ("seed_text", dict(temperature=1, seed="x"), TypeError, "seed 'x'"),
    ("seed_negative", dict(temperature=1, seed=-1), ValueError, "^seed -1 is outside"),
    ("temperature_text", dict(temperature="hot"), TypeError, "temperature 'hot'"),
    ("temperature_bool", dict(temperature=True), TypeError, "temperature True"),
    ("top_k_fraction", dict(temperature=1, top_k=1.5), TypeError, "top_k 1.5"),
    ("top_p_text", dict(temperature=1, top_p="x"), TypeError, "top_p 'x'"),
    ("stop_number", dict(stop=5), TypeError, "stop is text"),
    ("message_without_content", dict(prompt=[{"role": "user"}]), TypeError, "message 0"),
]


@pytest.fixture(scope="module")
def library():
    import iron_spec

    return iron_spec.load(LLAMA, random_weights=0, toy=True)


@pytest.mark.parametrize("case, kwargs, error, says", LIBRARY, ids=[c[0] for c in LIBRARY])
def test_a_bad_library_call_is_refused_naming_the_argument(library, case, kwargs, error, says):
    kwargs = dict(kwargs)
    prompt = kwargs.pop("prompt", [5, 17, 42])
    with pytest.raises(error, match=says):
        library.generate(prompt, max_new_tokens=2, **kwargs)


# iron_spec.load's own arguments (found by a new user's trial: random_weights=True drew at
# seed 1, max_seq_len=64.5 was taken as a context, "64" failed as a TypeError comparing int
# with str, prefill_chunk=0 fell back to the spec's, max_tokens for a causal model was
# dropped): each refused naming the argument and what would be valid, before anything loads.
LOAD = [
    ("seed_negative", dict(random_weights=-1), ValueError, "random_weights is -1; it is a whole number >= 0"),
    ("seed_bool", dict(random_weights=True), TypeError, r"random_weights is True \(bool\)"),
    ("seed_fraction", dict(random_weights=1.5), TypeError, r"random_weights is 1.5 \(float\)"),
    ("context_text", dict(max_seq_len="64"), TypeError, r"max_seq_len is '64' \(str\); it is a whole number >= 1"),
    ("context_fraction", dict(max_seq_len=64.5), TypeError, r"max_seq_len is 64.5 \(float\)"),
    ("context_bool", dict(max_seq_len=True), TypeError, r"max_seq_len is True \(bool\)"),
    ("context_zero", dict(max_seq_len=0), ValueError, "max_seq_len is 0; it is a whole number >= 1"),
    ("chunk_zero", dict(prefill_chunk=0), ValueError, "prefill_chunk is 0; it is a whole number >= 1"),
    ("chunk_negative", dict(prefill_chunk=-3), ValueError, "prefill_chunk is -3"),
    ("chunk_bool", dict(prefill_chunk=True), TypeError, r"prefill_chunk is True \(bool\)"),
    ("max_tokens_causal", dict(max_tokens=16), TypeError, "max_tokens is for an encoder's ids per text.*takes no max_tokens"),
    ("threads_text", dict(threads="2"), TypeError, r"threads is '2' \(str\)"),
    ("toy_text", dict(toy="yes"), TypeError, r"toy is 'yes' \(str\); it is True or False"),
    ("allow_text", dict(allow_unread_config="no"), TypeError, "allow_unread_config is 'no'"),
    ("progress_number", dict(progress=3), TypeError, "progress is 3"),
    ("decode_weights_number", dict(decode_weights=3), TypeError, "decode_weights is 3; it is one of 'float32'"),
    # Said as load's keywords, not the CLI's flags (found by a new user's trial).
    ("decode_weights_unknown", dict(decode_weights="fp8"), ValueError, "^decode_weights='fp8' is not one of float32, bfloat16"),
    ("prefill_weights_number", dict(prefill_weights=16), TypeError, "prefill_weights is 16; it is one of 'float32', 'bfloat16'"),
    ("prefill_weights_unknown", dict(prefill_weights="int8"), ValueError, "^prefill_weights='int8' is not one of float32, bfloat16"),
    ("kv_cache_number", dict(kv_cache=16), TypeError, "kv_cache is 16; it is one of 'float32', 'bfloat16'"),
    ("kv_cache_unknown", dict(kv_cache="int8"), ValueError, "^kv_cache='int8' is not one of float32, bfloat16"),
    ("weights_number", dict(weights=8), TypeError, "weights is 8; it is one of 'stored', 'float32'"),
    ("weights_unknown", dict(weights="q3_k"), ValueError, "^weights='q3_k' is not one of stored, float32, bfloat16"),
    ("context_past_model", dict(max_seq_len=100000), ValueError, "^max_seq_len=100000 is not within 1..512, the model's own context"),
    ("chunk_past_context", dict(max_seq_len=32, prefill_chunk=64), ValueError, "^prefill_chunk=64 is past the context max_seq_len 32"),
    ("toy_without_seed", dict(random_weights=None), ValueError, r"^toy=True needs random_weights=SEED: a toy has no checkpoint"),
]


@pytest.mark.parametrize("case, kwargs, error, says", LOAD, ids=[c[0] for c in LOAD])
def test_a_bad_load_argument_is_refused_naming_it(case, kwargs, error, says):
    import iron_spec
    from iron_spec.operators import native

    kwargs = dict(dict(random_weights=0, toy=True), **kwargs)
    before = native.threads()
    with pytest.raises(error, match=says):
        iron_spec.load(LLAMA, threads=1 if "threads" not in kwargs else kwargs.pop("threads"),
                       **kwargs)
    assert native.threads() == before  # refused before the threads were set


ENCODER_ONLY_NOT = [("max_seq_len", 64), ("prefill_chunk", 8), ("decode_weights", "int8"),
                    ("prefill_weights", "bfloat16"), ("kv_cache", "bfloat16"), ("weights", "q8_0")]


@pytest.mark.parametrize("name, value", ENCODER_ONLY_NOT, ids=[c[0] for c in ENCODER_ONLY_NOT])
def test_an_encoder_refuses_a_causal_models_argument(name, value):
    import iron_spec
    from tests.conftest import SPECS

    with pytest.raises(TypeError, match=f"{name} is for a causal model's.*bert.yaml is an encoder "
                                        "model \\(model: encoder\\)"):
        iron_spec.load(str(SPECS / "bert.yaml"), random_weights=0, toy=True, **{name: value})


# Found by a new user's trial: use_kv_cache(None) said "a KV cache of None" as a ValueError,
# where load(kv_cache=None) is a TypeError naming the argument; refused, the caches stay.
@pytest.mark.parametrize("value, error, says", [
    (None, TypeError, "^kv_cache is None; it is one of 'float32', 'bfloat16'"),
    (16, TypeError, "^kv_cache is 16; it is one of 'float32', 'bfloat16'"),
    ("int8", ValueError, "^kv_cache='int8' is not one of float32, bfloat16$")])
def test_switching_the_kv_cache_refuses_a_bad_dtype_and_keeps_the_caches(warm, value, error,
                                                                          says):
    lm = load_model(LLAMA, random_weights=0, toy=True).lm
    lm.use_kv_cache("bfloat16")
    with pytest.raises(error, match=says):
        lm.use_kv_cache(value)
    assert lm.kv_cache == "bfloat16"


# Found by trying: logprobs="yes" was taken, session=5 an AttributeError from inside,
# chat(system=5) refused only at the first send.
def test_a_bad_stream_flag_or_session_is_refused_naming_it(library):
    with pytest.raises(TypeError, match=r"logprobs is 'yes' \(str\); it is True or False"):
        library.generate([5, 17], max_new_tokens=2, logprobs="yes")
    with pytest.raises(TypeError, match="session is a int, not a Session over this model"):
        library.generate([5, 17], max_new_tokens=2, session=5)


# Found by a new user's trial: session=True and session="x" said a Session was wanted but
# not how to make one; a prompt past the context named the CLI's --max-seq-len from Python;
# embed() on a causal model was a bare AttributeError.
@pytest.mark.parametrize("session", [True, "x"])
@pytest.mark.parametrize("method", ["generate", "complete"])
def test_a_session_that_is_none_says_how_to_make_one(library, session, method):
    with pytest.raises(TypeError, match=r"^session is a (bool|str), not a Session over this "
                                        r"model: .*Session\(model.loaded.lm\)"):
        getattr(library, method)([5, 17], max_new_tokens=2, session=session)


def test_a_session_made_as_the_message_says_is_taken(library):
    made = Session(library.loaded.lm)
    assert library.complete([5, 17], max_new_tokens=2, session=made).token_ids
    assert made.held == 3
    other = Session(load_model(LLAMA, random_weights=1, toy=True).lm)
    with pytest.raises(TypeError, match="session is a Session over another model"):
        library.generate([5, 17], max_new_tokens=2, session=other)


def test_a_prompt_past_the_context_names_load_s_argument():
    import iron_spec

    shorter = iron_spec.load(LLAMA, random_weights=0, toy=True, max_seq_len=100)
    with pytest.raises(iron_spec.ContextFull,
                       match="^100 tokens and 1 more to draw do not fit max_seq_len 100.*"
                             r"a larger max_seq_len= raises it, up to the model's own "
                             r"context 512\)$") as e:
        shorter.generate([5] * 100, max_new_tokens=2)
    assert "--max-seq-len" not in str(e.value)


def test_a_prompt_past_the_model_s_own_context_offers_no_larger_one(library):
    # Found by a new user's trial: "a larger max_seq_len= raises it" where max_seq_len was
    # already the model's own (the toy config's max_position_embeddings 512), which load
    # refuses to pass.
    import iron_spec

    assert library.max_seq_len == library.config["max_position_embeddings"] == 512
    with pytest.raises(iron_spec.ContextFull) as e:
        library.generate([5] * 500, max_new_tokens=20)
    assert str(e.value) == (
        f"500 tokens and 19 more to draw do not fit max_seq_len 512, the model's own context "
        f"({LLAMA} toy.config: max_position_embeddings; no larger one can be loaded): give a "
        "shorter prompt, or draw at most 13 tokens")  # 500 + 13 - 1 = 512 positions
    with pytest.raises(iron_spec.ContextFull) as e:
        library.generate([5] * 513, max_new_tokens=1)
    assert str(e.value).endswith("no larger one can be loaded): give a shorter prompt")
    assert "raises" not in str(e.value)


def test_embed_on_a_causal_model_says_what_it_is_and_offers(library):
    with pytest.raises(AttributeError, match=r"^Model.embed: embed\(\) is an EncoderModel's, "
                                             r"loaded from a model: encoder spec; .*llama3.yaml "
                                             r"is a model: causal spec, whose Model offers "
                                             r"generate\(\), complete\(\)"):
        library.embed(["a text"])
    assert not hasattr(library, "embed")
    with pytest.raises(AttributeError, match="^'Model' object has no attribute 'nothing'$"):
        library.nothing


def test_generate_on_an_encoder_says_what_it_is_and_offers():
    import iron_spec
    from tests.conftest import SPECS

    encoder = iron_spec.load(str(SPECS / "bert.yaml"), random_weights=0, toy=True)
    with pytest.raises(AttributeError, match=r"^EncoderModel.generate: generate\(\) is a "
                                             r"Model's, loaded from a model: causal spec; "
                                             r".*bert.yaml is a model: encoder spec, whose "
                                             r"EncoderModel offers embed\(\)"):
        encoder.generate("a text")


def test_a_system_message_that_is_no_text_is_refused_at_chat(library):
    with pytest.raises(TypeError, match="system is int; it is the system message's text"):
        library.chat(system=5)


# Found by trying: max_new_tokens "3", 1.5 or True was a ValueError (a wrong type is a
# TypeError, as load's arguments), on_finish=5 a TypeError from inside once the tokens
# were drawn.
@pytest.mark.parametrize("value, error, says", [
    ("3", TypeError, r"max_new_tokens is '3' \(str\); it is a whole number >= 1"),
    (1.5, TypeError, r"max_new_tokens is 1.5 \(float\)"),
    (True, TypeError, r"max_new_tokens is True \(bool\)"),
    (0, ValueError, "max_new_tokens is 0; it is a whole number >= 1"),
    (-1, ValueError, "max_new_tokens is -1; it is a whole number >= 1")])
def test_a_bad_max_new_tokens_is_refused_by_its_kind(library, value, error, says):
    with pytest.raises(error, match=says):
        library.complete([5, 17], max_new_tokens=value)


def test_an_on_finish_that_is_not_callable_is_refused_before_anything_runs(library):
    session = Session(library.loaded.lm)
    with pytest.raises(TypeError, match=r"on_finish is 5 \(int\); it is None or a callable"):
        library.stream([5, 17], max_new_tokens=2, session=session, on_finish=5)
    assert session.calls == []


def test_a_folder_for_a_spec_is_refused_naming_it(tmp_path):
    import iron_spec

    (tmp_path / "a.yaml").write_text("spec: 1\n")
    with pytest.raises(ValueError, match=f"^{tmp_path} is a folder; a model is built from one "
                                         r"spec: a YAML file in it \(a.yaml, ...\)"):
        iron_spec.load(str(tmp_path), random_weights=0, toy=True)


def test_a_checkpoint_that_is_nowhere_is_named_as_load_s_argument(tmp_path):
    # Found by trying: from Python it said "--checkpoint PATH", a flag the caller never gave.
    import iron_spec

    with pytest.raises(FileNotFoundError, match=f"^checkpoint='{tmp_path / 'nope'}': nothing "
                                                "is there; give a checkpoint directory"):
        iron_spec.load(LLAMA, str(tmp_path / "nope"))


@pytest.mark.parametrize("prompts, error, says", [
    ([[5, 17], []], ValueError, "prompt 1 (of 2, counted from 0): the prompt holds no token ids"),
    ([[5, 17], [5, -1], [5]], IndexError, "prompt 1 (of 3, counted from 0): token id -1 at position 1"),
    ([[5], [5], [10**6]], IndexError, "prompt 2 (of 3, counted from 0): token id 1000000 at")])
def test_a_bad_prompt_among_several_is_named_by_its_index_and_none_runs(library, prompts, error,
                                                                        says):
    # Found by a new user's trial: generate(["Hi", ""]) said "the prompt encodes to no
    # tokens" without saying which of the prompts.
    before = library.engine().metrics.requests
    with pytest.raises(error) as raised:
        library.generate(prompts, max_new_tokens=2)
    assert says in str(raised.value)
    assert library.engine().metrics.requests == before  # the good prompts before it never ran


@pytest.mark.parametrize("options, says", [
    (dict(prefill_tokens=-3), "prefill_tokens is -3: a count >= 1"),
    (dict(held_sessions=-1), "held_sessions is -1: a count >= 0"),
    (dict(batched="maybe"), "batched is 'maybe': true or false"),
    (dict(max_batch=1000), "max_batch is 1000: at most")])
def test_a_bad_engine_option_is_refused_before_any_request_hangs_on_it(options, says):
    # Found by a new user's trial: engine(prefill_tokens=-3) was taken, and every request
    # then hung (no prompt row ever ran).
    import iron_spec

    model = iron_spec.load(LLAMA, random_weights=0, toy=True)
    with pytest.raises(ValueError, match=re.escape(says)):
        model.engine(**options)
    assert model.generate([[5, 17], [5]], max_new_tokens=2)  # the default engine still serves
