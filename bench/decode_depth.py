"""A decode step's speed against the position it runs at, in one run: tokens/s over 64 greedy
tokens drawn after a prompt of each depth, alternated over the runs, and each depth's ratio
to the shallowest. A model whose token mixers carry a state (short convolutions, SSMs, the
delta rule) decodes at a cost independent of the position; attention's grows with it.

    python bench/decode_depth.py specs/lfm2.yaml --checkpoint DIR [--depths 128,4000] [--runs 3]

Weights drawn where the directory holds a config.json alone (--random-weights).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import numpy as np
import typer

from iron_spec.spec.build import load_model
from iron_spec.runtime.causal import drawn_ids
from iron_spec.runtime.session import Session

DECODE = 64


def decode_rate(lm, prompt: list[int]) -> float:
    """Tokens/s over DECODE greedy tokens after ``prompt`` (its prefill not timed)."""
    s = Session(lm)
    for _ in s.generate(prompt, DECODE + 1):
        pass
    return s.stats.decode_tokens_per_s


def main(spec: Path, checkpoint: Path = typer.Option(..., help="checkpoint directory"),
         depths: str = typer.Option("128,4000", help="prompt lengths, comma-separated"),
         runs: int = typer.Option(3, min=1, help="runs per depth, after one warm-up"),
         random_weights: Optional[int] = typer.Option(None, help="draw weights at this seed"),
         as_json: bool = typer.Option(False, "--json", help="one JSON object")) -> None:
    at = [int(d) for d in depths.split(",")]
    loaded = load_model(spec, checkpoint=checkpoint, random_weights=random_weights,
                        max_seq_len=-(-(max(at) + DECODE + 2) // 256) * 256)
    lm = loaded.lm
    prompt = drawn_ids(lm.config, np.random.default_rng(0), max(at))
    decode_rate(lm, prompt[:at[0]])  # warm-up: both versions compiled, the pool started
    rates: dict[int, list[float]] = {d: [] for d in at}
    began = time.perf_counter()
    for _ in range(runs):
        for d in at:
            rates[d].append(decode_rate(lm, prompt[:d]))
    best = {d: max(r) for d, r in rates.items()}
    out = {"spec": str(spec), "checkpoint": str(checkpoint), "decode_tokens": DECODE,
           "tokens_per_s": {str(d): r for d, r in rates.items()},
           "best_tokens_per_s": {str(d): best[d] for d in at},
           "ratio_to_shallowest": {str(d): best[d] / best[at[0]] for d in at},
           "seconds": time.perf_counter() - began}
    if as_json:
        typer.echo(json.dumps(out))
        return
    for d in at:
        typer.echo(f"decode after {d:6d} tokens: {best[d]:8.2f} tok/s (runs "
                   f"{', '.join(f'{r:.2f}' for r in rates[d])}), "
                   f"{best[d] / best[at[0]]:.3f}x the {at[0]}-token figure")


if __name__ == "__main__":
    typer.run(main)
