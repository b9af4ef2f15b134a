"""``iron-spec list``: the specs this project ships (``iron_spec.spec.registry``), one line
each.

Not for: picking a spec for a checkpoint (``iron_spec.spec.registry.find``).
"""

from __future__ import annotations

import typer

from iron_spec.spec.errors import SpecError, message
from iron_spec.spec.registry import entries


def command() -> None:
    """List the specs: name, model kind, the config.json architectures each serves, file,
    and the architectures of the bigger checkpoints it reads its model from (parts)."""
    try:
        found = entries()
    except (FileNotFoundError, SpecError) as e:
        typer.echo(message(e), err=True)
        raise typer.Exit(1)
    width = max([len(e.name) for e in found] + [4])
    for e in found:
        own = [a for a in e.architectures if a not in e.parts]
        typer.echo(f"{e.name:<{width}}  {e.model:<8}  {', '.join(own):<32}  {e.path}"
                   + (f"  (as a part of: {', '.join(e.parts)})" if e.parts else ""))
