"""Where goldens live: found by fingerprint in every store, recorded into one.

A golden (``runtime.golden``; an encoder's is an ``.npz`` with a ``fingerprint`` too) is
keyed by a fingerprint of config.json and the checkpoint's tensors, the inputs transformers
ran on, never by the spec that reads them: any golden with the right fingerprint judges a
spec, wherever the spec is. The stores searched, in order:

1. the checkout whose ``specs/`` the spec is in: ``<checkout>/tests/goldens`` (where it
   exists; a spec in any other folder has none);
2. the goldens of the iron-spec installation itself (its checkout's ``tests/goldens``,
   present in an editable install), so a spec copied out of the checkout is still judged;
3. each folder named by ``IRON_SPEC_GOLDENS`` (``os.pathsep``-separated);
4. the user store, ``$XDG_CACHE_HOME/iron-spec/goldens`` (``~/.cache/iron-spec/goldens``).

In each store, ``<store>/<spec name>/*.npz`` are read first, then every ``<store>/*/*.npz``,
each through ``runtime.golden.read_npz`` (a FIFO or an archive that would inflate past its
bound among them is no golden, skipped unread).
Not for reading or judging a golden (``runtime.golden``, ``runtime.checks``).
"""

from __future__ import annotations

import os
from pathlib import Path

from iron_spec.runtime.golden import GoldenError, fingerprint_held

ENV = "IRON_SPEC_GOLDENS"
INSTALLED = Path(__file__).resolve().parents[2] / "tests" / "goldens"


def user_store() -> Path:
    """``$XDG_CACHE_HOME/iron-spec/goldens``, ``~/.cache/iron-spec/goldens`` without it."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "iron-spec" / "goldens"


def checkout_store(spec_file: str | Path) -> Path | None:
    """``tests/goldens`` of the checkout whose ``specs/`` folder holds ``spec_file``
    (``<checkout>/specs/<spec>.yaml``), None where there is none. A spec in any other folder
    (copied out of ``specs/``, even into the checkout) belongs to no checkout's store:
    ``<folder>/../tests/goldens`` beside it is somebody else's goldens."""
    folder = Path(spec_file).resolve().parent
    store = folder.parent / "tests" / "goldens"
    return store if folder.name == "specs" and store.is_dir() else None


def env_stores() -> list[Path]:
    return [Path(p) for p in os.environ.get(ENV, "").split(os.pathsep) if p]


def stores(spec_file: str | Path) -> list[Path]:
    """Every store searched for ``spec_file``'s goldens, in order, each once."""
    found: list[Path] = []
    for store in [checkout_store(spec_file), INSTALLED, *env_stores(), user_store()]:
        if store is not None and store.resolve() not in [s.resolve() for s in found]:
            found.append(store)
    return found


def writable(path: str | Path) -> None:
    """Refuse a golden ``path`` that cannot be written, before anything is recorded: its
    nearest existing folder must be a folder (not a file: ``/etc/hostname/g.npz``) this user
    may write in; nothing is made.

    Raises:
        ValueError: naming ``path``, the ancestor in the way and why.
    """
    path = Path(path)
    above = path.parent
    while not (above.exists() or above.is_symlink()) and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise ValueError(f"{path}: cannot be written, {above} is not a folder (a golden's path "
                         "is a .npz file in a folder)")
    if not os.access(above, os.W_OK | os.X_OK):
        raise ValueError(f"{path}: cannot be written, {above} is not a folder this user may "
                         "write in")


def record_store(spec_file: str | Path) -> Path:
    """Where ``--record-golden`` writes: the spec's checkout, else the first folder of
    ``IRON_SPEC_GOLDENS``, else the user store."""
    return checkout_store(spec_file) or next(iter(env_stores()), None) or user_store()


def fingerprint_of(path: Path) -> str | None:
    """The fingerprint a golden file holds; None for a file that is no golden (nor a regular
    file, nor within ``read_npz``'s bounds) or no file."""
    try:
        return fingerprint_held(path)
    except GoldenError:
        return None


def find(fingerprint: str, name: str, spec_file: str | Path) -> tuple[Path | None, list[Path]]:
    """The first golden recorded from ``fingerprint``'s inputs, searching the folder of spec
    ``name`` in each store first, then every other folder; and the stores searched."""
    searched = stores(spec_file)
    own = [p for s in searched for p in sorted((s / name).glob("*.npz"))]
    rest = [p for s in searched for p in sorted(s.glob("*/*.npz")) if p.parent.name != name]
    for path in own + rest:
        if fingerprint_of(path) == fingerprint:
            return path, searched
    return None, searched


def not_found(fingerprint: str, searched: list[Path]) -> str:
    """What a user reads where no golden was found: the inputs and the stores searched."""
    return (f"no golden for these inputs (fingerprint {fingerprint}) in "
            f"{', '.join(map(str, searched))}")
