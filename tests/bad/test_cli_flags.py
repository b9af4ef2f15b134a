"""Bad flags and arguments refused by the command line, each naming the flag or the file,
with no traceback (issue 13): values out of range, contexts and prompt chunks past the model
instead of silently cut, specs that are no files."""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from iron_spec.cli.app import app
from tests.bad.corpus import LLAMA

SPECS_FILE = LLAMA  # a file that is neither a golden nor a checkpoint

runner = CliRunner()
TOY = ["--random-weights", "0", "--toy", "--num-tokens", "2"]

FLAGS = [
    ("temperature_negative", ["--temperature", "-1"], "temperature"),
    ("temperature_nan", ["--temperature", "nan"], "temperature"),
    ("temperature_infinite", ["--temperature", "inf"], "temperature"),
    ("top_p_zero", ["--top-p", "0"], "--top-p"),
    ("top_p_past_one", ["--top-p", "1.5"], "--top-p"),
    ("top_p_nan", ["--top-p", "nan"], "--top-p"),
    ("top_k_negative", ["--top-k", "-1"], "top-k"),
    ("top_k_fraction", ["--top-k", "1.5"], "top-k"),
    ("num_tokens_zero", ["--num-tokens", "0"], "num-tokens"),
    ("num_tokens_text", ["--num-tokens", "many"], "num-tokens"),
    ("max_seq_len_zero", ["--max-seq-len", "0"], "max-seq-len"),
    ("max_seq_len_past_model", ["--max-seq-len", str(10**9)],
     "--max-seq-len 1000000000 is not within 1..512, the model's own context"),
    ("prefill_chunk_zero", ["--prefill-chunk", "0"], "'--prefill-chunk': 0 is not within 1..65536"),
    ("prefill_chunk_billion", ["--prefill-chunk", str(10**9)],
     "'--prefill-chunk': 1000000000 is not within 1..65536 (ids a prompt call holds)"),
    ("prefill_chunk_trillion", ["--prefill-chunk", str(10**12)],
     "'--prefill-chunk': 1000000000000 is not within 1..65536"),
    ("prefill_chunk_past_context", ["--prefill-chunk", "64", "--max-seq-len", "32"],
     "--prefill-chunk 64 is past the context max_seq_len 32"),
    ("seed_negative", ["--seed", "-1"], "seed"),
    ("decode_weights_unknown", ["--decode-weights", "int4"],
     "'int4' is not one of float32, bfloat16, bfloat16-rounded, int8"),
    ("prompt_len_zero", ["--prompt-len", "0"], "prompt-len"),
]


@pytest.mark.parametrize("case, flags, says", FLAGS, ids=[f[0] for f in FLAGS])
def test_a_bad_flag_is_refused_naming_it(case, flags, says):
    args = TOY + flags if "--num-tokens" not in flags else TOY[:3] + flags
    result = runner.invoke(app, ["run", LLAMA, *args])
    assert result.exit_code == 2, result.output  # a usage error, as click's own ranges
    assert "Traceback" not in result.output and result.exception is None or \
        isinstance(result.exception, SystemExit), result.exception
    assert says in _unboxed(result.output), result.output


CHECK_FLAGS = [
    ("max_seq_len_past_model", ["--max-seq-len", str(10**9)],
     "--max-seq-len 1000000000 is not within 1..512, the model's own context"),
    ("prefill_chunk_million", ["--prefill-chunk", str(10**6)],
     "'--prefill-chunk': 1000000 is not within 1..65536"),
    ("prefill_chunk_past_context", ["--prefill-chunk", "64", "--max-seq-len", "100"],
     "--prefill-chunk 64 does not fit --max-seq-len 100"),
    ("steps_past_context", ["--steps", "100000"], "check needs a context of at least 100008"),
]


@pytest.mark.parametrize("case, flags, says", CHECK_FLAGS, ids=[f[0] for f in CHECK_FLAGS])
def test_a_check_flag_out_of_range_is_a_usage_error_naming_it(case, flags, says):
    result = runner.invoke(app, ["check", LLAMA, "--random-weights", "0", "--toy", *flags])
    assert result.exit_code == 2, result.output
    assert says in _unboxed(result.output), result.output
    assert "[compiling" not in result.output  # refused before any plan is built


