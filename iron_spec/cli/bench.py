"""``iron-spec bench``: speed and memory of a spec on a checkpoint, side by side with
transformers (where the ``golden`` extra is installed) and the memory-bandwidth floor, in one
run, as ratios. Every figure is measured once per run, in turn, over ``runs`` runs after a
warm-up; a figure is the median of its runs, a ratio the median of its runs' ratios.

Measured here, never asserted in tests: these figures drift 20% from run to run on a shared
machine, so only ratios taken in one run mean anything.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Callable, List, Optional

import numpy as np
import typer

from iron_spec.operators import held, native
from iron_spec.operators.native import describe, threads
from iron_spec.runtime.causal import PROMPT_FORMS, drawn_ids
from iron_spec.runtime.gguf import GGUFCheckpoint, is_gguf
from iron_spec.runtime.session import Session

from iron_spec.spec.build import (DECODE_WEIGHTS, DECODE_WEIGHTS_HELP, KV_CACHE_HELP, KV_CACHES,
                                  PREFILL_WEIGHTS, PREFILL_WEIGHTS_HELP, WEIGHTS, WEIGHTS_HELP,
                                  Loaded, use_decode_weights, use_prefill_weights)
from iron_spec.spec.config import ALLOW_UNREAD, ALLOW_UNREAD_HELP
from iron_spec.spec.errors import FlagError, NoWeights
from iron_spec.spec.loader import load_spec

from .command import (CHECKPOINT_HELP, CHECKPOINT_METAVAR, EXPECTED, SPEC_HELP, UsageError,
                      choice, load_compiled, pick_spec, refuse, stages)

PROMPTS = (128, 512)
SHORT, DEEP, DECODE = 128, 2000, 64
#: Whether the deep decode (at DEEP positions) is measured: --quick leaves it out, and the
#: 512-token prompt (a large model's on a small machine: minutes each).
DEEP_DECODE = True
#: The context bench sizes the caches for, where the model's own is not shorter.
CONTEXT = 4096
COPY_ELEMENTS = 2**26  # the copy bandwidth's array: 256 MiB, 8x past the largest L3 here
#                       (1 GiB was 2 GiB with its copy: beside an 8B model, past the memory)


def peak_rss() -> int:
    """The process's peak resident memory so far, bytes (``ru_maxrss``: it only grows)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def bench_prompt(loaded: Loaded) -> list[int]:
    """The ids every measurement reads a prefix of, drawn at seed 0 (the same for the peer)."""
    return drawn_ids(loaded.lm.config, np.random.default_rng(0), max(PROMPTS) + DEEP)


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
        if name == "short" or DEEP_DECODE:
            out[f"decode_{name}_tokens_per_s"] = lambda at=at: decode(at)
    return out


def ours(loaded: Loaded, weights: str | None = None, prefill_weights: str | None = None,
         kv_cache: str | None = None) -> Figures:
    """Our figures; with ``weights``, only the decode figures, run on a decode step of those
    weights; with ``prefill_weights``, only the prefill figures, run on a prompt chunk of
    those; each on ``kv_cache``'s KV caches (default: the model's as it is now)."""
    lm, prompt = loaded.lm, bench_prompt(loaded)
    own = lm.decode_weights if weights is None else weights
    own_prefill = lm.prefill_weights if prefill_weights is None else prefill_weights
    own_kv = lm.kv_cache if kv_cache is None else kv_cache

    def caches() -> None:
        # Another side's caches: ours again, both versions compiled before anything is timed
        # (use_kv_cache drops them; the weights' packed forms stay).
        if lm.kv_cache != own_kv:
            lm.use_kv_cache(own_kv)
            lm.version(False)
            lm.version(True)

    def prefill(n: int) -> float:
        lm.prefill_weights = own_prefill  # each compiled once (CausalLM.version)
        caches()
        lm.version(True)
        s = Session(lm, caches=lm.caches)  # the model's caches, grown by the runs before
        start = time.perf_counter()
        s.logits(prompt[:n])
        return time.perf_counter() - start

    def decode(at: int) -> float:
        # generate's own loop (greedy), timed from the first token drawn to the last, as
        # the peer's: the prompt's prefill is not in it.
        lm.decode_weights = own  # each weights' decode step compiled once (CausalLM.version)
        caches()
        lm.version(False)
        s = Session(lm, caches=lm.caches)
        for _ in s.generate(prompt[:at], DECODE + 1):
            pass
        return s.stats.decode_tokens_per_s

    out = figures(prefill, decode)
    if weights is not None:
        return {k: v for k, v in out.items() if k.startswith("decode")}
    if prefill_weights is not None:
        return {k: v for k, v in out.items() if k.startswith("ttft")}
    return out


