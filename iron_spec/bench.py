"""``iron-spec bench``: speed and memory of a spec on a checkpoint, side by side with
transformers (where the ``golden`` extra is installed) and the memory-bandwidth floor, in one
run, as ratios. Every figure is measured once per run, in turn, over ``runs`` runs after a
warm-up; a figure is the median of its runs, a ratio the median of its runs' ratios.

Measured here, never asserted in tests: these figures drift 20% from run to run on a shared
machine, so only ratios taken in one run mean anything.
"""

from __future__ import annotations

import json
import resource
import statistics
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import typer

from iron_spec.operators.native import describe, threads
from iron_spec.runtime.session import Session

from .build import DECODE_WEIGHTS_HELP, Loaded
from .command import UsageError, load_compiled, refuse, stages
from .config import ALLOW_UNREAD, ALLOW_UNREAD_HELP
from .errors import FlagError

PROMPTS = (128, 512)
SHORT, DEEP, DECODE = 128, 2000, 64


def peak_rss() -> int:
    """The process's peak resident memory, bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def bench_prompt(loaded: Loaded) -> list[int]:
    """The ids every measurement reads a prefix of, drawn at seed 0 (the same for the peer)."""
    rng = np.random.default_rng(0)
    return rng.integers(0, loaded.lm.config.vocab_size, max(PROMPTS) + DEEP).tolist()


Figures = dict[str, Callable[[], float]]


def figures(prefill: Callable[[int], float], decode: Callable[[int], float]) -> Figures:
    """The same figures for any model, each a call that measures it once: from
    ``prefill(n)``, seconds for an n-token prompt, and ``decode(at)``, tokens/s over DECODE
    tokens drawn after an ``at``-token prompt."""
    out: Figures = {}
    for n in PROMPTS:
        out[f"ttft{n}_s"] = lambda n=n: prefill(n)
    # Short decode last: the floor's GEMV pass, its ratio's other term, comes right after.
    for name, at in (("deep", DEEP), ("short", SHORT)):
        out[f"decode_{name}_tokens_per_s"] = lambda at=at: decode(at)
    return out


def ours(loaded: Loaded) -> Figures:
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

    return figures(prefill, decode)


def floor(loaded: Loaded) -> tuple[Figures, dict]:
    """A plain numpy float32 GEMV over every weight matrix a decode step reads (passes/s),
    and the copy bandwidth of a 1 GiB array (bytes/s); and the bytes a pass reads."""
    lm = loaded.lm
    embed = lm.model.embed_tokens.weight.array
    # The embedding's gather reads one row, unless the head is tied to it and reads it all.
    mats = [w for w in loaded.weights().values()
            if w.ndim == 2 and (w is not embed or lm.lm_head.weight.array is embed)]
    rows = {w.shape[1]: np.ones((1, w.shape[1]), np.float32) for w in mats}
    outs = [np.empty((1, w.shape[0]), np.float32) for w in mats]

    def gemv_passes_per_s() -> float:
        # x @ W.T, a row against the checkpoint's row-major weight: the faster of numpy's
        # two GEMV orientations here (W @ x ran ~15% slower), so the floor flatters nothing.
        start = time.perf_counter()
        for w, o in zip(mats, outs):
            np.matmul(rows[w.shape[1]], w.T, out=o)
        return 1 / (time.perf_counter() - start)

    a = np.ones(2**28, np.float32)
    b = np.empty_like(a)

    def copy_bytes_per_s() -> float:
        start = time.perf_counter()
        np.copyto(b, a)
        return 2 * a.nbytes / (time.perf_counter() - start)

    return ({"gemv_passes_per_s": gemv_passes_per_s, "copy_bytes_per_s": copy_bytes_per_s},
            {"decode_weight_bytes": sum(w.nbytes for w in mats)})


def transformers_peer(loaded: Loaded, n_threads: int) -> Figures | None:
    """The same figures of transformers' own model (float32, greedy, KV cache on), or None
    where the ``golden`` extra is not installed."""
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
        with torch.inference_mode():
            model(ids, use_cache=True, logits_to_keep=1)  # as generate does
        return time.perf_counter() - start

    def decode(at: int) -> float:
        # generate's own loop (greedy, KV cache on), each new token's arrival timed.
        clock = _Clock()
        with torch.inference_mode():
            model.generate(torch.tensor([prompt[:at]]), max_new_tokens=DECODE + 1,
                           min_new_tokens=DECODE + 1, do_sample=False, streamer=clock)
        return DECODE / (clock.times[-1] - clock.times[1])

    return figures(prefill, decode)


class _Clock:
    """A transformers streamer that notes when each piece arrives: the prompt, then every
    token generated."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


