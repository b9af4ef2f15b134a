"""``iron-spec run`` as users of transformers and llama.cpp expect it: specs by name, fresh
seeds, stop strings, prompts from files and stdin, --system, end-of-text notices, JSON with
log-probabilities, a chat turn too long refused alone."""

from __future__ import annotations

import ctypes
import json
import os
import re

import numpy as np
import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from typer.testing import CliRunner

import iron_spec
from iron_spec.cli.app import app
from iron_spec.operators import threads
from tests.conftest import ROOT

runner = CliRunner()
TOY = ["--random-weights", "0", "--toy"]
GOLDEN = np.load(ROOT / "tests" / "goldens" / "llama3" / "toy-seed0.npz")
# transformers 5.24's greedy chat reply on SmolLM2-135M-Instruct (float32, system "You are
# a helpful assistant.", apply_chat_template with the generation prompt): 7 tokens, then
# <|im_end|>.
PARIS = "The capital of France is Paris."


def run(*args, **kwargs):
    return runner.invoke(app, ["run", *args], **kwargs)


def test_a_spec_by_name_from_another_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run("llama3", *TOY, "--num-tokens", "4")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.split()) == 4
    result = run("lama3", *TOY)
    assert result.exit_code == 1 and "did you mean llama3?" in result.output


def test_a_sampled_run_says_its_fresh_seed_and_the_seed_replays_it():
    first = run("llama3", *TOY, "--num-tokens", "16", "--temperature", "1")
    assert first.exit_code == 0, first.output
    seed = int(re.search(r"\[seed (\d+): --seed \1 draws this text again\]", first.output)[1])
    again = run("llama3", *TOY, "--num-tokens", "16", "--temperature", "1", "--seed", str(seed))
    assert again.stdout == first.stdout
    # A greedy run draws nothing at random: no seed to give.
    assert "[seed" not in run("llama3", *TOY, "--num-tokens", "2", "--temperature", "0").output


def test_json_gives_ids_and_transformers_log_probabilities():
    # The toy's prompt ids are the golden's (seed 0); its tokens after them are transformers'
    # greedy ones, with their log-probabilities.
    result = run("llama3", *TOY, "--num-tokens", "8", "--temperature", "0", "--json")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    n = int(GOLDEN["prompt_len"])
    assert record["token_ids"] == GOLDEN["tokens"][n:n + 8].tolist()
    assert [t["id"] for t in record["tokens"]] == record["token_ids"]
    np.testing.assert_allclose([t["logprob"] for t in record["tokens"]],
                               GOLDEN["top_logprobs"][:8, 0], atol=1e-4)
    assert record["finish_reason"] == "length" and record["seed"] is None
    assert record["prompt_tokens"] == n


