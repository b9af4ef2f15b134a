"""The ``iron-spec`` command line (typer): run a spec, lint specs, print the schema."""

from __future__ import annotations

import typer

from iron_spec.spec.schema import SCHEMA_PATH

from .command import HELP_OPTIONS, Command, Group, version

app = typer.Typer(cls=Group, add_completion=False, no_args_is_help=True,
                  rich_markup_mode="rich", context_settings={"help_option_names": HELP_OPTIONS},
                  help="Declarative YAML specs for language models: lint, show, check, run, "
                       "embed (fill-mask, classify), bench and serve them, on a checkpoint "
                       "as published (a Hugging Face folder or hub id, or a GGUF file).")


@app.callback()
def _app(show_version: bool = typer.Option(False, "--version", is_eager=True, callback=version,
                                           help="print the version and exit")) -> None:
    pass


from . import run as _run  # noqa: E402

app.command("run", cls=Command)(_run.command)


@app.command(cls=Command)
def schema() -> None:
    """Print the spec JSON Schema."""
    typer.echo(SCHEMA_PATH.read_text())


# Commands that live in their own modules, registered here (one line each).
from . import lint as _lint  # noqa: E402  (after app: the modules import nothing from here)

app.command("lint", cls=Command)(_lint.command)
from . import show as _show  # noqa: E402
app.command("show", cls=Command)(_show.command)
from . import check as _check  # noqa: E402

app.command("check", cls=Command, epilog=_check.EXIT_STATUS)(_check.command)
from . import bench as _bench  # noqa: E402

app.command("bench", cls=Command)(_bench.command)
from . import embed as _embed  # noqa: E402

app.command("embed", cls=Command)(_embed.command)
from . import tasks as _tasks  # noqa: E402

app.command("fill-mask", cls=Command)(_tasks.fill_mask_command)
app.command("classify", cls=Command)(_tasks.classify_command)
from . import list as _list  # noqa: E402

app.command("list", cls=Command)(_list.command)
from . import serve as _serve  # noqa: E402

app.command("serve", cls=Command)(_serve.command)