# Each ratio: (side, figure) over (side, figure), taken within each run.
RATIOS = {
    "decode_vs_transformers": (("ours", "decode_short_tokens_per_s"),
                               ("transformers", "decode_short_tokens_per_s")),
    "decode_vs_gemv_floor": (("ours", "decode_short_tokens_per_s"), ("floor", "gemv_passes_per_s")),
    "prefill128_vs_transformers": (("transformers", "ttft128_s"), ("ours", "ttft128_s")),
    "prefill512_vs_transformers": (("transformers", "ttft512_s"), ("ours", "ttft512_s")),
    "deep_vs_short_decode": (("ours", "decode_deep_tokens_per_s"), ("ours", "decode_short_tokens_per_s")),
}


def measure(loaded: Loaded, runs: int = 3, peer: bool = True,
            stage: Callable[[str], object] = lambda what: None) -> dict:
    """Every figure of ours, the floor's and (where installed) transformers', measured in
    turn within each of ``runs`` runs after a warm-up run. A machine's speed drifts by 20%
    over a minute; a ratio is the median of its runs' ratios, each from figures taken
    seconds apart, and a figure the median of its runs. ``stage`` is told each step as it
    begins (a progress display: a SmolLM2 run takes about a minute)."""
    n_threads = threads()
    result = {"threads": n_threads, "runs": runs, "max_seq_len": loaded.lm.config.max_seq_len,
              "prefill_chunk": loaded.lm.config.prefill_chunk, "decode_kernels": describe(),
              "decode_weights": loaded.lm.decode_weights}
    sides: dict[str, Figures] = {"ours": ours(loaded)}
    stage("warm-up: iron-spec")
    for fn in sides["ours"].values():
        fn()  # warm-up
    peak = peak_rss()  # ours, every figure run, before the floor's arrays or the peer's model
    sides["floor"], floor_static = floor(loaded)
    if peer:
        stage("loading transformers' model")
    peer_figures = transformers_peer(loaded, n_threads) if peer else None
    if peer_figures is not None:
        sides["transformers"] = peer_figures
    for name, side in sides.items():
        if name != "ours":  # warmed up above
            stage(f"warm-up: {name}")
            for fn in side.values():
                fn()  # warm-up: a first pass over a fresh array is page faults, not bandwidth
    samples: dict[str, dict[str, list[float]]] = {
        side: {name: [] for name in figs} for side, figs in sides.items()}
    for i in range(runs):
        stage(f"run {i + 1} of {runs}")
        for side, figs in sides.items():
            for name, fn in figs.items():
                samples[side][name].append(fn())
    for side, figs in samples.items():
        result[side] = {name: statistics.median(v) for name, v in figs.items()}
    for side in ("ours", "transformers"):
        if side in result:
            for n in PROMPTS:
                result[side][f"prefill{n}_tokens_per_s"] = n / result[side][f"ttft{n}_s"]
    result["transformers"] = result.get("transformers")
    result["ours"]["peak_rss_bytes"] = peak
    f = result["floor"]
    f.update(floor_static)
    f["gemv_gb_per_s"] = f["decode_weight_bytes"] * f["gemv_passes_per_s"] / 1e9
    f["copy_gb_per_s"] = f.pop("copy_bytes_per_s") / 1e9
    f["bandwidth_floor_tokens_per_s"] = f["copy_gb_per_s"] * 1e9 / f["decode_weight_bytes"]
    # The weights as loaded (float32), and the decode step's reduced copies where it has them.
    reduced = sum(a.nbytes for a in loaded.lm.packed.values() if a.dtype != np.float32)
    weights = sum(w.nbytes for w in loaded.weights().values()) + reduced
    result["reduced_decode_weights_bytes"] = reduced
    kv = sum(s.array.nbytes for _, s in loaded.lm.named_states())
    result["weights_bytes"], result["kv_cache_bytes"] = weights, kv

    def ratio(num, den):
        if num[0] not in samples or den[0] not in samples:
            return None
        return statistics.median(a / b for a, b in zip(samples[num[0]][num[1]],
                                                       samples[den[0]][den[1]]))
    result["ratios"] = {name: ratio(*pair) for name, pair in RATIOS.items()}
    result["ratios"]["peak_rss_vs_weights"] = peak / (weights + kv)
    return result


