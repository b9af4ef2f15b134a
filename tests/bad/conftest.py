"""Fixtures of the bad-input corpus: the toy checkpoint, copied fresh for each case."""

from __future__ import annotations

import pytest

from tests.bad.corpus import checkpoint_copy


@pytest.fixture()
def toy_dir(tmp_path_factory, tmp_path):
    """A fresh toy checkpoint directory (config.json, model.safetensors, tokenizer files)."""
    return checkpoint_copy(tmp_path_factory.getbasetemp(), tmp_path / "ckpt")


@pytest.fixture(autouse=True)
def quiet_log():
    """The iron_spec logger as it was: a command run here adds its stderr handler, which
    would print into later tests' captured output."""
    import logging
    log = logging.getLogger("iron_spec")
    handlers, level = list(log.handlers), log.level
    yield
    log.handlers[:] = handlers
    log.setLevel(level)
