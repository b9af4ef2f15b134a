"""Shared pieces of the bad-input corpus (issue 13): a toy checkpoint directory of the llama3
spec (config.json, model.safetensors, a byte-level tokenizer, generation_config.json) to
break one file at a time, and the count of cases by class the corpus holds.

Every case asserts its refusal: one of the tool's own error types, a message naming the file
and the key, line or tensor.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from tests.conftest import SPECS
from tests.runtime.test_tokenizer import write_tiny

LLAMA = str(SPECS / "llama3.yaml")
VOCAB = 258  # the tiny tokenizer's 256 bytes, <s> and </s>


def toy_config() -> dict:
    """The llama3 spec's toy config.json, its vocabulary the tiny tokenizer's."""
    from iron_spec.spec.loader import load_spec
    config = copy.deepcopy(load_spec(LLAMA).get("toy", "config"))
    config.update(vocab_size=VOCAB, bos_token_id=256, eos_token_id=257)
    return config


_BUILT: dict[str, Path] = {}


def pristine(root: Path) -> Path:
    """A whole toy checkpoint under ``root`` (built once per session, then copied)."""
    if "dir" not in _BUILT:
        from iron_spec.spec.build import load_model
        base = root / "pristine"
        base.mkdir(parents=True)
        (base / "config.json").write_text(json.dumps(toy_config()))
        loaded = load_model(LLAMA, checkpoint=base, random_weights=0)
        tensors = {n: np.ascontiguousarray(p.array) for n, p in loaded.lm.named_params()
                   if n in loaded.report.sources}
        save_file(tensors, str(base / "model.safetensors"))
        write_tiny(base)
        (base / "tokenizer_config.json").write_text(json.dumps(
            {"bos_token": "<s>", "eos_token": "</s>",
             "chat_template": "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
                              "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"}))
        (base / "generation_config.json").write_text(json.dumps(
            {"do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.9,
             "eos_token_id": 257}))
        _BUILT["dir"] = base
    return _BUILT["dir"]


def checkpoint_copy(root: Path, into: Path) -> Path:
    """A fresh copy of the toy checkpoint at ``into``."""
    shutil.copytree(pristine(root), into)
    return into


def dump(path: Path, data) -> None:
    """``data`` at ``path``: bytes as they are, text as it is, anything else as JSON."""
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data if isinstance(data, str) else json.dumps(data))
