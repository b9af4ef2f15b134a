"""``iron-spec lint``: every problem of every spec, each at its line and column."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, List

import typer

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


def command(
    paths: List[Path] = typer.Argument(..., help="spec files or folders of them"),
    format: str = typer.Option("text", "--format", help="text | json | github"),
) -> None:
    """Check specs: schema, then what the schema cannot see. Exit 0 clean, 1 problems, 2 could not run."""
    if format not in ("text", "json", "github"):
        typer.echo(f"error: --format {format!r} is not text, json or github", err=True)
        raise typer.Exit(2)
    try:
        problems, files = lint_paths(paths)
    except FileNotFoundError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    if format == "json":
        typer.echo(json.dumps([{"file": p.file, "line": p.line, "col": p.col,
                                "message": p.message} for p in problems], indent=2))
    else:
        for p in problems:
            if format == "github":
                typer.echo(f"::error file={p.file},line={p.line},col={p.col}::{p.message}")
            else:
                typer.echo(str(p))
        if format == "text":
            typer.echo(f"{len(files)} spec{'s' * (len(files) != 1)}, {len(problems)} "
                       f"problem{'s' * (len(problems) != 1)}", err=True)
    raise typer.Exit(1 if problems else 0)
