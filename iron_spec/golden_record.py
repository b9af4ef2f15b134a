"""Recording goldens from transformers' own model, in float32, on the same weights.

Only this module imports torch and transformers (the ``golden`` extra); reading a golden
needs neither (``runtime.golden``).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from runtime.golden import Golden

from .build import Loaded

GOLDEN_STEPS = 40



def hugging_face(loaded: Loaded):
    """transformers' own causal LM in float32 on ``loaded``'s weights.

    A real checkpoint directory loads as it is; drawn weights are written with the config
    to a temporary checkpoint first, so transformers renames and ties them as it loads any.

    Raises:
        ImportError: torch or transformers is not installed (the ``golden`` extra).
        ValueError: transformers' model lacks or does not take some of the weights.
    """
    import torch
    import transformers
    from safetensors.torch import save_file

    if loaded.directory is not None and loaded.random_weights is None:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            loaded.directory, dtype=torch.float32)
        return model.eval()
    with tempfile.TemporaryDirectory() as d:
        Path(d, "config.json").write_text(json.dumps(loaded.config_json))
        # np.array, not ascontiguousarray: a 0-d tensor (a buffer) stays 0-d.
        state = {k: torch.from_numpy(np.array(v, order="C")) for k, v in
                 loaded.checkpoint_tensors().items()}
        save_file(state, str(Path(d, "model.safetensors")))
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            d, dtype=torch.float32, output_loading_info=True)
    tied = set(loaded.report.tied)
    missing = [k for k in info["missing_keys"] if k not in tied]
    if missing or info["unexpected_keys"] or info.get("mismatched_keys"):
        raise ValueError(f"transformers' model lacks {sorted(missing)}, does not take "
                         f"{sorted(info['unexpected_keys'])}, mis-shapes "
                         f"{info.get('mismatched_keys')}")
    return model.eval()


def record(loaded: Loaded, prompt: list[int], steps: int = GOLDEN_STEPS) -> Golden:
    """transformers' distributions after ``prompt`` and then each of its own greedy tokens,
    ``steps`` of them, as a Golden keyed by ``loaded``'s fingerprint."""
    import torch
    import transformers

    model = hugging_face(loaded)
    tokens = list(prompt)
    rows = []
    with torch.no_grad():
        for _ in range(steps):
            out = model(torch.tensor([tokens]), use_cache=False, logits_to_keep=1).logits[0, -1]
            row = out.numpy().astype(np.float32)
            rows.append(row)
            tokens.append(int(np.argmax(row)))
    meta = {"transformers": transformers.__version__, "torch": torch.__version__,
            "dtype": "float32", "model": type(model).__name__}
    return Golden.from_logits(loaded.fingerprint(), tokens[:-1], len(prompt),
                              np.stack(rows), meta)
