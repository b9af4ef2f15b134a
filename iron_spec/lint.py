"""``iron-spec lint``: every problem of every spec, each at its line and column."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from .errors import SpecError
from .interpreter import expand
from .loader import load_spec
from .schema import validate


def spec_files(paths: Iterable[Path]) -> list[Path]:
    """The ``.yaml``/``.yml`` files of ``paths`` (folders searched, sorted).

    Raises FileNotFoundError naming a path that does not exist.
    """
    files = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(q for q in p.rglob("*") if q.suffix in (".yaml", ".yml"))
        elif p.is_file():
            files.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such file or folder")
    return files


def lint_file(path: Path) -> list[SpecError]:
    """The problems of one spec: YAML, schema, then expanding it on its toy config."""
    try:
        spec = load_spec(path)
    except SpecError as e:
        return [e]
    problems = validate(spec)
    if problems:
        return problems
    toy = spec.get("toy", "config")
    if toy is not None:
        try:
            expand(spec, toy, source=f"{path} toy.config")
        except SpecError as e:
            return [e]
    return []


def lint_paths(paths: Iterable[Path]) -> tuple[list[SpecError], list[Path]]:
    files = spec_files(paths)
    problems: list[SpecError] = []
    for f in files:
        problems += lint_file(f)
    return problems, files
