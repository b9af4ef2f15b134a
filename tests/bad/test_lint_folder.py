"""``iron-spec lint DIR`` reports every file, whatever one of them holds (issue 13): YAML a
safe loader cannot build (a tag on a key, a date that is none), bytes that are not UTF-8, a
FIFO or a folder named like a spec, a spec past the size bound (refused unread, at once)."""

from __future__ import annotations

import os
import shutil
import time

import pytest
from typer.testing import CliRunner

from iron_spec.cli.app import app
from iron_spec.spec.errors import SpecError
from iron_spec.spec.lint import lint_paths
from iron_spec.spec.loader import MAX_BYTES, load_spec
from tests.bad.corpus import LLAMA

runner = CliRunner()
BASE = open(LLAMA).read()

BROKEN = {  # file -> (its text or a maker, LINE:COL, what lint says there)
    "date.yaml": (BASE.replace("name: llama3", "name: 2024-13-45"), None,
                  "'2024-13-45' reads as a YAML timestamp but is not one (month must be in "
                  "1..12); quote it"),
    "key_tag.yaml": (BASE.replace("name: llama3", "!!python/name:os.system name: llama3"), None,
                     "could not determine a constructor for the tag"),
    "not_utf8.yaml": (BASE.encode().replace(b"name: llama3", b"name: llama\xff"), (1, 1),
                      "not UTF-8 text"),
    "toy_list.yaml": (BASE[:BASE.index("\ntoy:")] + "\ntoy: [1, 2]\n", None,
                      "toy is a list, not a mapping"),
    "tab.yaml": (BASE.replace("\n  hidden_size:", "\n\thidden_size:"), None, "a tab"),
    "big.yaml": ("# " + "x" * MAX_BYTES + "\n" + BASE, (1, 1), "larger than a spec may be"),
    "empty.yaml": ("", (1, 1), "the file is empty"),
    "fifo.yaml": (os.mkfifo, (1, 1), "is a FIFO (named pipe), not a regular spec file"),
}


def test_lint_of_a_folder_reports_every_file_whatever_one_holds(tmp_path):
    shutil.copy(LLAMA, tmp_path / "good.yaml")
    (tmp_path / "folder.yaml").mkdir()  # a folder named like a spec is no spec
    for name, (content, _, _) in BROKEN.items():
        path = tmp_path / name
        if callable(content):
            content(path)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    problems, files = lint_paths([tmp_path])
    assert sorted(f.name for f in files) == sorted([*BROKEN, "good.yaml"])
    for name, (_, where, says) in BROKEN.items():
        mine = [p for p in problems if p.file == str(tmp_path / name)]
        assert any(says in p.message for p in mine), (name, mine)
        if where is not None:
            assert any((p.line, p.col) == where for p in mine), (name, mine)
    assert not [p for p in problems if p.file == str(tmp_path / "good.yaml")]
    result = runner.invoke(app, ["lint", str(tmp_path)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"{len(BROKEN) + 1} specs" in result.output
    for name in BROKEN:
        assert f"{tmp_path / name}:" in result.output, name


def test_a_date_and_a_key_tag_are_refused_at_their_own_node(tmp_path):
    path = tmp_path / "x.yaml"
    line = BASE[:BASE.index("name: llama3")].count("\n") + 1
    path.write_text(BROKEN["date.yaml"][0])
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert (e.value.line, e.value.col) == (line, 7)
    path.write_text(BROKEN["key_tag.yaml"][0])
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert (e.value.line, e.value.col) == (line, 1)


def test_a_mebibyte_spec_is_refused_at_once_and_says_why(tmp_path):
    path = tmp_path / "big.yaml"
    # A legal spec (comments aside) of a mebibyte: refused unread, in well under a second.
    path.write_text(BASE + "".join(f"# {i:0120d}\n" for i in range(2**20 // 124)))
    begin = time.monotonic()
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert time.monotonic() - begin < 1.0
    assert e.value.message.startswith(f"{path.stat().st_size} bytes is larger than a spec may "
                                      f"be ({MAX_BYTES} bytes")
    assert "alias" not in e.value.message


def test_many_nodes_without_aliases_are_not_called_an_alias_bomb():
    from iron_spec.spec.loader import MAX_NODES, parse_spec
    text = "a: [" + ",".join(["1"] * (MAX_NODES + 1)) + "]\n"  # 2 bytes a node
    with pytest.raises(SpecError) as e:
        parse_spec(text, "f.yaml")
    assert f"more than {MAX_NODES} nodes" in e.value.message
    assert "alias" not in e.value.message and "a spec holds a few hundred" in e.value.message


def test_lint_takes_a_spec_s_name_as_the_other_commands_do(tmp_path, monkeypatch):
    # Found by a new user's trial: `iron-spec lint llama3` said "no such file or folder"
    # where run, check and show take the name from any folder.
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    result = runner.invoke(app, ["lint", "llama3", "gemma3"])
    assert result.exit_code == 0, result.output
    assert "2 specs, 0 problems" in result.output
    result = runner.invoke(app, ["lint", "lama3"])
    assert result.exit_code == 1
    assert "lama3: no such spec file, and no spec of that name in" in result.output
    assert "did you mean llama3?" in result.output