def floor(loaded: Loaded) -> tuple[Figures, dict]:
    """A plain numpy float32 GEMV over every weight matrix a decode step reads (passes/s),
    the copy bandwidth of a 1 GiB array (bytes/s: read and written, on one thread) and,
    where the decode pool is built, its read bandwidth (bytes/s: the array read once on
    the pool's threads, as a decode step reads its weights); and the bytes a pass reads."""
    lm = loaded.lm
    embed = lm.model.embed_tokens.weight.array
    # The embedding's gather reads one row, unless the head is tied to it and reads it all.
    mats = [w for w in loaded.weights().values()
            if w.ndim == 2 and (w is not embed or lm.lm_head.weight.array is embed)]
    rows = {w.shape[1]: np.ones((1, w.shape[1]), np.float32) for w in mats}
    outs = [np.empty((1, w.shape[0]), np.float32) for w in mats]
    # numpy reads float32 alone: weights held in another form (operators.held) have no numpy
    # GEMV to set beside theirs, only the read bandwidth over their own bytes.
    as_float32 = not any(held.is_held(w) for w in mats)

    def gemv_passes_per_s() -> float:
        # x @ W.T, a row against the checkpoint's row-major weight: the faster of numpy's
        # two GEMV orientations here (W @ x ran ~15% slower), so the floor flatters nothing.
        start = time.perf_counter()
        for w, o in zip(mats, outs):
            np.matmul(rows[w.shape[1]], w.T, out=o)
        return 1 / (time.perf_counter() - start)

    a = np.ones(COPY_ELEMENTS, np.float32)
    b = np.empty_like(a)

    def copy_bytes_per_s() -> float:
        start = time.perf_counter()
        np.copyto(b, a)
        return 2 * a.nbytes / (time.perf_counter() - start)

    def read_bytes_per_s() -> float:
        start = time.perf_counter()
        native.lib().read(a)
        return a.nbytes / (time.perf_counter() - start)

    out = {"copy_bytes_per_s": copy_bytes_per_s}
    if as_float32:
        out["gemv_passes_per_s"] = gemv_passes_per_s
    if native.LIB is not None:
        out["read_bytes_per_s"] = read_bytes_per_s
    return out, {"decode_weight_bytes": sum(held.nbytes(w) for w in mats)}


def held_forms(loaded: Loaded) -> str:
    """What the model's weights are held as (operators.held), by bytes: ``BF16 99%, F32 1%``."""
    by: dict[str, int] = {}
    for w in loaded.weights().values():
        by[held.form(w)] = by.get(held.form(w), 0) + held.nbytes(w)
    total = sum(by.values()) or 1
    return ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in sorted(by.items(), key=lambda kv: -kv[1]))


def bfloat16_prompt(loaded: Loaded, prefill: tuple[str, ...]) -> dict[str, bool]:
    """Where a bfloat16 prompt chunk (one of ``prefill``) reads its projections:
    ``describe``'s ``tiles`` (a projection's weight not held as bfloat16 is rounded into
    tiles at compile) and ``held_rows`` (one held as bfloat16 is read in place, x rounded:
    ``operators.linear``'s bfloat16-tiles form)."""
    if "bfloat16" not in prefill:
        return {"tiles": False, "held_rows": False}
    forms = {held.form(w) if held.is_held(w) else "F32" for w in projections(loaded)}
    return {"tiles": bool(forms - {"BF16"}), "held_rows": "BF16" in forms}


def projections(loaded: Loaded) -> list:
    """The weights a prompt chunk's GEMMs read: every projection's but the output head's
    (on the chunk's last row alone, a GEMV)."""
    from iron_spec.runtime.blocks.projections import Linear
    out, todo, head = [], [loaded.lm], getattr(loaded.lm, "lm_head", None)
    while todo:
        m = todo.pop()
        if isinstance(m, Linear) and m is not head and m.weight.array is not None:
            out.append(m.weight.array)
        todo += [child for _, child in m.children()]
    return out


def transformers_installed() -> bool:
    """Whether torch and transformers (the ``golden`` extra) can be imported."""
    try:
        return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))
    except (ImportError, ValueError):  # a module set to None, or without a spec
        return False


def transformers_peer(loaded: Loaded, n_threads: int) -> Figures | None:
    """The same figures of transformers' own model (float32, greedy, KV cache on), or None
    where the ``golden`` extra is not installed."""
    try:
        import torch
        from iron_spec.library.golden_record import hugging_face
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


