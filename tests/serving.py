"""A real ``iron-spec serve`` process for tests: on 127.0.0.1, on a free port, stopped at the
end (its output kept to say why where it fails to start)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen | None, log: Path, timeout: float) -> None:
    """Until ``url`` answers 200; raises RuntimeError with the server's output where the
    process ended or ``timeout`` seconds passed."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}):\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    raise RuntimeError(f"the server did not answer {url} in {timeout} s:\n{log.read_text()}")


@contextmanager
def serve(args: list[str], tmp: Path, env: dict | None = None,
          timeout: float = 300) -> Iterator[str]:
    """``iron-spec serve ARGS --host 127.0.0.1 --port PORT`` running; yields its base URL
    (``http://127.0.0.1:PORT``). Stopped (SIGINT, then killed) when the block ends."""
    port = free_port()
    log = tmp / f"serve-{port}.log"
    full_env = {**os.environ, **(env or {})}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", "from iron_spec.cli.app import app; app()",
                                 "serve", *args,
                                 "--host", "127.0.0.1", "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=full_env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base + "/health", proc, log, timeout)
        yield base
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """``proc`` (a server) stopped as a user stops one: SIGINT, then killed past 20 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
