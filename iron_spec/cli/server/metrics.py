"""``GET /metrics``: the engines' counts in Prometheus' text exposition format (0.0.4).

Per served causal model (label ``model``): requests running and waiting, requests finished
and failed, prompt tokens (and those run, the rest reused from held sessions' caches),
tokens generated, time to first token (a histogram, seconds), the decode steps' tokens/s
(rows over the seconds the steps took), and the KV caches' bytes (running and held
sessions). Per route: HTTP requests by status and their seconds. Names follow Prometheus'
conventions (``_total`` counters, base units), as vLLM's ``vllm:*`` metrics count the same.

Not for: the engine's own bookkeeping (``runtime.engine.Metrics``).
"""

from __future__ import annotations

import threading
from typing import Mapping


class Counters:
    """HTTP requests by (route, status) and their seconds, counted from any thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}
        self.seconds: dict[str, float] = {}

    def count(self, path: str, status: int, seconds: float = 0.0) -> None:
        route = path if path in ROUTES else "other"
        with self._lock:
            self.requests[(route, status)] = self.requests.get((route, status), 0) + 1
            self.seconds[route] = self.seconds.get(route, 0.0) + seconds


ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models",
          "/health", "/metrics")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def exposition(engines: Mapping, counters: Counters) -> str:
    """The text of ``/metrics`` for ``engines`` (name -> ``runtime.engine.Engine``)."""
    out: list[str] = []

    def metric(name: str, kind: str, help: str, samples: list[tuple[str, float]]) -> None:
        out.append(f"# HELP iron_spec_{name} {help}")
        out.append(f"# TYPE iron_spec_{name} {kind}")
        for labels, value in samples:
            out.append(f"iron_spec_{name}{labels} {value!r}" if isinstance(value, float)
                       else f"iron_spec_{name}{labels} {value}")

    per = [(f'{{model="{_label(n)}"}}', e) for n, e in engines.items()]
    metric("requests_running", "gauge", "Requests running: reading their prompts or drawing.",
           [(l, e.running) for l, e in per])
    metric("requests_waiting", "gauge", "Requests waiting for a place in the batch.",
           [(l, e.waiting) for l, e in per])
    metric("requests_finished_total", "counter", "Requests ended (any finish reason).",
           [(l, e.metrics.finished) for l, e in per])
    metric("requests_failed_total", "counter", "Requests a model call failed.",
           [(l, e.metrics.failed) for l, e in per])
    metric("prompt_tokens_total", "counter", "Prompt tokens of the requests whose prompt ran.",
           [(l, e.metrics.prompt_tokens) for l, e in per])
    metric("prompt_tokens_run_total", "counter",
           "Prompt tokens run; the rest were reused from a held session's KV cache.",
           [(l, e.metrics.prompt_tokens_run) for l, e in per])
    metric("generation_tokens_total", "counter", "Tokens drawn.",
           [(l, e.metrics.generated_tokens) for l, e in per])
    out.append("# HELP iron_spec_time_to_first_token_seconds Seconds from a request's "
               "arrival to its first token.")
    out.append("# TYPE iron_spec_time_to_first_token_seconds histogram")
    for n, e in engines.items():
        m, name = e.metrics, _label(n)
        for bound, count in zip(m.TTFT_BUCKETS, m.ttft_buckets):
            le = "+Inf" if bound == float("inf") else repr(bound)
            out.append(f'iron_spec_time_to_first_token_seconds_bucket{{model="{name}",'
                       f'le="{le}"}} {count}')
        out.append(f'iron_spec_time_to_first_token_seconds_sum{{model="{name}"}} {m.ttft_sum!r}')
        out.append(f'iron_spec_time_to_first_token_seconds_count{{model="{name}"}} {m.ttft_count}')
    metric("decode_steps_total", "counter", "Decode steps run (each over every request "
           "drawing then).", [(l, e.metrics.decode_steps) for l, e in per])
    metric("decode_tokens_per_second", "gauge",
           "Tokens the decode steps drew per second of their own time, since the start.",
           [(l, e.metrics.decode_rows / e.metrics.decode_seconds if e.metrics.decode_seconds
             else 0.0) for l, e in per])
    metric("kv_cache_bytes", "gauge", "Bytes the KV caches of running and held sessions take.",
           [(l, e.kv_bytes()) for l, e in per])
    metric("held_sessions", "gauge", "Finished requests' sessions held for prefix reuse.",
           [(l, len(e.pool)) for l, e in per])
    with counters._lock:
        requests = dict(counters.requests)
        seconds = dict(counters.seconds)
    metric("http_requests_total", "counter", "HTTP requests by route and status.",
           [(f'{{route="{r}",status="{s}"}}', n) for (r, s), n in sorted(requests.items())])
    metric("http_request_seconds_total", "counter", "Seconds spent answering, by route.",
           [(f'{{route="{r}"}}', float(s)) for r, s in sorted(seconds.items())])
    return "\n".join(out) + "\n"