def gguf_peer(loaded: Loaded, gguf: Path, n_threads: int) -> tuple[Figures, dict] | None:
    """The same figures of llama.cpp (llama-cpp-python, the ``peer`` extra) on ``gguf``, a GGUF
    file of the same model: same prompt ids, same threads, greedy; and what it ran (the
    file, its tensor type). None where llama-cpp-python is not installed.

    Raises:
        ValueError: the file is missing, or its vocabulary is smaller than the model's.
    """
    # llama.cpp's OpenMP threads spin at every barrier unless told to sleep; on a machine
    # shared with other processes they spin against descheduled partners: SmolLM2 Q8_0
    # decoded at 0.4-1.4 tok/s at load average 18 here, 15-64 with PASSIVE (ours sleeps
    # after 0.2 ms). Set before the engine's OpenMP runtime loads; a user's own setting kept.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        engine = importlib.import_module(ENGINE_MODULE)
    except ImportError:
        return None
    if not gguf.is_file():
        raise ValueError(f"--gguf {gguf}: no such file")
    prompt = bench_prompt(loaded)
    llm = getattr(engine, ENGINE_CLASS)(model_path=str(gguf), n_ctx=len(prompt) + DECODE + 8,
                          n_threads=n_threads, n_threads_batch=n_threads, n_batch=512,
                          n_ubatch=512, verbose=False)
    if llm.n_vocab() < loaded.lm.config.vocab_size:
        raise ValueError(f"--gguf {gguf}: a vocabulary of {llm.n_vocab()} tokens, not the "
                         f"model's {loaded.lm.config.vocab_size}: not the same model")

    def prefill(n: int) -> float:
        llm.reset()  # the cache emptied: every prompt token evaluated
        start = time.perf_counter()
        llm.eval(prompt[:n])
        return time.perf_counter() - start

    def decode(at: int) -> float:
        llm.reset()
        times = []
        for _ in llm.generate(prompt[:at], top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                              repeat_penalty=1.0, reset=True):
            times.append(time.perf_counter())
            if len(times) == DECODE + 1:
                break
        return DECODE / (times[-1] - times[0])

    kind = llm.metadata.get("general.file_type")
    name = FILE_TYPES.get(int(kind), f"file type {kind}") if kind is not None else "unknown"
    return figures(prefill, decode), {"file": str(gguf), "type": name,
                                      "version": getattr(engine, "__version__", "?")}


# The GGUF engine bench runs as a peer (the peer extra), by its names: the engine's, its
# Python module's and package's, its model class's, and the key its ratios are named by.
ENGINE, ENGINE_MODULE, ENGINE_PACKAGE, ENGINE_CLASS = ("llama.cpp", "llama_cpp",
                                                       "llama-cpp-python", "Llama")
ENGINE_KEY = ENGINE_MODULE

# llama.cpp's general.file_type values (llama.h, enum llama_ftype), the ones a bench meets.
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
              10: "Q2_K", 12: "Q3_K_M", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
              17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}


#: The GGUF tensor types of the same bits as each decode weights: a ratio between them is
#: like against like (our int8 is Q8_0's very blocks).
SAME_BITS = {"float32": ("F32",), "bfloat16": ("BF16", "F16"), "bfloat16-rounded": ("BF16", "F16"),
             "int8": ("Q8_0",)}


def engine_side(kind: str) -> str:
    """The side a GGUF file of tensor type ``kind`` is measured as."""
    return f"{ENGINE} {kind}"


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
    f"decode_vs_{ENGINE_KEY}": (("ours", "decode_short_tokens_per_s"),
                                (ENGINE, "decode_short_tokens_per_s")),
    f"prefill128_vs_{ENGINE_KEY}": ((ENGINE, "ttft128_s"), ("ours", "ttft128_s")),
    f"prefill512_vs_{ENGINE_KEY}": ((ENGINE, "ttft512_s"), ("ours", "ttft512_s")),
}
SHORT_DECODE = "decode_short_tokens_per_s"
# Bytes a decode step's projection weight takes per float32 byte, by decode weights.
BYTES_PER_FLOAT32_BYTE = {"float32": 1.0, "bfloat16": 0.5, "bfloat16-rounded": 0.5,
                          "int8": 34 / 128}


