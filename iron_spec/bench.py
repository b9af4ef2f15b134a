"""``iron-spec bench``: speed and memory of a spec on a checkpoint, side by side with
transformers (where the ``golden`` extra is installed) and the memory-bandwidth floor, in one
run, as ratios. Each figure is the median of ``runs`` runs after a warm-up.

Measured here, never asserted in tests: these figures drift 20% from run to run on a shared
machine, so only ratios taken in one run mean anything.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import typer

from runtime.session import Session

from .build import Loaded, load_model
from .errors import message

PROMPTS = (128, 512)
SHORT, DEEP, DECODE = 128, 2000, 64


def median_of(runs: int, fn: Callable[[], float]) -> float:
    fn()  # warm-up
    return statistics.median(fn() for _ in range(runs))


def threads() -> int:
    """The BLAS threads numpy runs with: OPENBLAS_NUM_THREADS or OMP_NUM_THREADS, else
    every core (OpenBLAS's own default)."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return os.cpu_count() or 1


def peak_rss() -> int:
    """The process's peak resident memory, bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def bench_prompt(loaded: Loaded) -> list[int]:
    """The ids every measurement reads a prefix of, drawn at seed 0 (the same for the peer)."""
    rng = np.random.default_rng(0)
    return rng.integers(0, loaded.lm.config.vocab_size, max(PROMPTS) + DEEP).tolist()


def figures(runs: int, prefill: Callable[[int], float], decode: Callable[[int], float]) -> dict:
    """The same figures for any model: ``prefill(n)`` seconds for an n-token prompt,
    ``decode(at)`` tokens/s over DECODE tokens after ``at``, each the median of ``runs``."""
    out: dict = {}
    for n in PROMPTS:
        seconds = median_of(runs, lambda: prefill(n))
        out[f"prefill{n}_tokens_per_s"] = n / seconds
        out[f"ttft{n}_s"] = seconds
    for name, at in (("short", SHORT), ("deep", DEEP)):
        out[f"decode_{name}_tokens_per_s"] = median_of(runs, lambda: decode(at))
    return out


def ours(loaded: Loaded, runs: int) -> dict:
    lm, prompt = loaded.lm, bench_prompt(loaded)

    def prefill(n: int) -> float:
        s = Session(lm)
        start = time.perf_counter()
        s.logits(prompt[:n])
        return time.perf_counter() - start

    def decode(at: int) -> float:
        # generate's own loop (greedy), timed from the first token drawn to the last, as
        # the peer's: the prompt's prefill is not in it.
        s = Session(lm)
        for _ in s.generate(prompt[:at], DECODE + 1):
            pass
        return s.stats.decode_tokens_per_s

    return {**figures(runs, prefill, decode), "peak_rss_bytes": peak_rss()}


def floor(loaded: Loaded, runs: int) -> dict:
    """A plain numpy float32 GEMV over every weight matrix a decode step reads, and the copy
    bandwidth of a 1 GiB array."""
    lm = loaded.lm
    embed = lm.model.embed_tokens.weight.array
    # The embedding's gather reads one row, unless the head is tied to it and reads it all.
    mats = [w for w in loaded.weights().values()
            if w.ndim == 2 and (w is not embed or lm.lm_head.weight.array is embed)]
    rows = {w.shape[1]: np.ones((1, w.shape[1]), np.float32) for w in mats}
    outs = [np.empty((1, w.shape[0]), np.float32) for w in mats]

    def gemv_pass() -> float:
        # x @ W.T, a row against the checkpoint's row-major weight: the faster of numpy's
        # two GEMV orientations here (W @ x ran ~15% slower), so the floor flatters nothing.
        start = time.perf_counter()
        for w, o in zip(mats, outs):
            np.matmul(rows[w.shape[1]], w.T, out=o)
        return time.perf_counter() - start

    seconds = median_of(runs, gemv_pass)
    weight_bytes = sum(w.nbytes for w in mats)
    a = np.ones(2**28, np.float32)
    b = np.empty_like(a)

    def copy() -> float:
        start = time.perf_counter()
        np.copyto(b, a)
        return time.perf_counter() - start

    copy_s = median_of(runs, copy)
    return {"gemv_passes_per_s": 1 / seconds, "decode_weight_bytes": weight_bytes,
            "gemv_gb_per_s": weight_bytes / seconds / 1e9,
            "copy_gb_per_s": 2 * 2**30 / copy_s / 1e9,
            "bandwidth_floor_tokens_per_s": (2 * 2**30 / copy_s) / weight_bytes}


def transformers_peer(loaded: Loaded, runs: int, n_threads: int) -> dict | None:
    """The same measurements of transformers' own model (float32, greedy, KV cache on)."""
    try:
        import torch
        from .golden_record import hugging_face
    except ImportError:
        return None
    torch.set_num_threads(n_threads)
    model, prompt = hugging_face(loaded), bench_prompt(loaded)

    def prefill(n: int) -> float:
        ids = torch.tensor([prompt[:n]])
        start = time.perf_counter()
        model(ids, use_cache=True, logits_to_keep=1)  # as generate does
        return time.perf_counter() - start

    def decode(at: int) -> float:
        # generate's own loop (greedy, KV cache on), each new token's arrival timed.
        clock = _Clock()
        model.generate(torch.tensor([prompt[:at]]), max_new_tokens=DECODE + 1,
                       min_new_tokens=DECODE + 1, do_sample=False, streamer=clock)
        return DECODE / (clock.times[-1] - clock.times[1])

    with torch.inference_mode():
        return figures(runs, prefill, decode)


class _Clock:
    """A transformers streamer that notes when each piece arrives: the prompt, then every
    token generated."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def measure(loaded: Loaded, runs: int = 3, peer: bool = True) -> dict:
    n_threads = threads()
    result = {"threads": n_threads, "runs": runs, "max_seq_len": loaded.lm.config.max_seq_len,
              "prefill_chunk": loaded.lm.config.prefill_chunk}
    result["ours"] = ours(loaded, runs)
    weights = sum(w.nbytes for w in loaded.weights().values())
    kv = sum(s.array.nbytes for _, s in loaded.lm.named_states())
    result["weights_bytes"], result["kv_cache_bytes"] = weights, kv
    result["floor"] = floor(loaded, runs)
    result["transformers"] = transformers_peer(loaded, runs, n_threads) if peer else None
    o, f, t = result["ours"], result["floor"], result["transformers"]

    def ratio(a, b):
        return None if a is None or b is None else a / b
    result["ratios"] = {
        "decode_vs_transformers": ratio(o["decode_short_tokens_per_s"], t and t["decode_short_tokens_per_s"]),
        "decode_vs_gemv_floor": ratio(o["decode_short_tokens_per_s"], f["gemv_passes_per_s"]),
        "prefill128_vs_transformers": ratio(o["prefill128_tokens_per_s"], t and t["prefill128_tokens_per_s"]),
        "prefill512_vs_transformers": ratio(o["prefill512_tokens_per_s"], t and t["prefill512_tokens_per_s"]),
        "deep_vs_short_decode": ratio(o["decode_deep_tokens_per_s"], o["decode_short_tokens_per_s"]),
        "peak_rss_vs_weights": o["peak_rss_bytes"] / (weights + kv),
    }
    return result


def report(r: dict) -> str:
    o, f, t, q = r["ours"], r["floor"], r["transformers"], r["ratios"]
    lines = [f"threads {r['threads']}, median of {r['runs']} runs after a warm-up, "
             f"max_seq_len {r['max_seq_len']}, prefill_chunk {r['prefill_chunk']}",
             f"{'':28}{'iron-spec':>12}{'transformers':>14}{'ratio':>8}"]

    def row(label, key, rkey=None, unit="tok/s"):
        peer = "" if t is None else f"{t[key]:14.1f}"
        ratio = "" if rkey is None or q[rkey] is None else f"{q[rkey]:8.2f}"
        lines.append(f"{label:28}{o[key]:12.1f}{peer:>14}{ratio:>8}  {unit}")
    row("prefill 128 tokens", "prefill128_tokens_per_s", "prefill128_vs_transformers")
    row("prefill 512 tokens", "prefill512_tokens_per_s", "prefill512_vs_transformers")
    lines.append(f"{'TTFT 128 tokens':28}{o['ttft128_s']:12.3f}"
                 f"{'' if t is None else format(t['ttft128_s'], '14.3f'):>14}          s")
    row(f"decode at {SHORT}", "decode_short_tokens_per_s", "decode_vs_transformers")
    row(f"decode at {DEEP}", "decode_deep_tokens_per_s")
    lines.append(f"numpy GEMV pass over the decode weights: {f['gemv_passes_per_s']:.1f} passes/s "
                 f"({f['gemv_gb_per_s']:.1f} GB/s of {f['decode_weight_bytes'] / 1e6:.0f} MB); "
                 f"copy bandwidth {f['copy_gb_per_s']:.1f} GB/s, floor "
                 f"{f['bandwidth_floor_tokens_per_s']:.1f} tok/s")
    lines.append(f"peak RSS {o['peak_rss_bytes'] / 2**20:.0f} MiB; weights "
                 f"{r['weights_bytes'] / 2**20:.0f} MiB + KV cache {r['kv_cache_bytes'] / 2**20:.0f} MiB")
    lines.append("ratios: " + ", ".join(f"{k} {'n/a' if v is None else format(v, '.2f')}"
                                        for k, v in q.items()))
    return "\n".join(lines)


def command(
    spec: Path = typer.Argument(..., help="the spec YAML"),
    checkpoint: Optional[str] = typer.Option(None, help="checkpoint directory or hub id"),
    random_weights: Optional[int] = typer.Option(None, min=0, help="draw weights at this seed"),
    toy: bool = typer.Option(False, "--toy", help="the spec's tiny shape"),
    runs: int = typer.Option(3, min=1, help="runs per figure, after one warm-up"),
    max_seq_len: int = typer.Option(4096, min=DEEP + DECODE + 1,
                                    help="context length the caches are sized for"),
    peer: bool = typer.Option(True, help="also measure transformers where it is installed"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object"),
) -> None:
    """Prefill and decode tokens/s, TTFT and peak memory, against transformers and the floor."""
    from .cli import EXPECTED
    try:
        loaded = load_model(spec, checkpoint=checkpoint, random_weights=random_weights, toy=toy,
                            max_seq_len=None if toy else max_seq_len)
        if loaded.lm.config.max_seq_len < DEEP + DECODE + 1:
            raise ValueError(f"max_seq_len {loaded.lm.config.max_seq_len} is shorter than the "
                             f"{DEEP + DECODE + 1} positions the deep decode needs")
        loaded.lm.decode_step, loaded.lm.prompt_chunk  # compiled before anything is timed
        result = measure(loaded, runs, peer)
    except EXPECTED as e:
        typer.echo(message(e), err=True)
        raise typer.Exit(2)
    typer.echo(json.dumps(result, indent=2) if as_json else report(result))
