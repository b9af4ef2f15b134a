"""The layers of the package, and imports pointing one way through them.

    iron_spec          the public names (``iron_spec.load``), loaded on first use
    iron_spec.cli      the commands: the typer app and one module per command
    iron_spec.library  what a Python user drives: ``load`` -> Model, embeddings, goldens
    iron_spec.spec     reading and expanding specs, and building a model from one
    iron_spec.runtime  modules, compile, sessions, generation, checkpoints (runtime/)
    iron_spec.operators  one module per operator family (operators/)

A module imports only from its own layer or the layers below it, and no two modules import
each other, directly or round a circle. Every import counts: at module level, inside a
function (an import moved into a function to dodge a circle is still the circle) and under
``TYPE_CHECKING``. Importing a submodule runs its package's ``__init__``; that edge is not
counted, so the layers' own ``__init__`` import nothing of the project (checked here) and
the three that do (``iron_spec``, ``iron_spec.runtime``, ``iron_spec.operators``) import
only downward.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Folder -> the package it installs as (pyproject.toml's package-dir).
FOLDERS = {"iron_spec": "iron_spec", "runtime": "iron_spec.runtime",
           "operators": "iron_spec.operators"}
# Lowest first: a module may import from its own layer and any before it.
LAYERS = ("iron_spec.operators", "iron_spec.runtime", "iron_spec.spec", "iron_spec.library",
          "iron_spec.cli", "iron_spec")
# Package inits that hold code of their own (the rest are a docstring).
INITS_WITH_IMPORTS = {"iron_spec", "iron_spec.runtime", "iron_spec.operators"}


def modules(root: Path = ROOT) -> dict[str, tuple[Path, bool]]:
    """Every module of the package: dotted name -> (file, is a package); a compiled
    extension (``operators/_cpu.c``) by its source."""
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((root / folder).rglob("*.py")) + sorted((root / folder).rglob("*.c")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            init = parts[-1] == "__init__"
            name = ".".join([package] + (parts[:-1] if init else parts))
            found.setdefault(name, (path, init))
    return found


def imports(name: str, path: Path, init: bool, known: dict) -> list[tuple[str, int]]:
    """The project modules ``name`` imports, each with the line: every ``import`` and
    ``from ... import`` in the file, wherever it stands."""
    if path.suffix != ".py":
        return []
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) - (node.level - (1 if init else 0))]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            # ``from pkg import sub`` imports the submodule; ``from pkg import name`` the pkg.
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module
                       for a in node.names]
        for target in targets:
            parts = target.split(".")
            while parts and ".".join(parts) not in known:
                parts.pop()  # iron_spec.operators.native.threads -> the module it is in
            if parts and ".".join(parts) != name:
                out.append((".".join(parts), node.lineno))
    return out


def graph(root: Path = ROOT) -> dict[str, list[tuple[str, int]]]:
    known = modules(root)
    return {name: imports(name, path, init, known) for name, (path, init) in known.items()}


def layer(name: str) -> int | None:
    """The index in ``LAYERS`` of the layer ``name`` is in (None: in none)."""
    for i, prefix in reversed(list(enumerate(LAYERS))):
        if name == prefix or (prefix != "iron_spec" and name.startswith(prefix + ".")):
            return i
    return None


def cycles(edges: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """The import circles: each strongly connected set of two or more modules (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w, _ in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def where(name: str, known: dict) -> str:
    return str(known[name][0].relative_to(ROOT))


def test_no_import_circles():
    edges, known = graph(), modules()
    found = [" <-> ".join(group) + ": " + "; ".join(
        f"{where(a, known)}:{line} imports {b}" for a in group for b, line in edges[a] if b in group)
        for group in cycles(edges)]
    assert not found, "import circles:\n" + "\n".join(found)


def test_every_module_is_in_a_layer():
    outside = [where(m, modules()) for m in graph() if layer(m) is None]
    assert not outside, f"in no layer (put each in one of {', '.join(LAYERS[:-1])}): {outside}"


def test_imports_point_down_the_layers():
    known = modules()
    against = [f"{where(a, known)}:{line} ({LAYERS[layer(a)]}) imports {b} ({LAYERS[layer(b)]})"
               for a, targets in graph().items() if layer(a) is not None
               for b, line in targets if layer(b) is not None and layer(b) > layer(a)]
    assert not against, "imports against the layers " + " -> ".join(reversed(LAYERS)) + \
        ":\n" + "\n".join(against)


def test_the_layers_packages_import_nothing_of_the_project():
    known = modules()
    loud = [f"{where(m, known)} imports {', '.join(sorted({b for b, _ in targets}))}"
            for m, targets in graph().items()
            if known[m][1] and m not in INITS_WITH_IMPORTS and targets]
    assert not loud, loud


@pytest.mark.parametrize("tree, problem", [
    ({"a": "from . import b", "b": "def f():\n    from . import a"}, "circle"),
    ({"a": "", "b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import x",
      "c": "from .b import y"}, "circle"),
])
def test_a_circle_is_found_wherever_its_imports_stand(tmp_path, tree, problem):
    # The check itself, on a tree made for it: a circle closed by a function-level import or
    # one under TYPE_CHECKING is found as surely as one at module level.
    folder = tmp_path / "iron_spec" / "spec"
    folder.mkdir(parents=True)
    (folder.parent / "__init__.py").write_text("")
    (folder / "__init__.py").write_text("")
    for name, text in tree.items():
        (folder / f"{name}.py").write_text(text + "\n")
    assert cycles(graph(tmp_path)), tree


def test_an_import_up_the_layers_is_found(tmp_path):
    for folder, text in (("runtime", "from iron_spec.spec import loader\n"),
                         ("iron_spec/spec", "")):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "__init__.py").write_text("")
        (tmp_path / folder / "loader.py").write_text(text)
    edges = graph(tmp_path)
    assert ("iron_spec.spec.loader", 1) in edges["iron_spec.runtime.loader"]
    assert layer("iron_spec.spec.loader") > layer("iron_spec.runtime.loader")
