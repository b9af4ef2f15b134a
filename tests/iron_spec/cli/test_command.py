"""The conventions every command follows (iron_spec.cli.command): help as click tools print it,
-h, --version, and one rule of exit statuses (README "Exit status")."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import version

import pytest
from typer.testing import CliRunner

from iron_spec.cli.app import app
from tests.conftest import SPECS

LLAMA = str(SPECS / "llama3.yaml")
BERT = str(SPECS / "bert.yaml")
COMMANDS = ["run", "lint", "show", "check", "bench", "embed", "fill-mask", "classify", "list",
            "schema"]
runner = CliRunner()


def invoke(*args, **kwargs):
    return runner.invoke(app, list(args), **kwargs)


@pytest.mark.parametrize("command", [[]] + [[c] for c in COMMANDS])
def test_help_names_values_as_click_tools_do(command):
    result = invoke(*command, "--help")
    assert result.exit_code == 0, result.output
    # typer 0.29 prints <bool>, <int range>, <str>, <path> beside every flag, {spec} in usage
    assert not re.search(r"<(bool|int|float|str|path|text)\b", result.output), result.output
    assert "{" not in result.output.splitlines()[1]
    assert invoke(*command, "-h").output == result.output


def test_help_says_the_exit_statuses():
    for command in COMMANDS:
        text = " ".join(invoke(command, "-h").output.split())
        assert "Exit status: 0" in text and "2 a usage error" in text, command
    text = " ".join(invoke("check", "-h").output.split())
    assert "3 every check passed but nothing verified the spec" in text


def test_help_text_is_shown_as_written(monkeypatch):
    import typer.rich_utils
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", 400)  # each help on one line (the choices widen a column)
    # markdown would eat <spec>, rich markup [x]: both kinds in these help strings
    text = " ".join(invoke("check", "-h").output.split())
    assert "recorded into the spec's checkout as <spec>/<inputs>.npz under tests/goldens" in text
    text = " ".join(invoke("embed", "-h").output.split())
    assert "at least 2, the [CLS] and [SEP] a text is put between" in text
    assert "Usage: root embed [OPTIONS] [SPEC]" in text
    text = " ".join(invoke("check", "-h").output.split())
    assert "--checkpoint DIR|ID|GGUF the checkpoint: a directory" in text
    assert "--steps INTEGER [x>=1] teacher-forced KL steps" in text
    assert "--toy the spec's tiny shape" in text


MODEL_COMMANDS = ["run", "embed", "fill-mask", "classify", "show", "check", "bench"]


@pytest.mark.parametrize("command", MODEL_COMMANDS)
def test_every_command_takes_spec_and_checkpoint_alike(command, monkeypatch):
    # One way: SPEC the one optional argument (picked from --checkpoint's config.json where
    # not named), --checkpoint naming each form it takes.
    import typer.rich_utils
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", 400)
    text = " ".join(invoke(command, "-h").output.split())
    assert f"Usage: root {command} [OPTIONS] [SPEC]" in text
    assert "[SPEC] a spec's name (iron-spec list) or a spec YAML's path; default: the spec " \
        "serving --checkpoint's config.json architectures" in text
    assert "--checkpoint DIR|ID|GGUF the checkpoint: a directory (config.json, " \
        "model.safetensors" in text and "a Hugging Face hub id" in text and "a GGUF file" in text


@pytest.mark.parametrize("command", ["show", "check"])
def test_show_and_check_pick_the_spec_from_config_json_and_say_it(command, tmp_path):
    from tests.conftest import toy_config
    directory = toy_config(tmp_path, "llama3")
    args = [command, "--checkpoint", str(directory)] + (
        ["--random-weights", "0", "--self-only"] if command == "check" else [])
    result = invoke(*args)
    # show: the toy directory holds no weights to place (exit 1); check runs on drawn ones.
    assert result.exit_code in (0, 1) and "Traceback" not in result.output, result.output
    assert f"[spec llama3: {SPECS / 'llama3.yaml'}, picked by --checkpoint's config.json " \
        "architectures]" in result.stderr, result.stderr


@pytest.mark.parametrize("command, shown", [
    ("run", ["--temperature FLOAT [x>=0]", "--top-p FLOAT [0<x<=1]", "--min-p FLOAT [0<=x<=1]",
             "--repetition-penalty FLOAT [x>0]", "--prefill-chunk INTEGER [1<=x<=65536]",
             "--weights [stored|float32|bfloat16|", "--kv-cache [float32|bfloat16]",
             "--decode-weights [float32|bfloat16|bfloat16-rounded|int8]"]),
    ("bench", ["--decode-weights [float32|bfloat16|bfloat16-rounded|int8],...",
               "--kv-cache [float32|bfloat16],..."])])
def test_help_shows_each_flag_s_range_and_choices(command, shown, monkeypatch):
    # As click's FloatRange, IntRange and Choice show theirs; the refusals stay the callbacks'.
    import typer.rich_utils
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", 400)
    text = " ".join(invoke(command, "-h").output.split())
    for s in shown:
        assert s in text, (s, text)
    result = invoke("run", "llama3", "--toy", "--random-weights", "0", "--top-p", "0")
    assert result.exit_code == 2 and "0.0 is not a finite number > 0 and <= 1" in result.output


@pytest.mark.parametrize("args, says", [
    (["run", "The capital", "--toy", "--random-weights", "0"],
     "SPEC 'The capital' is no spec name or path; a text is given with --prompt; iron-spec "
     "list shows them all"),
    (["embed", "hello world", "--checkpoint", "."],
     "SPEC 'hello world' is no spec name or path; a text is given with --text; iron-spec list"),
    # The closest name first; which others follow depends on the specs shipped.
    (["show", "lama3"], "SPEC 'lama3' is no spec name or path; did you mean llama3? (or ")])
def test_an_unknown_spec_is_said_in_one_short_line(args, says):
    # Found by a new user's trial: a 1,300-character line listing every spec.
    result = invoke(*args)
    assert result.exit_code == 1, result.output
    assert result.output.startswith("error: " + says), result.output
    assert len(result.output) < 400 and "gemma3" not in result.output, result.output


@pytest.mark.parametrize("architectures", [None, ["NoSuchForCausalLM"]])
def test_a_spec_picked_by_model_type_says_model_type(architectures, tmp_path):
    # config.json without architectures (or with none a spec serves): its model_type picks
    # the spec, and the line says so rather than "architectures".
    import json
    from tests.conftest import toy_config
    directory = toy_config(tmp_path, "llama3")
    config = json.loads((directory / "config.json").read_text())
    config.pop("architectures", None)
    if architectures is not None:
        config["architectures"] = architectures
    (directory / "config.json").write_text(json.dumps(config))
    result = invoke("show", "--checkpoint", str(directory))
    said = "(its architectures not given)" if architectures is None else \
        "(its architectures NoSuchForCausalLM served by no spec)"
    assert f"[spec llama3: {SPECS / 'llama3.yaml'}, picked by --checkpoint's config.json " \
        f"model_type llama {said}]" in result.stderr, result.stderr


def test_version_is_the_installed_packages():
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.output == f"iron-spec {version('iron-spec')}\n"


# One rule: 0 done, 1 input refused (or a check failed), 2 usage (check: 3 not verified).
REFUSED = [
    ["run", "nope.yaml", "--random-weights", "0", "--toy"],
    ["run", LLAMA, "--checkpoint", "/nonexistent/dir", "--prompt", "x"],
    ["lint", "nope.yaml"],
    ["show", "nope.yaml"],
    ["check", "nope.yaml", "--random-weights", "0", "--toy"],
    ["bench", "nope.yaml", "--checkpoint", "/nonexistent/dir"],
    ["embed", BERT, "--checkpoint", "/nonexistent/dir", "--text", "hello"],
    ["embed", LLAMA, "--checkpoint", "/nonexistent/dir", "--text", "hello"],
]
USAGE = [
    ["run", LLAMA, "--random-weights", "0", "--toy", "--temperature", "-1"],
    ["run", LLAMA, "--random-weights", "0", "--toy", "--temperature", "nan"],
    ["run", LLAMA, "--random-weights", "0", "--toy", "--top-p", "0"],
    ["run", LLAMA, "--random-weights", "0", "--toy", "--top-p", "1.5"],
    ["run", LLAMA, "--random-weights", "0", "--toy", "--top-k", "-1"],
    ["run", LLAMA, "--no-such-flag"],
    ["lint", LLAMA, "--format", "xml"],
    ["show", LLAMA, "--format", "yaml"],
    ["show", LLAMA, "--toy", "--checkpoint", "/nonexistent/dir"],
    ["check", LLAMA, "--self-only", "--record-golden"],
    ["run", LLAMA, "--toy"],
    ["run", LLAMA, "--toy", "--random-weights", "0", "--checkpoint", "/nonexistent/dir"],
    ["check", LLAMA, "--toy"],
    ["embed", BERT, "--text", "hello"],
    ["embed", BERT, "--max-tokens", "1", "--text", "hello"],
    ["embed", BERT, "a text", "--checkpoint", "/nonexistent/dir"],
    ["list", "extra"],
    ["run"], ["show"], ["check"], ["bench"], ["embed", "--text", "hello"],
]


@pytest.mark.parametrize("args", REFUSED, ids=lambda a: " ".join(a[:2]))
def test_refused_input_exits_1(args):
    result = invoke(*args)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and "error:" in result.output


@pytest.mark.parametrize("args", USAGE, ids=lambda a: " ".join(a[:1] + a[-2:]))
def test_usage_errors_exit_2(args):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "Usage:" in result.output


@pytest.fixture()
def no_examples(tmp_path):
    """specs/llama3.yaml without its examples: line."""
    text = (SPECS / "llama3.yaml").read_text()
    lines = [l for l in text.splitlines(keepends=True) if not l.startswith("examples:")]
    assert len(lines) == len(text.splitlines()) - 1
    (tmp_path / "llama3.yaml").write_text("".join(lines))
    return str(tmp_path / "llama3.yaml")


def test_no_checkpoint_and_no_example_is_a_usage_error(no_examples):
    for command in ("run", "check"):
        result = invoke(command, no_examples)
        assert result.exit_code == 2, result.output
        text = " ".join(result.output.split())
        assert "give --checkpoint DIR (or a hub id), or --random-weights SEED --toy" in text
        assert "names no examples:" in text
    result = invoke("bench", no_examples)
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "give --checkpoint DIR or a hub id" in text and "it takes no --toy" in text


# --- a spec's examples: the checkpoint a command takes when given none ------------------------

def cli(*args, env):
    """The command in a fresh process (huggingface_hub reads HF_HUB_OFFLINE when imported)."""
    return subprocess.run([sys.executable, "-c", "from iron_spec.cli.app import app; app()", *args],
                          capture_output=True, text=True, env={**os.environ, **env}, timeout=600)


def test_an_example_neither_cached_nor_reachable_says_what_to_do(tmp_path):
    result = cli("run", LLAMA, "--prompt", "x", env={"HF_HUB_OFFLINE": "1",
                                                     "HF_HOME": str(tmp_path)})
    assert result.returncode == 1, result.stderr
    errors = [l for l in result.stderr.splitlines() if l.startswith("error:")]
    assert errors == [
        f"error: no --checkpoint given, and {LLAMA}'s example HuggingFaceTB/SmolLM2-135M-Instruct "
        f"is not in the hub cache ({tmp_path / 'hub'}) and cannot be downloaded (HF_HUB_OFFLINE "
        "is set): download it where the hub is reachable (hf download "
        "HuggingFaceTB/SmolLM2-135M-Instruct), or give --checkpoint DIR, or --random-weights "
        "SEED --toy for a run with no files"], result.stderr
    assert "Traceback" not in result.stderr


def test_the_first_example_is_taken_from_the_hub_cache(tmp_path, smollm2):
    # A hub cache as huggingface_hub lays it out, its snapshot the SmolLM2 checkpoint's files.
    repo = tmp_path / "hub" / "models--HuggingFaceTB--SmolLM2-135M-Instruct"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for f in smollm2.iterdir():
        (snapshot / f.name).symlink_to(f)
    result = cli("run", LLAMA, "--prompt", "The capital of France is", "--num-tokens", "8",
                 "--temperature", "0", "--max-seq-len", "256",
                 env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert "checkpoint HuggingFaceTB/SmolLM2-135M-Instruct, the spec's first example" in result.stderr
    # transformers' greedy continuation on this checkpoint, float32 (as test_cli's).
    assert result.stdout.startswith(" Paris.\n\nThe answer is:")


def test_lint_refuses_an_example_that_is_no_hub_id(tmp_path):
    text = (SPECS / "llama3.yaml").read_text()
    line = next(i for i, l in enumerate(text.splitlines(), 1) if l.startswith("examples:"))
    bad = tmp_path / "llama3.yaml"
    bad.write_text(text.replace("examples: [HuggingFaceTB/SmolLM2-135M-Instruct]",
                                "examples: [not a hub id]"))
    result = invoke("lint", str(bad))
    assert result.exit_code == 1
    assert f"{bad}:{line}:12: error: examples[0]: 'not a hub id' does not match" in result.output


# --- progress: one plain line per stage when piped, a bar on a terminal -----------------------

CHECK_STAGES = ["[loading weights]", "[compiling the decode step]",
                "[compiling the prompt chunk]", "[checking: config defaults vs transformers]",
                "[checking: per-step check]",
                "[checking: compiled = reference]", "[checking: KL vs golden]",
                "[checking: float64 KL vs golden]", "[checking: determinism]", "[checking: chat turn]",
                "[checking: chunked = decode]", "[checking: deep decode]"]


def test_check_says_each_stage_as_it_starts_when_piped():
    result = invoke("check", LLAMA, "--random-weights", "0", "--toy")
    assert result.exit_code == 0, result.output
    assert [l for l in result.stderr.splitlines() if l.startswith("[")] == CHECK_STAGES
    assert "━" not in result.output  # no bar where stderr is no terminal


@pytest.mark.parametrize("args", [
    ["run", "llama3", "--prompt-ids", "1,2"], ["show", "llama3"], ["check", "llama3", "--self-only"],
    ["bench", "llama3", "--no-peer"], ["embed", "bert", "--text", "hi"],
    ["classify", "bert", "--text", "hi"]])
@pytest.mark.parametrize("fault", ["no weights", "config.json", "no checkpoint"])
def test_no_loading_line_before_a_refusal_that_reads_no_weight(args, fault, tmp_path):
    # Found by a new user's trial: "[loading weights]" before "no such weights file", a
    # config.json error or a missing checkpoint: said only once a weight is read.
    from tests.conftest import toy_config
    name = "bert" if "bert" in args else "llama3"
    directory = toy_config(tmp_path, name, **({"hidden_size": "x"} if fault == "config.json"
                                              else {}))
    checkpoint = str(tmp_path / "none") if fault == "no checkpoint" else str(directory)
    result = invoke(*args, "--checkpoint", checkpoint)
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert "loading weights" not in result.output, result.output


def test_run_says_its_stages_when_piped():
    result = invoke("run", LLAMA, "--random-weights", "0", "--toy", "--num-tokens", "2")
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert [l for l in lines if l in CHECK_STAGES] == CHECK_STAGES[:3]


def test_a_terminal_gets_a_bar_not_lines():
    # stderr a pseudo-terminal, as a user's: rich draws its bar there and no stage line.
    import pty
    main, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", "from iron_spec.cli.app import app; app()",
                             "check", LLAMA, "--random-weights", "0", "--toy"],
                            stdout=subprocess.PIPE, stderr=child, stdin=subprocess.DEVNULL,
                            env={**os.environ, "COLUMNS": "120"})
    os.close(child)
    seen = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        seen += chunk
    proc.wait(timeout=600)
    os.close(main)
    assert proc.returncode == 0
    text = seen.decode("utf-8", "replace")
    assert "loading weights" in text or "checking:" in text
    assert "[loading weights]" not in text and "[checking: deep decode]" not in text


@pytest.mark.parametrize("args", [["show", "llama3", "--toy"],
                                  ["check", "llama3", "--random-weights", "0", "--toy"]])
def test_spec_names_serve_show_and_check_from_any_folder(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)  # no specs/ here: the name is found among the shipped specs
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output


def test_the_commands_take_the_shared_conventions_from_command_not_cli():
    """cli.app registers the commands, so a command importing from it is a cycle (run dodged it
    with an import inside its function): EXPECTED and the stderr log live in command."""
    import ast
    from pathlib import Path

    from iron_spec import cli
    from iron_spec.cli.command import EXPECTED, log_to_stderr  # noqa: F401
    folder = Path(cli.__file__).parent
    for path in sorted(set(folder.glob("*.py")) - {folder / "app.py"}):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.module not in ("app", "iron_spec.cli.app"), \
                    f"{path.name}:{node.lineno} imports from cli.app"