def test_a_bench_context_past_the_model_is_a_usage_error_naming_it(tmp_path):
    import json
    from iron_spec.spec.loader import load_spec
    (tmp_path / "config.json").write_text(json.dumps(load_spec(LLAMA).get("toy", "config")))
    result = runner.invoke(app, ["bench", LLAMA, "--checkpoint", str(tmp_path),
                                 "--random-weights", "0", "--max-seq-len", str(10**9),
                                 "--no-peer"])
    assert result.exit_code == 2, result.output
    assert "--max-seq-len 1000000000 is not within 1..512, the model's own context" in \
        _unboxed(result.output)


def test_bench_sizes_its_context_to_a_shorter_model_not_past_it(tmp_path):
    # The toy's own context is 512: bench's default (4096) gives way to it, so the refusal
    # names the deep decode's need, not a --max-seq-len the user never gave.
    import json
    from iron_spec.spec.loader import load_spec
    (tmp_path / "config.json").write_text(json.dumps(load_spec(LLAMA).get("toy", "config")))
    result = runner.invoke(app, ["bench", LLAMA, "--checkpoint", str(tmp_path),
                                 "--random-weights", "0", "--no-peer"])
    assert result.exit_code != 0, result.output
    said = _unboxed(result.output)
    assert "max_seq_len 512 is shorter than the 2065 positions the deep decode needs" in said
    assert "--max-seq-len" not in said


def _unboxed(output: str) -> str:
    """``output`` with rich's error box taken off and its wrapping undone."""
    return " ".join(output.replace("│", " ").split())


@pytest.mark.parametrize("flags", [["--random-weights", "0"], ["--prompt-len", "10"]])
def test_toy_with_a_checkpoint_is_refused(tmp_path, flags):
    # with or without drawn weights: the toy's refusal, not a call for a prompt
    result = runner.invoke(app, ["run", LLAMA, "--toy", *flags, "--checkpoint", str(tmp_path)])
    assert result.exit_code == 2 and "--toy draws a tiny shape" in result.output  # usage


# Found by a new user's trial: flags that do not go together exited 1 here, 2 elsewhere
# (--stop '', --toy with a checkpoint, --steps on an encoder): a usage error is 2, as click's.
@pytest.mark.parametrize("args, says", [
    (["run", LLAMA, "--random-weights", "0", "--toy", "--prompt", "hi"],
     "--prompt and --chat need a checkpoint's tokenizer.json; a --toy run prompts with random ids"),
    (["run", LLAMA, "--random-weights", "0", "--toy", "--chat"], "a --toy run prompts with"),
    (["check", "bert", "--random-weights", "0", "--toy", "--decode-weights", "bfloat16"],
     "--decode-weights bfloat16: an encoder has no decode step"),
    (["check", "bert", "--random-weights", "0", "--toy", "--prefill-weights", "bfloat16"],
     "--prefill-weights bfloat16: an encoder has no prompt chunk"),
    (["check", "bert", "--random-weights", "0", "--toy", "--kv-cache", "bfloat16"],
     "--kv-cache bfloat16: an encoder has no KV cache"),
    (["check", LLAMA, "--random-weights", "0", "--toy", "--overwrite-golden"],
     "--overwrite-golden is for --record-golden alone"),
    (["check", LLAMA, "--random-weights", "0", "--toy", "--self-only", "--record-golden"],
     "--self-only judges by no golden; it takes no --golden or --record-golden"),
    (["show", LLAMA, "--toy", "--checkpoint", "/nowhere"],
     "--toy shows the spec's toy config; it takes no --checkpoint")])
def test_flags_that_do_not_go_together_are_a_usage_error(args, says):
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    said = _unboxed(result.output)
    assert says in said and "Invalid value" not in said, result.output
    assert "loading" not in result.output


def test_a_checkpoint_that_is_nowhere_is_refused_naming_it(tmp_path):
    result = runner.invoke(app, ["run", LLAMA, "--checkpoint", str(tmp_path / "nope"),
                                 "--prompt", "hi"])
    assert result.exit_code == 1 and f"--checkpoint {tmp_path / 'nope'}" in result.output


SPECS = [
    ("missing", lambda p: None, "no such"),
    ("directory", lambda p: p.mkdir(), "is a folder; a model is built from one spec"),
    ("fifo", lambda p: os.mkfifo(p), "is a FIFO"),
    ("not_utf8", lambda p: p.write_bytes(b"spec: 1\nname: \xff\n"), "not UTF-8"),
    ("too_large", lambda p: p.write_text("# " + "x" * 2**18 + "\nspec: 1\n"),
     "larger than a spec may be"),
]