def measure(loaded: Loaded, runs: int = 3, peer: bool = True, gguf=(),
            also: tuple[str, ...] = (), stage: Callable[[str], object] = lambda what: None,
            also_prefill: tuple[str, ...] = (), also_kv: tuple[str, ...] = ()) -> dict:
    """Every figure of ours, the floor's and (where installed) transformers' and llama.cpp's
    (on each of ``gguf``, GGUF files: a Path or several), measured in turn within each of
    ``runs`` runs after a warm-up run; ``also``:
    more decode weights whose decode figures are measured beside the model's own;
    ``also_prefill``: more prefill weights whose prefill figures are, likewise;
    ``also_kv``: more KV caches, each decode weights' decode figures measured on each. A
    machine's speed drifts by 20% over a minute; a ratio is the median of its runs' ratios,
    each from figures taken seconds apart, and a figure the median of its runs. ``stage`` is
    told each step as it begins (a progress display: a SmolLM2 run takes about a minute)."""
    n_threads = threads()
    own, own_prefill = loaded.lm.decode_weights, loaded.lm.prefill_weights
    own_kv = loaded.lm.kv_cache
    result = {"threads": n_threads, "runs": runs, "max_seq_len": loaded.lm.config.max_seq_len,
              "prefill_chunk": loaded.lm.config.prefill_chunk,
              # The bfloat16 prompt's kernel named only where a prompt chunk ran on it.
              "decode_kernels": describe(**bfloat16_prompt(loaded, (own_prefill, *also_prefill))),
              "decode_weights": own, "also_decode_weights": list(also),
              "prefill_weights": own_prefill, "also_prefill_weights": list(also_prefill),
              "kv_cache": own_kv, "also_kv_caches": list(also_kv)}
    sides: dict[str, Figures] = {"ours": ours(loaded)}
    shown = {"ours": "iron-spec"}  # each of our sides as a progress stage names it
    for w in also:
        sides[f"ours {w}"] = ours(loaded, w)
        shown[f"ours {w}"] = f"iron-spec ({w} decode weights)"
    for w in also_prefill:
        sides[f"ours prefill {w}"] = ours(loaded, prefill_weights=w)
        shown[f"ours prefill {w}"] = f"iron-spec ({w} prefill weights)"
    for kv in also_kv:
        for w in (own, *also):
            sides[kv_side(w, kv)] = ours(loaded, w, kv_cache=kv)
            shown[kv_side(w, kv)] = f"iron-spec ({w} decode weights, {kv} KV cache)"
    for name in list(sides):
        stage(f"warm-up: {shown[name]}")
        for fn in sides[name].values():
            fn()  # warm-up (and each version compiled, its weights packed)
    _back(loaded.lm, own, own_prefill, own_kv)
    peak = peak_rss()  # ours, every figure run, before the floor's arrays or the peers' models
    sides["floor"], floor_static = floor(loaded)
    installed = transformers_installed()
    # transformers builds its model from a checkpoint directory's config.json; a GGUF file
    # has none (llama.cpp's figures on it stand beside ours instead).
    from_gguf = isinstance(loaded.checkpoint, GGUFCheckpoint)
    if peer and installed and not from_gguf:  # said only where it is about to happen
        stage("loading transformers' model")
    peer_figures = transformers_peer(loaded, n_threads) \
        if peer and installed and not from_gguf else None
    not_measured = result["not_measured"] = {}
    if peer_figures is not None:
        sides["transformers"] = peer_figures
    elif peer and from_gguf:
        not_measured["transformers"] = ("the checkpoint is a GGUF file, which transformers' "
                                        "model is not built from here")
    elif peer:
        not_measured["transformers"] = ("torch and transformers are not installed (pip "
                                         "install -e '.[golden]')")
    files = [gguf] if isinstance(gguf, (str, Path)) else list(gguf or ())
    engines = {}  # side -> what it ran
    # A --gguf file is measured whatever --peer says (it names transformers alone).
    for file in files:
        stage(f"loading {ENGINE} on {Path(file).name}")
        engine = gguf_peer(loaded, Path(file), n_threads)
        if engine is None:  # not installed: no file is measured
            not_measured[ENGINE] = (f"{ENGINE_PACKAGE} is not installed (pip install -e "
                                    f"'.[peer]'; it builds from source, minutes), so "
                                    f"{', '.join(Path(f).name for f in files)} went unread")
            break
        side = engine_side(engine[1]["type"])
        if side in engines:
            raise ValueError(f"--gguf {file}: a second {engine[1]['type']} file; give one "
                             "file of each tensor type")
        sides[side], engines[side] = engine
    # The first file as the engine's side of the ratios named after it alone.
    first_engine = next(iter(engines), None)
    result[f"{ENGINE}_run"] = engines.get(first_engine)
    result[f"{ENGINE}_runs"] = engines
    for name, side in sides.items():
        if not name.startswith("ours"):  # warmed up above
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
    _back(loaded.lm, own, own_prefill, own_kv)
    for side, figs in samples.items():
        result[side] = {name: statistics.median(v) for name, v in figs.items()}
    for side in ("ours", "transformers", *engines, *(f"ours prefill {w}" for w in also_prefill)):
        if side in result:
            for n in PROMPTS:
                result[side][f"prefill{n}_tokens_per_s"] = n / result[side][f"ttft{n}_s"]
    result["transformers"] = result.get("transformers")
    result[ENGINE] = result.get(first_engine)
    result["ours"]["peak_rss_bytes"] = peak
    result["process_peak_rss_bytes"] = peak_rss()  # the floor's arrays and the peers too
    f = result["floor"]
    f.update(floor_static)
    if "gemv_passes_per_s" in f:
        f["gemv_gb_per_s"] = f["decode_weight_bytes"] * f["gemv_passes_per_s"] / 1e9
    f["copy_gb_per_s"] = f.pop("copy_bytes_per_s") / 1e9
    f["bandwidth_floor_tokens_per_s"] = f["copy_gb_per_s"] * 1e9 / f["decode_weight_bytes"]
    if "read_bytes_per_s" in f:
        f["read_gb_per_s"] = f.pop("read_bytes_per_s") / 1e9
        f["read_floor_tokens_per_s"] = f["read_gb_per_s"] * 1e9 / f["decode_weight_bytes"]
    # The weights as loaded (float32), and the decode step's and the prompt chunk's reduced
    # copies where they have them.
    # A packed form's key ends with the weights its plan was compiled for (runtime.plan):
    # the prompt chunk's reduced form is PROMPT_FORMS', the decode step's its own name.
    copies = {key: a for key, a in loaded.lm.packed.items()
              if not held.is_held(a) and a.dtype != np.float32}  # held weights are no copy
    reduced = sum(a.nbytes for a in copies.values())
    weights = sum(held.nbytes(w) for w in loaded.weights().values()) + reduced
    result["weights_held"] = held_forms(loaded)
    tiles = set(PROMPT_FORMS.values()) - {"float32"}
    result["reduced_prefill_weights_bytes"] = sum(a.nbytes for key, a in copies.items()
                                                  if key[-1] in tiles)
    result["reduced_decode_weights_bytes"] = reduced - result["reduced_prefill_weights_bytes"]
    kv = sum(s.array.nbytes for _, s in loaded.lm.named_states())
    result["weights_bytes"], result["kv_cache_bytes"] = weights, kv

    def ratio(num, den):
        num, den = [(first_engine, x[1]) if x[0] == ENGINE else x for x in (num, den)]
        if num[1] not in samples.get(num[0], {}) or den[1] not in samples.get(den[0], {}):
            return None
        return statistics.median(a / b for a, b in zip(samples[num[0]][num[1]],
                                                       samples[den[0]][den[1]]))
    result["ratios"] = {name: ratio(*pair) for name, pair in RATIOS.items()}
    result["ratios"]["peak_rss_vs_weights"] = peak / (weights + kv)
    # Each decode weights against the floor of the bytes it reads (copy bandwidth over the
    # projections at that precision), against transformers' and llama.cpp's decode, and
    # against our own float32-or-first weights.
    for w, side in [(own, "ours")] + [(w, f"ours {w}") for w in also]:
        mine = samples[side][SHORT_DECODE]
        for name, figure in (("bandwidth", "copy_bytes_per_s"), ("read", "read_bytes_per_s")):
            if figure in samples["floor"]:
                floor_at = [c / (f["decode_weight_bytes"] * BYTES_PER_FLOAT32_BYTE[w])
                            for c in samples["floor"][figure]]
                result["ratios"][f"{w}_decode_vs_{name}_floor"] = statistics.median(
                    a / b for a, b in zip(mine, floor_at))
        # Against llama.cpp on each file of the same bits (int8 against Q8_0, ...).
        for e, run in engines.items():
            if run["type"] in SAME_BITS.get(w, ()):
                result["ratios"][f"{w}_decode_vs_{ENGINE_KEY}_{run['type']}"] = ratio(
                    (side, SHORT_DECODE), (e, SHORT_DECODE))
        if side != "ours":
            for peer_side in ("ours", "transformers", ENGINE):
                key = own if peer_side == "ours" else peer_side.replace(".", "_")
                result["ratios"][f"{w}_decode_vs_{key}"] = ratio((side, SHORT_DECODE),
                                                                (peer_side, SHORT_DECODE))
    # Each more KV cache's deep decode against its own short one and against the model's
    # cache's deep decode, at each decode weights.
    for kv in also_kv:
        for w in (own, *also):
            side, base = kv_side(w, kv), "ours" if w == own else f"ours {w}"
            deep = "decode_deep_tokens_per_s"
            result["ratios"][f"{w}_{kv}_cache_deep_vs_short_decode"] = ratio(
                (side, deep), (side, SHORT_DECODE))
            result["ratios"][f"{w}_{kv}_cache_deep_vs_{own_kv}_cache"] = ratio(
                (side, deep), (base, deep))
    # Each more prefill weights against transformers', our own and llama.cpp's of its bits.
    for w in also_prefill:
        side = f"ours prefill {w}"
        for n in PROMPTS:
            ttft = f"ttft{n}_s"
            for peer_side, key in (("transformers", "transformers"), ("ours", own_prefill)):
                result["ratios"][f"{w}_prefill{n}_vs_{key}"] = ratio((peer_side, ttft),
                                                                    (side, ttft))
            for e, run in engines.items():
                if run["type"] in SAME_BITS.get(w, ()):
                    result["ratios"][f"{w}_prefill{n}_vs_{ENGINE_KEY}_{run['type']}"] = ratio(
                        (e, ttft), (side, ttft))
    return result


