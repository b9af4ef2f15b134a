"""Add transformers' config class defaults to committed goldens' meta, keeping every other
array as it is (needs transformers; never run by the tests):

    python -m tests.goldens.add_config_defaults [PATH ...]   # default: every golden here

A golden's meta names the transformers class it was recorded through (``model``); its
``config_class``'s defaults are recorded as ``--record-golden`` records them
(``iron_spec.library.config_defaults.of``: ``type(config)()`` saved in full), with the class's
``model_type`` and the spec the golden's folder is named after where the meta lacks them.
No model runs. Afterwards every array the file held but meta is compared with the old
file's, byte for byte; a difference is an error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import transformers

from iron_spec.library.config_defaults import of
from iron_spec.runtime.golden import add_arrays, load_arrays
from tests.goldens.add_float64 import HERE, same_but_added


def add(path: Path) -> str:
    old = load_arrays(path)
    meta = json.loads(str(old["meta"])) if "meta" in old else {}
    named = meta.get("model")
    model = getattr(transformers, named, None) if named else None
    if model is None:
        return f"left as it was: its meta names no transformers class ({named!r})"
    cls = model.config_class
    more = {"config_defaults": of(cls)}
    more.setdefault("model_type", meta.get("model_type") or cls.model_type)
    more["spec"] = meta.get("spec") or path.parent.name
    add_arrays(path, {}, more)
    bad = same_but_added(old, load_arrays(path), set())
    if bad:
        raise SystemExit(f"{path}: arrays changed: {bad}")
    record = more["config_defaults"]
    return f"{cls.__name__}'s defaults added" + (f" (none: {record['error']})"
                                                 if "error" in record else "")


def main(paths: list[str]) -> None:
    for path in [Path(p) for p in paths] or sorted(HERE.glob("*/*.npz")):
        print(f"{path}: {add(path.resolve())}, every other array unchanged", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
