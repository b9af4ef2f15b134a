"""Linting specs: every problem of every spec, each at its line and column.

A spec is checked in three passes, every problem of each kept: the schema (``schema``); the
rules the schema cannot see (``rules``: expressions naming no field, config fields that
cannot resolve, options a kind does not take, duplicate architectures, and with ``--config``
the keys of a config.json nothing maps); then the spec expanded and its model built on its
toy config (and on ``--config``'s), which checks option values and renames.

Not for: the rules themselves (``rules``), the command and its output formats
(``iron_spec.cli.lint``), showing a model (``iron_spec.cli.show``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from iron_spec.runtime.checks import Result
from iron_spec.runtime.files import read_object
from iron_spec.runtime.values import architectures

from . import parts, rules
from .errors import SpecError
from .loader import Spec, load_spec
from .schema import validate

@dataclass
class ConfigFile:
    """A checkpoint's config.json given to ``--config``: where it is, and what it holds."""

    path: str
    data: dict

    @classmethod
    def read(cls, path: Path) -> "ConfigFile":
        """A config.json, or a checkpoint directory holding one.

        Raises FileNotFoundError (no file) or ValueError (not a JSON object)."""
        if path.is_dir():
            path = path / "config.json"
        data = read_object(path, what="config.json")
        architectures(data, str(path))
        return cls(str(path), data)


def spec_files(paths: Iterable[Path]) -> list[Path]:
    """The ``.yaml``/``.yml`` files of ``paths`` (folders searched, sorted).

    Raises FileNotFoundError naming a path that does not exist.
    """
    files = []
    for p in map(Path, paths):
        if p.is_dir():
            # A folder named x.yaml is no spec; a FIFO or device so named is listed, and
            # load_spec refuses it as that file's problem.
            files += sorted(q for q in p.rglob("*") if q.suffix in (".yaml", ".yml")
                            and not q.is_dir())
        elif p.exists():
            files.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such file or folder")
    return files


def _merge(problems: list[SpecError], more: list[SpecError]) -> None:
    """Add ``more``, less any on a line already reported: expanding stops at the first
    problem, which is usually one a rule found already (at its key, where a rule points at
    its value)."""
    lines = {p.line for p in problems}
    problems += [p for p in more if p.line not in lines]


def lint_spec(spec: Spec, config: ConfigFile | None = None) -> list[SpecError]:
    """Every problem of one parsed spec, in file order (``config``: also against it)."""
    problems = validate(spec)
    problems += rules.expressions(spec) + rules.config_fields(spec) + rules.kinds(spec)
    problems += rules.ignored(spec) + rules.spellings(spec) + rules.unread_fields(spec)
    problems += rules.validation(spec) + rules.pattern_options(spec)
    toy = spec.get("toy", "config")
    configs = []
    if isinstance(toy, dict):
        configs.append((toy, "toy.config", ("toy", "config")))
    elif "toy" not in spec.data:
        problems.append(spec.error((), "no toy: section: lint expands a spec on its toy config "
                                       "(and --toy runs it); give a tiny config.json there"))
    part = None
    if config is not None:
        data, path = config.data, config.path
        part = parts.find(spec, data)  # a part of a bigger checkpoint: its own config
        if part is not None:
            try:
                data, path = parts.config_of(spec, part, data, path)
            except SpecError as e:
                problems.append(e)
                data, path = parts.config_of(spec, part, data, path, allow_unread=True)
        configs.append((data, path, ("config",)))
        problems += rules.unmapped(spec, data, path)
        problems += rules.refused(spec, data, path)
        if part is None:
            problems += rules.architecture(spec, data, path)
    names: set[str] = set()
    matrices: set[str] = set()
    for data, source, place in configs:
        found = rules.config_keys(spec, data, source)
        problems += found
        if found:
            continue
        model, stopped = rules.build(spec, data, f"{spec.file} {source}" if source ==
                                     "toy.config" else source, place,
                                     None if place == ("toy", "config") else part)
        _merge(problems, stopped)
        if model is not None:
            names |= {name for name, _ in model.named_params()}
            matrices |= {name for name, p in model.named_params() if len(p.shape) in (2, 3)}
    if isinstance(toy, dict):  # after the builds: a key unread is no reason to hide why
        problems += rules.unmapped(spec, toy, "toy.config") + rules.refused(spec, toy, "toy.config")
    if names:
        problems += rules.renames(spec, names)
        problems += rules.patterns(spec, matrices)
    unique = {(p.line, p.col, p.message): p for p in problems}
    return sorted(unique.values(), key=lambda p: (p.line, p.col, p.message))


def as_check(spec: Spec) -> tuple[list[SpecError], Result]:
    """``lint_spec``'s problems of ``spec`` and a check's verdict on them (``check`` runs the
    very checks ``iron-spec lint`` runs, and a spec lint rejects fails it): its figure the
    count, each problem's ``FILE:LINE:COL: error:`` line for its caller to print."""
    problems = lint_spec(spec)
    n = len(problems)
    figure = f"{n} problem{'s' * (n != 1)}" + (f" (printed above, as iron-spec lint {spec.file} "
                                                "prints them)" if n else "")
    return problems, Result("lint", not problems, figure, {"problems": [str(p) for p in problems]})


def lint_paths(paths: Iterable[Path], config: ConfigFile | None = None
               ) -> tuple[list[SpecError], list[Path]]:
    """Every problem of every spec under ``paths``, and the spec files read.

    Raises FileNotFoundError naming a path that does not exist.
    """
    paths = list(paths)
    files = spec_files(paths)
    if not files:
        raise FileNotFoundError(f"no .yaml or .yml spec under {', '.join(map(str, paths))}")
    problems: list[SpecError] = []
    specs = []
    for f in files:
        try:
            spec = load_spec(f)
        except SpecError as e:
            problems.append(e)
            continue
        except Exception as e:  # whatever one file holds, the others are still reported
            problems.append(SpecError(str(f), 1, 1, f"could not read this spec: {e}"))
            continue
        specs.append(spec)
        try:
            problems += lint_spec(spec, config)
        except Exception as e:  # a spec lint cannot judge is a problem of that spec alone
            problems.append(SpecError(str(f), 1, 1, f"lint could not check this spec: "
                                                    f"{type(e).__name__}: {e}"))
    problems += rules.duplicate_architectures(specs)
    order = {str(f): i for i, f in enumerate(files)}
    problems.sort(key=lambda p: (order.get(p.file, len(order)), p.line, p.col))
    return problems, files
