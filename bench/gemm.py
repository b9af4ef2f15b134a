"""A prompt chunk's float32 GEMMs on this machine: ours against numpy's BLAS and torch.

    python bench/gemm.py [--side ours|numpy|torch] [--rows 512] [--threads 2] [--runs 5]

Times ``out (rows, n) = x (rows, k) @ w (n, k).T`` at SmolLM2-135M's projection shapes
(k 576 -> n 960, 576 -> 1536 gate/up as one, 1536 -> 576 down) and Gemma 3 270M's
(640 -> 1280, 640 -> 4096, 2048 -> 640), and prints GF/s per shape (median of ``--runs``
after a warm-up). Without ``--side`` each side runs in a process of its own, in turn: a
BLAS pool left spinning after its side slows the next side's in the same process, so the
sides are compared across processes, and their ratio is quoted from one run of this script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SHAPES = {"smollm2 qkv": (576, 960), "smollm2 gate+up": (576, 3072),
          "smollm2 down": (1536, 576), "gemma3 qkv": (640, 1280),
          "gemma3 gate+up": (640, 4096), "gemma3 down": (2048, 640)}
SIDES = ("ours", "numpy", "torch")


def _side(side: str, rows: int, runs: int) -> dict[str, float]:
    """GF/s per shape of one side, in this process."""
    import numpy as np

    rng = np.random.default_rng(0)
    if side == "ours":
        from iron_spec.operators import native
        lib = native.gemm_lib()
        if lib is None:
            raise SystemExit("operators._cpu is not built or its GEMM is off (IRON_SPEC_GEMM)")
    elif side == "torch":
        import torch
    seen = {}
    for name, (k, n) in SHAPES.items():
        x = rng.standard_normal((rows, k)).astype(np.float32)
        w = rng.standard_normal((n, k)).astype(np.float32)
        out = np.empty((rows, n), np.float32)
        if side == "ours":
            call = lambda: lib.gemm(out, x, w, None)  # noqa: E731
        elif side == "numpy":
            call = lambda: np.matmul(x, w.T, out=out)  # noqa: E731
        else:
            tx, tw, to = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(out)
            call = lambda: torch.mm(tx, tw.t(), out=to)  # noqa: E731
        call()
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        seen[name] = 2 * rows * k * n / statistics.median(times) / 1e9
    return seen


def _whole(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return int(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", choices=SIDES)
    ap.add_argument("--rows", type=_whole, default=512)
    ap.add_argument("--threads", type=_whole, default=2)
    ap.add_argument("--runs", type=_whole, default=5)
    args = ap.parse_args()
    if args.side:
        # Our pool and OpenBLAS take their count from these at their first use (found by a
        # new user's trial: --side ours --threads 1 ran on every core).
        os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = str(args.threads)
        if args.side == "torch":
            import torch
            torch.set_num_threads(args.threads)
        print(json.dumps(_side(args.side, args.rows, args.runs)))
        return
    # Our pool takes its count where OpenBLAS does (operators/native.threads).
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(args.threads),
               OMP_NUM_THREADS=str(args.threads))
    table = {}
    for side in SIDES:
        done = subprocess.run([sys.executable, __file__, "--side", side, "--rows",
                               str(args.rows), "--threads", str(args.threads), "--runs",
                               str(args.runs)], env=env, capture_output=True, text=True)
        if done.returncode:
            print(f"{side}: not measured ({done.stderr.strip().splitlines()[-1:]})")
            continue
        table[side] = json.loads(done.stdout)
    print(f"GF/s, {args.rows} rows, {args.threads} thread{'s' * (args.threads != 1)}")
    print(f"{'shape':16}" + "".join(f"{s:>9}" for s in table)
          + ("   ours/torch" if {"ours", "torch"} <= table.keys() else ""))
    for name in SHAPES:
        line = f"{name:16}" + "".join(f"{table[s][name]:9.1f}" for s in table)
        if {"ours", "torch"} <= table.keys():
            line += f"   {table['ours'][name] / table['torch'][name]:.2f}"
        print(line)


if __name__ == "__main__":
    main()
