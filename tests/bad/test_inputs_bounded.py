"""Input bounded before it costs, and refusals that say what they are (issue 30): a prompt
far past the context is refused before it is tokenized whole (found: a 20 MB --prompt-file
took 3.3 GB and 25 s before "does not fit the context"), a 60 MB chat line is refused alone
and the chat goes on, ``examples:`` that hold no hub ids say the path came from
``examples``, the memory budget's refusal names the file, the keys and lint's figure, a RoPE
value of the wrong type is said as that (not as an unread key with advice that runs another
model), a missing shard is named, a 7 MB one-line error is cut, a spec's own limits are the
CLI's."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import save_file
from typer.testing import CliRunner

import iron_spec
from iron_spec.library.api import ContextFull
from iron_spec.cli.app import app
from iron_spec.spec.errors import MOST
from iron_spec.runtime.tokenizer import PIECE, Tokenizer
from tests.bad.corpus import LLAMA, dump
from tests.conftest import checkpoint

runner = CliRunner()
BASE = open(LLAMA).read()


def _unboxed(output: str) -> str:
    return " ".join(output.replace("│", " ").split())


def _watched(model) -> list[int]:
    """The lengths of every text ``model``'s tokenizer encodes from now on."""
    seen, tok = [], model.tokenizer._tok
    real = tok.encode

    class Watched:
        def __getattr__(self, name):
            return getattr(tok, name)

        def encode(self, text, *args, **kwargs):
            seen.append(len(text))
            return real(text, *args, **kwargs)
    model.tokenizer._tok = Watched()
    return seen


# -- prompts and chat lines ------------------------------------------------------------------------

def test_a_20_mb_prompt_is_refused_before_it_is_tokenized(toy_dir):
    model = iron_spec.load(LLAMA, toy_dir)
    L, longest = model.max_seq_len, model.tokenizer.longest
    assert model.max_prompt_bytes() == L * longest
    seen = _watched(model)
    with pytest.raises(ContextFull, match=f"the prompt's {20 * 2**20} bytes of text .more than "
                                          f"{L * longest}: {L} tokens of at most {longest} "
                                          "bytes, this tokenizer's longest token; refused "
                                          "before it is tokenized. do not fit max_seq_len"):
        model.generate("ab" * (10 * 2**20))
    assert seen == []
    # A chat's messages together, likewise (a text of at most PIECE characters costs little:
    # it is tokenized as it is).
    with pytest.raises(ContextFull, match="refused before it is tokenized"):
        model.chat().send("x" * (PIECE + 1))
    assert seen == []
    # Within the bound the prompt is tokenized as before (and still too long: said as ever).
    with pytest.raises(ContextFull, match=f"do not fit max_seq_len {L}"):
        model.generate("y" * (L + 5))


