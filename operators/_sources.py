"""The digest of the C extension's sources (``_cpu*.c``, ``_cpu*.h`` in this folder): compiled
into the extension by setup.py (``_cpu.SOURCE_DIGEST``) and compared at import by ``native``,
so an extension built from other sources (a C change since the last ``pip install -e .``)
is never called with this tree's step codes and arguments.

Standard library only: setup.py loads this file by path, before the package is installed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def digest(folder: str | Path) -> str | None:
    """The SHA-256 (16 hex digits) over each source's name and bytes in name order, or None
    where ``folder`` holds no sources (an installed wheel ships the built extension only)."""
    files = sorted(Path(folder).glob("_cpu*.[ch]"))
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]
