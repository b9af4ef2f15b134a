"""Prefill and decode tokens/s of a spec on a checkpoint (or a toy), median of several runs.

    python bench/decode_prefill.py specs/llama3.yaml --checkpoint DIR [--prompt-tokens 128]
        [--decode-tokens 64] [--runs 3]

Speed is measured here, never asserted in tests. Threads are BLAS's own (printed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from iron_spec.build import load_model
from runtime.session import Session


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec")
    p.add_argument("--checkpoint")
    p.add_argument("--toy", action="store_true")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--max-seq-len", type=int, default=4096)
    a = p.parse_args()
    loaded = load_model(a.spec, checkpoint=a.checkpoint, toy=a.toy,
                        random_weights=0 if a.toy else None, max_seq_len=a.max_seq_len)
    lm = loaded.lm
    lm.decode_step, lm.prompt_chunk  # compile both before timing
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, lm.config.vocab_size, a.prompt_tokens).tolist()
    prefill, decode = [], []
    for run in range(a.runs + 1):  # the first is a warm-up
        session = Session(lm)
        start = time.perf_counter()
        session.logits(prompt)
        seconds = time.perf_counter() - start
        list(session.generate(prompt, a.decode_tokens + 1))  # the prompt is held: all decode
        if run:
            prefill.append(a.prompt_tokens / seconds)
            decode.append(session.stats.decode_tokens_per_s)
    threads = os.environ.get("OPENBLAS_NUM_THREADS", "BLAS default")
    print(f"{a.spec} on {a.checkpoint or 'toy'}: threads {threads}, C={lm.config.prefill_chunk}")
    print(f"prefill {a.prompt_tokens} tokens: {statistics.median(prefill):8.1f} tokens/s "
          f"(median of {a.runs})")
    print(f"decode  {a.decode_tokens} tokens: {statistics.median(decode):8.1f} tokens/s "
          f"(median of {a.runs})")


if __name__ == "__main__":
    main()
