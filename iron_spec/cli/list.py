"""``iron-spec list``: the specs this project ships (``iron_spec.spec.registry``), one line
each, or as the README's table of what is supported (``--markdown``).

Not for: picking a spec for a checkpoint (``iron_spec.spec.registry.find``).
"""

from __future__ import annotations

from pathlib import Path

import typer

from iron_spec.spec.errors import message, shorten
from iron_spec.spec.registry import Entry, entries

#: The tables ``--markdown`` prints, by a spec's ``model``: its title and what a user does.
KINDS = {"causal": "Text generation (`model: causal`: `iron-spec run`, `model.generate`)",
         "encoder": "Embeddings (`model: encoder`: `iron-spec embed`, `model.embed`)"}


def command(markdown: bool = typer.Option(False, "--markdown",
                                          help="Markdown tables of what is supported, one per "
                                               "kind of model: each spec, the config.json "
                                               "architectures it serves (alone, and as a part of "
                                               "a bigger checkpoint) and the GGUF files it reads "
                                               "(the README's, which tests/test_readme.py keeps "
                                               "current)")) -> None:
    """List the specs: name, model kind, the config.json architectures each serves, file,
    and the architectures of the bigger checkpoints it reads its model from (parts). A file
    of the folder that is no spec is skipped, a warning on stderr naming it and why."""
    skipped: list[tuple[Path, str]] = []
    try:
        found = entries(skipped=skipped)
    except FileNotFoundError as e:
        typer.echo(message(e), err=True)
        raise typer.Exit(1)
    for path, why in skipped:
        typer.echo(f"warning: {path} is skipped, no spec: {shorten(why, 300)} (iron-spec lint "
                   f"{path} says all)", err=True)
    if markdown:
        typer.echo(tables(found), nl=False)
        return
    width = max([len(e.name) for e in found] + [4])
    for e in found:
        own = [a for a in e.architectures if a not in e.parts]
        typer.echo(f"{e.name:<{width}}  {e.model:<8}  {', '.join(own):<32}  {e.path}"
                   + (f"  (as a part of: {', '.join(e.parts)})" if e.parts else ""))


def tables(found: list[Entry]) -> str:
    """``found`` as Markdown: a table per kind of model (``KINDS``), a row per spec."""
    out = []
    for kind, title in KINDS.items():
        rows = [e for e in found if e.model == kind]
        out += [f"{title}: {len(rows)} specs", "",
                "| spec | serves (config.json `architectures`) | and as a part of | GGUF files of |",
                "|---|---|---|---|"]
        out += [f"| `{e.name}` | {', '.join(a for a in e.architectures if a not in e.parts) or '-'} "
                f"| {', '.join(e.parts) or '-'} | {e.gguf or '-'} |" for e in rows]
        out.append("")
    other = sorted({e.model for e in found} - set(KINDS))
    for kind in other:  # a kind a later spec brings: listed, never dropped
        out += [f"`model: {kind}`: " + ", ".join(f"`{e.name}`" for e in found
                                                if e.model == kind), ""]
    return "\n".join(out)
