"""The command line as a user meets it: runs, and bad input met with one clear line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from safetensors.numpy import save_file
from typer.testing import CliRunner

from iron_spec.spec.build import load_model
from iron_spec.cli.app import app
from iron_spec.runtime.generation import read_generation_config, sampler_for
from tests.conftest import SPECS

LLAMA = str(SPECS / "llama3.yaml")
runner = CliRunner()


@pytest.fixture()
def toy_checkpoint(tmp_path):
    """A toy-shaped checkpoint directory of the llama3 spec, weights drawn at seed 0."""
    loaded = load_model(LLAMA, random_weights=0, toy=True)
    tensors = {name: np.ascontiguousarray(p.array) for name, p in loaded.lm.named_params()
               if name in loaded.report.sources}
    (tmp_path / "config.json").write_text(json.dumps(loaded.config_json))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path, tensors


def _tokenizer(directory: Path) -> None:
    """A word-level tokenizer.json in ``directory`` (a text prompt needs one, refused before
    the weights load without it), so a run reaches the weights."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    tok = HFTokenizer(WordLevel({"[UNK]": 0, "x": 7}, unk_token="[UNK]"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.save(str(directory / "tokenizer.json"))


def run(*args):
    return runner.invoke(app, ["run", LLAMA, *args])


def test_toy_run_with_no_files():
    result = run("--random-weights", "0", "--toy", "--num-tokens", "16")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.split()) == 16
    assert "tokens/s" in result.output and "time to first token" in result.output


def test_checkpoint_without_tokenizer_refuses_a_text_prompt(toy_checkpoint):
    directory, _ = toy_checkpoint
    # No tokenizer.json: a run on it needs --random-weights' prompt ids; with its own weights
    # it loads and then says what it lacks.
    result = run("--checkpoint", str(directory), "--prompt", "hello")
    assert result.exit_code == 1
    assert "tokenizer" in result.output and "Traceback" not in result.output
    # It names the file it lacks; the --toy runs' random ids are no answer for a checkpoint.
    line = _error_line(result)
    assert f"{directory / 'tokenizer.json'} is missing" in line and "--toy" not in line


def _error_line(result) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [l for l in result.output.splitlines() if l.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0]


def test_missing_and_misshaped_tensors_named_together(toy_checkpoint):
    directory, tensors = toy_checkpoint
    _tokenizer(directory)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    tensors["model.norm.weight"] = np.ones(65, np.float32)
    tensors["model.layers.0.self_attn.q_proj.weight"] = np.ones((64, 63), np.float32)
    save_file(tensors, str(directory / "model.safetensors"))
    line = _error_line(run("--checkpoint", str(directory), "--prompt", "x"))
    assert "missing 1: model.layers.1.mlp.up_proj.weight" in line
    assert f"model.norm.weight in {directory / 'model.safetensors'} is [65]" in line
    assert "model.layers.0.self_attn.q_proj.weight in" in line and "is [64, 63]" in line


def test_truncated_safetensors_names_the_file(toy_checkpoint):
    directory, _ = toy_checkpoint
    _tokenizer(directory)
    path = directory / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    line = _error_line(run("--checkpoint", str(directory), "--prompt", "x"))
    assert str(path) in line and "truncated" in line


def test_not_a_directory_nor_a_hub_id(tmp_path):
    line = _error_line(run("--checkpoint", str(tmp_path / "nope"), "--prompt", "x"))
    assert "nope" in line


def test_max_seq_len_past_the_model(toy_checkpoint):
    result = run("--random-weights", "0", "--toy", "--max-seq-len", "100000")
    assert result.exit_code == 2, result.output  # a flag out of its range: usage
    assert "--max-seq-len 100000 is not within 1..512" in result.output


def test_prompt_past_max_seq_len_is_refused():
    # Random ids and the tokens to draw: counted before anything loads, a usage error.
    result = run("--random-weights", "0", "--toy", "--max-seq-len", "32", "--prompt-len", "30",
                 "--num-tokens", "8")
    assert result.exit_code == 2 and "loading" not in result.output, result.output
    assert "--prompt-len 30 and --num-tokens 8 do not fit --max-seq-len 32: the prompt and the " \
        "tokens drawn after it take 37 positions; give a --num-tokens of at most 3" in \
        " ".join(result.output.replace("│", " ").split())


def test_greedy_on_smollm2(smollm2):
    result = run("--checkpoint", str(smollm2), "--prompt", "The capital of France is",
                 "--num-tokens", "8", "--temperature", "0", "--max-seq-len", "256")
    assert result.exit_code == 0, result.output
    # transformers' greedy continuation on this checkpoint, float32.
    assert result.stdout.startswith(" Paris.\n\nThe answer is:")