@pytest.mark.parametrize("case, make, says", SPECS, ids=[s[0] for s in SPECS])
def test_a_spec_that_is_no_spec_file_is_refused_naming_it(tmp_path, case, make, says):
    path = tmp_path / "x.yaml"
    make(path)
    result = runner.invoke(app, ["run", str(path), *TOY])
    assert result.exit_code in (1, 2) and "Traceback" not in result.output, result.output
    assert str(path) in result.output and says in result.output, result.output
    # Refused before anything loads (found by trying: a folder said so after
    # "[loading weights]").
    assert "loading" not in result.output, result.output


def test_a_folder_of_specs_names_what_it_holds_and_an_encoder_spec_is_refused_first():
    from tests.conftest import SPECS as SHIPPED

    result = runner.invoke(app, ["run", str(SHIPPED), *TOY])
    assert result.exit_code == 1, result.output
    first = sorted(p.name for p in SHIPPED.glob("*.yaml"))[0]
    assert f"{SHIPPED} is a folder; a model is built from one spec: a YAML file in it " \
           f"({first}" in result.output
    result = runner.invoke(app, ["run", "bert", *TOY])
    assert result.exit_code == 1 and "loading" not in result.output, result.output
    assert "bert.yaml is an encoder spec (model: encoder)" in result.output


def test_a_toy_section_that_is_no_mapping_is_refused_naming_its_line(tmp_path):
    text = open(LLAMA).read()
    start = text.index("\ntoy:")
    path = tmp_path / "x.yaml"
    path.write_text(text[:start] + "\ntoy: [16]\n")
    result = runner.invoke(app, ["run", str(path), *TOY])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    line = text[:start].count("\n") + 2
    assert f"{path}:{line}:1: error: " in result.output, result.output


def test_runtime_prefill_chunk_past_the_bound_is_refused_not_cut(tmp_path):
    text = open(LLAMA).read()
    path = tmp_path / "x.yaml"
    path.write_text(text.replace("\nruntime:", "\nruntime:\n  prefill_chunk: 1000000000000", 1)
                    .replace("\n  prefill_chunk: 256", ""))
    result = runner.invoke(app, ["run", str(path), "--random-weights", "0", "--toy"])
    # The schema bounds it as --prefill-chunk is bounded (issue 30: it linted clean): the
    # spec is refused by lint and by every load, --toy's too.
    lint = runner.invoke(app, ["lint", str(path)])
    assert lint.exit_code == 1 and "runtime.prefill_chunk: 1000000000000 is greater than " \
        "the maximum of 65536" in lint.output, lint.output
    from iron_spec.spec.build import load_model
    from iron_spec.spec.errors import SpecError
    (tmp_path / "ck").mkdir()
    import json
    from iron_spec.spec.loader import load_spec
    (tmp_path / "ck" / "config.json").write_text(json.dumps(load_spec(path).get("toy", "config")))
    with pytest.raises(SpecError) as e:
        load_model(path, checkpoint=tmp_path / "ck", random_weights=0)
    assert "runtime.prefill_chunk: 1000000000000 is greater than the maximum of 65536" in \
        str(e.value) and f"{path}:" in str(e.value)
    assert result.exit_code == 1 and "greater than the maximum of 65536" in result.output, \
        result.output


def test_a_bad_expression_shadowed_by_a_config_key_is_refused_by_run_as_lint_does(tmp_path):
    text = open(LLAMA).read()
    old = 'expr: "hidden_size // num_attention_heads"'
    assert old in text
    path = tmp_path / "x.yaml"
    path.write_text(text.replace(old, 'expr: "hidden_size // num_attention_headz"'))
    result = runner.invoke(app, ["run", str(path), *TOY])  # the toy config has head_dim
    assert result.exit_code == 1, result.output
    assert "names num_attention_headz, not a config field" in result.output, result.output
    lint = runner.invoke(app, ["lint", str(path)])
    assert lint.exit_code == 1 and "num_attention_headz" in lint.output


