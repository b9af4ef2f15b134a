"""Where a prompt and a decode step spend their time, by the compiled steps' codes.

    python bench/profile.py specs/llama3.yaml --checkpoint DIR [--weights q8_0] [--decode-weights int8]
        [--prefill-weights bfloat16] [--kv-cache bfloat16] [--prompt 512] [--at 128]
        [--tokens 64]

Runs one prompt of ``--prompt`` ids (bench's text), then ``--tokens`` greedy decode steps
from ``--at`` ids, each inside ``operators.native.profile``, and prints each code's share of
the wall time (gemm, attend, gemv, rms_norm, ...), its calls and ms. A diagnosis, not a
figure: ``iron-spec bench`` gives the figures, as ratios to its peers. Needs the native
program (operators._cpu built, IRON_SPEC_PROGRAM not 0).
"""

from __future__ import annotations

import argparse
import time

from iron_spec.cli.bench import bench_prompt
from iron_spec.spec.build import DECODE_WEIGHTS, KV_CACHES, PREFILL_WEIGHTS, WEIGHTS, load_model
from iron_spec.operators import native
from iron_spec.runtime.session import Session


def table(title: str, prof: native.Profile, wall: float, per: int, unit: str) -> str:
    rows = [f"{title}: {wall * 1e3:.1f} ms wall, of it in native steps "
            f"{sum(s for _, s in prof.values()) * 1e3:.1f} ms"]
    for code, (calls, seconds) in sorted(prof.items(), key=lambda kv: -kv[1][1]):
        n = calls // per
        rows.append(f"  {code:11s} {seconds / wall:6.1%}  {seconds * 1e3 / per:8.2f} ms/{unit}"
                    f"  {n:6d} call{'s' * (n != 1)}/{unit}")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec")
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--decode-weights", default="float32", choices=DECODE_WEIGHTS)
    ap.add_argument("--prefill-weights", default="float32", choices=PREFILL_WEIGHTS)
    ap.add_argument("--kv-cache", default="float32", choices=KV_CACHES)
    ap.add_argument("--weights", default="stored", choices=WEIGHTS)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--at", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    if not native.PROGRAM:
        raise SystemExit("no native program here (operators._cpu not built, or "
                         "IRON_SPEC_PROGRAM=0): nothing to count")
    for name in ("prompt", "at", "tokens"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name} {getattr(args, name)}: give a whole number >= 1")
    try:
        loaded = load_model(args.spec, checkpoint=args.checkpoint,
                            max_seq_len=max(args.prompt, args.at + args.tokens + 1),
                            decode_weights=args.decode_weights,
                            prefill_weights=args.prefill_weights, kv_cache=args.kv_cache,
                            weights=args.weights)
    except ValueError as e:  # the context asked for is this script's --prompt, --at, --tokens
        raise SystemExit(f"--prompt {args.prompt}, --at {args.at} and --tokens {args.tokens} "
                         f"need {max(args.prompt, args.at + args.tokens + 1)} positions: {e}")
    lm, ids = loaded.lm, bench_prompt(loaded)
    if len(ids) < max(args.prompt, args.at):
        raise SystemExit(f"bench's prompt has {len(ids)} ids: --prompt and --at at most that")
    Session(lm).logits(ids[:8])  # both plans compiled and warm before anything is counted
    print(native.describe())
    with native.profile() as prof:
        start = time.perf_counter()
        Session(lm).logits(ids[:args.prompt])
        wall = time.perf_counter() - start
    print(table(f"prompt of {args.prompt} ids ({args.prefill_weights} prefill weights)",
                prof, wall, 1, "prompt"))
    tokens = Session(lm).generate(ids[:args.at], args.tokens + 1)
    next(tokens)  # the prompt's prefill and the first token: outside the count
    with native.profile() as prof:
        start = time.perf_counter()
        for _ in tokens:
            pass
        wall = time.perf_counter() - start
    print(table(f"{args.tokens} decode steps from {args.at} ids ({args.decode_weights} decode "
                "weights)", prof, wall, args.tokens, "token"))

if __name__ == "__main__":
    main()