def test_chat_turn_ends_at_end_of_turn(smollm2):
    result = run("--checkpoint", str(smollm2), "--chat", "--prompt",
                 "What is the capital of France?", "--temperature", "0", "--max-seq-len", "512")
    assert result.exit_code == 0, result.output
    assert "Paris" in result.stdout
    assert "<|im_end|>" not in result.stdout
    assert "[decode]" in result.output and "tokens/s" in result.output


def test_nan_weights_are_refused_naming_the_tensor(toy_checkpoint):
    directory, tensors = toy_checkpoint
    _tokenizer(directory)
    tensors["model.layers.0.mlp.down_proj.weight"][3, 5] = np.nan
    save_file(tensors, str(directory / "model.safetensors"))
    line = _error_line(run("--checkpoint", str(directory), "--prompt", "x"))
    assert "tensor model.layers.0.mlp.down_proj.weight holds 1 NaN or infinite values" in line


def test_a_corrupt_tokenizer_is_refused_before_the_weights_load(toy_checkpoint):
    directory, _ = toy_checkpoint
    (directory / "tokenizer.json").write_text("{not json")
    line = _error_line(run("--checkpoint", str(directory), "--prompt", "x"))
    assert "tokenizer.json: not a tokenizer" in line


def test_a_spec_for_another_architecture_is_refused(smollm2):
    result = runner.invoke(app, ["run", str(SPECS / "gemma3.yaml"), "--checkpoint", str(smollm2),
                                 "--prompt", "x"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "this spec serves Gemma3ForCausalLM" in result.output
    assert "is LlamaForCausalLM" in result.output


@pytest.mark.parametrize("flag,value", [("--num-tokens", "0"), ("--temperature", "-1"),
                                        ("--temperature", "nan"), ("--top-p", "0"),
                                        ("--max-seq-len", "0")])
def test_bad_flags_are_refused_before_anything_loads(flag, value):
    result = run("--random-weights", "0", "--toy", flag, value)
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert flag.lstrip("-").split("-")[0] in result.output.lower()


def test_a_named_golden_that_is_not_one_is_an_error(tmp_path):
    path = tmp_path / "x.npz"
    np.savez(path, a=np.zeros(3))
    result = runner.invoke(app, ["check", LLAMA, "--random-weights", "0", "--toy",
                                 "--golden", str(path)])
    assert result.exit_code == 1 and "not a golden" in result.output


GOLDEN = Path(__file__).parents[2] / "goldens" / "llama3" / "toy-seed0.npz"


def _edited_golden(tmp_path, **changes):
    with np.load(GOLDEN, allow_pickle=False) as f:
        data = {k: f[k] for k in f.files}
    data.update(changes)
    path = tmp_path / "edited.npz"
    np.savez(path, **data)
    return path


@pytest.mark.parametrize("edit, says", [
    ("truncated", "not a golden"),
    ("ids past the vocabulary", "token id 99999, past this model's vocabulary of 256"),
    ("rows that do not fit", "must be (steps, K)"),
    ("a prompt longer than its tokens", "do not hold a prompt"),
])
def test_a_golden_that_does_not_hold_together_is_refused_naming_it(tmp_path, edit, says):
    # A truncated file was a BadZipFile traceback, and ids past the vocabulary an IndexError
    # naming no file (a new user's trial).
    with np.load(GOLDEN, allow_pickle=False) as f:
        ids, lp = f["top_ids"], f["top_logprobs"]
    if edit == "truncated":
        path = tmp_path / "cut.npz"
        path.write_bytes(GOLDEN.read_bytes()[:3000])
    elif edit == "ids past the vocabulary":
        bad = ids.copy()
        bad[3, 7] = 99999
        path = _edited_golden(tmp_path, top_ids=bad)
    elif edit == "rows that do not fit":
        path = _edited_golden(tmp_path, top_logprobs=lp[:5])
    else:
        path = _edited_golden(tmp_path, prompt_len=np.int64(500))
    result = runner.invoke(app, ["check", LLAMA, "--random-weights", "0", "--toy",
                                 "--golden", str(path)])
    assert result.exit_code == 1 and says in result.output, result.output
    assert "Traceback" not in result.output and str(path.name) in result.output


# --- input that is not what it should be: one line, never a traceback --------------------------

def test_a_prompt_that_is_not_utf8_is_refused_naming_the_byte():
    # Python hands a command line's non-UTF-8 bytes over as lone surrogates (surrogateescape).
    line = _error_line(run("--random-weights", "0", "--toy", "--prompt", "caf\udce9"))
    assert "--prompt is not UTF-8 text: byte 0xe9 at position 3" in line


def test_a_chat_line_that_is_not_utf8_is_skipped_and_the_chat_goes_on(smollm2):
    result = runner.invoke(app, ["run", LLAMA, "--checkpoint", str(smollm2), "--chat",
                                 "--num-tokens", "2", "--max-seq-len", "128"],
                           input=b"caf\xe9\nHi\n")
    assert result.exit_code == 1, result.output  # a turn was refused: said at the end
    assert "error: line 1 is not UTF-8 text: byte 0xe9 at position 3; skipped" in result.output
    assert result.output.count("[prefill]") == 1  # the second line had its turn
    assert "Traceback" not in result.output


def write_generation_config(directory, text: str):
    (directory / "generation_config.json").write_text(text)
    return directory / "generation_config.json"


@pytest.mark.parametrize("settings", [{"do_sample": True, "top_k": None},
                                      {"do_sample": True, "temperature": None, "top_p": None},
                                      {"do_sample": None}])
def test_null_generation_settings_are_unset(toy_checkpoint, settings):
    directory, _ = toy_checkpoint
    write_generation_config(directory, json.dumps(settings))
    result = run("--checkpoint", str(directory), "--random-weights", "0", "--num-tokens", "4")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.split()) == 4


def _sampling(loaded, temperature, top_k, top_p, seed):
    return sampler_for(*read_generation_config(loaded.directory), seed=seed,
                       temperature=temperature, top_k=top_k, top_p=top_p)


def test_null_generation_settings_leave_their_warper_off_as_transformers(tmp_path):
    loaded = SimpleNamespace(directory=tmp_path)
    write_generation_config(tmp_path, json.dumps({"do_sample": True, "top_k": None,
                                                  "temperature": None, "top_p": None}))
    s = _sampling(loaded, None, None, None, 0)
    assert (s.temperature, s.top_k, s.top_p) == (1.0, None, 1.0)
    # absent: GenerationConfig's defaults (top_k 50); given: as given; no do_sample: greedy
    write_generation_config(tmp_path, json.dumps({"do_sample": True, "temperature": 0.5}))
    s = _sampling(loaded, None, None, None, 0)
    assert (s.temperature, s.top_k, s.top_p) == (0.5, 50, 1.0)
    write_generation_config(tmp_path, json.dumps({"do_sample": None, "temperature": 0.5}))
    assert _sampling(loaded, None, None, None, 0).greedy


@pytest.mark.parametrize("text,says", [('{"do_sample": true, "top_k": "many"}',
                                        "top_k is 'many' (text), not a whole number"),
                                       ('{"do_sample": true, "top_p": 0}', "top_p is 0, not a finite number above 0 and at most 1")])
def test_a_bad_generation_config_is_refused_naming_the_file(toy_checkpoint, text, says):
    directory, _ = toy_checkpoint
    path = write_generation_config(directory, text)
    line = _error_line(run("--checkpoint", str(directory), "--random-weights", "0"))
    assert line.startswith(f"error: {path}: ") and says in line


def test_check_fits_its_prompt_chunk_to_a_short_context():
    def check(length, seed=1):
        return runner.invoke(app, ["check", LLAMA, "--random-weights", str(seed), "--toy",
                                   "--max-seq-len", str(length)])
    # A prompt of a chunk and 8, and 39 tokens after it (40 KL steps): a chunk of 1 at least.
    for length in (1, 32, 47):
        result = check(length)
        assert result.exit_code == 2 and "Traceback" not in result.output
        assert f"check needs a context of at least 48, and --max-seq-len is {length}" in \
            result.output
    result = check(62)  # the toy's chunk of 16 needs 63: 15 it is
    assert result.exit_code == 3, result.output  # seed 1: no golden, not verified
    assert "prompt chunk 15 (the spec's 16, shrunk to fit)" in result.output
    assert "8/8 self-consistency checks passed" in result.stdout
    # The golden's prompt is what it is: 24 tokens and 39 after them.
    result = check(62, seed=0)
    assert result.exit_code == 1
    assert "check needs a --max-seq-len of at least 63, not 62: it runs a prompt of 24 " \
           "tokens (the golden's)" in result.output
    assert "10/10 checks passed: verified against transformers" in check(63, seed=0).stdout


def test_the_default_num_tokens_fits_what_the_context_leaves():
    # 24 prompt ids in a context of 32: 9 drawn (the last needs no room), not 64 refused.
    result = run("--random-weights", "0", "--toy", "--max-seq-len", "32")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.split()) == 9
    assert "[the text stopped where the context (max_seq_len 32; --max-seq-len up to 512 " \
        "gives more) is full]" in result.output


