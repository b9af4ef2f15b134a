"""The serving engine alone (runtime/engine.py, no HTTP, no client): B requests submitted
together, each a prompt of its own drawn ids and greedy decoding, as ``iron-spec serve`` runs
them; what serve_load.py measures through HTTP, without the server and the client.

    python bench/engine_load.py --checkpoint smollm2.q8_0.gguf --weights stored \\
        --requests 1,8 --prompt-tokens 64 --max-tokens 256

Per B (after an untimed request: compile, weights paged in), two rounds: tokens/s over the
round's wall time, the mean time to first token, and the decode steps' own time a step
(``Engine.metrics``). One run on a shared machine: read the ratios, not the figures.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import iron_spec
from iron_spec.operators.sampling import Sampler
from iron_spec.runtime.engine import Engine, Request


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--weights", default="stored")
    ap.add_argument("--requests", default="1,8", help="requests at once, comma-separated")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-seq-len", type=int, default=2304)
    args = ap.parse_args()
    counts = [int(b) for b in args.requests.split(",")]
    model = iron_spec.load(checkpoint=args.checkpoint, weights=args.weights,
                           threads=args.threads, max_seq_len=args.max_seq_len, progress=False)
    lm = model.loaded.lm
    engine = Engine(lm, max_batch=max(counts), held_sessions=0)
    rng = np.random.default_rng(1)
    V = lm.config.vocab_size

    def request(n: int) -> Request:
        return Request(ids=[int(i) for i in rng.integers(0, V, args.prompt_tokens)],
                       max_new_tokens=n, sampler=Sampler())

    engine.submit(request(8)).wait()
    first = None
    for b in counts:
        for _ in range(2):
            m = engine.metrics
            steps, seconds = m.decode_steps, m.decode_seconds
            begin = time.perf_counter()
            done = [t.wait() for t in [engine.submit(request(args.max_tokens)) for _ in range(b)]]
            wall = time.perf_counter() - begin
            tokens = sum(len(c.token_ids) for c in done)
            step = (m.decode_seconds - seconds) / max(1, m.decode_steps - steps)
            rate = tokens / wall
            first = first or rate
            print(f"{b} request(s): {rate:.1f} tokens/s ({rate / first:.2f}x the first's), TTFT "
                  f"mean {1e3 * np.mean([c.ttft for c in done]):.0f} ms, {1e3 * step:.1f} ms a "
                  f"decode step", flush=True)
    engine.close()


if __name__ == "__main__":
    main()
