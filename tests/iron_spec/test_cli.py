"""The command line as a user meets it: runs, and bad input met with one clear line."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import save_file
from typer.testing import CliRunner

from iron_spec.build import load_model
from iron_spec.cli import app
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


def _error_line(result) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [l for l in result.output.splitlines() if l.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0]


def test_missing_and_misshaped_tensors_named_together(toy_checkpoint):
    directory, tensors = toy_checkpoint
    del tensors["model.layers.1.mlp.up_proj.weight"]
    tensors["model.norm.weight"] = np.ones(65, np.float32)
    tensors["model.layers.0.self_attn.q_proj.weight"] = np.ones((64, 63), np.float32)
    save_file(tensors, str(directory / "model.safetensors"))
    line = _error_line(run("--checkpoint", str(directory), "--prompt", "x"))
    assert "missing 1: model.layers.1.mlp.up_proj.weight" in line
    assert "model.norm.weight is [65]" in line
    assert "model.layers.0.self_attn.q_proj.weight is [64, 63]" in line


def test_truncated_safetensors_names_the_file(toy_checkpoint):
    directory, _ = toy_checkpoint
    path = directory / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    line = _error_line(run("--checkpoint", str(directory), "--prompt", "x"))
    assert str(path) in line and "truncated" in line


def test_not_a_directory_nor_a_hub_id(tmp_path):
    line = _error_line(run("--checkpoint", str(tmp_path / "nope"), "--prompt", "x"))
    assert "nope" in line


def test_max_seq_len_past_the_model(toy_checkpoint):
    line = _error_line(run("--random-weights", "0", "--toy", "--max-seq-len", "100000"))
    assert "--max-seq-len 100000 is not within 1..512" in line


def test_prompt_past_max_seq_len_is_refused():
    line = _error_line(run("--random-weights", "0", "--toy", "--max-seq-len", "32",
                           "--prompt-len", "30", "--num-tokens", "8"))
    assert "30 tokens and 7 more to draw do not fit max_seq_len 32" in line


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
    assert result.exit_code == 2 and "not a golden" in result.output
