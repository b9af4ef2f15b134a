"""The batched decode step (runtime/batch.py) on a real checkpoint: each B's cost against one
row's, and where it goes.

    python bench/batch_step.py --checkpoint ~/.cache/iron-spec/checkpoints/smollm2-135m-instruct \\
        [--weights float32|q8_0|bfloat16|stored] [--rows 1,2,4,8,16] [--prompt 64] [--steps 8]

B sessions, each with a prompt of its own (``--prompt`` drawn ids), decode ``--steps`` steps
side by side as the server's engine runs them (``BatchDecode.step``; B = 1 is the decode
step itself), each B in turn, three timed steps after an untimed one at the same B (which
assembles the batch's program again for its rows, as the server does when its batch changes); then one more pass under
``native.profile`` for the native steps' time by step code (``gemv``: the projections;
``attend``: each row's attention over its own cache; the rest). A GGUF file as ``--checkpoint`` is
served from its blocks with ``--weights stored``. ``--before``: each step also run
without operators/_cpu_skinny.h's kernels, interleaved, side by side.
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
    ap.add_argument("--before", action="store_true", help="also without operators/"
                    "_cpu_skinny.h's kernels (_cpu.skinny(False)), interleaved")
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

    lib = native.lib()
    ways = (True, False) if args.before else (True,)
    seen = {(w, b): [] for w in ways for b in rows}
    profs = {}
    was = lib.skinny()
    try:
        for b in rows:
            steps(b, 1)  # the program assembled for these rows, the caches grown
        for _ in range(args.steps):  # interleaved: the machine's load alike for each
            for w in ways:
                lib.skinny(w)
                for b in rows:
                    steps(b, 1)  # untimed: the program assembled again for b rows
                    seen[w, b] += [steps(b, 1) for _ in range(3)]
        for w in ways:
            lib.skinny(w)
            for b in rows:
                with native.profile() as prof:
                    t = steps(b, 2)
                profs[w, b] = (prof, t)
    finally:
        lib.skinny(was)
    print(f"{args.checkpoint} held as {args.weights}, {args.threads} threads, prompts of "
          f"{args.prompt}, median of {3 * args.steps} steps a B:")
    for w in ways:
        one = np.median(seen[w, rows[0]])
        for b in rows:
            t = np.median(seen[w, b])
            prof, pt = profs[w, b]
            inside = sum(sec for _, sec in prof.values())
            split = " ".join(f"{k} {sec / inside:.0%}" for k, (_, sec) in
                             sorted(prof.items(), key=lambda kv: -kv[1][1])[:3])
            print(f"  {'' if w else 'before '}B={b:2d}: {t * 1e3:6.1f} ms a step ({t / one:4.2f}x "
                  f"one row's; {b / t:5.1f} tokens/s, {b * one / t:4.2f}x one row's); a "
                  f"profiled step {pt * 1e3:.1f} ms, its native steps' time: {split}")


if __name__ == "__main__":
    main()
