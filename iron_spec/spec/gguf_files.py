"""GGUF files (llama.cpp's checkpoints) as a spec serves them: the spec's ``gguf`` section
(``options.checkpoint.gguf_layout``) meets ``runtime.gguf``'s reader. ``build`` and ``registry`` call
these where a ``--checkpoint`` is a ``.gguf`` file rather than a directory.

Not for: reading the file (``runtime.gguf``, ``runtime.gguf_vocab``).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Iterable

from iron_spec.runtime.gguf import GGUFCheckpoint, GGUFFile, config, is_gguf
from iron_spec.runtime.gguf_vocab import tokenizer as _tokenizer
from iron_spec.runtime.tokenizer import Tokenizer

from .errors import SpecError
from .loader import Spec, load_spec
from .options.checkpoint import gguf_layout

__all__ = ["is_gguf", "open_file", "config_json", "tokenizer", "checkpoint", "architecture"]


def open_file(path: str | Path) -> GGUFFile:
    """The GGUF file at ``path``, parsed once per load (config, tokenizer and weights read
    the same header; a 262k-token vocabulary takes over a second).

    Raises:
        FileNotFoundError, GGUFError: as ``runtime.gguf.GGUFFile``.
    """
    path = Path(path).resolve()
    return _open(path, path.stat().st_mtime_ns)


@lru_cache(maxsize=2)
def _open(path: Path, mtime_ns: int) -> GGUFFile:
    return GGUFFile(path)


def _layout(spec: Spec, file: GGUFFile):
    layout = gguf_layout(spec)
    if layout is None:
        raise spec.error((), f"{file.path} is a GGUF file (general.architecture "
                         f"{file.architecture}); this spec has no gguf section to read one: "
                         f"{_served(file.architecture, Path(spec.file).parent)}")
    if layout.architecture != file.architecture:
        raise spec.error(("gguf", "architecture"),
                         f"this spec reads GGUF files of {layout.architecture}; {file.path} is "
                         f"{file.architecture}: {_served(file.architecture, Path(spec.file).parent)}")
    return layout


def _served(arch: str, folder: Path) -> str:
    """What would read a GGUF file of ``arch``: the spec of ``folder`` (the named spec's
    own) whose gguf section names it, or that none does and which architectures are read."""
    read: dict[str, str] = {}
    for path in sorted(folder.glob("*.yaml")):
        try:
            name = load_spec(path).get("gguf", "architecture")
        except (SpecError, OSError):  # another spec's own trouble is not this file's
            continue
        if isinstance(name, str):
            read.setdefault(name, path.stem)
    if arch in read:
        return (f"the spec {read[arch]} reads it (name it, or give no spec: it is picked by "
                "general.architecture)")
    return (f"no spec reads GGUF files of {arch} (specs read {', '.join(sorted(read))}); its "
            "safetensors checkpoint loads with the spec of its architectures")


def config_json(spec: Spec, path: str | Path) -> dict:
    """The config.json of the GGUF file at ``path`` as ``spec`` serves it.

    Raises:
        SpecError: the spec reads no GGUF files, or those of another architecture.
        GGUFError: as ``runtime.gguf.config``.
    """
    file = open_file(path)
    return config(file, _layout(spec, file))


def tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer of the GGUF file at ``path`` (``runtime.gguf_vocab.tokenizer``)."""
    return _tokenizer(open_file(path))


def checkpoint(spec: Spec, path: str | Path, config: dict, names: Iterable[str],
               transposed: Iterable[str] = ()) -> GGUFCheckpoint:
    """The GGUF file at ``path``'s tensors under the checkpoint ``names`` a model reads, in
    transformers' layout, ``transposed`` those of them transformers stores ``[in, out]``
    (``runtime.gguf.GGUFCheckpoint``)."""
    file = open_file(path)
    return GGUFCheckpoint(file, _layout(spec, file), config, names, transposed)


def architecture(path: str | Path) -> str:
    """``general.architecture`` of the GGUF file at ``path``."""
    return open_file(path).architecture