def kv_side(weights: str, kv_cache: str) -> str:
    """The side of our decode on ``weights`` over a ``kv_cache`` KV cache (bench --kv-cache's
    more caches)."""
    return f"ours {weights} {kv_cache} cache"


def _back(lm, decode_weights: str, prefill_weights: str, kv_cache: str) -> None:
    """``lm`` on the model's own weights and KV cache again, after the sides' switching."""
    lm.decode_weights, lm.prefill_weights = decode_weights, prefill_weights
    if lm.kv_cache != kv_cache:
        lm.use_kv_cache(kv_cache)


def _weights_said(r: dict) -> str:
    """The weights the versions read: a reduced copy where one was asked for, else the held
    form (a run holding bfloat16 weights read them as held, not as float32)."""
    held = r.get("weights_held")
    if r["decode_weights"] == r["prefill_weights"] == "float32" and held and \
            not held.startswith("F32 100%"):
        return f"weights read as held ({held}) by both versions"
    return f"{r['decode_weights']} decode weights, {r['prefill_weights']} prefill weights"


def report(r: dict) -> str:
    o, f, t, q = r["ours"], r["floor"], r["transformers"], r["ratios"]
    lines = [f"threads {r['threads']}, median of {r['runs']} run{'s' * (r['runs'] != 1)} after "
             "a warm-up, "
             f"max_seq_len {r['max_seq_len']}, prefill_chunk {r['prefill_chunk']}; decode "
             f"kernels: {r['decode_kernels']}; {_weights_said(r)}, {r['kv_cache']} KV cache",
             f"{'':28}{'iron-spec':>12}{'transformers':>14}{'ratio':>8}"]

    def row(label, key, rkey=None, unit="tok/s"):
        if key not in o:  # not measured (--quick)
            return
        peer = "" if t is None else f"{t[key]:14.1f}"
        ratio = "" if rkey is None or q[rkey] is None else f"{q[rkey]:8.2f}"
        lines.append(f"{label:28}{o[key]:12.1f}{peer:>14}{ratio:>8}  {unit}")
    row("prefill 128 tokens", "prefill128_tokens_per_s", "prefill128_vs_transformers")
    row("prefill 512 tokens", "prefill512_tokens_per_s", "prefill512_vs_transformers")
    lines.append(f"{'TTFT 128 tokens':28}{o['ttft128_s']:12.3f}"
                 f"{'' if t is None else format(t['ttft128_s'], '14.3f'):>14}          s")
    row(f"decode at {SHORT}", "decode_short_tokens_per_s", "decode_vs_transformers")
    row(f"decode at {DEEP}", "decode_deep_tokens_per_s")
    for w in r["also_decode_weights"]:
        mine = r[f"ours {w}"]
        lines.append(f"{f'decode at {SHORT}, {w}':28}{mine[SHORT_DECODE]:12.1f}"
                     f"{'':>14}{'':>8}  tok/s")
        if "decode_deep_tokens_per_s" in mine:
            lines.append(f"{f'decode at {DEEP}, {w}':28}{mine['decode_deep_tokens_per_s']:12.1f}"
                         f"{'':>14}{'':>8}  tok/s")
    for kv in r.get("also_kv_caches", ()):
        for w in (r["decode_weights"], *r["also_decode_weights"]):
            mine = r[kv_side(w, kv)]
            for at, key in ((SHORT, SHORT_DECODE), (DEEP, "decode_deep_tokens_per_s")):
                if key not in mine:
                    continue
                lines.append(f"{f'decode at {at}, {w}, {kv} KV':28}{mine[key]:12.1f}"
                             f"{'':>14}{'':>8}  tok/s")
    for w in r.get("also_prefill_weights", ()):
        mine = r[f"ours prefill {w}"]
        for n in PROMPTS:
            rkey = f"{w}_prefill{n}_vs_transformers"
            ratio = "" if q.get(rkey) is None else f"{q[rkey]:8.2f}"
            lines.append(f"{f'prefill {n} tokens, {w}':28}{mine[f'prefill{n}_tokens_per_s']:12.1f}"
                         f"{'':>14}{ratio:>8}  tok/s")
    for side, run in r.get(f"{ENGINE}_runs", {}).items():
        lp = r[side]
        got = lambda key: f"{lp[key]:.1f}" if key in lp else "-"  # noqa: E731
        lines.append(f"{ENGINE} {run['version']} on {Path(run['file']).name} ({run['type']}): "
                     f"prefill 128 / 512 {got('prefill128_tokens_per_s')} / "
                     f"{got('prefill512_tokens_per_s')} tok/s, decode at {SHORT} / {DEEP} "
                     f"{got(SHORT_DECODE)} / {got('decode_deep_tokens_per_s')} tok/s")
    lines.append((f"numpy GEMV pass over the decode weights as float32: "
                  f"{f['gemv_passes_per_s']:.1f} passes/s "
                  f"({f['gemv_gb_per_s']:.1f} GB/s of {f['decode_weight_bytes'] / 1e6:.0f} MB); "
                  if "gemv_passes_per_s" in f else
                  f"decode weights {f['decode_weight_bytes'] / 1e6:.0f} MB as held "
                  f"({r.get('weights_held')}); ") +
                 f"copy bandwidth {f['copy_gb_per_s']:.1f} GB/s, floor "
                 f"{f['bandwidth_floor_tokens_per_s']:.1f} tok/s"
                 + (f"; read on the pool {f['read_gb_per_s']:.1f} GB/s, floor "
                    f"{f['read_floor_tokens_per_s']:.1f} tok/s" if "read_gb_per_s" in f else ""))
    decode, prefill = r["reduced_decode_weights_bytes"], r.get("reduced_prefill_weights_bytes", 0)
    parts = []
    if decode:
        names = [w for w in [r['decode_weights'], *r['also_decode_weights']] if w != 'float32']
        parts.append(f"{decode / 2**20:.0f} MiB the decode steps' reduced copies"
                     + (f": {', '.join(names)}" if names else ""))
    if prefill:
        parts.append(f"{prefill / 2**20:.0f} MiB the prompt chunk's bfloat16 tiles")
    lines.append(f"peak RSS {o['peak_rss_bytes'] / 2**20:.0f} MiB through iron-spec's own "
                 f"figures (the process's peak when they were done); weights "
                 f"{r['weights_bytes'] / 2**20:.0f} MiB"
                 + (f" (of it {'; '.join(parts)})" if parts else "")
                 + f" + KV cache {r['kv_cache_bytes'] / 2**20:.0f} MiB")
    if "process_peak_rss_bytes" in r:
        # What ran beside ours, each named: a peer that did not run holds no memory.
        engines = len(r.get(f"{ENGINE}_runs") or {})
        held = ["the above", "the floor's two 1 GiB copy arrays"] + \
            (["transformers' model"] if r.get("transformers") is not None else []) + \
            ([f"{ENGINE}'s model{'s' * (engines > 1)}"] if engines else [])
        lines.append(f"peak RSS of the whole process {r['process_peak_rss_bytes'] / 2**20:.0f} "
                     f"MiB: {', '.join(held[:-1])} and {held[-1]}")
    for side, why in r.get("not_measured", {}).items():
        lines.append(f"{side}: not measured: {why}")
    lines.append("ratios: " + ", ".join(f"{k} {'n/a' if v is None else format(v, '.2f')}"
                                        for k, v in q.items()))
    return "\n".join(lines)


