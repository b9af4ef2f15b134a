"""The specs this project ships, and which serves a checkpoint: the entries ``iron-spec list``
prints, and a spec picked from a config.json's ``architectures`` when none is named.

A file of a specs folder that is no spec (not YAML, a FIFO, a folder named ``x.yaml``, a
link to a device, past the loader's size) poisons nothing else: ``list``, a lookup by name
and a pick by architectures skip it with a warning naming it and why (the ``iron_spec``
logger), and serve every other spec. Named itself, it is read, and refused as lint would.

Not for: reading what a spec means (``interpreter``, ``encoder``).
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from iron_spec.runtime.host import checkpoint_directory

from iron_spec.runtime.gguf import file_architecture, is_gguf

from . import keys, parts
from .arguments import said
from .build import read_config
from .errors import FlagError, SpecError, message, shorten
from .loader import load_spec
from .schema import schema

log = logging.getLogger("iron_spec")


def _shipped() -> Path:
    """The specs folder: ``iron_spec/specs`` in an install, ``specs/`` beside ``iron_spec/``
    in a checkout (an editable install maps the one onto the other)."""
    here = Path(__file__).resolve().parent.parent  # iron_spec/, this module's package's
    installed = here / "specs"
    return installed if installed.is_dir() else here.parent / "specs"


#: The shipped specs' folder; ``IRON_SPEC_SPECS`` points elsewhere.
SPECS = Path(os.environ.get("IRON_SPEC_SPECS") or _shipped())


def specs_folder() -> Path:
    """The specs folder now: ``IRON_SPEC_SPECS`` where set, else the shipped one."""
    return Path(os.environ.get("IRON_SPEC_SPECS") or _shipped())


@dataclass(frozen=True)
class Entry:
    """One spec file: its ``name``, ``model`` kind, the ``architectures`` it serves (its own,
    then those its ``parts`` read: a bigger checkpoint holding its model; ``parts`` those
    alone), and the GGUF ``general.architecture`` it reads (its ``gguf`` section; None:
    none)."""

    path: Path
    name: str
    model: str
    architectures: tuple[str, ...]
    gguf: str | None = None
    parts: tuple[str, ...] = ()


def entries(folder: Path | None = None,
            skipped: list[tuple[Path, str]] | None = None) -> list[Entry]:
    """Every spec under ``folder`` (default ``SPECS``), by file name. A file that is no spec
    (``load_spec`` refuses it: run ``iron-spec lint`` on it) is skipped: appended to
    ``skipped`` as (path, why) where given, else said in a warning on the ``iron_spec``
    logger.

    Raises:
        FileNotFoundError: no such folder.
    """
    folder = Path(folder or specs_folder())
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no specs folder (IRON_SPEC_SPECS names another)")
    paths = sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml"))
    # Read once for the same files: picking a spec for each of many configs parses none again.
    found, broken = _entries(tuple((p, *_stamp(p)) for p in paths))
    for path, why in broken:
        if skipped is not None:
            skipped.append((path, why))
        else:
            log.warning("%s is skipped, no spec: %s", path, shorten(why, 300))
    return list(found)


def _stamp(path: Path) -> tuple[int | None, int | None]:
    """``path``'s modification time and size, which tell a file changed; (None, None) where
    it cannot be looked at (a dangling link: ``load_spec`` says why)."""
    try:
        st = path.stat()
    except OSError:
        return None, None
    return st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=8)
def _entries(files: tuple) -> tuple[tuple[Entry, ...], tuple[tuple[Path, str], ...]]:
    """The entries of ``files`` (path, mtime, size), and each file that is no spec with
    why."""
    out = []
    broken = []
    for path, _, _ in files:
        try:
            spec = load_spec(path)
        except (SpecError, OSError) as e:
            broken.append((path, " ".join(message(e).split())))
            continue
        # Another tool's YAML in the folder (a serve file, a CI config) parses too: without a
        # spec's top-level keys it is no spec, not a spec of model "?".
        missing = [k for k in schema()["required"]
                   if not isinstance(spec.data, dict) or k not in spec.data]
        if missing:
            keys = ", ".join(schema()["required"])
            broken.append((path, f"none of a spec's keys ({keys})" if len(missing) == len(
                schema()["required"]) else f"no {', '.join(missing)} (a spec has {keys})"))
            continue
        archs = spec.get("architectures", default=[])
        archs = [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []
        gguf = spec.get("gguf", "architecture")
        out.append(Entry(path, str(spec.get("name", default=path.stem)),
                         str(spec.get("model", default="?")),
                         tuple(archs + parts.architectures(spec)),
                         gguf if isinstance(gguf, str) else None,
                         tuple(parts.architectures(spec))))
    return tuple(out), tuple(broken)


def for_architectures(architectures, source: str, folder: Path | None = None,
                      config: dict | None = None) -> Path:
    """The spec serving ``architectures`` (a config.json's), the first one a spec serves,
    as transformers builds ``architectures[0]``; where several read it as a part of a bigger
    checkpoint, the one whose part reads ``config`` (by its text model's ``model_type``);
    where several serve it as their own (transformers builds one class for model types of
    other defaults), the one named as ``config``'s ``model_type``; where none serves any (a
    name only the checkpoints carry, EXAONE's own or a fine-tune's), or the file names none,
    the one spec serving ``config``'s ``model_type`` (``keys.serves``), as transformers builds
    by model type.

    Raises:
        ValueError: ``architectures`` is neither a list of names nor absent, no spec serves
            any of them or the model type, or two specs serve the same one, none named as
            ``model_type`` (naming what each serves).
    """
    model_type = (config or {}).get("model_type")
    if architectures is not None and (not isinstance(architectures, list) or not all(
            isinstance(a, str) for a in architectures)) or (architectures is None and model_type is None):
        raise ValueError(f"{source}: its architectures is {architectures!r}, not a list of class "
                         "names; name the spec to run")
    known = entries(folder)
    for arch in architectures or []:
        serving = [e for e in known if arch in e.architectures]
        if len(serving) > 1 and config is not None:
            serving = [e for e in serving if arch not in parts.architectures(load_spec(e.path))
                       or parts.find(load_spec(e.path), config) is not None] or serving
        if len(serving) > 1 and any(e.name == model_type for e in serving):
            serving = [e for e in serving if e.name == model_type]
        if len(serving) > 1:
            raise ValueError(f"{arch} is served by {len(serving)} specs "
                             f"({', '.join(str(e.path) for e in serving)}); name one")
        if serving:
            return serving[0].path
    by_type = [e for e in known if keys.serves(e.name, model_type)]
    if len(by_type) == 1:
        return by_type[0].path
    if len(by_type) > 1:
        raise ValueError(f"{source}: model_type {model_type} is served by {len(by_type)} specs "
                         f"({', '.join(str(e.path) for e in by_type)}); name one")
    served = sorted({a for e in known for a in e.architectures})
    named = ", ".join(architectures or []) or "no architectures"
    raise ValueError(f"{source}: no spec serves {named}"
                     + (f" or model_type {model_type}" if model_type is not None else "")
                     + f" (specs serve: {', '.join(served) or 'nothing'}); write one, or name a spec")


def for_checkpoint(checkpoint: str | Path, folder: Path | None = None) -> Path:
    """The spec serving the checkpoint's config.json ``architectures``.

    Raises:
        FileNotFoundError: no checkpoint or config.json there.
        ValueError: as ``for_architectures``.
    """
    directory = checkpoint_directory(checkpoint, said("checkpoint", str(checkpoint)))
    if is_gguf(directory):
        return for_gguf(directory, folder)
    config = read_config(directory)
    return for_architectures(config.get("architectures"), str(directory / "config.json"), folder,
                             config)


def picked_by(checkpoint: str | Path, path: Path, folder: Path | None = None) -> str:
    """What made ``for_checkpoint(checkpoint)`` pick ``path``, as a user reads it: the GGUF
    file's architecture, config.json's ``architectures`` (one the spec serves), else its
    ``model_type`` (no architectures, or none a spec serves)."""
    directory = checkpoint_directory(checkpoint, said("checkpoint", str(checkpoint)))
    if is_gguf(directory):
        return f"GGUF general.architecture {file_architecture(directory)}"
    config = read_config(directory)
    archs = config.get("architectures")
    archs = [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []
    # The folder's broken files were said when the spec was picked: not again here.
    served = {a for e in entries(folder, skipped=[]) if e.path == path for a in e.architectures}
    if any(a in served for a in archs):
        return "config.json architectures"
    return (f"config.json model_type {config.get('model_type')} (its architectures "
            + (f"{', '.join(archs)} served by no spec)" if archs else "not given)"))


def for_gguf(path: str | Path, folder: Path | None = None) -> Path:
    """The spec reading GGUF files of ``path``'s ``general.architecture`` (its
    ``gguf.architecture``).

    Raises:
        GGUFError: not a readable GGUF file.
        ValueError: no spec reads that architecture, or two do (naming each).
    """
    arch = file_architecture(path)
    known = entries(folder)
    serving = [e for e in known if e.gguf == arch]
    if len(serving) > 1:
        raise ValueError(f"GGUF files of {arch} are read by {len(serving)} specs "
                         f"({', '.join(str(e.path) for e in serving)}); name one")
    if not serving:
        read = sorted({e.gguf for e in known if e.gguf})
        raise ValueError(f"{path}: no spec reads GGUF files of {arch} (specs read: "
                         f"{', '.join(read) or 'none'}); its safetensors checkpoint loads with "
                         "the spec of its architectures, or a spec with a gguf section naming "
                         f"architecture {arch} reads it")
    return serving[0].path


def find(spec: str | Path | None, checkpoint: str | Path | None = None,
         folder: Path | None = None) -> Path:
    """The spec file ``spec`` names: a path to one; a name (``llama3``, a spec's ``name`` or
    file stem) in ``folder`` (default ``specs_folder()``, so from any working folder); a path
    relative to a checkout's ``specs/`` (``specs/llama3.yaml``) that is not there, the
    folder's file of that name; None, the spec serving ``checkpoint``'s architectures.

    Raises:
        FlagError: neither a spec nor a checkpoint, or a spec of ''.
        ValueError: no spec serves the checkpoint's architectures, the name is several
            specs' ``name`` and no file's, or ``spec`` is a folder.
        FileNotFoundError: no such file and no spec of that name (every valid name listed).
    """
    if spec is None:
        if checkpoint is None:
            raise FlagError("name a spec (iron-spec list shows them), or give a checkpoint "
                            "to pick one from its config.json architectures")
        return for_checkpoint(checkpoint, folder)
    if str(spec) == "":  # Path("") is the working folder: never what an empty $VAR meant
        raise FlagError("the spec is '', no name nor path: give a spec's name (iron-spec list "
                        "shows them) or a spec YAML's path")
    path = Path(spec).expanduser()
    if path.is_dir():  # lint reads a folder of specs; a model is built from one
        inside = sorted(p.name for p in path.glob("*.y*ml"))[:3]
        raise ValueError(f"{spec} is a folder; a model is built from one spec: a YAML file "
                         + (f"in it ({', '.join(inside)}, ...) " if inside else "")
                         + "or a spec's name (iron-spec list shows them)")
    if path.exists():  # a FIFO too: the loader refuses it, naming what it is
        return path
    folder = Path(folder or specs_folder())
    if not path.is_absolute() and len(path.parts) == 2 and path.parts[0] == "specs" and \
            (folder / path.name).is_file():
        return folder / path.name
    if len(path.parts) == 1:
        stem = path.stem if path.suffix in (".yaml", ".yml") else str(path)
        # A file of that name first, whatever it holds: a folder's file names are its own,
        # and a broken one is refused as itself (not as "no such spec") when it loads.
        for suffix in (".yaml", ".yml"):
            own = folder / f"{stem}{suffix}"
            if own.exists() or own.is_symlink():
                return own
        known = entries(folder) if folder.is_dir() else []
        named = [e.path for e in known if e.name == stem]
        if len(named) > 1:
            raise ValueError(f"{spec}: {len(named)} specs in {folder} are named {stem} "
                             f"({', '.join(p.name for p in named)}); name one by its file")
        if named:
            return named[0]
        names = sorted({e.path.stem for e in known})
        import difflib
        close = difflib.get_close_matches(stem, names, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise FileNotFoundError(f"{spec}: no such spec file, and no spec of that name in "
                                f"{folder}{hint} (the specs: {', '.join(names) or 'none'}; "
                                "IRON_SPEC_SPECS names another folder)")
    raise FileNotFoundError(f"{spec}: no such spec file")
