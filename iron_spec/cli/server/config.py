"""What ``iron-spec serve`` serves: models by name, each a spec and a checkpoint with its
load options, from a small YAML file or the command's flags.

    # serve.yaml
    host: 127.0.0.1          # the default; 0.0.0.0 listens on every interface
    port: 8000
    api_key_env: MY_KEY       # the API key from this environment variable (or api_key: ...)
    max_batch: 8             # requests decoded together, per model
    threads: 2
    models:
      smollm2:
        checkpoint: ~/.cache/iron-spec/checkpoints/smollm2-135m-instruct
        spec: llama3         # optional: else config.json's architectures pick it
        max_seq_len: 4096    # and any other iron_spec.load option
      minilm:
        checkpoint: ~/.cache/iron-spec/checkpoints/all-minilm-l6-v2

Not for: the HTTP side (``app``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from iron_spec.runtime.engine import check_options

#: iron_spec.load's options a model entry may give (beside spec and checkpoint).
LOAD_OPTIONS = ("max_seq_len", "prefill_chunk", "weights", "decode_weights", "prefill_weights",
                "kv_cache", "max_tokens", "random_weights", "toy", "allow_unread_config")
#: The engine's options a file may give (top level: every model's).
ENGINE_OPTIONS = ("max_batch", "held_sessions", "held_bytes", "prefill_tokens", "batched")
TOP = ("host", "port", "api_key", "api_key_env", "threads", "models", *ENGINE_OPTIONS)


class ConfigError(ValueError):
    """A serve configuration that cannot be used: the file, the key and what is valid."""


@dataclass
class ModelEntry:
    """A model to serve; ``causal``: options that apply where it is a causal model alone
    (``serve --max-seq-len`` beside an encoder: a context is a causal model's). ``source``:
    the file the entry is read from (None: the command's flags), its errors naming the file,
    the entry and its keys as the file spells them (``max_seq_len: 64``), but for ``flags``,
    the options a flag overrode it with (named ``--max-seq-len 64``)."""
    name: str
    spec: str | None = None
    checkpoint: str | None = None
    options: dict = field(default_factory=dict)
    causal: dict = field(default_factory=dict)
    source: str | None = None
    flags: frozenset = frozenset()


@dataclass
class ServeConfig:
    models: list[ModelEntry]
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    threads: int | None = None
    engine: dict = field(default_factory=dict)


def read_config(path: str | Path) -> ServeConfig:
    """``path``'s configuration (the module docstring's keys).

    Raises:
        ConfigError: not YAML, not a mapping, an unknown key (named with what is valid), a
            value of the wrong type, no models, an api_key_env that is not set.
    """
    path = Path(path).expanduser()
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:  # FILE:LINE:COL as a spec's errors are said
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        what = " ".join(str(getattr(e, "problem", None) or e).split())
        raise ConfigError(f"{where}: not YAML: {what}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a mapping of {', '.join(TOP)}")
    for key in data:
        if key not in TOP:
            raise ConfigError(f"{path}: unknown key {key!r} (the keys: {', '.join(TOP)})")
    models = data.get("models")
    if not isinstance(models, dict) or not models:
        raise ConfigError(f"{path}: models: a mapping of names to {{checkpoint, spec, ...}}")
    entries = []
    for name, entry in models.items():
        where = f"{path}: models.{name}"
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{path}: a model's name is text, not {name!r}")
        if isinstance(entry, str):
            entry = {"checkpoint": entry}
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: a checkpoint path, or a mapping of checkpoint, spec "
                              f"and {', '.join(LOAD_OPTIONS)}")
        for key in entry:
            if key not in ("spec", "checkpoint", *LOAD_OPTIONS):
                raise ConfigError(f"{where}: unknown key {key!r} (the keys: spec, checkpoint, "
                                  f"{', '.join(LOAD_OPTIONS)})")
        spec, checkpoint = entry.get("spec"), entry.get("checkpoint")
        if spec is None and checkpoint is None:
            raise ConfigError(f"{where}: give a checkpoint (and a spec, or none for "
                              "config.json's architectures to pick it)")
        for key, value in (("spec", spec), ("checkpoint", checkpoint)):
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{where}.{key}: text, not {value!r}")
        entries.append(ModelEntry(name, spec, checkpoint,
                                  {k: v for k, v in entry.items() if k in LOAD_OPTIONS},
                                  source=str(path)))
    key = data.get("api_key")
    if key is not None and (not isinstance(key, str) or not key):
        raise ConfigError(f"{path}: api_key is {key!r}: text (quote it: api_key: \"12345\")")
    env = data.get("api_key_env")
    if env is not None:
        if not isinstance(env, str) or env not in os.environ:
            raise ConfigError(f"{path}: api_key_env names {env!r}, which is not set")
        key = os.environ[env]
    port = data.get("port", 8000)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"{path}: port {port!r} is not a port number (0..65535)")
    host = data.get("host", "127.0.0.1")
    if not isinstance(host, str):
        raise ConfigError(f"{path}: host {host!r} is not an address")
    threads = data.get("threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):
        raise ConfigError(f"{path}: threads {threads!r} is not a count >= 1")
    engine = {k: data[k] for k in ENGINE_OPTIONS if k in data}
    try:
        check_options(**engine)  # before any weights load, not after
    except ValueError as e:
        raise ConfigError(f"{path}: {e}") from None
    return ServeConfig(entries, host, port, key, threads, engine)


def load_models(config: ServeConfig, progress: bool = False) -> dict[str, Any]:
    """Each entry loaded (``iron_spec.load``), by name.

    Raises:
        ConfigError: what ``iron_spec.load`` refused, the entry's name added (and a file's
            entry its file, ``serve.yaml: models.NAME: max_seq_len: 100000 is ...``).
    """
    from iron_spec.library.api import load
    from iron_spec.spec.arguments import given_in

    out: dict[str, Any] = {}
    for e in config.models:
        if e.name in out:
            raise ConfigError(f"two models are named {e.name!r}")
        where = f"{e.source}: models.{e.name}" if e.source is not None else f"model {e.name!r}"
        file_keys = set() if e.source is None else {"spec", "checkpoint", *LOAD_OPTIONS}
        try:
            options, flags = dict(e.options), set(e.flags)
            with given_in(file_keys - flags):
                causal = bool(e.causal) and _is_causal(e)
            if causal:
                options.update(e.causal)
            else:  # the file's own value stands
                flags -= set(e.causal)
            with given_in(file_keys - flags):
                out[e.name] = load(e.spec, e.checkpoint, threads=config.threads, **options)
        except (ValueError, TypeError, OSError) as err:
            raise ConfigError(f"{where}: {err}") from None
    return out


def _is_causal(entry: ModelEntry) -> bool:
    """Whether ``entry``'s spec (named, or picked by its checkpoint) is a causal model's."""
    from iron_spec.spec.loader import load_spec
    from iron_spec.spec.registry import find

    checkpoint = entry.checkpoint
    if checkpoint is not None and checkpoint.startswith("~"):  # as iron_spec.load takes it
        checkpoint = str(Path(checkpoint).expanduser())
    return load_spec(find(entry.spec, checkpoint)).get("model") == "causal"
