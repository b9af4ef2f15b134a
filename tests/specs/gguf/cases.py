"""The GGUF cases: each a tiny Hugging Face checkpoint (``<name>.json``: the spec, a
config.json llama.cpp's converter can express, the tensors by name and shape, drawn at seed
0 by ``tests.specs.divergences.cases.draw``) with transformers' own logits on it as the
golden (``tests/goldens/<spec>/<name>-seed0.npz``, ``record.py``). The test writes the
checkpoint as llama.cpp lays it out (``convert.py``) and runs the GGUF file."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from tests.specs.divergences import cases as _cases

HERE = Path(__file__).resolve().parent
names = partial(_cases.names, HERE)
case = partial(_cases.case, folder=HERE)
golden_file = partial(_cases.golden_file, folder=HERE)
spec_file = partial(_cases.spec_file, folder=HERE)
materialize = partial(_cases.materialize, folder=HERE)
prompt = partial(_cases.prompt, folder=HERE)
draw = _cases.draw


def family(name: str) -> str:
    """The llama.cpp family a case is converted as: its name past ``gguf-``."""
    return name.removeprefix("gguf-")
