"""What every ``iron-spec`` command shares: its help as click tools print it (no type noise,
text shown as written, ``-h``), the exit statuses, the refusals it expects (``EXPECTED``),
its log and progress on stderr.

Not the commands themselves (``cli`` and the modules it registers) nor what they compute.
"""

from __future__ import annotations

import logging
import math
import sys
from contextlib import contextmanager
from typing import Callable, Iterator, NoReturn, Optional

import jinja2
import typer
from rich.markup import escape
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from pathlib import Path

from iron_spec.runtime.checkpoint import CheckpointError
from iron_spec.library.progress import LOADING
from iron_spec.spec.build import load_model
from iron_spec.spec.errors import FlagError, SpecError, message, shorten
from iron_spec.spec.registry import entries, find, picked_by, specs_folder

# Exit statuses, one rule for every command (README "Exit status"; each --help's epilog).
DONE, REFUSED, USAGE, NOT_VERIFIED = 0, 1, 2, 3
EXIT_STATUS = ("Exit status: 0 done; 1 the input was refused (a spec, config.json, checkpoint, "
               "tokenizer, golden or text that cannot be used) or a check failed; 2 a usage "
               "error (an unknown option, a missing argument, a flag's value out of its range "
               "or flags that do not go together).")
HELP_OPTIONS = ["-h", "--help"]
# SPEC and --checkpoint, taken the same way by every command that loads a model (run, embed,
# show, check, bench): SPEC the one positional argument, optional; the texts a command reads
# are options (run's --prompt, embed's --text), so no text is ever taken for a spec.
SPEC_HELP = ("a spec's name (iron-spec list) or a spec YAML's path; default: the spec serving "
             "--checkpoint's config.json architectures (a GGUF file's general.architecture), "
             "said on stderr")
CHECKPOINT_METAVAR = "DIR|ID|GGUF"
CHECKPOINT_HELP = ("the checkpoint: a directory (config.json, model.safetensors or a sharded "
                   "model.safetensors.index.json, tokenizer.json), a Hugging Face hub id (its "
                   "cache; HF_HUB_OFFLINE honoured) or a GGUF file (its config, tokenizer and "
                   "tensors read from it)")

# What a command refuses as its input's fault (``refuse``: one line, exit 1; a FlagError
# exit 2), not as a bug (a traceback): an OSError is a path the user gave that the system
# will not open as asked (a name too long for the file system, a folder where a file goes).
EXPECTED = (SpecError, CheckpointError, FileNotFoundError, ValueError, IndexError,
            jinja2.TemplateError, OSError)
log = logging.getLogger("iron_spec")
# The value a flag takes, as click tools name it (``--seed INTEGER``); a switch shows none.
METAVARS = {int: "INTEGER", float: "FLOAT", str: "TEXT"}


def _no_type(ctx) -> None:
    return None


def _text(help: str | None) -> str | None:
    """``help`` as written: paragraphs kept, a docstring's wrapping undone (typer's rich mode
    keeps every newline), and rich markup escaped (it would eat ``[x]``)."""
    if not help:
        return help
    return escape("\n\n".join(" ".join(p.split()) for p in help.split("\n\n")))


def _usage(param: TyperArgument) -> str:
    """An argument in the usage line as click prints it: ``SPEC``, ``[SPEC]``, ``TEXT...``."""
    name = param.metavar
    if param.nargs != 1 and not name.endswith("..."):
        name += "..."
    return name if param.required or name.startswith("[") else f"[{name}]"


class _HelpSwitch:
    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""  # a switch: no <bool>
        return option