def test_prompt_ids_continue_as_transformers_does(tmp_path):
    # The golden's prompt ids given by hand: transformers' greedy tokens after them.
    n = int(GOLDEN["prompt_len"])
    ids = ",".join(str(i) for i in GOLDEN["tokens"][:n])
    result = run("llama3", *TOY, "--prompt-ids", ids, "--num-tokens", "8", "--temperature",
                 "0", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["token_ids"] == GOLDEN["tokens"][n:n + 8].tolist()
    # and a checkpoint with no tokenizer.json (a save_pretrained toy's) runs on them too
    from iron_spec.spec.loader import load_spec
    (tmp_path / "config.json").write_text(json.dumps(load_spec(ROOT / "specs" / "llama3.yaml")
                                                     .get("toy", "config")))
    result = run("llama3", "--checkpoint", str(tmp_path), "--random-weights", "0",
                 "--prompt-ids", "5 6 7", "--num-tokens", "3")
    assert result.exit_code == 0, result.output
    assert "prompt ids: 5 6 7" in result.output


@pytest.mark.parametrize("args,says", [
    (["--prompt-ids", "1,x"], "--prompt-ids: 'x' is not a token id"),
    (["--prompt-ids", " , "], "--prompt-ids is empty"),
    (["--prompt-ids", "1,,2"], "--prompt-ids '1,,2': an empty entry"),  # an id left out
    (["--prompt-ids", "1, 2,"], "--prompt-ids '1, 2,': an empty entry"),
    (["--prompt-ids", "1", "--chat"], "--prompt-ids is the prompt"),
    (["--prompt-ids", "1,2", "--num-tokens", "100000"],
     "the 2 --prompt-ids and --num-tokens 100000 do not fit"),
    (["--system", "be brief"], "--system is the system message of a --chat"),
    (["--prompt", "x", "--prompt-file", "f"], "not both"),
    (["--stop", ""], "would stop before anything"),
    (["--min-p", "1.5"], "1.5 is not a finite number >= 0 and <= 1"),
    (["--presence-penalty", "9"], "9.0 is not a finite number >= -2"),  # OpenAI's range
    (["--repetition-penalty", "0"], "0.0 is not a finite number > 0"),
])
def test_bad_usage_exits_2(args, says):
    result = run("llama3", *TOY, *args)
    assert result.exit_code == 2, result.output
    assert says in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("where", ["toy", "checkpoint"])
def test_prompt_ids_past_the_vocabulary_are_refused_before_anything_loads(where, tmp_path):
    # Found by a new user's trial: --prompt-ids 99999999 refused only after load and compile.
    from tests.conftest import toy_config
    at = TOY if where == "toy" else ["--checkpoint", str(toy_config(tmp_path, "llama3"))]
    result = run("llama3", *at, "--prompt-ids", "1,99999999")
    assert result.exit_code == 1, result.output
    assert result.output == ("error: --prompt-ids: token id 99999999 at position 1 is outside "
                             "the vocabulary [0, 256) (" + ("the toy's" if where == "toy" else
                                                           "config.json's") + " vocab_size)\n")


@pytest.mark.parametrize("seed", [str(10**23), str(2**64), "1e23", "1.5", "x"])
def test_a_seed_that_is_no_64_bit_whole_number_is_a_usage_error(seed):
    result = run("llama3", *TOY, "--seed", seed, env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--seed'" in result.output
    if seed.isdigit():  # in range is 0 to 2**64 - 1, as the sampler's own check
        assert "less than or equal to 18446744073709551615" in result.output
    else:
        assert "valid integer" in result.output


def test_a_missing_prompt_file_is_refused(tmp_path):
    result = run("llama3", *TOY, "--prompt-file", str(tmp_path / "nope.txt"))
    assert result.exit_code == 1 and "nope.txt: no such file" in result.output


def test_an_image_that_is_a_directory_is_a_usage_error(tmp_path):
    # Found by a new user's trial: "--image DIR: no such file".
    toy = os.path.join(os.path.dirname(__file__), "..", "..", "checkpoints", "gemma3-vision-toy")
    result = run("gemma3", "--checkpoint", toy, "--image", str(tmp_path), "--chat",
                 "--prompt", "x", env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert f"--image {tmp_path} is a directory, not a file" in result.output


def test_a_prompt_file_that_is_a_directory_is_a_usage_error(tmp_path):
    result = run("llama3", *TOY, "--prompt-file", str(tmp_path), env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert f"--prompt-file {tmp_path} is a directory" in result.output
    assert "no such file" not in result.output


@pytest.fixture()
def worded(tmp_path):
    """A toy checkpoint with a word-level tokenizer (``t0`` ... ``t255``, one id each) and a
    chat template, weights drawn at seed 0."""
    from safetensors.numpy import save_file
    model = iron_spec.load("llama3", random_weights=0, toy=True)
    loaded = model.loaded
    tensors = {name: np.ascontiguousarray(p.array) for name, p in loaded.lm.named_params()
               if name in loaded.report.sources}
    (tmp_path / "config.json").write_text(json.dumps(loaded.config_json))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    tok = HFTokenizer(WordLevel({f"t{i}": i for i in range(256)}, unk_token="t0"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": (
        "{% for m in messages %}{{ m['content'] }} {% endfor %}")}))
    return tmp_path, model


def test_the_end_of_text_as_the_first_token_drawn_is_said(worded):
    directory, model = worded
    first = model.complete([1, 2, 3], max_new_tokens=1, temperature=0).token_ids[0]
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": first}))
    result = run("llama3", "--checkpoint", str(directory), "--prompt", "t1 t2 t3")
    assert result.exit_code == 0, result.output
    assert result.stdout == "\n"
    assert f"[end of text: the first token drawn was the end-of-text token {first}, so " \
           "there is no text]" in result.output


def test_a_prompt_from_a_file_or_stdin_is_the_prompt(worded, tmp_path):
    directory, _ = worded
    (tmp_path / "p.txt").write_text("t5 t6 t7")
    given = run("llama3", "--checkpoint", str(directory), "--prompt", "t5 t6 t7",
                "--num-tokens", "5")
    assert given.exit_code == 0, given.output
    assert len(given.stdout.split()) == 5
    for args, stdin in ((["--prompt-file", str(tmp_path / "p.txt")], None),
                        (["--prompt-file", "-"], "t5 t6 t7"), (["--prompt", "-"], "t5 t6 t7")):
        result = run("llama3", "--checkpoint", str(directory), *args, "--num-tokens", "5",
                     input=stdin)
        assert result.exit_code == 0, result.output
        assert result.stdout == given.stdout, args


def test_stop_strings_cut_the_text_before_them(worded):
    directory, _ = worded
    whole = run("llama3", "--checkpoint", str(directory), "--prompt", "t5 t6", "--num-tokens",
                "12").stdout.rstrip("\n")
    word = whole.split()[3]  # the fourth word drawn
    cut = run("llama3", "--checkpoint", str(directory), "--prompt", "t5 t6", "--num-tokens",
              "12", "--stop", word, "--json")
    record = json.loads(cut.stdout)
    assert record["text"] == whole[:whole.index(word)]
    assert record["finish_reason"] == "stop" and record["stop"] == word


def test_a_chat_turn_too_long_is_refused_alone(worded):
    directory, model = worded
    long_line = " ".join(["t9"] * 40)
    result = run("llama3", "--checkpoint", str(directory), "--chat", "--max-seq-len", "32",
                 "--num-tokens", "2", input=f"t1 t2\n{long_line}\nt3 t4\n")
    # Found by a fresh user's trial: the chat went on but exited 0, as if every turn had
    # been answered; a shell user reads a failure from the status (as `set -e` does).
    assert result.exit_code == 1, result.output
    assert "is refused, the conversation kept as it was" in result.output
    assert result.output.count("[prefill]") == 2  # the turns before and after it ran
    assert result.stderr.rstrip().endswith("error: 1 turn of this chat was refused (line 2 of "
                                           "stdin)"), result.stderr
    # In the library: the refused turn changes nothing, and the next one goes on.
    chat = iron_spec.load("llama3", directory, max_seq_len=32).chat()
    chat.send("t1 t2", max_new_tokens=2)
    messages, held = list(chat.messages), chat.session.held
    with pytest.raises(iron_spec.ContextFull):
        chat.send(long_line)
    assert chat.messages == messages and chat.session.held == held
    chat.send("t3", max_new_tokens=2)
    assert [m["content"] for m in chat.messages][:3] == ["t1 t2", messages[1]["content"], "t3"]


def test_a_chat_with_refused_turns_ends_non_zero_and_each_refusal_changes_nothing(worded):
    directory, _ = worded
    # Line 2 is no UTF-8, line 4 past the context: both refused, the chat going on; the
    # turns answered are those of a chat never sent them (greedy: the same tokens).
    turns = b"t1 t2\n\xff t3\nt4 t5\n" + b" ".join([b"t9"] * 40) + b"\nt6\n"
    flags = ["llama3", "--checkpoint", str(directory), "--chat", "--max-seq-len", "32",
             "--num-tokens", "2", "--temperature", "0", "--json"]
    result = run(*flags, input=turns)
    assert result.exit_code == 1, result.output
    assert "line 2" in result.stderr and "is refused, the conversation kept" in result.stderr
    assert "error: 2 turns of this chat were refused (lines 2, 4 of stdin)" in result.stderr
    clean = run(*flags, input="t1 t2\nt4 t5\nt6\n")
    assert clean.exit_code == 0, clean.output
    assert [json.loads(l)["token_ids"] for l in result.stdout.splitlines()] == \
        [json.loads(l)["token_ids"] for l in clean.stdout.splitlines()]
    assert len(clean.stdout.splitlines()) == 3


@pytest.mark.parametrize("flags, stdin, says", [
    (["--prompt", ""], None, "--prompt is empty; give some text"),
    (["--prompt", "-"], "", "the prompt on stdin is empty, its end before any text; give some"),
    (["--prompt-file", "-"], "", "the prompt on stdin is empty, its end before any text"),
    (["--prompt-file", "EMPTY"], None, "empty.txt is empty; give some text"),
    (["--chat", "--prompt", ""], None, "--prompt is empty; give some text"),
    (["--prompt", "   "], None, "--prompt is empty but for white space; give some text"),
    (["--prompt", "-"], " \n\n", "the prompt on stdin is empty but for white space; give some")])
def test_an_empty_prompt_is_a_usage_error_before_anything_loads(worded, flags, stdin, says):
    # Found by a new user's trial: refused with exit 1 only once the weights had loaded and
    # both plans compiled ("the prompt encodes to no tokens"), where --stop '' is exit 2 at once.
    directory, _ = worded
    (directory / "empty.txt").write_text("")
    flags = [str(directory / "empty.txt") if f == "EMPTY" else f for f in flags]
    result = run("llama3", "--checkpoint", str(directory), *flags, input=stdin)
    assert result.exit_code == 2, result.output
    assert says in " ".join(result.output.replace("│", " ").split()), result.output
    assert "loading" not in result.output and "compiling" not in result.output


@pytest.mark.parametrize("stdin", ["", "\n   \n"])
def test_a_chat_with_no_turns_on_stdin_is_a_usage_error_before_anything_loads(worded, stdin):
    # Found by a new user's trial: `: | iron-spec run ... --chat` loaded, compiled, printed
    # "> " and exited 0.
    directory, _ = worded
    result = run("llama3", "--checkpoint", str(directory), "--chat", input=stdin)
    assert result.exit_code == 2, result.output
    assert "--chat: no turns on stdin (its end before any line of text); give the turns one a " \
        "line on stdin, or the first with --prompt" in " ".join(
            result.output.replace("│", " ").split()), result.output
    assert "loading" not in result.output and "> " not in result.output


def test_a_chat_s_turns_read_before_loading_are_each_answered(worded):
    directory, _ = worded
    result = run("llama3", "--checkpoint", str(directory), "--chat", "--num-tokens", "2",
                 input="\nt1 t2\nt3\n")
    assert result.exit_code == 0, result.output
    assert result.stderr.count("[prefill]") == 2, result.stderr


def test_a_chat_turn_past_the_model_s_own_context_offers_a_new_conversation(worded):
    # Found by a new user's trial: "load with a larger max_seq_len=" where the context was
    # already the model's own (max_position_embeddings 512 here).
    directory, _ = worded
    chat = iron_spec.load("llama3", directory).chat()
    assert chat.model.max_seq_len == 512
    with pytest.raises(iron_spec.ContextFull) as e:
        chat.send(" ".join(["t9"] * 600))
    assert str(e.value) == (
        "this turn makes the conversation 600 tokens, past max_seq_len 512; it is refused, the "
        f"conversation kept as it was (max_seq_len 512 is the model's own context ({directory}"
        "/config.json: max_position_embeddings; no larger one can be loaded): send a shorter "
        "turn, or start a new conversation)")
    shorter = iron_spec.load("llama3", directory, max_seq_len=32).chat()
    with pytest.raises(iron_spec.ContextFull, match=r"send a shorter one, or load with a "
                       r"larger max_seq_len=, up to the model's own context 512\)$"):
        shorter.send(" ".join(["t9"] * 40))
    result = run("llama3", "--checkpoint", str(directory), "--prompt",
                 " ".join(["t9"] * 505), "--temperature", "0")
    assert result.exit_code == 0, result.output
    assert "[the text stopped where the context (max_seq_len 512, the model's own) is full]" \
        in result.output


def test_chat_with_a_system_message_replies_as_transformers(smollm2):
    result = run("llama3", "--checkpoint", str(smollm2), "--chat", "--system",
                 "You are a helpful assistant.", "--prompt", "What is the capital of France?",
                 "--max-seq-len", "256")
    assert result.exit_code == 0, result.output
    assert result.stdout == PARIS + "\n"
    assert "[end of text: the model drew its end-of-text token 2]" in result.output


def test_a_chats_second_turn_runs_only_its_own_tokens(smollm2):
    # Found by a new user's trial: --chat printed [prefill] 24 / 46 / 71 tokens, every turn
    # running the whole conversation again.
    result = run("llama3", "--checkpoint", str(smollm2), "--chat", "--system",
                 "You are a helpful assistant.", "--max-seq-len", "256",
                 input="What is the capital of France?\nAnd of Italy?\n")
    assert result.exit_code == 0, result.output
    assert result.stdout == PARIS + "\nThe capital of Italy is Rome.\n"
    prefill = [l for l in result.stderr.splitlines() if l.startswith("[prefill]")]
    assert prefill[0].startswith("[prefill] 27 tokens, time to first token")
    assert prefill[1].startswith("[prefill] 49 tokens (15 run, 34 from the KV cache), time")


def test_threads_sets_what_openblas_and_the_decode_pool_run_on(monkeypatch):
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")  # the pool's count, restored after
    libraries = threads._openblas_libraries()
    assert libraries, "numpy's OpenBLAS is loaded"
    lib = ctypes.CDLL(libraries[0])
    get = next(getattr(lib, n) for n in ("openblas_get_num_threads",
                                         "scipy_openblas_get_num_threads64_") if hasattr(lib, n))
    before = get()
    try:
        assert threads.set_threads(1) == 1
        assert get() == 1 and os.environ["OPENBLAS_NUM_THREADS"] == "1"
    finally:
        threads.set_threads(before)
    with pytest.raises(ValueError, match="threads 0 is not a whole number >= 1"):
        threads.set_threads(0)


def test_threads_past_the_cores_are_cut_to_them_and_it_says_so(monkeypatch):
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", os.environ.get("OPENBLAS_NUM_THREADS", "1"))
    cores = len(os.sched_getaffinity(0))
    result = run("llama3", *TOY, "--num-tokens", "2", "--threads", "1000")
    assert result.exit_code == 0, result.output
    assert (f"threads 1000 asked for, {cores} used: this process may run on {cores} core"
            in result.stderr), result.stderr
    assert os.environ["OPENBLAS_NUM_THREADS"] == str(cores)
    quiet = run("llama3", *TOY, "--num-tokens", "2", "--threads", "1")
    assert "asked for" not in quiet.stderr


def test_the_log_handler_is_gone_when_the_command_ends():
    """run prints the iron_spec logger's lines while it runs; it leaves the logger as it found
    it, so a second run in the same process prints each line once, not twice."""
    import logging
    log = logging.getLogger("iron_spec")
    before = (list(log.handlers), log.level)
    first = run("llama3", *TOY, "--num-tokens", "2")
    second = run("llama3", *TOY, "--num-tokens", "2")
    assert first.exit_code == second.exit_code == 0, second.output
    assert (list(log.handlers), log.level) == before
    line = next(l for l in first.stderr.splitlines() if l.startswith("KV cache"))
    assert second.stderr.splitlines().count(line) == 1, second.stderr


def test_a_reply_interrupted_is_dropped_and_the_chat_goes_on(worded, monkeypatch):
    # Found by trying Ctrl-C mid-reply: the stream ended as finish_reason "length" and the
    # conversation kept the half reply; the CLI's chat ended with a traceback-less "Aborted!".
    directory, _ = worded
    chat = iron_spec.load("llama3", directory).chat()
    stream = chat.stream("t1 t2", max_new_tokens=8, temperature=0)
    next(iter(stream))
    stream.close()
    assert stream.result.finish_reason == "interrupted" and chat.messages == []
    chat.send("t3", max_new_tokens=2, temperature=0)
    assert [m["role"] for m in chat.messages] == ["user", "assistant"]
    from iron_spec.cli import run as run_module

    show, seen = run_module._Output.show, []

    def interrupted_once(self, stream, shown=None):
        seen.append(1)
        if len(seen) == 1:
            next(iter(stream))
            raise KeyboardInterrupt
        return show(self, stream, shown)

    monkeypatch.setattr(run_module._Output, "show", interrupted_once)
    result = run("llama3", "--checkpoint", str(directory), "--chat", "--num-tokens", "2",
                 input="t1 t2\nt3 t4\n")
    assert result.exit_code == 0, result.output
    assert "(interrupted: that reply is dropped, the conversation goes on" in result.output
    assert len(seen) == 2  # the next turn ran


# Found by a new user's trial: chat.send(on_finish=...) and chat.send(session=None) were a
# TypeError from inside Model.stream ("got multiple values for keyword argument").
def test_a_chat_takes_on_finish_after_its_own_and_refuses_a_session(worded):
    directory, _ = worded
    chat = iron_spec.load("llama3", directory).chat()
    got = []
    chat.send("t1 t2", max_new_tokens=2, temperature=0, on_finish=got.append)
    assert [m["role"] for m in chat.messages] == ["user", "assistant"]
    assert len(got) == 1 and got[0].text == chat.messages[-1]["content"]
    before, held = list(chat.messages), chat.session.held
    for bad, says in (({"session": None}, "a chat runs on its own session"),
                      ({"on_finish": 5}, "on_finish")):
        with pytest.raises(TypeError, match=says):
            chat.send("t3", max_new_tokens=2, **bad)
        assert chat.messages == before and chat.session.held == held


@pytest.mark.parametrize("written, prompt", [
    ("Tell me a story.\n", "Tell me a story."),     # an editor's last newline is not the prompt's
    ("Tell me a story.", "Tell me a story."),
    ("Two lines.\n\n", "Two lines.\n"),              # one dropped, as llama.cpp's -f: a blank line kept
    ("Windows line.\r\n", "Windows line.\r")])
def test_a_prompt_files_one_trailing_newline_is_dropped_as_llama_cpps_f_drops_it(tmp_path, written,
                                                                                  prompt):
    from iron_spec.cli.run import _prompt_text
    path = tmp_path / "p.txt"
    path.write_bytes(written.encode())
    assert _prompt_text(None, path) == prompt
    assert _prompt_text("Tell me a story.\n", None) == "Tell me a story.\n"  # --prompt is as typed


def test_a_chat_template_that_is_not_jinja_is_refused_before_the_first_turn(worded):
    # Found by a new user's trial: a template with a syntax error was refused at every turn,
    # after the user had typed it, never when the chat began.
    directory, _ = worded
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": (
        "{% for m in messages %}{{ m['content'] }}\n{% if m %}")}))  # two blocks never closed
    result = run("llama3", "--checkpoint", str(directory), "--chat", "--num-tokens", "2",
                 input="t1 t2\n", env={"COLUMNS": "300"})
    assert result.exit_code != 0
    assert "tokenizer_config.json" in result.output and "line 2" in result.output
    assert "> " not in result.output  # no prompt for a turn was ever shown
    assert run("llama3", "--checkpoint", str(directory), "--prompt", "t1 t2",
               "--num-tokens", "2").exit_code == 0  # a plain prompt needs no template


