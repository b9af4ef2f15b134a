"""``iron-spec lint``: every problem of every spec (``iron_spec.spec.lint``), printed as
text (``FILE:LINE:COL: error: MESSAGE``), JSON or GitHub workflow annotations.

Not for: what is checked (``iron_spec.spec.lint``, ``iron_spec.spec.rules``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from iron_spec.spec.errors import SpecError, message
from iron_spec.spec.lint import ConfigFile, lint_paths
from iron_spec.spec.registry import find

FORMATS = ("text", "json", "github")


def render(problems: list[SpecError], format: str) -> str:
    """``problems`` as ``text`` (``FILE:LINE:COL: error: MESSAGE``), ``json`` or ``github``
    (workflow annotations)."""
    if format == "json":
        return json.dumps([{"file": p.file, "line": p.line, "col": p.col, "message": p.message}
                           for p in problems], indent=2)
    if format == "github":
        # A workflow command's message ends at a newline, and `%` starts an escape.
        def esc(s: str) -> str:
            return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
        return "\n".join(f"::error file={esc(p.file)},line={p.line},col={p.col}::{esc(p.message)}"
                         for p in problems)
    return "\n".join(map(str, problems))


def command(
    paths: List[str] = typer.Argument(..., help="spec files or folders of them, or specs' names (iron-spec list)"),
    format: str = typer.Option("text", "--format", help="text | json | github"),
    config: Optional[Path] = typer.Option(None, "--config", help="a checkpoint's config.json: "
                                          "also report every key of it the spec neither maps "
                                          "nor ignores"),
) -> None:
    """Check specs: schema, then what the schema cannot see. Exit 0 clean, 1 problems found
    or a path or --config refused."""
    if format not in FORMATS:
        raise typer.BadParameter(f"{format!r} is not one of {', '.join(FORMATS)}",
                                 param_hint="--format")
    if "" in paths:  # Path("") is the working folder: never what an empty $VAR meant
        raise typer.BadParameter("'' is no spec file, folder or name", param_hint="PATHS")
    paths = [Path(p) for p in paths]
    try:
        # A spec's name (llama3), as every other command takes it, from any folder: a bare
        # word that is no file here (a path keeps lint's "no such file or folder").
        paths = [find(str(p)) if len(p.parts) == 1 and not p.suffix and not p.exists()
                 and not p.is_symlink() else p for p in paths]
        problems, files = lint_paths(paths, None if config is None else ConfigFile.read(config))
    except (FileNotFoundError, ValueError, OSError) as e:
        typer.echo(message(e), err=True)
        raise typer.Exit(1)
    out = render(problems, format)
    if out:
        typer.echo(out)
    if format == "text":
        typer.echo(f"{len(files)} spec{'s' * (len(files) != 1)}, {len(problems)} "
                   f"problem{'s' * (len(problems) != 1)}", err=True)
    raise typer.Exit(1 if problems else 0)