class Command(_HelpSwitch, TyperCommand):
    """A command whose help follows click tools' conventions (``tidy``); its usage line
    names arguments as click does (``SPEC``, ``[SPEC]``; typer 0.29 prints ``{spec}``)."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        return pieces + [_usage(p) for p in self.get_params(ctx) if isinstance(p, TyperArgument)]


def tidy(command) -> None:
    """Give ``command``'s help the conventions of click tools, in place: its text shown as
    written (``_text``: typer's markdown mode would eat ``<spec>``, its rich mode ``[x]``),
    each option's value named in capitals (``--seed INTEGER``) and a switch with none (typer
    prints ``<bool>``, ``<int range>``), arguments by their capitalised names, and the exit
    statuses (``EXIT_STATUS``) as the epilog unless the command gives its own."""
    if getattr(command, "_tidy", False):
        return
    command._tidy = True
    command.help = _text(command.help)
    command.short_help = _text(command.short_help)
    command.epilog = _text(command.epilog or EXIT_STATUS)
    for param in getattr(command, "params", ()):
        param.help = _text(param.help)
        if isinstance(param, TyperArgument):
            param.metavar = param.metavar or param.name.upper()
            param.display_type_rich = _no_type  # the name column says it
        elif isinstance(param, TyperOption) and param.metavar is None:
            desc = param.type_descriptor
            param.metavar = "" if param.is_flag else "PATH" if desc.is_path else \
                METAVARS.get(desc.annotation, "VALUE")
            # A range or the choices a callback (number, whole, choice) holds the value to,
            # shown as click's FloatRange, IntRange and Choice show theirs.
            check = getattr(param.callback, "__wrapped__", param.callback)
            if getattr(check, "range", None):
                param.metavar = f"{param.metavar} {check.range}"
            elif getattr(check, "choices", None):
                param.metavar = check.choices


class Group(_HelpSwitch, TyperGroup):
    """The ``iron-spec`` group: every command it holds follows ``tidy``'s conventions (its
    usage line too where it is registered with ``cls=Command``)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        tidy(self)
        for command in self.commands.values():
            tidy(command)


class UsageError(typer.BadParameter):
    """A command line that cannot run as written (exit 2, after the usage line and ``Try
    -h``), said as it is: a flag missing or flags that do not go together. (typer exports
    no UsageError of its own; BadParameter is one, prefixed "Invalid value".)"""

    def format_message(self) -> str:
        return shorten(self.message)


def refuse(e: Exception) -> NoReturn:
    """End a command on ``e``, a refusal it expects: a FlagError as a usage error (exit 2),
    anything else as its one line (``errors.message``) and exit 1."""
    if isinstance(e, FlagError):
        raise UsageError(str(e)) from None
    typer.echo(message(e), err=True)
    raise typer.Exit(REFUSED)


class _Stderr(logging.Handler):
    """Log lines to whatever ``sys.stderr`` is when they are emitted, so a progress display
    that redirects it prints them above itself instead of through its bar."""

    def emit(self, record: logging.LogRecord) -> None:
        print(shorten(self.format(record)), file=sys.stderr)


