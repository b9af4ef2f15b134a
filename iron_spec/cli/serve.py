"""``iron-spec serve``: models behind an OpenAI-compatible HTTP API (``iron_spec.cli.server``),
run by uvicorn on 127.0.0.1 unless told otherwise.

    iron-spec serve llama3 --checkpoint DIR                 # one model, named after DIR
    iron-spec serve --model smollm2=DIR --model minilm=DIR2  # several, specs from config.json
    iron-spec serve --config serve.yaml                     # the file's models and settings

Not for: the app itself (``server.app``), one generation (``run``).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import List, Optional

import typer

from iron_spec.runtime.engine import check_options
from iron_spec.spec.build import WEIGHTS, WEIGHTS_HELP
from iron_spec.spec.errors import FlagError

from .command import choice, log_to_stderr, refuse
from .server.config import ConfigError, ModelEntry, ServeConfig, load_models, read_config

#: The environment variable an API key is read from where --api-key is not given.
API_KEY_VARIABLE = "IRON_SPEC_API_KEY"
EXTRA = ("the server needs the serve extra: pip install 'iron-spec[serve]' (starlette and "
         "uvicorn)")


#: Seconds the requests in flight get to end once the server is told to stop.
SHUTDOWN_GRACE = 5


def _entries(spec: Optional[str], checkpoint: Optional[str], name: Optional[str],
             models: list[str], options: dict, causal: dict) -> list[ModelEntry]:
    entries = []
    if spec is not None or checkpoint is not None:
        where = checkpoint if checkpoint is not None else spec
        entries.append(ModelEntry(name or Path(str(where)).expanduser().name.removesuffix(".yaml")
                                  .removesuffix(".gguf"), spec, checkpoint, dict(options),
                                  dict(causal)))
    elif name is not None:
        raise FlagError("--name names the model of SPEC/--checkpoint; with --model give "
                        "NAME=CHECKPOINT")
    for m in models:
        label, sep, path = m.partition("=")
        if not sep or not label or not path:
            raise FlagError(f"--model {m!r}: NAME=CHECKPOINT (the spec picked by its "
                            "config.json's architectures)")
        entries.append(ModelEntry(label, None, path, dict(options), dict(causal)))
    return entries


def command(
    spec: Optional[str] = typer.Argument(None, metavar="[SPEC]",
                                         help="a spec's name or path for --checkpoint (else "
                                              "its config.json's architectures pick one)"),
    checkpoint: Optional[str] = typer.Option(None, metavar="DIR|ID|GGUF",
                                             help="the checkpoint to serve"),
    name: Optional[str] = typer.Option(None, metavar="NAME",
                                       help="the model's name in requests (default: the "
                                            "checkpoint folder's name)"),
    model: List[str] = typer.Option([], "--model", metavar="NAME=CHECKPOINT",
                                    help="serve this checkpoint as NAME too (repeatable)"),
    config: Optional[Path] = typer.Option(None, "--config", metavar="FILE",
                                          help="a YAML file naming the models and settings "
                                               "(docs/serving.md); flags given override it"),
    host: Optional[str] = typer.Option(None, help="the address to listen on (default "
                                                  "127.0.0.1: this machine only)"),
    port: Optional[int] = typer.Option(None, min=0, max=65535, help="the port (default 8000)"),
    api_key: Optional[str] = typer.Option(None, metavar="KEY",
                                          help=f"ask every /v1 request for 'Authorization: "
                                               f"Bearer KEY' (default: ${API_KEY_VARIABLE} "
                                               "where set, else no key)"),
    max_batch: Optional[int] = typer.Option(None, min=1, max=256,
                                            help="requests decoded together, per model "
                                                 "(default 8); more wait their turn"),
    held_sessions: Optional[int] = typer.Option(None, min=0,
                                                help="finished requests' sessions kept for "
                                                     "prefix reuse (default: --max-batch)"),
    max_seq_len: Optional[int] = typer.Option(None, min=1, help="each causal model's context (an encoder keeps its own)"),
    threads: Optional[int] = typer.Option(None, min=1, help="threads for the kernels"),
    weights: Optional[str] = typer.Option(None, "--weights", callback=choice(WEIGHTS),
                                          help=WEIGHTS_HELP),
    random_weights: Optional[int] = typer.Option(None, min=0, metavar="SEED",
                                                 help="draw the weights (a test server)"),
    toy: bool = typer.Option(False, "--toy", help="the spec's toy shape (with "
                                                  "--random-weights: no files at all)"),
) -> None:
    """Serve models over an OpenAI-compatible HTTP API: /v1/chat/completions,
    /v1/completions, /v1/embeddings, /v1/models, /health, /metrics."""
    try:
        import uvicorn

        from .server.app import build_app
    except ImportError:
        refuse(ValueError(EXTRA))
    try:
        options = {k: v for k, v in (("max_seq_len", max_seq_len),
                                      ("random_weights", random_weights),
                                      ("weights", weights)) if v is not None}
        if toy:
            options["toy"] = True
        cfg = read_config(config) if config is not None else ServeConfig([])
        # A context (--max-seq-len) is a causal model's: an encoder served beside it keeps
        # its own.
        causal = {k: options.pop(k) for k in ("max_seq_len",) if k in options}
        entries = _entries(spec, checkpoint, name, model, options, causal)
        if entries:
            cfg.models = entries
        else:  # the file's models: a flag given overrides the file's value
            for e in cfg.models:
                e.options.update(options)
                e.causal.update(causal)
                e.flags = frozenset((*options, *causal))
        if not cfg.models:
            raise FlagError("give a model: SPEC --checkpoint DIR, --model NAME=DIR or "
                            "--config FILE")
        cfg.host = host or cfg.host
        cfg.port = cfg.port if port is None else port
        cfg.threads = threads or cfg.threads
        cfg.api_key = api_key or os.environ.get(API_KEY_VARIABLE) or cfg.api_key
        for k, v in (("max_batch", max_batch), ("held_sessions", held_sessions)):
            if v is not None:
                cfg.engine[k] = v
        check_options(**cfg.engine)
        # The address is taken before the weights load (found by a new user's trial: a port
        # in use was found only after loading, and after "serving ... on" was printed).
        sock = _listen(cfg.host, cfg.port)
        cfg.port = sock.getsockname()[1]  # port 0: the one the system gave
        with log_to_stderr():
            served = load_models(cfg)
            app = build_app(served, api_key=cfg.api_key, engine=cfg.engine)
    except (FlagError, ConfigError, ValueError, OSError) as e:
        refuse(e)
    typer.echo(f"serving {', '.join(served)} on http://{cfg.host}:{cfg.port}/v1"
               + (" (API key required)" if cfg.api_key else ""), err=True)
    # On SIGINT or SIGTERM, requests in flight get SHUTDOWN_GRACE seconds to end, then are
    # cancelled (each its engine request with it): a stream of thousands of tokens does not
    # keep a server told to stop running, as uvicorn's default (no bound) would.
    uvicorn.Server(uvicorn.Config(app, log_level="warning",
                                  timeout_graceful_shutdown=SHUTDOWN_GRACE)).run(sockets=[sock])


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` (IPv6 where ``host`` has a colon), the one uvicorn
    then serves on.

    Raises:
        OSError: the address cannot be taken, saying which and why (in use, not this host's).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as e:
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e} (--host, --port "
                      "or the serve file's host and port)") from None
