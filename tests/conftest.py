"""Shared fixtures: the real checkpoints ``../shared/data/make_checkpoints.sh`` builds.

Where they are absent a test that needs one is skipped, except in CI (``CI=true``), where
it fails: a green CI must have run them.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

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
