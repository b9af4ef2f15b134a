"""A batched decode step's GEMVs: the cost of B rows against one, per held weight form.

    python bench/batch_gemv.py [--rows 1,2,4,8,16] [--forms F32,BF16,Q8_0,Q4_0,Q4_K]
                               [--layers 30] [--hidden 576] [--inter 1536] [--vocab 49152]

A whole decode step's projections (SmolLM2-135M's shapes by default: per layer q, k and v
fused, o, gate and up fused, down; then the head) on drawn weights held in each form, run as
one native program of OP_GEMV steps over B rows (the batched decode step's: runtime/batch.py)
for each B in turn, interleaved, median of ``--runs`` (``--before``: and as before
operators/_cpu_skinny.h, side by side). Prints each B's milliseconds a step,
its cost over one row's, and the weights' read rate at one row. Q4_K needs rows of whole
256-value super-blocks: where ``--hidden`` is not, its k is rounded up to one (said so).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from iron_spec.operators import held, native
from iron_spec.operators.linear import Linear
from iron_spec.runtime import holding


def shapes(layers: int, hidden: int, inter: int, vocab: int, kv: int) -> list[tuple[int, int]]:
    """(n, k) of each projection a decode step runs, in order."""
    per = [(hidden + 2 * kv, hidden), (hidden, hidden), (2 * inter, hidden), (hidden, inter)]
    return per * layers + [(vocab, hidden)]


def drawn(form: str, n: int, k: int, rng):
    """A drawn (n, k) matrix held as ``form``: float32 and bfloat16 from normal values, a
    block form from random bytes with every float16 scale and minimum small and finite."""
    if form in ("F32", "BF16"):
        w = rng.standard_normal((n, k), np.float32)
        return w if form == "F32" else holding.convert(w, form, "drawn")
    block, nbytes = held.BLOCKS[form]
    raw = rng.integers(0, 256, (n, k // block, nbytes), dtype=np.uint8)
    at = {"Q6_K": (208,), "Q4_1": (0, 2), "Q5_1": (0, 2), "Q4_K": (0, 2), "Q5_K": (0, 2)}
    for o in at.get(form, (0,)):
        scale = (rng.standard_normal((n, k // block)) * 0.01).astype(np.float16)
        raw[..., o:o + 2] = scale.view(np.uint8).reshape(n, k // block, 2)
    return holding.blocks(form, raw.reshape(n, -1), (n, k))


def build(form: str, mats: list[tuple[int, int]], cap: int, rng):
    """The program of ``mats``' GEMVs held as ``form`` over up to ``cap`` rows, and its bytes."""
    steps, nbytes, cache = [], 0, {}
    for n, k in mats:
        if (n, k) not in cache:  # one drawn matrix a shape, converted once: copies after
            cache[n, k] = drawn(form, n, k, rng)
        w0 = cache[n, k]
        w = w0.copy() if form in ("F32", "BF16") else holding.blocks(w0.form, w0.data.copy(), w0.shape)
        x = rng.standard_normal((cap, k), np.float32)
        y = np.empty((cap, n), np.float32)
        one = Linear().lower(y[:1], x[:1], w)
        held = one.ints[2] if len(one.ints) > 2 else -1
        step = native.Step(native.OP_GEMV, (y, x) + tuple(one.arrays[2:]),
                           tuple(one.ints[:2]) + (held, cap), one.floats, rows=3)
        steps.append((step, None, cap))
        nbytes += sum(a.nbytes for a in one.arrays[2:3])
    return native.program(steps), len(steps), nbytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--forms", default="F32,BF16,Q8_0,Q4_0,Q4_K")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--inter", type=int, default=1536)
    ap.add_argument("--kv", type=int, default=192)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--before", action="store_true", help="also without _cpu_skinny.h's "
                    "kernels (each row's one-row kernel a block at a time), interleaved")
    args = ap.parse_args()
    lib = native.lib()
    if lib is None:
        raise SystemExit("operators._cpu is not built or is off (IRON_SPEC_NATIVE)")
    rows = [int(b) for b in args.rows.split(",")]
    rng = np.random.default_rng(0)
    print(native.describe())
    for form in args.forms.split(","):
        hidden = args.hidden
        if form.endswith("_K") and hidden % 256:
            hidden = -(-hidden // 256) * 256
            print(f"{form}: hidden {args.hidden} is no whole super-block: {hidden} instead")
        mats = shapes(args.layers, hidden, args.inter, args.vocab, args.kv)
        prog, count, nbytes = build(form, mats, max(rows), rng)
        ways = (True, False) if args.before else (True,)
        seen = {(s, b): [] for s in ways for b in rows}
        was = lib.skinny()
        try:
            for s in ways:  # warm
                lib.skinny(s)
                for b in rows:
                    native.run(prog, {"rows": b}, 0, count)
            for _ in range(args.runs):
                for s in ways:
                    lib.skinny(s)
                    for b in rows:
                        t = time.perf_counter()
                        native.run(prog, {"rows": b}, 0, count)
                        seen[s, b].append(time.perf_counter() - t)
        finally:
            lib.skinny(was)
        for s in ways:
            one = np.median(seen[s, rows[0]])
            cells = "  ".join(f"B={b}: {np.median(seen[s, b]) * 1e3:6.2f} ms "
                              f"({np.median(seen[s, b]) / one:4.2f}x)" for b in rows)
            name = form + ("" if s else " before")
            print(f"{name:12s} {nbytes / 1e6:4.0f} MB, {nbytes / one / 1e9:4.1f} GB/s at "
                  f"B={rows[0]}: {cells}", flush=True)
        del prog


if __name__ == "__main__":
    main()
