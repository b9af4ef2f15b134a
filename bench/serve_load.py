"""A load generator for ``iron-spec serve`` (and llama.cpp's server beside it, on the same
GGUF and threads): concurrent streams of streamed completions, through the ``openai`` client.

    python bench/serve_load.py --checkpoint ~/.cache/iron-spec/checkpoints/smollm2-135m-instruct \\
        --streams 1,8 --requests 3 --max-tokens 64 --threads 2 \\
        [--gguf FILE.gguf --peer [--llama-server PATH]] [--prefix 2000] [--json]

Each stream sends ``--requests`` completions one after another (a prompt of
``--prompt-tokens`` tokens of its own, greedy, ``--max-tokens`` drawn); all streams start
together, then again with their first requests spread over one request's time (as
independent users arrive: streams started together with equal lengths stay in step, every
prompt arriving beside seven others, whose prefills then run one after another). Per
scenario it reports the aggregate tokens/s (every token drawn over the scenario's wall
time), the mean time to first token, and the ratios the serving issue asks for (8 streams
against one: tokens/s and TTFT). ``--prefix N`` sends two requests sharing a
prompt of N tokens (their last tokens differ) and reports the second's TTFT over the
first's: a held session's caches reused. ``--peer`` runs the same scenarios on llama.cpp's
server over ``--gguf``, with ``--threads`` threads: ``--llama-server PATH``, llama.cpp's own
(continuous batching over as many slots as the most streams; built from the llama.cpp that
llama-cpp-python vendors, docs/serving.md#load), else ``llama_cpp.server`` (llama-cpp-python,
``pip install 'iron-spec[peer]'`` plus its server's own dependencies; one request at a time);
our server serves the same GGUF where ``--gguf`` is given, else ``--checkpoint``. One run on a shared machine: read the
ratios, side by side, not the absolute figures.

Servers listen on 127.0.0.1 only and are stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

WORDS = ("the river carried small boats past quiet towns where people sold bread fish and "
         "lamps while children ran along the banks counting birds and clouds").split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], port: int, log: Path, env: dict) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env)
    end = time.monotonic() + 600
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"{cmd[0]} exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2):
                return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"the server did not start:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def text_of(tokenizer, n: int, seed: int) -> str:
    """A text of exactly ``n`` tokens under ``tokenizer`` (words drawn at ``seed``)."""
    rng = np.random.default_rng(seed)
    words = [WORDS[i] for i in rng.integers(0, len(WORDS), 2 * n + 8)]
    ids = tokenizer.encode(" ".join(words)).ids[:n]
    return tokenizer.decode(ids)


async def one(client, model: str, prompt: str, max_tokens: int) -> dict:
    begin = time.perf_counter()
    first, chunks, usage = None, 0, None
    stream = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                             temperature=0, stream=True)
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            chunks += 1
            if first is None:
                first = time.perf_counter()
        if getattr(chunk, "usage", None):
            usage = chunk.usage.completion_tokens
    end = time.perf_counter()
    return {"ttft": (first or end) - begin, "tokens": usage or chunks, "seconds": end - begin,
            "decode": ((usage or chunks) - 1) / (end - first) if first and end > first else 0.0}


def client_of(url: str):
    """The ``openai`` client of one scenario: no retries (a failure is reported, not hidden
    in a time), and a connection a request (``Connection: close``): llama-server closes a
    kept-alive connection after a few requests, and a request sent on it as it closes fails
    with "Server disconnected"; a fresh connection costs both servers the same."""
    import openai
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                              timeout=3600, default_headers={"Connection": "close"})


async def scenario(url: str, model: str, prompts: list[list[str]], max_tokens: int,
                   stagger: float = 0.0) -> dict:
    """Each list of ``prompts`` a stream, its requests one after another; stream ``s``
    starts ``s * stagger`` seconds after the first (0: all at once)."""
    client = client_of(url)

    async def stream(ps, s):
        await asyncio.sleep(s * stagger)
        return [await one(client, model, p, max_tokens) for p in ps]

    begin = time.perf_counter()
    async with client:
        results = await asyncio.gather(*[stream(ps, s) for s, ps in enumerate(prompts)])
    wall = time.perf_counter() - begin
    done = [r for rs in results for r in rs]
    tokens = sum(r["tokens"] for r in done)
    return {"streams": len(prompts), "requests": len(done), "tokens": tokens, "wall": wall,
            "tokens_per_s": tokens / wall, "ttft_mean": float(np.mean([r["ttft"] for r in done])),
            "ttft_median": float(np.median([r["ttft"] for r in done])),
            "stream_decode_per_s": float(np.mean([r["decode"] for r in done]))}


async def prefix_reuse(url: str, model: str, shared: str, tails: list[str]) -> dict:
    client = client_of(url)
    async with client:
        a = await one(client, model, shared + tails[0], 4)
        b = await one(client, model, shared + tails[1], 4)
    return {"first_ttft": a["ttft"], "second_ttft": b["ttft"], "ratio": b["ttft"] / a["ttft"]}


def run_side(name, cmd, port, env, model, args, tokenizer, log_dir) -> dict:
    proc = start(cmd, port, log_dir / f"{name}.log", env)
    url = f"http://127.0.0.1:{port}"
    out = {"side": name}
    try:
        # Warm-up: one request (compiles, pages weights in).
        asyncio.run(scenario(url, model, [[text_of(tokenizer, 16, 999)]], 8))
        def prompts_of(n: int, scenario: int) -> list[list[str]]:
            # Prompts no earlier scenario sent: a server's held caches (ours, llama-server's
            # slots and prompt cache) reuse none of them.
            return [[text_of(tokenizer, args.prompt_tokens, 10000 * scenario + 100 * s + r)
                     for r in range(args.requests)] for s in range(n)]

        for i, n in enumerate(args.streams):
            prompts = prompts_of(n, 2 * i + 1)
            out[f"streams_{n}"] = r = asyncio.run(scenario(url, model, prompts, args.max_tokens))
            print(f"{name}: {n} stream(s) at once: {r['tokens_per_s']:.1f} tok/s aggregate, "
                  f"TTFT mean {r['ttft_mean'] * 1e3:.0f} ms (median "
                  f"{r['ttft_median'] * 1e3:.0f}), per-stream decode "
                  f"{r['stream_decode_per_s']:.1f} tok/s", flush=True)
            if n > 1 and f"streams_{min(args.streams)}" in out:
                # Arrivals spread over one request's time, as independent users' are: the
                # streams do not march in step, each new prompt meeting the others' decoding.
                one_request = out[f"streams_{min(args.streams)}"]["wall"] / args.requests
                out[f"staggered_{n}"] = r = asyncio.run(scenario(
                    url, model, prompts_of(n, 2 * i + 2), args.max_tokens,
                    stagger=one_request / n))
                print(f"{name}: {n} streams arriving {one_request / n:.2f} s apart: "
                      f"{r['tokens_per_s']:.1f} tok/s aggregate (the ramp counted), TTFT mean "
                      f"{r['ttft_mean'] * 1e3:.0f} ms (median {r['ttft_median'] * 1e3:.0f})",
                      flush=True)
        if args.prefix:
            shared = text_of(tokenizer, args.prefix, 7)
            out["prefix"] = r = asyncio.run(prefix_reuse(url, model, shared, [
                " " + text_of(tokenizer, 8, 8), " " + text_of(tokenizer, 8, 9)]))
            print(f"{name}: a repeated {args.prefix}-token prefix: TTFT {r['first_ttft']:.2f} s "
                  f"then {r['second_ttft']:.3f} s: {r['ratio']:.3f}x", flush=True)
    finally:
        stop(proc)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="the checkpoint (its tokenizer.json "
                   "makes the prompts; served where no --gguf)")
    p.add_argument("--gguf", help="a GGUF of the same model: both servers serve it")
    p.add_argument("--peer", action="store_true", help="llama.cpp's server beside, on --gguf: "
                   "llama-server where --llama-server names it, else llama_cpp.server")
    p.add_argument("--llama-server", help="llama.cpp's own llama-server binary (built from the "
                   "llama.cpp that llama-cpp-python 0.3.36 vendors: docs/serving.md#load); run "
                   "with as many parallel slots as the most streams")
    p.add_argument("--streams", default="1,8", help="concurrent streams, comma-separated")
    p.add_argument("--requests", type=int, default=3, help="requests each stream sends")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--weights", help="what our server holds the weights as (iron-spec serve "
                   "--weights: stored, float32, ...; default: its own, stored)")
    p.add_argument("--max-seq-len", type=int, default=4096)
    p.add_argument("--prefix", type=int, default=0, help="tokens of a repeated prefix (0: none)")
    p.add_argument("--only", choices=("ours", "peer"), help="one side only")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    args.streams = [int(s) for s in args.streams.split(",")]
    from tokenizers import Tokenizer
    checkpoint = Path(args.checkpoint).expanduser()
    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    # Each server as it runs by default: llama.cpp's OpenMP threads spin at its barriers (on a
    # machine whose cores other jobs hold they lose them: OMP_WAIT_POLICY=PASSIVE in the
    # environment then, said in the results).
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(args.threads)}
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"serve_load.{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    sides = []
    if args.only != "peer":
        port = free_port()
        served = args.gguf or str(checkpoint)
        cmd = [str(Path(sys.executable).parent / "iron-spec"), "serve", "--checkpoint", served,
               "--name", "model", "--threads", str(args.threads), "--max-batch",
               str(max(args.streams)), "--max-seq-len", str(args.max_seq_len), "--host",
               "127.0.0.1", "--port", str(port)] + (["--weights", args.weights]
                                                      if args.weights else [])
        sides.append(run_side("iron-spec", cmd, port, env, "model", args, tokenizer, logs))
    if args.peer or args.only == "peer":
        if not args.gguf:
            raise SystemExit("--peer needs --gguf FILE")
        port = free_port()
        slots = max(args.streams)
        if args.llama_server:
            # Continuous batching over `slots` slots, each with the context our server gives
            # a request, in one KV cache (its default when slots are set is one cache each);
            # its own prompt cache reuse across requests, as ours.
            cmd = [args.llama_server, "--model", args.gguf, "--alias", "model", "--threads",
                   str(args.threads), "--threads-batch", str(args.threads), "--parallel",
                   str(slots), "--ctx-size", str(args.max_seq_len * slots), "--cont-batching",
                   "--metrics", "--no-webui", "--host", "127.0.0.1", "--port", str(port)]
            sides.append(run_side("llama-server", cmd, port, env, "model", args, tokenizer,
                                  logs))
        else:
            cmd = [sys.executable, "-m", "llama_cpp.server", "--model", args.gguf,
                   "--model_alias", "model", "--n_threads", str(args.threads),
                   "--n_threads_batch", str(args.threads), "--n_ctx", str(args.max_seq_len),
                   "--host", "127.0.0.1", "--port", str(port),
                   # Its default cuts a streaming request short as soon as another arrives:
                   # each request is served to its end, one at a time (llama_cpp.server has
                   # one model behind a lock, no parallel slots).
                   "--interrupt_requests", "False"]
            sides.append(run_side("llama.cpp", cmd, port, env, "model", args, tokenizer, logs))
    lo, hi = min(args.streams), max(args.streams)
    for s in sides:
        a, b = s.get(f"streams_{lo}"), s.get(f"streams_{hi}")
        if a and b and hi != lo:
            s["ratio_tokens_per_s"] = b["tokens_per_s"] / a["tokens_per_s"]
            s["ratio_ttft"] = b["ttft_mean"] / a["ttft_mean"]
            print(f"{s['side']}: {hi} streams vs {lo}: tokens/s {s['ratio_tokens_per_s']:.2f}x, "
                  f"TTFT {s['ratio_ttft']:.2f}x at once", end="")
            c = s.get(f"staggered_{hi}")
            if c:
                s["ratio_ttft_staggered"] = c["ttft_mean"] / a["ttft_mean"]
                print(f", {s['ratio_ttft_staggered']:.2f}x arriving apart", end="")
            print()
    if len(sides) == 2:
        for n in args.streams:
            r = sides[0][f"streams_{n}"]["tokens_per_s"] / sides[1][f"streams_{n}"]["tokens_per_s"]
            print(f"iron-spec vs llama.cpp at {n} stream(s): aggregate tokens/s {r:.2f}x")
    if args.json:
        print(json.dumps(sides, indent=1))


if __name__ == "__main__":
    main()