# Found by a new user's trial: --decode-weights fp8 exited 1 after "[loading weights]"; a
# flag's value out of its range is a usage error (exit 2), refused before anything loads.
@pytest.mark.parametrize("command, flag, value, says", [
    ("run", "--decode-weights", "fp8", "'fp8' is not one of float32, bfloat16, bfloat16-rounded, int8"),
    ("check", "--decode-weights", "fp8", "'fp8' is not one of float32, bfloat16, bfloat16-rounded, int8"),
    ("bench", "--decode-weights", "float32,fp8", "'fp8' is not one of float32, bfloat16, bfloat16-rounded, int8"),
    ("run", "--prefill-weights", "int8", "'int8' is not one of float32, bfloat16"),
    ("check", "--prefill-weights", "int8", "'int8' is not one of float32, bfloat16"),
    ("bench", "--prefill-weights", "float32,int8", "'int8' is not one of float32, bfloat16"),
    ("run", "--kv-cache", "float16", "'float16' is not one of float32, bfloat16"),
    ("check", "--kv-cache", "int8", "'int8' is not one of float32, bfloat16"),
    ("bench", "--kv-cache", "float32,q8", "'q8' is not one of float32, bfloat16"),
    # Found by a new user's trial: a side named twice was measured twice, one overwriting.
    ("bench", "--kv-cache", "bfloat16,bfloat16", "'bfloat16' given twice; each of float32, bfloat16 at most once"),
    ("bench", "--decode-weights", "int8, float32,int8", "'int8' given twice")])
def test_an_unknown_weights_choice_is_a_usage_error_before_loading(command, flag, value, says):
    result = runner.invoke(app, [command, LLAMA, "--checkpoint", "/nowhere", flag, value])
    assert result.exit_code == 2, result.output
    assert says in _unboxed(result.output)
    assert "loading" not in result.output


def test_a_prompt_past_the_context_names_the_flag():
    # Random prompt ids and the tokens to draw are counted before anything loads (a usage
    # error, as --max-seq-len past the model's own context): no load to find 41 > 32.
    result = runner.invoke(app, ["run", LLAMA, *TOY, "--max-seq-len", "32", "--prompt-len",
                                 "40"])
    assert result.exit_code == 2, result.output
    said = _unboxed(result.output)
    assert "--prompt-len 40 does not fit --max-seq-len 32; give at most 32, or a larger " \
        "--max-seq-len (up to the model's own 512)" in said, result.output
    assert "loading" not in result.output and "max_seq_len=" not in result.output


@pytest.mark.parametrize("flags, says", [
    # 500 ids and 13 drawn take 512 positions, the toy's max_position_embeddings; 14, 513.
    (["--prompt-len", "500", "--num-tokens", "14"],
     "--prompt-len 500 and --num-tokens 14 do not fit the model's own context 512: the prompt "
     "and the tokens drawn after it take 513 positions; give a --num-tokens of at most 13"),
    (["--num-tokens", "100000000"], "take 100000023 positions; give a --num-tokens of at most 489"),
    (["--prompt-len", "20", "--num-tokens", "20", "--max-seq-len", "32"],
     "do not fit --max-seq-len 32: the prompt and the tokens drawn after it take 39 positions; "
     "give a --num-tokens of at most 13, or a larger --max-seq-len (up to the model's own 512)")])
def test_tokens_to_draw_past_the_context_are_refused_before_loading(flags, says):
    # Found by a new user's trial: --num-tokens 100000000 loaded the weights and compiled
    # both plans before the context said no.
    result = runner.invoke(app, ["run", LLAMA, "--random-weights", "0", "--toy", *flags])
    assert result.exit_code == 2, result.output
    assert says in _unboxed(result.output), result.output
    assert "loading" not in result.output


def test_the_most_tokens_the_context_holds_run():
    result = runner.invoke(app, ["run", LLAMA, "--random-weights", "0", "--toy", "--prompt-len",
                                 "500", "--num-tokens", "13"])
    assert result.exit_code == 0, result.output


def test_a_text_prompt_s_tokens_to_draw_past_the_model_s_context_are_refused_before_loading(
        tmp_path):
    import json
    from iron_spec.spec.loader import load_spec
    (tmp_path / "config.json").write_text(json.dumps(load_spec(LLAMA).get("toy", "config")))
    (tmp_path / "tokenizer.json").write_text("{}")  # never read: refused first
    result = runner.invoke(app, ["run", LLAMA, "--checkpoint", str(tmp_path), "--prompt", "hi",
                                 "--num-tokens", "513"])
    assert result.exit_code == 2, result.output
    assert "--num-tokens 513 does not fit the model's own context 512: a prompt and the " \
        "tokens drawn after it take its tokens and 512 more positions; give a --num-tokens " \
        "of at most 513 less the prompt's length in tokens" in _unboxed(result.output)



