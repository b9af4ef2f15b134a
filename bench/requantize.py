"""What converting already-quantized weights costs: ``--weights FORM`` on a checkpoint whose
matrices are stored quantized (a Q8_0 GGUF) against the same conversion of the original
weights (a BF16 GGUF or safetensors directory of the same model), each judged by its KL
against the float32 logits of the original.

    python bench/requantize.py --original smollm2.bf16.gguf --quantized smollm2.q8_0.gguf
                               [--weights q4_0] [--prompt-file iron_spec/cli/prompt.txt]

Prints, per side, the mean KL(original float32 || side) over the prompt's positions and the
share of positions whose top-1 token agrees. The load says it re-quantizes (a warning on
stderr, ``runtime.checkpoint.requantized``); this measures by how much.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import iron_spec


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--original", required=True, help="the model's original weights")
    parser.add_argument("--quantized", required=True, help="the same model stored quantized")
    parser.add_argument("--weights", default="q4_0", help="the form both are converted to")
    parser.add_argument("--prompt-file", type=Path,
                        default=Path(__file__).resolve().parents[1] / "iron_spec" / "cli" /
                        "prompt.txt")
    a = parser.parse_args()
    text = a.prompt_file.read_text()
    reference = iron_spec.load(checkpoint=a.original, weights="float32", max_seq_len=4096)
    ids = reference.encode(text)
    p = log_softmax(reference.logits(ids))
    del reference
    for name, checkpoint, weights in (("original", a.original, a.weights),
                                      ("quantized", a.quantized, a.weights),
                                      ("quantized as stored", a.quantized, "stored")):
        model = iron_spec.load(checkpoint=checkpoint, weights=weights, max_seq_len=4096)
        q = log_softmax(model.logits(ids))
        kl = (np.exp(p) * (p - q)).sum(-1)
        agree = float(np.mean(p.argmax(-1) == q.argmax(-1)))
        print(f"{name:<20} --weights {weights:<7} mean KL {kl.mean():.4f}, top-1 agrees "
              f"{agree:.3f} over {len(ids)} positions")
        del model


if __name__ == "__main__":
    main()
