"""Fixtures of the bad-input corpus: the toy checkpoint, copied fresh for each case."""

from __future__ import annotations

import pytest

from tests.bad.corpus import checkpoint_copy


@pytest.fixture()
def toy_dir(tmp_path_factory, tmp_path):
    """A fresh toy checkpoint directory (config.json, model.safetensors, tokenizer files)."""
    return checkpoint_copy(tmp_path_factory.getbasetemp(), tmp_path / "ckpt")