@contextmanager
def log_to_stderr() -> Iterator[None]:
    """The ``iron_spec`` logger's INFO lines (the context fitted, the KV cache reserved) on
    stderr for the ``with`` block; the handler and the level are put back as they were when
    it ends, so a command run twice in one process (tests' CliRunner) prints each line once
    and a later caller's logging is not the command's."""
    if any(isinstance(h, _Stderr) for h in log.handlers):  # an outer block prints already
        yield
        return
    handler, level = _Stderr(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def version(value: bool) -> None:
    """``--version``: the installed package's version (importlib.metadata), then exit 0."""
    if value:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as installed
        try:
            typer.echo(f"iron-spec {installed('iron-spec')}")
        except PackageNotFoundError:  # a source tree on sys.path, never installed
            typer.echo("iron-spec (not installed: no version)")
        raise typer.Exit(DONE)


def number(low: Optional[float] = None, high: Optional[float] = None, *,
           low_open: bool = False) -> Callable:
    """A typer option callback refusing, as a usage error (exit 2), a value that is not a
    finite number within ``low``..``high`` (``low`` itself excluded with ``low_open``);
    None (the flag not given) passes."""
    def check(value):
        if value is None:
            return value
        bad = not math.isfinite(value) or (low is not None and (value <= low if low_open
                                                                 else value < low)) \
            or (high is not None and value > high)
        if bad:
            lo = "" if low is None else f"{'>' if low_open else '>='} {low:g}"
            hi = "" if high is None else f"<= {high:g}"
            raise typer.BadParameter(f"{value} is not a finite number "
                                     f"{' and '.join(s for s in (lo, hi) if s)}".rstrip())
        return value
    # As click's FloatRange shows its range: [x>=0], [x>0], [0<x<=1], [x<=1]; none: None.
    above = f"{'>' if low_open else '>='}{low:g}" if low is not None else ""
    check.range = (f"[{low:g}{'<' if low_open else '<='}x<={high:g}]" if low is not None and
                   high is not None else f"[x{above}]" if above else
                   f"[x<={high:g}]" if high is not None else None)
    return check


def whole(low: int, high: int, what: str) -> Callable:
    """A typer option callback refusing, as a usage error (exit 2) before anything loads, a
    whole number outside ``low``..``high``, naming that range and ``what`` the flag is;
    None (the flag not given) passes."""
    def check(value):
        if value is not None and not low <= value <= high:
            raise typer.BadParameter(f"{value} is not within {low}..{high} ({what})")
        return value
    check.range = f"[{low}<=x<={high}]"  # as click's IntRange shows its range
    return check


def choice(valid: tuple[str, ...], several: bool = False) -> Callable:
    """A typer option callback refusing, as a usage error (exit 2) before anything loads, a
    value that is none of ``valid`` (each valid one named); with ``several``, a
    comma-separated list of them, each at most once."""
    def check(value):
        if value is None:
            return value
        values = [v.strip() for v in (value.split(",") if several else [value])]
        for v in values:
            if v not in valid:
                raise typer.BadParameter(f"{v!r} is not one of {', '.join(valid)}"
                                         + (" (several: comma-separated)" if several else ""))
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:  # measured twice in one run, the second side would overwrite the first
            raise typer.BadParameter(f"{', '.join(map(repr, twice))} given twice; each of "
                                     f"{', '.join(valid)} at most once")
        # As checked: " int8" is int8 (it reached the loader unstripped, a KeyError).
        return ",".join(values)
    check.choices = f"[{'|'.join(valid)}]" + (",..." if several else "")  # as click's Choice
    return check


class Stages:
    """Progress on stderr for steps that take seconds: on a terminal one rich bar (the stage,
    its count where known, elapsed time), rewritten in place and gone when done; elsewhere
    (a pipe, a file, a test) one plain line per stage as it starts, so a log shows where the
    time went and a bar never garbles it."""

    def __init__(self, bar):
        self._bar, self._task = bar, None

    def stage(self, description: str, total: Optional[int] = None) -> Callable[[int, int], None]:
        """Start a stage; returns ``advance(done, total)`` for its count (a no-op when piped)."""
        if self._bar is None:
            print(f"[{description}]", file=sys.stderr, flush=True)
            return lambda done, total: None
        if self._task is not None:  # a fresh task: its count and elapsed time start anew
            self._bar.remove_task(self._task)
        self._task = self._bar.add_task(description, total=total)

        def advance(done: int, total: int) -> None:
            self._bar.update(self._task, completed=done, total=total)
        return advance

    def weights(self) -> "_Weights":
        """The ``loading weights`` stage for a loader's ``progress(done, total)``, started
        only at its first tensor read, so a refusal before any weight is read (no
        checkpoint, a spec's or config.json's error) is not preceded by it; its ``ended()``
        when the load returns says it where none was read (weights drawn report no count)."""
        return _Weights(self)

    def reporter(self) -> Callable[[str, int, int], None]:
        """A library load's ``progress(stage, done, total)`` (``iron_spec.library.progress``)
        shown here: each stage it names started as it first reports, the weights' once a
        tensor is read or drawn (``weights``), not at the 0 of 1 the load starts with."""
        current: dict = {}

        def report(stage: str, done: int, total: int) -> None:
            if stage == LOADING and done == 0 and current.get("stage") != stage:
                return  # said at its first tensor: a refusal before one is not preceded by it
            if current.get("stage") != stage:
                current["stage"], current["advance"] = stage, self.stage(stage, total)
            current["advance"](done, total)
        return report


class _Weights:
    """``Stages.weights``: ``(done, total)`` calls shown from the first with ``done`` > 0."""

    def __init__(self, stages: Stages):
        self._stages, self._advance = stages, None

    def __call__(self, done: int, total: int) -> None:
        if self._advance is None:
            if done == 0:
                return
            self._advance = self._stages.stage(LOADING, total)
        self._advance(done, total)

    def ended(self) -> None:
        if self._advance is None:  # drawn, not read: said once drawn
            self(1, 1)


def load_compiled(stages: Stages, spec, **kwargs):
    """``build.load_model(spec, **kwargs)`` with its progress on ``stages``: the weights as
    they load (tensors read of all), then the decode step and the prompt chunk compiled, each
    a stage (a SmolLM2 load takes seconds, each compile about one).

    Raises:
        what ``load_model`` raises.
    """
    read = stages.weights()
    loaded = load_model(spec, progress=read, **kwargs)
    read.ended()
    for prompt, what in ((False, "compiling the decode step"), (True, "compiling the prompt chunk")):
        stages.stage(what)
        loaded.lm.version(prompt)
    return loaded


@contextmanager
def stages(terminal: Optional[bool] = None) -> Iterator[Stages]:
    """A ``Stages`` on stderr for the ``with`` block; ``terminal`` (default: whether stderr
    is one) chooses the bar or the plain lines."""
    if terminal is None:
        terminal = sys.stderr.isatty()
    if not terminal:
        yield Stages(None)
        return
    from rich.console import Console
    from rich.progress import (BarColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn,
                               TimeElapsedColumn)
    from rich.text import Text

    class Count(ProgressColumn):
        """``done/total`` where the stage counts (tensors read), else nothing (rich's
        MofNCompleteColumn prints ``0/?``)."""

        def render(self, task):
            return Text("" if task.total is None else f"{task.completed:.0f}/{task.total:.0f}")

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), Count(),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        yield Stages(bar)


