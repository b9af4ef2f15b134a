"""The conventions every command follows (iron_spec.command): help as click tools print it,
-h, --version, and one rule of exit statuses (README "Exit status")."""

from __future__ import annotations

import re
from importlib.metadata import version

import pytest
from typer.testing import CliRunner

from iron_spec.cli import app
from tests.conftest import SPECS

LLAMA = str(SPECS / "llama3.yaml")
BERT = str(SPECS / "bert.yaml")
COMMANDS = ["run", "lint", "show", "check", "bench", "embed", "list", "schema"]
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
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", 250)  # each help on one line
    # markdown would eat <spec>, rich markup [x]: both kinds in these help strings
    text = " ".join(invoke("check", "-h").output.split())
    assert "recorded into the spec's checkout as <spec>/<inputs>.npz under tests/goldens" in text
    text = " ".join(invoke("embed", "-h").output.split())
    assert "at least 2, the [CLS] and [SEP] a text is put between" in text
    assert "Usage: root embed [OPTIONS] [SPEC] TEXT..." in text
    text = " ".join(invoke("check", "-h").output.split())
    assert "--checkpoint DIR|ID checkpoint directory or hub id" in text
    assert "--steps INTEGER [x>=1] teacher-forced KL steps" in text
    assert "--toy the spec's tiny shape" in text


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
    ["embed", BERT, "--checkpoint", "/nonexistent/dir", "hello"],
    ["embed", LLAMA, "--checkpoint", "/nonexistent/dir", "hello"],
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
    ["bench", LLAMA],
    ["embed", BERT, "--max-tokens", "1", "hello"],
    ["list", "extra"],
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


def test_bench_names_the_flags_it_takes():
    result = invoke("bench", LLAMA)
    assert "--checkpoint" in result.output and "it takes no --toy" in " ".join(result.output.split())