# Found by a new user's trial: an empty argument (an unset $VAR) was the working folder to
# Path(""): `lint ""` linted every spec under it, `run ""` called the folder "" a folder,
# `--checkpoint ""` said the folder lacked tokenizer.json. Each is a usage error now.
@pytest.mark.parametrize("args, says", [
    (["run", "", *TOY], "the spec is '', no name nor path"),
    (["check", "", "--random-weights", "0", "--toy"], "the spec is '', no name nor path"),
    (["show", ""], "the spec is '', no name nor path"),
    (["lint", ""], "'' is no spec file, folder or name"),
    (["lint", LLAMA, ""], "'' is no spec file, folder or name"),
    (["run", LLAMA, "--checkpoint", "", "--prompt", "hi"], "--checkpoint '' names nothing"),
    (["check", LLAMA, "--checkpoint", ""], "--checkpoint '' names nothing"),
    (["show", LLAMA, "--checkpoint", ""], "--checkpoint '' names nothing")])
def test_an_empty_spec_path_or_checkpoint_is_a_usage_error(args, says):
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert says in _unboxed(result.output), result.output
    assert "loading" not in result.output and "spec," not in result.output


def test_a_golden_or_checkpoint_that_cannot_be_is_refused_before_anything_loads(tmp_path):
    # Found by a new user's trial: each was refused only after the weights had loaded and
    # both plans compiled.
    for golden, code, says in ((tmp_path, 2, f"--golden {tmp_path} is a folder"),
                               (tmp_path / "none.npz", 1, "none.npz is missing"),
                               (SPECS_FILE, 1, "not a golden file")):
        result = runner.invoke(app, ["check", LLAMA, "--random-weights", "0", "--toy",
                                     "--golden", str(golden)])
        assert result.exit_code == code, result.output
        assert says in _unboxed(result.output) and "loading" not in result.output
    result = runner.invoke(app, ["run", LLAMA, "--checkpoint", SPECS_FILE, "--prompt", "hi"])
    assert result.exit_code == 1, result.output
    assert "a file that is not GGUF (no GGUF magic); give a checkpoint directory" in \
        _unboxed(result.output) and "loading" not in result.output


def test_a_prompt_file_that_is_a_device_is_read_not_called_missing():
    # /dev/null exists (a character device): read, it is an empty prompt, not "no such file"
    result = runner.invoke(app, ["run", LLAMA, "--toy", "--random-weights", "0",
                                 "--prompt-file", "/dev/null"])
    assert result.exit_code == 2, result.output
    assert "--prompt-file /dev/null is empty" in _unboxed(result.output)


# Found by a new user's trial: bench --gguf took a missing path, a text file, a folder and the
# same file twice, ran for minutes and measured nothing; bench on an encoder exited 1 after
# "[loading weights]". Each is a usage error before anything loads.
@pytest.mark.parametrize("make, says", [
    (lambda tmp: tmp / "none.gguf", "none.gguf: no such file"),
    (lambda tmp: tmp, "not a GGUF file"),
    (lambda tmp: (tmp / "t.gguf").write_text("not gguf") and tmp / "t.gguf", "not a GGUF file (its first bytes are not 'GGUF')"),
])
def test_bench_refuses_a_gguf_that_is_not_one(tmp_path, make, says):
    result = runner.invoke(app, ["bench", LLAMA, "--checkpoint", "/nowhere", "--gguf",
                                 str(make(tmp_path))])
    assert result.exit_code == 2, result.output
    assert says in _unboxed(result.output) and "loading" not in result.output


def test_bench_refuses_the_same_gguf_twice(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + bytes(20))
    result = runner.invoke(app, ["bench", LLAMA, "--checkpoint", "/nowhere", "--gguf", str(f),
                                 "--gguf", str(tmp_path / "." / "m.gguf")])
    assert result.exit_code == 2, result.output
    assert "given twice" in _unboxed(result.output) and "loading" not in result.output


@pytest.mark.parametrize("flag", [["--decode-weights", "int8"], ["--kv-cache", "bfloat16"], []])
def test_bench_refuses_an_encoder_before_loading(flag):
    from tests.conftest import SPECS
    result = runner.invoke(app, ["bench", str(SPECS / "bert.yaml"), "--random-weights", "0",
                                 *flag])
    assert result.exit_code == 2, result.output
    assert "is an encoder spec (model: encoder): bench measures a causal model's prefill and " \
        "decode" in _unboxed(result.output)
    assert "loading" not in result.output