def report(r: dict) -> str:
    o, f, t, q = r["ours"], r["floor"], r["transformers"], r["ratios"]
    lines = [f"threads {r['threads']}, median of {r['runs']} run{'s' * (r['runs'] != 1)} after "
             "a warm-up, "
             f"max_seq_len {r['max_seq_len']}, prefill_chunk {r['prefill_chunk']}; decode "
             f"kernels: {r['decode_kernels']}, {r['decode_weights']} weights",
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
    lines.append(f"numpy GEMV pass over the decode weights as float32: "
                 f"{f['gemv_passes_per_s']:.1f} passes/s "
                 f"({f['gemv_gb_per_s']:.1f} GB/s of {f['decode_weight_bytes'] / 1e6:.0f} MB); "
                 f"copy bandwidth {f['copy_gb_per_s']:.1f} GB/s, floor "
                 f"{f['bandwidth_floor_tokens_per_s']:.1f} tok/s")
    extra = r["reduced_decode_weights_bytes"]
    lines.append(f"peak RSS {o['peak_rss_bytes'] / 2**20:.0f} MiB; weights "
                 f"{r['weights_bytes'] / 2**20:.0f} MiB"
                 + (f" (of it {extra / 2**20:.0f} MiB the decode step's {r['decode_weights']})"
                    if extra else "") + f" + KV cache {r['kv_cache_bytes'] / 2**20:.0f} MiB")
    lines.append("ratios: " + ", ".join(f"{k} {'n/a' if v is None else format(v, '.2f')}"
                                        for k, v in q.items()))
    return "\n".join(lines)


def command(
    spec: Path = typer.Argument(..., help="the spec YAML"),
    checkpoint: Optional[str] = typer.Option(None, metavar="DIR|ID", help="checkpoint directory or hub id"),
    random_weights: Optional[int] = typer.Option(None, min=0, help="draw weights at this seed "
                                                 "(the checkpoint's config, not its weights)"),
    runs: int = typer.Option(3, min=1, help="runs per figure, after one warm-up"),
    max_seq_len: int = typer.Option(4096, min=DEEP + DECODE + 1,
                                    help="context length the caches are sized for"),
    peer: bool = typer.Option(True, help="also measure transformers where it is installed"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object"),
    decode_weights: str = typer.Option("float32", "--decode-weights", help=DECODE_WEIGHTS_HELP),
    allow_unread_config: bool = typer.Option(False, ALLOW_UNREAD, help=ALLOW_UNREAD_HELP),
) -> None:
    """Prefill and decode tokens/s, TTFT and peak memory, against transformers and the floor."""
    from .cli import EXPECTED
    try:
        with stages() as s:  # compiled before anything is timed
            try:
                loaded = load_compiled(s, spec, checkpoint=checkpoint,
                                       random_weights=random_weights, max_seq_len=max_seq_len,
                                       decode_weights=decode_weights,
                                       allow_unread_config=allow_unread_config)
            except FlagError:  # no checkpoint, and the spec names no example
                # A toy's context is too short for the deep decode, and its speed says nothing.
                raise UsageError("bench measures a checkpoint's shape: give --checkpoint DIR or "
                                 "a hub id (with --random-weights SEED, weights drawn instead "
                                 "of read), or name one under the spec's examples:; it takes "
                                 "no --toy") from None
            if loaded.lm.config.max_seq_len < DEEP + DECODE + 1:
                raise ValueError(f"max_seq_len {loaded.lm.config.max_seq_len} is shorter than "
                                 f"the {DEEP + DECODE + 1} positions the deep decode needs")
            result = measure(loaded, runs, peer, s.stage)
    except EXPECTED as e:
        refuse(e)
    typer.echo(json.dumps(result, indent=2) if as_json else report(result))