def _gguf_files(files: Optional[List[Path]]) -> Optional[List[Path]]:
    """A typer callback: each --gguf a GGUF file (its magic read), none given twice; refused
    as a usage error (exit 2) before anything loads, where it was measured as missing after
    minutes of our own figures."""
    seen: dict[Path, Path] = {}
    for file in files or ():
        if not file.exists():
            raise typer.BadParameter(f"{file}: no such file")
        if not file.is_file() or not is_gguf(file):
            raise typer.BadParameter(f"{file}: not a GGUF file (its first bytes are not "
                                     "'GGUF')")
        key = file.resolve()
        if key in seen:
            raise typer.BadParameter(f"{file}: given twice (as {seen[key]}); one file of "
                                     "each tensor type")
        seen[key] = file
    return files


def command(
    spec: Optional[str] = typer.Argument(None, metavar="[SPEC]", help=SPEC_HELP),
    checkpoint: Optional[str] = typer.Option(None, metavar=CHECKPOINT_METAVAR, help=CHECKPOINT_HELP + "; default: the spec's first examples: hub id"),
    random_weights: Optional[int] = typer.Option(None, min=0, help="draw weights at this seed "
                                                 "(the checkpoint's config, not its weights)"),
    runs: int = typer.Option(3, min=1, help="runs per figure, after one warm-up"),
    max_seq_len: Optional[int] = typer.Option(None, min=DEEP + DECODE + 1,
                                              help=f"context length the caches are sized for: "
                                              f"at least {DEEP + DECODE + 1}, as the deep decode "
                                              f"draws {DECODE + 1} tokens after a {DEEP}-token "
                                              f"prompt [default: {CONTEXT} or the model's own, "
                                              "the shorter]"),
    peer: bool = typer.Option(True, help="also measure transformers where it is installed"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object"),
    weights: str = typer.Option("stored", "--weights", callback=choice(WEIGHTS), help=WEIGHTS_HELP + "; one a run: a file's stored form is measured beside the GGUF peer on the same file (--gguf FILE)"),
    decode_weights: str = typer.Option("float32", "--decode-weights", callback=choice(DECODE_WEIGHTS, several=True), help=DECODE_WEIGHTS_HELP + ". Several, comma-separated (float32,bfloat16,int8): the first is the model's, the others' decode measured beside it in the same run"),
    prefill_weights: str = typer.Option("float32", "--prefill-weights", callback=choice(PREFILL_WEIGHTS, several=True), help=PREFILL_WEIGHTS_HELP + ". Several, comma-separated (float32,bfloat16): the first is the model's, the others' prefill measured beside it in the same run"),
    kv_cache: str = typer.Option("float32", "--kv-cache", callback=choice(KV_CACHES, several=True), help=KV_CACHE_HELP + ". Several, comma-separated (float32,bfloat16): the first is the model's, each decode weights' decode measured on the others beside it in the same run"),
    gguf: Optional[List[Path]] = typer.Option(None, metavar="FILE", callback=_gguf_files, help=f"a GGUF file of the same model: {ENGINE} ({ENGINE_PACKAGE}, the peer extra) measured on it beside transformers; repeat it for several tensor types (Q8_0, BF16, ...), each decode weights then set against the file of its bits"),
    allow_unread_config: bool = typer.Option(False, ALLOW_UNREAD, help=ALLOW_UNREAD_HELP),
    quick: bool = typer.Option(False, "--quick", help=f"prefill {PROMPTS[0]} and decode at {SHORT} alone: no {PROMPTS[-1]}-token prompt, no decode at {DEEP} (a 1-8B model on a small machine: minutes each)"),
) -> None:
    """Prefill and decode tokens/s, TTFT and peak memory, against transformers, llama.cpp
    (with --gguf) and the floor."""
    global PROMPTS, DEEP_DECODE
    if quick:
        PROMPTS, DEEP_DECODE = PROMPTS[:1], False
    first, *also = [w.strip() for w in decode_weights.split(",")]
    first_prefill, *also_prefill = [w.strip() for w in prefill_weights.split(",")]
    first_kv, *also_kv = [w.strip() for w in kv_cache.split(",")]
    try:
        spec = pick_spec(spec, checkpoint)  # a name or a path, from any folder; or picked
        if load_spec(spec).get("model") == "encoder":  # said before any weight is read
            raise FlagError(f"{spec} is an encoder spec (model: encoder): bench measures a "
                            "causal model's prefill and decode; an encoder has no decode "
                            "step, KV cache or prompt chunk")
        with stages() as s:  # compiled before anything is timed
            try:
                loaded = load_compiled(s, spec, checkpoint=checkpoint,
                                       random_weights=random_weights, max_seq_len=max_seq_len,
                                       context_at_most=CONTEXT,
                                       decode_weights=first,
                                       prefill_weights=first_prefill,
                                       allow_unread_config=allow_unread_config,
                                       kv_cache=first_kv, weights=weights)
            except NoWeights:  # no checkpoint, and the spec names no example
                # A toy's context is too short for the deep decode, and its speed says nothing.
                raise UsageError("bench measures a checkpoint's shape: give --checkpoint DIR or "
                                 "a hub id (with --random-weights SEED, weights drawn instead "
                                 "of read), or name one under the spec's examples:; it takes "
                                 "no --toy") from None
            for w in also:  # each compiled (and refused, where its weights do not fit) now
                s.stage(f"compiling the decode step on {w} weights")
                use_decode_weights(loaded, w)
            for w in also_prefill:
                s.stage(f"compiling the prompt chunk on {w} weights")
                use_prefill_weights(loaded, w)
            if loaded.lm.config.max_seq_len < DEEP + DECODE + 1:
                raise ValueError(f"max_seq_len {loaded.lm.config.max_seq_len} is shorter than "
                                 f"the {DEEP + DECODE + 1} positions the deep decode needs")
            result = measure(loaded, runs, peer, tuple(gguf or ()), tuple(also), s.stage,
                             tuple(also_prefill), tuple(also_kv))
    except EXPECTED as e:
        refuse(e)
    typer.echo(json.dumps(result, indent=2) if as_json else report(result))