def test_the_default_num_tokens_fits_after_a_text_prompt(smollm2):
    result = run("--checkpoint", str(smollm2), "--prompt", "Hi", "--max-seq-len", "32",
                 "--temperature", "0")
    assert result.exit_code == 0, result.output
    assert "[decode]  31 tokens" in result.output  # 1 prompt token, 32 drawn


def test_a_prompt_past_the_context_is_refused_before_its_ids_print():
    result = run("--random-weights", "0", "--toy", "--prompt-len", "100000")
    assert result.exit_code == 2, result.output  # counted before anything loads: usage
    assert "--prompt-len 100000 does not fit the model's own context 512; give at most 512" in \
        " ".join(result.output.replace("│", " ").split())
    assert "prompt ids" not in result.output and len(result.output) < 1000


def test_a_mis_shaped_tensor_names_the_checkpoints_side_and_the_specs(toy_checkpoint):
    # Found by a new user's trial: "X is [96, 64], the model's X is [128, 64]" said neither
    # which file holds X nor where the spec's [128, 64] comes from. run, check and show alike.
    directory, tensors = toy_checkpoint
    _tokenizer(directory)
    name = "model.layers.0.mlp.up_proj.weight"
    tensors[name] = np.ones((96, 64), np.float32)
    save_file(tensors, str(directory / "model.safetensors"))
    said = (f"checkpoint tensor {name} in {directory / 'model.safetensors'} is [96, 64]; the "
            f"spec expects {name} to be [128, 64] from intermediate_size=128, hidden_size=64")
    assert said in _error_line(run("--checkpoint", str(directory), "--prompt", "x"))
    check = runner.invoke(app, ["check", LLAMA, "--checkpoint", str(directory)])
    assert check.exit_code == 1 and said in check.output, check.output
    show = runner.invoke(app, ["show", LLAMA, "--checkpoint", str(directory)])
    assert show.exit_code == 1 and f"mis-shaped: {said}" in show.output, show.output


