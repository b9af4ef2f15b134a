"""The decode GEMVs' bandwidth on this machine, per weight form and prefetch distance.

    python bench/gemv.py [--rows 1536] [--cols 576] [--matrices 60] [--ahead 0,2048,4096,8192]

Streams ``--matrices`` distinct weight matrices (more than the caches hold, as a decode step
reads its layers) through ``operators._cpu.gemv`` on the pool, float32, bfloat16 (row groups)
and Q8_0, at each prefetch distance in turn (``_cpu.prefetch``; interleaved, median of
``--runs``), beside the pool's read bandwidth of a 256 MB array: the ratio to it is the
figure, as bench's decode-vs-floor. A machine's own optimum, not the next one's.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from iron_spec.operators import formats, native


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1536)
    ap.add_argument("--cols", type=int, default=576)
    ap.add_argument("--matrices", type=int, default=60)
    ap.add_argument("--ahead", default="0,2048,4096,8192")
    ap.add_argument("--runs", type=int, default=4)
    args = ap.parse_args()
    lib = native.LIB
    if lib is None:
        raise SystemExit("operators._cpu is not built or is off (IRON_SPEC_NATIVE)")
    rng = np.random.default_rng(0)
    ws = [rng.standard_normal((args.rows, args.cols)).astype(np.float32)
          for _ in range(args.matrices)]
    forms = {"float32": ws,
             "bfloat16": [formats.group_bfloat16(formats.round_bfloat16(w)) for w in ws],
             "int8": [formats.group_q8_0(formats.quantize_q8_0(w)) for w in ws]}
    x = rng.standard_normal(args.cols).astype(np.float32)
    y = np.empty(args.rows, np.float32)
    dists = [int(d) for d in args.ahead.split(",")]
    before = lib.prefetch()
    seen = {(f, d): [] for f in forms for d in dists}
    try:
        for _ in range(args.runs):
            for d in dists:
                lib.prefetch(d, d, d)
                for f, mats in forms.items():
                    start = time.perf_counter()
                    for w in mats:
                        lib.gemv(y, x, w, None)
                    seen[f, d].append(sum(w.nbytes for w in mats) / (time.perf_counter() - start))
    finally:
        lib.prefetch(*before)
    buf = np.ones(64 << 20, np.float32)
    start = time.perf_counter()
    for _ in range(3):
        lib.read(buf)
    read = 3 * buf.nbytes / (time.perf_counter() - start)
    print(f"{native.describe()}\nread {read / 1e9:.1f} GB/s; GEMV GB/s (and over read) by "
          f"prefetch distance, bytes (defaults {before}):")
    for f in forms:
        cells = (f"{d}: {np.median(seen[f, d]) / 1e9:.1f} ({np.median(seen[f, d]) / read:.2f})"
                 for d in dists)
        print(f"  {f:9s}" + "   ".join(cells))


if __name__ == "__main__":
    main()
