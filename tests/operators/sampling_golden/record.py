"""Record what transformers' own logits processors and stop-string criterion compute, for
tests/operators/test_sampling_golden.py (which needs neither torch nor transformers).

Run from the checkout with a venv holding the ``golden`` extra (torch, transformers):

    .venv/bin/python tests/operators/sampling_golden/record.py

It writes ``processors.npz`` beside itself: seeded logits, a token history, and for each
case the generation settings (JSON), the processors ``GenerationMixin._get_logits_processor``
builds for them, in its order, and the scores they leave. With the real SmolLM2 checkpoint
present (``IRON_SPEC_CHECKPOINTS``) it also writes ``stop_strings.npz``: token sequences and,
for each stop string, the first token at which ``StopStringCriteria`` ends generation.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import (AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM,
                          StopStringCriteria)

HERE = Path(__file__).resolve().parent
V = 256
CASES = [
    {"repetition_penalty": 1.3},
    {"repetition_penalty": 0.7},
    {"do_sample": True, "temperature": 0.7, "top_k": 20},
    {"do_sample": True, "top_k": 6},
    {"do_sample": True, "top_p": 0.9},
    {"do_sample": True, "temperature": 2.0, "top_p": 0.5},
    {"do_sample": True, "min_p": 0.05},
    {"do_sample": True, "temperature": 0.5, "min_p": 0.2},
    {"do_sample": True, "temperature": 1.5, "top_k": 40, "top_p": 0.8, "min_p": 0.1,
     "repetition_penalty": 1.2},
    {"do_sample": True, "temperature": 0.8, "top_p": 0.95, "min_p": 0.3,
     "repetition_penalty": 1.5},
]


def logits() -> np.ndarray:
    """Rows of several spreads, and one of coarse values (ties at the k-th largest)."""
    rng = np.random.default_rng(0)
    rows = [rng.normal(0, s, V) for s in (1.0, 3.0, 8.0)]
    rows.append(np.round(rng.normal(0, 2.0, V) * 2) / 2)
    return np.stack(rows).astype(np.float32)


def processors():
    model = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1))
    x = logits()
    history = np.random.default_rng(1).integers(0, V, 40)
    out = {"logits": x, "history": history, "transformers": np.array(transformers.__version__)}
    for i, settings in enumerate(CASES):
        config = GenerationConfig(**settings)
        built = model._get_logits_processor(generation_config=config,
                                            input_ids_seq_length=history.size, device="cpu")
        ids = torch.tensor(history[None].repeat(x.shape[0], 0))
        scores = built(ids, torch.tensor(x))
        out[f"case{i}.settings"] = np.array(json.dumps(settings))
        out[f"case{i}.processors"] = np.array(" ".join(type(p).__name__ for p in built))
        out[f"case{i}.scores"] = scores.numpy()
    np.savez(HERE / "processors.npz", **out)


TEXTS = ["The capital of France is Paris.\n\nThe answer is: Paris",
         "def stop():\n    return 'stopped'  # stops here",
         "Wörter über Straße, naïve café"]
STOPS = ["Paris", "\n\n", "is:", "ance", "stop", "opp", "'  #", "über", "é", "ß"]


def stop_strings(directory: Path):
    tok = AutoTokenizer.from_pretrained(str(directory))
    out = {"transformers": np.array(transformers.__version__), "stops": np.array(STOPS)}
    for t, text in enumerate(TEXTS):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        out[f"text{t}.ids"] = np.array(ids)
        first = []
        for stop in STOPS:
            criterion = StopStringCriteria(tok, [stop])
            at = -1  # never
            for n in range(1, len(ids) + 1):
                if bool(criterion(torch.tensor([ids[:n]]), None)[0]):
                    at = n
                    break
            first.append(at)
        out[f"text{t}.first"] = np.array(first)  # tokens drawn when generation ends
    np.savez(HERE / "stop_strings.npz", **out)


if __name__ == "__main__":
    processors()
    checkpoints = Path(os.environ.get("IRON_SPEC_CHECKPOINTS",
                                      Path.home() / ".cache" / "iron-spec" / "checkpoints"))
    smollm2 = checkpoints / "smollm2-135m-instruct"
    if (smollm2 / "tokenizer.json").exists():
        stop_strings(smollm2)
    else:
        print(f"{smollm2} is missing: stop_strings.npz not recorded")
