"""What this host offers a model: a checkpoint directory from a path or a hub id, and the
context (``max_seq_len``) that fits its memory (the seeds' ``fit``)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .gguf import is_gguf

logger = logging.getLogger("iron_spec")

HOST_RESERVE = 2 * 2**30  # bytes left to the OS and the Python process itself
CHECKPOINT_FILES = ["*config.json", "model*.safetensors*", "tokenizer.json",
                    "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"]


def checkpoint_directory(checkpoint: str | Path, named: str | None = None) -> Path:
    """``checkpoint`` itself if it is a directory or a GGUF file (``runtime.gguf``: one file
    holding config, tokenizer and weights), else a hub repository id resolved through
    ``huggingface_hub`` (its cache, and ``HF_HUB_OFFLINE``, honoured).

    Raises:
        FileNotFoundError: neither a directory, a GGUF file, nor a repository that is cached
            or reachable, naming it as ``named`` (the caller's spelling of the argument with
            its value, ``--checkpoint DIR``; default the value alone).
    """
    path = Path(checkpoint)
    if path.is_dir() or is_gguf(path):
        return path
    text = str(checkpoint)
    named = named or text
    if path.exists() or text.startswith((".", "/", "~")) or text.count("/") != 1:
        # Say what is there: nothing, an empty file, or a file of another kind.
        there = "nothing is there" if not path.exists() and not path.is_symlink() else \
            "a link to nothing" if not path.exists() else \
            "an empty file" if path.is_file() and path.stat().st_size == 0 else \
            "a file that is not GGUF (no GGUF magic)" if path.is_file() else None
        raise FileNotFoundError(f"{named}: " + (f"{there}; " if there else "")
                                + "give a checkpoint directory (one holding config.json and "
                                "model.safetensors), a GGUF file, or a hub id like org/name")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    try:
        return Path(snapshot_download(text, allow_patterns=CHECKPOINT_FILES))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError) as e:
        raise FileNotFoundError(
            f"{named}: not a directory, and the hub repository {text} is neither "
            f"cached nor reachable ({type(e).__name__}); download it where the hub is reachable "
            "or pass a checkpoint directory") from None


def host_budget() -> int:
    """Bytes a model may hold here: physical memory (or the cgroup's limit, if lower) less
    ``HOST_RESERVE``."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            total = min(total, int(limit))
    except (OSError, ValueError):
        pass
    return total - HOST_RESERVE


def fit(native: int, chunk: int, fixed: int, per_position: int, budget: int | None = None) -> int:
    """The context to serve: ``native`` (the checkpoint's own) where ``fixed + per_position *
    native`` bytes fit ``budget``, else the longest whole number of ``chunk``-token prompt
    chunks that does; said in one log line either way.

    Raises:
        ValueError: not even one chunk fits.
    """
    budget = host_budget() if budget is None else budget
    need = fixed + per_position * native
    if need <= budget:
        logger.info("max_seq_len %d, the model's own: at most %.2f GiB with the context "
                    "full, of a %.1f GiB budget", native, need / 2**30, budget / 2**30)
        return native
    # per_position 0 (nothing grows with the context): only the weights could not fit
    fits = int((budget - fixed) // per_position) // chunk * chunk if per_position > 0 else 0
    if fits < chunk:
        raise ValueError(f"{fixed / 2**30:.1f} GiB of weights and one {chunk}-token chunk do not "
                         f"fit this host's {budget / 2**30:.1f} GiB budget")
    logger.warning("max_seq_len %d, not the model's own %d: that would hold %.1f GiB, past this "
                   "host's %.1f GiB budget (memory less %.0f GiB reserved)", fits, native,
                   need / 2**30, budget / 2**30, HOST_RESERVE / 2**30)
    return fits