# Found by a new user's trial: each of these was said only after the weights loaded and both
# plans compiled ("[loading weights]", "[compiling ...]" first); a local checkpoint's own
# files, and the flags, refuse them before anything loads.
@pytest.mark.parametrize("case", ["no_tokenizer_prompt", "no_tokenizer_chat",
                                  "temperature_negative", "toy_without_seed", "toy_prompt"])
def test_refused_before_anything_loads(toy_checkpoint, case):
    directory, _ = toy_checkpoint
    if case == "temperature_negative":
        (directory / "generation_config.json").write_text(json.dumps(
            {"do_sample": True, "temperature": -3}))
    args = {"no_tokenizer_prompt": ["--checkpoint", str(directory), "--prompt", "hello"],
            "no_tokenizer_chat": ["--checkpoint", str(directory), "--chat"],
            "temperature_negative": ["--checkpoint", str(directory), "--random-weights", "0",
                                     "--num-tokens", "2"],
            "toy_without_seed": ["--toy", "--num-tokens", "2"],
            "toy_prompt": ["--toy", "--random-weights", "0", "--prompt", "hello"]}[case]
    result = run(*args)
    assert "loading" not in result.output and "compiling" not in result.output, result.output
    says = {"no_tokenizer_prompt": f"--prompt needs the checkpoint's tokenizer, and "
                                   f"{directory / 'tokenizer.json'} is missing",
            "no_tokenizer_chat": f"--chat needs the checkpoint's tokenizer, and "
                                 f"{directory / 'tokenizer.json'} is missing",
            "temperature_negative": f"{directory / 'generation_config.json'}: temperature is "
                                    "-3, not a finite number at least 0",
            "toy_without_seed": "--toy needs --random-weights SEED",
            "toy_prompt": "--prompt and --chat need a checkpoint's tokenizer.json"}[case]
    # flags that do not go together are a usage error; a checkpoint's own files refuse it
    assert result.exit_code == (2 if case.startswith("toy") else 1), result.output
    assert says in result.output, result.output


def test_a_greedy_run_reads_no_sampling_setting_before_loading(toy_checkpoint):
    # A broken temperature refuses sampling only: --temperature 0 reads none of it.
    directory, _ = toy_checkpoint
    (directory / "generation_config.json").write_text(json.dumps({"temperature": -3}))
    result = run("--checkpoint", str(directory), "--random-weights", "0", "--temperature",
                 "0", "--num-tokens", "2")
    assert result.exit_code == 0, result.output
