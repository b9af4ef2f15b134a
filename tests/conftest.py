"""Shared fixtures: the real checkpoints ``../shared/data/make_checkpoints.sh`` builds, and
the suite's memory budget.

Where the checkpoints are absent a test that needs one is skipped, except in CI
(``CI=true``), where it fails: a green CI must have run them.

The budget (README's testing line): the run's peak resident memory, as the process measures
it at the end (``ru_maxrss`` of pytest and of the largest process it started), at most
``MEMORY_BUDGET``; past it the run fails, naming the peak. Each module's garbage is
collected as it ends, so what one module made never adds to the next's peak.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import resource
from pathlib import Path

import pytest

#: The suite's peak resident memory at most (bytes): 4 GB, CI's bound for the tests.
MEMORY_BUDGET = 4 * 10**9

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"
CHECKPOINTS = Path(os.environ.get("IRON_SPEC_CHECKPOINTS",
                                  Path.home() / ".cache" / "iron-spec" / "checkpoints"))


def checkpoint(name: str) -> Path:
    """The directory of real checkpoint ``name``; skip (fail in CI) where it is absent."""
    path = CHECKPOINTS / name
    if not (path / "config.json").exists():
        message = (f"{path} is missing: build it with bash ../shared/data/make_checkpoints.sh "
                   f"{CHECKPOINTS}")
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def download(name: str) -> Path:
    """The file ``name`` make_checkpoints.sh downloaded (``CHECKPOINTS/.downloads``: the GGUF
    files the real checkpoints were converted from); skip (fail in CI) where it is absent."""
    path = CHECKPOINTS / ".downloads" / name
    if not path.is_file():
        message = (f"{path} is missing: download it with bash ../shared/data/make_checkpoints.sh "
                   f"{CHECKPOINTS}")
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def smollm2() -> Path:
    return checkpoint("smollm2-135m-instruct")


@pytest.fixture(autouse=True)
def golden_stores(tmp_path_factory, monkeypatch) -> Path:
    """An empty user store for goldens (``XDG_CACHE_HOME``) and no ``IRON_SPEC_GOLDENS``: what
    a user has recorded never judges a test. Returns the user store."""
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.delenv("IRON_SPEC_GOLDENS", raising=False)
    return cache / "iron-spec" / "goldens"


def encoder_toy(name: str):
    """Spec ``name``'s encoder on its toy (weights drawn at seed 0) and the committed golden
    transformers recorded for it."""
    from iron_spec.cli.check import golden_path
    from iron_spec.spec.encoder import load_encoder
    from iron_spec.runtime.encoder_golden import EncoderGolden
    loaded = load_encoder(SPECS / f"{name}.yaml", random_weights=0, toy=True)
    return loaded, EncoderGolden.read(golden_path(loaded), loaded.fingerprint())


def hidden_errors(model, golden, float64: bool = False) -> list[float]:
    """max |our hidden states - transformers'| on each of ``golden``'s probes (pooling off;
    each with its global attention mask where the golden holds one); ``float64``: our
    float64 ``reference()`` against transformers run in float64."""
    import dataclasses
    import numpy as np
    states = model.version(dataclasses.replace(model.config.pooling, kind="none"))
    from iron_spec.runtime.checks import call_keywords
    run = states.reference if float64 else states
    wants = golden.hidden64 if float64 else golden.hidden
    return [float(np.abs(run(ids, types, **call_keywords(golden.global_masks, k)) - want).max())
            for k, ((ids, types), want) in enumerate(zip(golden.probes, wants))]


def toy_config(tmp_path: Path, name: str, **changes) -> Path:
    """A folder holding spec ``name``'s toy config.json with ``changes`` made to it."""
    import json
    from iron_spec.spec.loader import load_spec
    config = dict(load_spec(SPECS / f"{name}.yaml").get("toy", "config"), **changes)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def edited_spec(tmp_path: Path, name: str, old: str, new: str) -> Path:
    """Spec ``name`` with its first ``old`` (which it must hold) replaced by ``new``, written
    into ``tmp_path``."""
    text = (SPECS / f"{name}.yaml").read_text()
    assert old in text
    path = tmp_path / f"{name}.yaml"
    path.write_text(text.replace(old, new, 1))
    return path


#: Recording a golden (and reading a transformers config class) needs the golden extra,
#: torch and transformers, which CI does not install: such a test is skipped without it.
golden_extra = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None,
    reason="recording needs torch and transformers (the golden extra)")


def resident() -> int:
    """This process's resident memory now, bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


_COLLECTED_AT = [0]  # resident bytes after the last full collection


@pytest.fixture(autouse=True, scope="module")
def collected():
    """A module's garbage freed as it ends, where the process grew by 256 MiB since the last
    full collection: cycles (a traceback's frames, a test's closures) wait for the
    collector's full pass otherwise, which it runs by object count, not bytes, so a module's
    arrays could outlive it by many modules. Not after every module: a full pass over the
    suite's objects took seconds on a loaded machine."""
    yield
    if resident() > _COLLECTED_AT[0] + 2**28:
        gc.collect()
        _COLLECTED_AT[0] = resident()


def peak_rss() -> int:
    """The most resident memory this process, or the largest process it started, has held,
    bytes (as ``/usr/bin/time -v`` reports a run's)."""
    return 1024 * max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)


def pytest_sessionfinish(session, exitstatus):
    """Fail a run whose peak memory passed ``MEMORY_BUDGET``, naming the peak."""
    peak = peak_rss()
    if peak > MEMORY_BUDGET and session.testscollected:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"peak memory {peak / 1e9:.2f} GB is past the suite's budget "
                                f"of {MEMORY_BUDGET / 1e9:.0f} GB (tests/conftest.py)", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