def test_a_config_key_transformers_leaves_unread_is_said_once(worded):
    # Found by a new user's trial: run said it twice (its context check before the load read
    # config.json too).
    directory, _ = worded
    config = json.loads((directory / "config.json").read_text())
    config["rms_norm_epss"] = config.pop("rms_norm_eps")  # a typo: transformers keeps it
    # as an attribute, unread, and builds the model with rms_norm_eps's default
    (directory / "config.json").write_text(json.dumps(config))
    result = run("llama3", "--checkpoint", str(directory), "--prompt", "t1 t2", "--num-tokens",
                 "2", env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert result.output.count("unread, as transformers leaves them") == 1, result.output
    assert "rms_norm_epss (did you mean rms_norm_eps?)" in result.output


def test_a_chat_turn_with_an_image_on_a_text_model_is_refused_as_generate_refuses_it(worded,
                                                                                    tmp_path):
    # Found by a new user's trial: chat().send(text, images=[...]) on a text model dropped the
    # images unread (the file never opened), where generate refuses them.
    directory, _ = worded
    model = iron_spec.load(checkpoint=str(directory))
    chat = model.chat()
    for given in ({"images": [str(tmp_path / "nowhere.png")]}, {"audio": ["clip.wav"]}):
        with pytest.raises(ValueError, match="this model has no (image|audio) tower"):
            chat.send("t1 t2", max_new_tokens=2, **given)
    assert chat.messages == []  # nothing kept
    assert chat.send("t1 t2", max_new_tokens=2)


@pytest.mark.parametrize("flag, name, content, says", [
    ("--image", "photo.jpg", b"not an image", "not an image Pillow can read"),
    ("--audio", "clip.wav", b"not a sound", "not a sound soundfile can read")])
def test_an_image_or_sound_that_cannot_be_read_is_refused_before_the_weights_load(
        tmp_path, flag, name, content, says):
    # Found by a new user's trial: an image that is no image was refused only after the
    # weights loaded and the towers compiled (minutes on a large model).
    if flag == "--audio":
        pytest.importorskip("soundfile")
    path = tmp_path / name
    path.write_bytes(content)
    result = run("llama3", *TOY, "--prompt", "x", flag, str(path), env={"COLUMNS": "300"})
    assert result.exit_code == 1, result.output
    assert says in result.output and str(path) in result.output
    assert "loading" not in result.output


def test_a_chat_s_image_goes_with_the_first_turn_kept_not_a_refused_or_blank_one(tmp_path):
    # Found by a fresh user's trial: --image went with stdin's line 1 whatever it was; a
    # blank line or a refused turn there took the image with it, a refusal that changed the
    # chat.
    from PIL import Image
    toy = ROOT / "tests" / "checkpoints" / "gemma3-vision-toy"
    golden = np.load(ROOT / "tests" / "goldens" / "towers" / "gemma3" / "gemma3-vision-toy.npz")
    picture = tmp_path / "picture.png"
    Image.fromarray(golden["image"]).save(picture)
    result = run("--checkpoint", str(toy), "--image", str(picture), "--chat", "--num-tokens",
                 "1", "--temperature", "0", "--json", input=b"\n\xff\nWhat is it?\n")
    assert result.exit_code == 1, result.output
    assert "error: 1 turn of this chat was refused (line 2 of stdin)" in result.stderr
    model = iron_spec.load("gemma3", toy)
    assert json.loads(result.stdout)["prompt_tokens"] == len(model.encode(
        [{"role": "user", "content": [{"type": "image", "image": str(picture)},
                                      {"type": "text", "text": "What is it?"}]}]))
