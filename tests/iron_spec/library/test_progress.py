"""The library's progress: a bar where someone watches, a callback's stages in order, silence
when asked (iron_spec.library.progress)."""

from __future__ import annotations

import io
import sys

import pytest

import iron_spec
from iron_spec.library import progress
from tests.bad.corpus import checkpoint_copy


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory):
    """A toy checkpoint on disk (config.json, model.safetensors, tokenizer files): weights
    to read, so the load reports them."""
    return checkpoint_copy(tmp_path_factory.getbasetemp(), tmp_path_factory.mktemp("progress") / "ckpt")


def test_a_callback_hears_loading_then_each_compile(toy_dir):
    seen = []
    iron_spec.load(checkpoint=toy_dir, progress=lambda *a: seen.append(a))
    stages = [s for s, _, _ in seen]
    assert stages[0] == "loading weights"
    loading = [(d, t) for s, d, t in seen if s == "loading weights"]
    assert loading[-1][0] == loading[-1][1] > 1  # every tensor of the toy, counted
    assert [a for a in seen if a[0] != "loading weights"] == [
        ("compiling the decode step", 0, 1), ("compiling the decode step", 1, 1),
        ("compiling the prompt chunk", 0, 1), ("compiling the prompt chunk", 1, 1)]
    assert seen[0] == ("loading weights", 0, 1)
    encoder = []  # drawn weights: no count between the stage's start and its end
    iron_spec.load("bert", random_weights=0, toy=True, progress=lambda *a: encoder.append(a))
    assert encoder == [("loading weights", 0, 1), ("loading weights", 1, 1),
                       ("compiling the encoder", 0, 1), ("compiling the encoder", 1, 1)]


def test_a_load_compiles_both_versions():
    lm = iron_spec.load("llama3", random_weights=0, toy=True, progress=False).loaded.lm
    assert set(lm._versions) == {(False, False), (True, False)}


def test_a_bar_where_someone_watches_and_nothing_where_not(monkeypatch, toy_dir):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stderr, default in ((Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr(sys, "stderr", stderr)
        assert progress.watched() is default
        iron_spec.load(checkpoint=toy_dir)
        shown = stderr.getvalue()
        for stage in ("loading weights", "compiling the decode step",
                      "compiling the prompt chunk"):
            assert (stage in shown) is default, shown
    quiet = Terminal()
    monkeypatch.setattr(sys, "stderr", quiet)
    iron_spec.load("llama3", random_weights=0, toy=True, progress=False)
    assert quiet.getvalue() == ""
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", piped)
    iron_spec.load("llama3", random_weights=0, toy=True, progress=True)
    assert "compiling the prompt chunk" in piped.getvalue()


def test_a_notebook_kernel_counts_as_watched(monkeypatch):
    class ZMQInteractiveShell:  # IPython's kernel shell, by its class name
        pass

    ipython = type(sys)("IPython")
    ipython.get_ipython = ZMQInteractiveShell
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert progress.watched()


@pytest.mark.parametrize("bad", [3, "yes", 1.0])
def test_progress_that_is_none_of_its_forms_is_refused(bad):
    with pytest.raises(TypeError, match="progress is .*give True .a progress bar., False"):
        iron_spec.load("llama3", random_weights=0, toy=True, progress=bad)
