"""The library as a Python user drives it: ``iron_spec.load(...)`` and its Model."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest

import iron_spec
from iron_spec.spec.registry import find
from tests.conftest import ROOT, SPECS

GOLDEN = np.load(ROOT / "tests" / "goldens" / "llama3" / "toy-seed0.npz")


@pytest.fixture(scope="module")
def toy():
    return iron_spec.load("llama3", random_weights=0, toy=True)


def test_importing_operators_loads_no_library():
    # The library's names load on first use: the operators alone pull in nothing else.
    code = ("import sys, iron_spec.operators; "
            "print(sorted(m for m in sys.modules if m.startswith('iron_spec.') and not "
            "m.startswith('iron_spec.operators')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_greedy_ids_and_logprobs_are_transformers(toy):
    # The golden's tokens: a prompt of 24 ids, then transformers' own greedy continuation,
    # and at each step its log-probability of the most likely token.
    n = int(GOLDEN["prompt_len"])
    prompt, expected = GOLDEN["tokens"][:n], GOLDEN["tokens"][n:]
    c = toy.complete(prompt.tolist(), max_new_tokens=expected.size, temperature=0,
                     logprobs=True)
    assert c.token_ids == expected.tolist()
    assert c.finish_reason == "length" and c.seed is None and c.prompt_tokens == n
    np.testing.assert_allclose(c.logprobs, GOLDEN["top_logprobs"][:expected.size, 0],
                               atol=1e-4)


def test_a_seed_replays_and_no_seed_draws_a_fresh_one(toy):
    ids = GOLDEN["tokens"][:8].tolist()
    a = toy.complete(ids, max_new_tokens=12, temperature=1.0)
    b = toy.complete(ids, max_new_tokens=12, temperature=1.0)
    assert a.seed is not None and b.seed is not None and a.seed != b.seed
    again = toy.complete(ids, max_new_tokens=12, temperature=1.0, seed=a.seed)
    assert again.token_ids == a.token_ids


def test_stream_yields_what_generate_returns(toy):
    ids = GOLDEN["tokens"][:8].tolist()
    s = toy.stream(ids, max_new_tokens=6, temperature=0)
    pieces = list(s)
    assert "".join(pieces) == s.result.text == toy.generate(ids, max_new_tokens=6,
                                                              temperature=0)
    assert len(pieces) == 6  # no tokenizer: each id a piece


def test_a_prompt_past_the_context_is_refused_before_anything_runs(toy):
    with pytest.raises(ValueError, match="do not fit max_seq_len 512"):
        toy.stream([1] * 500, max_new_tokens=20)
    with pytest.raises(IndexError, match="outside the vocabulary"):
        toy.stream([1, 2, 256])
    with pytest.raises(TypeError, match="a prompt is text"):
        toy.stream(3.5)
    with pytest.raises(ValueError, match="needs the checkpoint's tokenizer"):
        toy.stream("hello")
    with pytest.raises(ValueError, match="min_p 2.0 is outside"):
        toy.stream([1, 2], min_p=2.0)


def test_specs_by_name_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert find("llama3") == SPECS / "llama3.yaml"
    assert find("specs/llama3.yaml") == SPECS / "llama3.yaml"  # the README's spelling
    with pytest.raises(FileNotFoundError) as e:
        find("lama3")
    assert "did you mean llama3?" in str(e.value) and "gemma3" in str(e.value)
    other = tmp_path / "mine"
    other.mkdir()
    shutil.copy(SPECS / "llama3.yaml", other / "my_llama.yaml")
    monkeypatch.setenv("IRON_SPEC_SPECS", str(other))
    assert find("my_llama") == other / "my_llama.yaml"
    with pytest.raises(FileNotFoundError, match="the specs: my_llama"):
        find("qwen3")


@pytest.mark.parametrize("args", [(123,), ("llama3", 5), ("llama3", ["dir"])])
def test_load_refuses_a_spec_or_checkpoint_of_another_type_naming_it(args):
    with pytest.raises(TypeError, match=r"load: (spec|checkpoint) is (int|list), not a str or Path"):
        iron_spec.load(*args)


@pytest.mark.parametrize("method", ["generate", "complete"])
def test_an_unknown_option_names_the_method_called_and_the_options_there_are(toy, method):
    with pytest.raises(TypeError, match=rf"{method}\(\) got an unexpected keyword argument "
                                        r"'nosuch' \(it takes max_new_tokens, "):
        getattr(toy, method)([1, 2, 3], nosuch=1)


def test_embed_refuses_what_is_no_text_counting_from_zero():
    bert = iron_spec.load("bert", random_weights=0, toy=True)
    with pytest.raises(TypeError, match="embed takes a str or an iterable of str, not NoneType"):
        bert.embed(None)
    with pytest.raises(TypeError, match=r"texts\[1\] is int, not str"):
        bert.embed(["a", 1])


def test_a_name_two_specs_share_is_refused_and_a_file_name_still_serves(tmp_path):
    # Copies of one spec (a user's flips) share its name: the pick was silently the first
    # file in order (a new user's trial). A file's own name still picks that file.
    text = (SPECS / "llama3.yaml").read_text()
    for stem in ("a_flip", "b_flip"):
        (tmp_path / f"{stem}.yaml").write_text(text)
    with pytest.raises(ValueError, match="2 specs in .* are named llama3 .a_flip.yaml, "
                                         "b_flip.yaml.; name one by its file"):
        find("llama3", folder=tmp_path)
    assert find("b_flip", folder=tmp_path) == tmp_path / "b_flip.yaml"


def test_load_with_nothing_to_load_says_so_in_the_librarys_words():
    with pytest.raises(TypeError, match=r"load\(\) needs a spec .* or a checkpoint"):
        iron_spec.load()


def test_a_nested_list_prompt_says_what_it_held():
    # A list of lists alone is a list of prompts (complete([[1, 2]]) runs one); one mixing
    # ids and lists is neither.
    model = iron_spec.load("llama3", random_weights=0, toy=True)
    with pytest.raises(TypeError, match="sequence of integer token ids .*; not list of int, list"):
        model.complete([[1, 2], 3])


def test_a_two_turn_chat_runs_only_the_new_turn_on_smollm2(smollm2):
    # Found by a new user's trial: turn 2 ran ('prompt', 0, 46), the whole history again.
    model = iron_spec.load("llama3", smollm2, max_seq_len=256)
    chat = model.chat(system="You are a helpful assistant.")
    first = chat.stream("What is the capital of France?")
    assert first.text() == "The capital of France is Paris."
    prompt = model.encode(chat.messages[:2])
    # The caches hold the prompt and every token drawn but the last (<|im_end|>, never read).
    held = len(prompt) + len(first.result.token_ids) - 1
    assert chat.session.held == held
    before = len(chat.session.calls)
    second = chat.stream("And of Italy?")
    assert second.text() == "The capital of Italy is Rome."
    turn = model.encode(chat.messages[:4])
    calls = chat.session.calls[before:]
    # The turn's own tokens alone (the reply's <|im_end|>, then the new user turn), as one
    # prompt call from the position the caches hold; then the reply's decode steps.
    assert turn[:held] == prompt + first.result.token_ids[:-1]
    assert calls[0] == ("prompt", held, len(turn) - held)
    assert all(kind == "decode" for kind, _, _ in calls[1:])
    assert (second.result.prompt_tokens, second.result.cached_tokens) == (len(turn), held)


def test_a_model_dropped_is_freed_without_the_garbage_collector():
    # Found measuring the suite: a model's versions and its session pointed back at it, so
    # its arrays lived until the collector's rare full pass (a notebook loading one model
    # after another grew by ~0.5 GB a SmolLM2). Nothing points back now: refcounts free it.
    import gc
    import weakref
    gc.collect()
    gc.disable()
    try:
        model = iron_spec.load("llama3", random_weights=0, toy=True, progress=False)
        model.generate([1, 2, 3], max_new_tokens=3)
        chat_session = iron_spec.runtime.session.Session(model.loaded.lm)
        chat_session.logits([4, 5, 6])
        lm, weights = weakref.ref(model.loaded.lm), weakref.ref(model.loaded.lm.lm_head.weight.array)
        del model, chat_session
        assert lm() is None and weights() is None
    finally:
        gc.enable()