def test_a_long_prompt_is_counted_in_pieces_until_it_passes_the_context(toy_dir):
    tokenizer = Tokenizer(toy_dir)
    text = "word " * (3 * PIECE // 5)  # 3 PIECE characters, 1 token a byte
    assert tokenizer.surely_past(text, len(text) // 2)
    assert not tokenizer.surely_past(text, len(text) + 10)
    seen = _watched(type("M", (), {"tokenizer": tokenizer})())
    tokenizer.surely_past(text, 10)
    assert seen and max(seen) <= PIECE and len(seen) == 1  # stopped at the first piece


def test_smollm2_refuses_a_20_mb_prompt_file_and_counts_a_long_prompt_in_pieces(tmp_path):
    model = iron_spec.load("llama3", checkpoint("smollm2-135m-instruct"), max_seq_len=8192)
    # Its tokenizer.json's longest token, a newline and 80 spaces as written ("ĊĠĠ...": 81
    # characters, 162 bytes of UTF-8): docs/bad-input.md's 1.3 MB.
    assert model.max_prompt_bytes() == 8192 * 162
    seen = _watched(model)
    text = "The capital of France is Paris. " * (20 * 2**20 // 32)
    with pytest.raises(ContextFull, match="refused before it is tokenized"):
        model.generate(text)
    assert seen == []
    # Under the byte bound (8192 tokens of 162 bytes, 1.3 MB) and past the context: counted
    # a piece at a time, stopped after the few pieces that pass it.
    with pytest.raises(ContextFull, match="its first pieces alone encode to more than 8192 "
                                          "tokens; refused before the rest is tokenized"):
        model.generate(text[: 2**20])
    assert max(seen) <= PIECE and len(seen) < 2**20 // PIECE
    path = tmp_path / "prompt.txt"
    path.write_text(text)
    result = runner.invoke(app, ["run", "llama3", "--checkpoint",
                                 str(checkpoint("smollm2-135m-instruct")), "--prompt-file",
                                 str(path), "--max-seq-len", "8192"])
    assert result.exit_code == 1 and "refused before it is tokenized" in result.output, \
        result.output


def test_a_prompt_file_past_64_mib_is_refused_unread(tmp_path, toy_dir):
    from iron_spec.cli import run
    path = tmp_path / "huge.txt"
    with open(path, "wb") as f:
        f.truncate(run.MAX_TEXT + 1)  # sparse: no disk spent
    result = runner.invoke(app, ["run", LLAMA, "--checkpoint", str(toy_dir), "--prompt-file",
                                 str(path)])
    assert result.exit_code == 1, result.output
    assert f"--prompt-file {path} holds more than {run.MAX_TEXT} bytes (64 MiB), more text " \
           "than any context holds: refused unread" in _unboxed(result.output)


def test_a_60_mb_chat_line_is_refused_alone_and_the_chat_goes_on(toy_dir):
    lines = "hello\n" + "x" * (60 * 2**20) + "\nbye\n"
    result = runner.invoke(app, ["run", LLAMA, "--checkpoint", str(toy_dir), "--chat",
                                 "--num-tokens", "3", "--temperature", "0"], input=lines)
    assert result.exit_code == 1, result.output[-2000:]  # a turn was refused: said at the end
    said = _unboxed(result.output)
    assert f"error: line 2 is {60 * 2**20 + 1} bytes, more than a turn can hold" in said
    assert "skipped unread, the conversation goes on as it was" in said
    assert said.count("[prefill]") == 2  # lines 1 and 3 each answered
    assert "error: 1 turn of this chat was refused (line 2 of stdin)" in said


# -- examples: ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("examples, says", [
    ("123", "examples is 123 (int), not a list of Hugging Face hub ids (org/name)"),
    ("[org/" + "a" * 5000 + "]", "examples[0] is 'org/" + "a" * 55 + "... (5004 characters), "
                                 "not a Hugging Face hub id"),
    ("[/etc]", "examples[0] is '/etc', not a Hugging Face hub id: org/name, each of letters, "
               "digits, '-', '_' and '.', the name at most 96 characters (an example is "
               "downloaded by its id, never read as a path: give --checkpoint DIR for a "
               "directory)"),
    ("[../../etc]", "examples[0] is '../../etc', not a Hugging Face hub id"),
], ids=["a_number", "5000_characters", "a_path", "a_relative_path"])
def test_examples_that_are_no_hub_ids_are_refused_naming_examples(tmp_path, examples, says):
    path = tmp_path / "x.yaml"
    path.write_text(BASE.replace("examples: [HuggingFaceTB/SmolLM2-135M-Instruct]",
                                 f"examples: {examples}"))
    result = runner.invoke(app, ["run", str(path), "--prompt", "hi"])
    assert result.exit_code == 1, result.output
    said = _unboxed(result.output)
    assert f"{path}:9:" in said and says in said, said
    assert "OSError" not in said and "Traceback" not in said
    lint = runner.invoke(app, ["lint", str(path)])
    assert lint.exit_code == 1 and f"{path}:9:" in lint.output, lint.output


# -- config.json -----------------------------------------------------------------------------------

def _config_dir(tmp_path, **changes):
    from tests.bad.corpus import toy_config
    folder = tmp_path / "ck"
    folder.mkdir()
    dump(folder / "config.json", {**toy_config(), **changes})
    return folder


def test_the_memory_budget_names_the_file_the_keys_and_the_held_bytes(tmp_path):
    V, E, M, N, H, G, D = 49152, 16384, 65536, 30, 128, 8, 128
    folder = _config_dir(tmp_path, hidden_size=E, intermediate_size=M, num_attention_heads=H,
                         num_key_value_heads=G, head_dim=D, num_hidden_layers=N, vocab_size=V,
                         tie_word_embeddings=False)
    # The checkpoint stores float16 (2 bytes a value): its header is all a load reads before
    # the budget refuses it.
    save_file({"model.norm.weight": np.ones(E, np.float16)}, str(folder / "model.safetensors"))
    # By hand: the embedding and lm_head, the final norm; per layer q and o (E x H D), k and
    # v (E x G D), gate, up and down (E x M) and two norms.
    count = 2 * V * E + E + N * (2 * E * H * D + 2 * E * G * D + 3 * E * M + 2 * E)
    config = folder / "config.json"
    sizes = f"(vocab_size {V}, hidden_size {E}, intermediate_size {M}, num_hidden_layers {N})"
    # lint reads no checkpoint: 4 bytes a weight, as --weights float32 holds them.
    as_float32 = f"the model on {config} holds {4 * count / 2**30:.1f} GiB of weights as " \
                 f"float32 {sizes}"
    lint = runner.invoke(app, ["lint", LLAMA, "--config", str(config)])
    assert lint.exit_code == 1 and as_float32 in _unboxed(lint.output), lint.output
    as_stored = f"the model on {config} holds {2 * count / 2**30:.1f} GiB of weights as " \
                f"stored (2 bytes a weight) {sizes}"
    as_q8_0 = f"the model on {config} holds {34 / 32 * count / 2**30:.1f} GiB of weights as " \
              f"q8_0 (1.06 bytes a weight) {sizes}"
    for command, flags, figure in (
            ("run", [], as_stored), ("run", ["--max-seq-len", "512"], as_stored),
            ("run", ["--weights", "float32"], as_float32),
            ("run", ["--weights", "q8_0"], as_q8_0), ("check", [], as_stored)):
        ids = ["--prompt-ids", "1,2"] if command == "run" else []
        result = runner.invoke(app, [command, LLAMA, "--checkpoint", str(folder), *ids, *flags])
        said = _unboxed(result.output)
        assert result.exit_code == 1 and figure in said and "past this host's" in said, \
            (command, flags, said)


@pytest.mark.parametrize("changes, says", [
    ({"rope_scaling": "linear"}, "rope_scaling is 'linear', not a mapping of RoPE parameters "
                                 "or null"),
    ({"rope_parameters": 5}, "rope_parameters is 5, not a mapping of RoPE parameters "
                             "(rope_type, rope_theta, ...) or null"),
    ({"rope_parameters": "default", "rope_theta": 10000.0},
     "rope_parameters is 'default', not a mapping"),
], ids=["rope_scaling_text", "rope_parameters_number", "rope_parameters_text"])
def test_a_value_of_the_wrong_type_is_no_unread_key(tmp_path, changes, says):
    folder = _config_dir(tmp_path, **changes)
    for allow in ([], ["--allow-unread-config"]):
        result = runner.invoke(app, ["run", LLAMA, "--checkpoint", str(folder), "--prompt-ids",
                                     "1,2", *allow])
        said = _unboxed(result.output)
        assert result.exit_code == 1 and says in said, said
        assert "allow-unread-config" not in said and "neither mapped" not in said
    lint = runner.invoke(app, ["lint", LLAMA, "--config", str(folder / "config.json")])
    assert says in _unboxed(lint.output) and "neither mapped" not in lint.output, lint.output


def _sharded(toy_dir, weight_map_of):
    """toy_dir's weights in two shards and an index whose weight_map ``weight_map_of``
    makes from the true one (None: no index)."""
    from safetensors.numpy import load_file
    tensors = load_file(str(toy_dir / "model.safetensors"))
    (toy_dir / "model.safetensors").unlink()
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, held in halves.items():
        save_file({n: tensors[n] for n in held}, str(toy_dir / shard))
    true = {n: shard for shard, held in halves.items() for n in held}
    made = weight_map_of(true)
    if made is not None:
        dump(toy_dir / "model.safetensors.index.json", {"weight_map": made})
    return halves


@pytest.mark.parametrize("case", ["missing", "name_too_long", "no_index"])
def test_a_shard_that_is_not_there_is_named(toy_dir, case):
    second = "model-00002-of-00002.safetensors"
    long_name = "s" * 5000 + ".safetensors"
    halves = _sharded(toy_dir, {
        "missing": lambda m: {n: s.replace("00002-of", "00003-of") for n, s in m.items()},
        "name_too_long": lambda m: {n: long_name if s == second else s for n, s in m.items()},
        "no_index": lambda m: None}[case])
    result = runner.invoke(app, ["run", LLAMA, "--checkpoint", str(toy_dir), "--prompt-ids",
                                 "1,2"])
    said = _unboxed(result.output)
    assert result.exit_code == 1 and "Traceback" not in said, said
    if case == "missing":
        held = sorted(halves[second])
        assert f"shard model-00003-of-00002.safetensors is missing: no " \
               f"{toy_dir / 'model-00003-of-00002.safetensors'}, which the index says holds " \
               f"{len(held)} tensors ({', '.join(held[:3])}, ...)" in said
    elif case == "name_too_long":
        assert f"shard '{'s' * 60}... (5012 characters)' cannot be a file name here" in said
    else:
        assert f"holds model-00001-of-00002.safetensors, {second} but no " \
               "model.safetensors.index.json" in said


def test_a_7_mb_one_line_error_is_cut_to_its_start_and_end(tmp_path):
    folder = _config_dir(tmp_path, architectures=["X" * (7 * 2**20)], model_type="nothing")
    result = runner.invoke(app, ["run", "--checkpoint", str(folder), "--prompt-ids", "1,2"])
    assert result.exit_code == 1
    line = result.output.strip().splitlines()[-1]
    assert len(line) <= MOST + 60, len(line)
    assert line.startswith(f"error: {folder / 'config.json'}: no spec serves XXX")
    assert f"characters cut ...]" in line and line.endswith("or name a spec")


# -- a spec's own limits are the CLI's ------------------------------------------------------------

@pytest.mark.parametrize("old, new, says", [
    ("runtime:\n  prefill_chunk: 256", "runtime:\n  prefill_chunk: 1000000000000",
     "runtime.prefill_chunk: 1000000000000 is greater than the maximum of 65536"),
    ("toy:\n  prefill_chunk: 16", "toy:\n  prefill_chunk: 100000",
     "toy.prefill_chunk: 100000 is greater than the maximum of 65536"),
    ("attention: {bias: attention_bias, o_bias: attention_bias, rope: default}",
     "attention: {bias: attention_bias, o_bias: attention_bias, rope: default, "
     "window: 1000000000000}",
     "layer.attention.window is 1000000000000, not a whole number within 1..2147483647"),
    ("    num_hidden_layers: 2\n", "    num_hidden_layers: 1000000000\n",
     "num_hidden_layers"),
], ids=["prefill_chunk", "toy_prefill_chunk", "window", "layers"])
def test_lint_refuses_a_spec_past_the_clis_limits(tmp_path, old, new, says):
    assert old in BASE
    path = tmp_path / "x.yaml"
    path.write_text(BASE.replace(old, new, 1))
    lint = runner.invoke(app, ["lint", str(path)])
    assert lint.exit_code == 1 and says in _unboxed(lint.output), lint.output


LONG = "a" * 5000


@pytest.mark.parametrize("args", [
    ["run", LONG, "--toy", "--random-weights", "0"],
    ["run", LLAMA, "--checkpoint", LONG, "--prompt-ids", "1"],
    ["run", LLAMA, "--toy", "--random-weights", "0", "--prompt-file", LONG],
    ["check", LLAMA, "--toy", "--random-weights", "0", "--golden", LONG + ".npz"],
    ["check", LLAMA, "--toy", "--random-weights", "0", "--record-golden", "--golden",
     LONG + "/g.npz"],
    ["lint", LONG],
    ["lint", LLAMA, "--config", LONG],
    ["embed", "bert", "--checkpoint", LONG, "--text", "a text"],
], ids=["spec", "checkpoint", "prompt_file", "golden", "golden_to_record", "lint", "lint_config",
        "embed_checkpoint"])
def test_a_path_too_long_for_a_file_name_is_one_line_not_a_traceback(args):
    # Found: OSError (File name too long) came through as a traceback from each of these.
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(f"error: {'a' * 60}... (50") and \
        last.endswith(" characters): File name too long"), result.output
    assert "Traceback" not in result.output and len(result.output) < 400, result.output


def test_a_60_mb_text_to_embed_is_tokenized_only_as_far_as_its_ids_need():
    # The tokenizers library tokenizes a text whole before it truncates it: 60 MB took
    # ~10 GB. The text's first ids are what a prefix past max_tokens gives.
    model = iron_spec.load(checkpoint=checkpoint("all-minilm-l6-v2"))
    text = "A man is eating food. " * (60 * 2**20 // 22)
    seen = []
    tok = model.tokenizer._tok
    real = tok.encode

    class Watched:
        def __getattr__(self, name):
            return getattr(tok, name)

        def encode(self, t, *a, **k):
            seen.append(len(t))
            return real(t, *a, **k)
    model.tokenizer._tok = Watched()
    got = model.embed(text)
    assert got.shape == (1, 384) and np.isfinite(got).all()
    ids, _, truncated = model.tokenizer.encode(text)
    assert max(seen) <= 2 * max(PIECE, 64 * model.tokenizer.max_tokens) and truncated
    # The library's own truncation of the text's first MB (cut far past its ids), whole.
    assert ids == real(text[: 2**20]).ids and len(ids) == model.tokenizer.max_tokens
