"""The batched decode step (runtime/batch.py) on a real checkpoint: each B's cost against one
row's, and where it goes.

    python bench/batch_step.py --checkpoint ~/.cache/iron-spec/checkpoints/smollm2-135m-instruct \\
        [--weights float32|q8_0|bfloat16|stored] [--rows 1,2,4,8,16] [--prompt 64] [--steps 8]

B sessions, each with a prompt of its own (``--prompt`` drawn ids), decode ``--steps`` steps
side by side as the server's engine runs them (``BatchDecode.step``; B = 1 is the decode
step itself), each B in turn after one warm step; then one more pass under
``native.profile`` for the split by step code (``gemv``: the projections; ``attend``: each
row's attention over its own cache; the rest) and the wall time outside the native calls
(Python: assembling the program, copying the logits). A GGUF file as ``--checkpoint`` is
served from its blocks with ``--weights stored``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import iron_spec
from iron_spec.operators import native
from iron_spec.runtime.batch import BatchDecode
from iron_spec.runtime.session import Session


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--weights", default="float32")
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-seq-len", type=int, default=1024)
    args = ap.parse_args()
    rows = [int(b) for b in args.rows.split(",")]
    model = iron_spec.load(checkpoint=args.checkpoint, weights=args.weights,
                           threads=args.threads, max_seq_len=args.max_seq_len, progress=False)
    lm = model.loaded.lm
    print(native.describe())
    rng = np.random.default_rng(0)
    V = lm.config.vocab_size
    top = max(rows)
    sessions = [Session(lm) for _ in range(top)]
    histories = [rng.integers(1, V, args.prompt).tolist() for _ in range(top)]
    for s, h in zip(sessions, histories):
        s.logits(h)
    batch = BatchDecode(lm, top)

    def steps(b: int, n: int) -> float:
        t = time.perf_counter()
        for _ in range(n):
            out = batch.step(sessions[:b], histories[:b])
            for h, logits in zip(histories, out):
                h.append(int(np.argmax(logits)))
        return (time.perf_counter() - t) / n

    seen = {}
    for b in rows:
        steps(b, 1)  # the program assembled for these rows, the caches grown
        seen[b] = steps(b, args.steps)
    one = seen[rows[0]]
    print(f"{args.checkpoint} held as {args.weights}, {args.threads} threads, prompts of "
          f"{args.prompt}, {args.steps} steps a B:")
    for b in rows:
        with native.profile() as prof:
            t = steps(b, 2) * 2
        inside = sum(sec for _, sec in prof.values())
        split = "  ".join(f"{k} {sec / 2 * 1e3:.1f}" for k, (_, sec) in
                          sorted(prof.items(), key=lambda kv: -kv[1][1])[:4])
        print(f"  B={b:2d}: {seen[b] * 1e3:7.1f} ms a step ({seen[b] / one:4.2f}x one row's; "
              f"{b / seen[b]:6.1f} tokens/s, {b * one / seen[b]:4.2f}x one row's); ms by code: "
              f"{split}; outside native {(t - inside) / 2 * 1e3:.1f}")


if __name__ == "__main__":
    main()