def pick_spec(spec: Optional[str], checkpoint: Optional[str],
              text_flag: Optional[str] = None) -> Path:
    """The spec file ``spec`` names (``registry.find``: a name or a path), or where none is
    named the one serving ``checkpoint``'s config.json architectures (a GGUF file's
    ``general.architecture``), which is then said on stderr: a user sees which spec runs.

    ``text_flag``: the option a command takes its texts by (``--prompt``), named where
    ``spec`` is no spec and could be a text meant for it.

    Raises:
        FlagError: neither a spec nor a checkpoint.
        FileNotFoundError: no such spec (the valid names listed, and ``text_flag``).
        ValueError: no spec serves the checkpoint.
    """
    if spec is None:
        if checkpoint is None:
            raise FlagError("name a SPEC (iron-spec list shows them), or give --checkpoint "
                            "to pick one from its config.json architectures")
        path = find(None, checkpoint)
        source = picked_by(checkpoint, path)
        typer.echo(f"[spec {path.stem}: {path}, picked by --checkpoint's {source}]", err=True)
        return path
    try:
        return find(spec)
    except FileNotFoundError:
        path = Path(spec)
        texty = any(c.isspace() for c in spec)
        if not texty and (path.suffix in (".yaml", ".yml") or len(path.parts) != 1):
            raise  # a spec file's path: find's "no such spec file"
        # A name that is none (a typo, or a text meant for text_flag): the closest names,
        # not every spec's (a 1,300-character line).
        import difflib
        names = sorted({e.path.stem for e in entries()} | {e.name for e in entries()})
        close = difflib.get_close_matches(spec.lower(), names, n=3)
        raise FileNotFoundError(
            f"SPEC {spec!r} is no spec name or path"
            + (f"; did you mean {close[0]}?" + (f" (or {', '.join(close[1:])})"
                                                if close[1:] else "") if close else "")
            + (f"; a text is given with {text_flag}" if text_flag is not None and
               (texty or not close) else "")
            + f"; iron-spec list shows them all (the specs in {specs_folder()}; "
            "IRON_SPEC_SPECS names another folder)") from None

