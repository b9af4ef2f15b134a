"""The divergences from transformers (issue 11, item 7), each a tiny checkpoint of the very
config that diverged, with transformers' own logits on it as the golden.

A case is ``<name>.json`` here: the spec that serves it, the config.json (one transformers'
own config class accepts), and the checkpoint's tensors by name and shape, as transformers'
``save_pretrained`` writes them for that config (listed by ``record.py``). The tensors' values
are drawn here at seed 0 by name, without our model: the checkpoint, and so the golden's
fingerprint, depend on nothing under test. The golden is ``tests/goldens/<spec>/<name>-seed0.npz``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent
SEED = 0
STEPS = 40


def names(folder: Path = HERE) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.json"))


def case(name: str, folder: Path = HERE) -> dict:
    """The case ``name`` (of ``folder``, default this one's): ``spec``, ``config``,
    ``tensors`` (name -> shape), ``prompt_len``, ``prefill_chunk``, ``why``."""
    return json.loads((folder / f"{name}.json").read_text())


def write_case(name: str, c: dict, folder: Path = HERE) -> None:
    """Write case ``name``: one key a line, the config and the tensors one entry a line."""
    def block(d: dict) -> str:
        return "{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in d.items()) + "\n }"
    body = ",\n".join(f" {json.dumps(k)}: {block(v) if isinstance(v, dict) and v else json.dumps(v)}"
                      for k, v in c.items())
    (folder / f"{name}.json").write_text("{\n" + body + "\n}\n")


def golden_file(name: str, folder: Path = HERE) -> Path:
    return ROOT / "tests" / "goldens" / case(name, folder)["spec"] / f"{name}-seed{SEED}.npz"


def spec_file(name: str, folder: Path = HERE) -> Path:
    return ROOT / "specs" / f"{case(name, folder)['spec']}.yaml"


def draw(tensors: dict[str, list[int]], seed: int = SEED) -> dict[str, np.ndarray]:
    """float32 tensors in name order from ``default_rng(seed)``: matrices normal with standard
    deviation ``1 / sqrt(in_features)`` (embeddings: rows of standard deviation 1 /
    sqrt(hidden), logits of order one through the head), norm weights and learned scalars
    ``1 + N(0, 0.1)``, every other vector (biases) ``N(0, 0.1)``."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in sorted(tensors):
        shape = tuple(tensors[name])
        if len(shape) == 2:
            out[name] = rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(shape[1]))
        else:
            t = np.float32(0.1) * rng.standard_normal(shape, dtype=np.float32)
            if name.endswith(("norm.weight", "layer_scalar")):
                t += np.float32(1.0)
            out[name] = t
    return out


def materialize(name: str, directory: Path, folder: Path = HERE) -> Path:
    """Write case ``name``'s checkpoint (config.json, model.safetensors) into ``directory``."""
    c = case(name, folder)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(c["config"], indent=1))
    save_file(draw(c["tensors"]), str(directory / "model.safetensors"))
    return directory


def prompt(name: str, folder: Path = HERE) -> list[int]:
    c = case(name, folder)
    vocab = c["config"]["vocab_size"]
    return np.random.default_rng(SEED).integers(0, vocab, c.get("prompt_len", 24)).tolist()
