"""A specs folder (``IRON_SPEC_SPECS``) holding files that are no spec (issue 30): found, one
broken file made ``list``, ``run llama3`` and every spec-less run exit 1. Each such file is
skipped with a warning naming it, every other spec served; named itself, it is refused as
itself. A FIFO among them is never opened for reading (nothing hangs)."""

from __future__ import annotations

import logging
import os
import shutil
import threading

import pytest
from typer.testing import CliRunner

import iron_spec
from iron_spec.cli.app import app
from iron_spec.spec.loader import MAX_BYTES
from tests.bad.corpus import LLAMA

runner = CliRunner()
BASE = open(LLAMA).read()

BROKEN = {  # file -> (a maker, what its warning says)
    "bad_yaml.yaml": (lambda p: p.write_text("name: [unclosed\n"), "not valid YAML"),
    "fifo.yaml": (os.mkfifo, "is a FIFO (named pipe), not a regular spec file"),
    "folder.yaml": (lambda p: p.mkdir(), "is a directory, not a regular spec file"),
    "zero.yaml": (lambda p: p.symlink_to("/dev/zero"), "is a device, not a regular spec file"),
    "big.yaml": (lambda p: p.write_text("# " + "x" * (300 * 1024) + "\n" + BASE),
                 f"larger than a spec may be ({MAX_BYTES} bytes, 256 KiB)"),
    "dangling.yaml": (lambda p: p.symlink_to(p.parent / "nowhere.yaml"), "no such spec file"),
    # Found by a new user's trial: another tool's YAML mapping was listed as a spec of model `?`.
    "serve.yaml": (lambda p: p.write_text("port: 8000\nmodels:\n  a: b\n"),
                   "none of a spec's keys (spec, name, architectures, model, config, layer)"),
    "half.yaml": (lambda p: p.write_text("spec: 1\nname: half\n"),
                  "no architectures, model, config, layer (a spec has spec, name,"),
}


@pytest.fixture()
def folder(tmp_path, monkeypatch):
    """A specs folder of llama3 and every broken file, named by IRON_SPEC_SPECS."""
    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(LLAMA, specs / "llama3.yaml")
    for name, (make, _) in BROKEN.items():
        make(specs / name)
    monkeypatch.setenv("IRON_SPEC_SPECS", str(specs))
    return specs


def guarded(fn, *args, seconds: float = 120, **kwargs):
    """``fn(...)``'s result, failing where it runs past ``seconds`` (a FIFO read)."""
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("r", fn(*args, **kwargs)), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "it hangs"
    return out["r"]


def test_list_skips_each_broken_file_with_a_warning_and_lists_the_rest(folder):
    result = guarded(runner.invoke, app, ["list"])
    assert result.exit_code == 0, result.output
    assert any(line.startswith("llama3 ") for line in result.output.splitlines())
    for name, (_, says) in BROKEN.items():
        warned = [line for line in result.output.splitlines()
                  if line.startswith(f"warning: {folder / name} is skipped, no spec")]
        assert len(warned) == 1 and says in warned[0], (name, result.output)


def test_a_lookup_by_name_and_a_spec_less_run_skip_them(folder, toy_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="iron_spec"):
        model = guarded(iron_spec.load, "llama3", random_weights=0, toy=True)
    assert model.spec == folder / "llama3.yaml"
    result = guarded(runner.invoke, app, ["run", "llama3", "--toy", "--random-weights", "0",
                                          "--prompt-ids", "1,2,3", "--num-tokens", "2"])
    assert result.exit_code == 0, result.output
    # No spec named: the checkpoint's architectures pick llama3 past the broken files, each
    # said in a warning.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="iron_spec"):
        model = guarded(iron_spec.load, checkpoint=toy_dir)
    assert model.spec == folder / "llama3.yaml"
    warned = [r.getMessage() for r in caplog.records if "is skipped, no spec" in r.getMessage()]
    assert len(warned) == len(BROKEN), warned
    result = guarded(runner.invoke, app, ["run", "--checkpoint", str(toy_dir), "--prompt-ids",
                                          "1,2", "--num-tokens", "2"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("name", ["bad_yaml", "fifo", "folder", "zero", "big"])
def test_a_broken_file_named_itself_is_refused_as_itself(folder, name):
    result = guarded(runner.invoke, app, ["run", name, "--toy", "--random-weights", "0"])
    assert result.exit_code == 1, result.output
    assert str(folder / f"{name}.yaml") in result.output
    assert BROKEN[f"{name}.yaml"][1] in result.output, result.output
    assert "no such spec" not in result.output
