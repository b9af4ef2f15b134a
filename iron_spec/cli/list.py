"""``iron-spec list``: the specs this project ships (``iron_spec.spec.registry``), one line
each.

Not for: picking a spec for a checkpoint (``iron_spec.spec.registry.find``).
"""

from __future__ import annotations

import typer

from iron_spec.spec.errors import SpecError, message
from iron_spec.spec.registry import entries


def command() -> None:
    """List the specs: name, model kind, the config.json architectures each serves, file."""
    try:
        found = entries()
    except (FileNotFoundError, SpecError) as e:
        typer.echo(message(e), err=True)
        raise typer.Exit(1)
    width = max([len(e.name) for e in found] + [4])
    for e in found:
        typer.echo(f"{e.name:<{width}}  {e.model:<8}  {', '.join(e.architectures):<32}  {e.path}")
