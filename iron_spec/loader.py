"""Reading a spec file: safe YAML only, bounded in size and alias expansion, every node's
place kept so an error can name its line and column.

Not for: what the spec means (``schema``, ``config``, ``interpreter``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import SpecError

MAX_BYTES = 2**20  # a spec is a page of YAML; anything larger is refused unread
MAX_NODES = 100_000  # nodes after alias expansion: a billion-laughs file stops here

Path_ = tuple  # a node's place: the keys and indices leading to it


@dataclass
class Spec:
    """A parsed spec: ``data`` (plain dicts, lists and scalars) and ``marks``, each node's
    (line, col), 1-based, by its path of keys and indices."""

    file: str
    data: Any
    marks: dict[Path_, tuple[int, int]] = field(default_factory=dict)

    def mark(self, path: Path_) -> tuple[int, int]:
        """The place of ``path``, or of its nearest ancestor that has one."""
        path = tuple(path)
        while path and path not in self.marks:
            path = path[:-1]
        return self.marks.get(path, (1, 1))

    def error(self, path: Path_, message: str) -> SpecError:
        line, col = self.mark(path)
        return SpecError(self.file, line, col, message)

    def get(self, *path: Any, default: Any = None) -> Any:
        node = self.data
        for key in path:
            if isinstance(node, dict) and key in node:
                node = node[key]
            elif isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
                node = node[key]
            else:
                return default
        return node


def load_spec(path: str | Path) -> Spec:
    """Read and parse the spec at ``path``.

    Raises:
        FileNotFoundError: no file at ``path``.
        SpecError: larger than 1 MiB, not UTF-8, not YAML (a tab in the indentation, a bad
            token), empty, more than one document, aliases expanding past ``MAX_NODES``
            nodes, a duplicate key, or a top level that is not a mapping.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such spec file")
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise SpecError(str(path), 1, 1, f"{size} bytes is larger than a spec may be ({MAX_BYTES})")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(str(path), 1, 1, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    return parse_spec(text, str(path))


def parse_spec(text: str, file: str = "<spec>") -> Spec:
    """``load_spec`` on ``text`` already read; ``file`` names it in errors."""
    try:
        docs = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        problem = e.problem or str(e)
        if "\t" in text.splitlines()[line - 1][:col] if line - 1 < len(text.splitlines()) else False:
            problem += " (a tab: YAML indents with spaces only)"
        raise SpecError(file, line, col, f"not valid YAML: {problem}") from None
    except yaml.YAMLError as e:
        raise SpecError(file, 1, 1, f"not valid YAML: {e}") from None
    if not docs or docs[0] is None:
        raise SpecError(file, 1, 1, "the file is empty; a spec is a mapping starting with `spec: 1`")
    if len(docs) > 1:
        m = docs[1].start_mark
        raise SpecError(file, m.line + 1, m.column + 1, "a spec is one YAML document, not several")
    spec = Spec(file, None)
    budget = [MAX_NODES]
    spec.data = _construct(docs[0], (), spec, budget)
    if not isinstance(spec.data, dict):
        kind = type(spec.data).__name__
        raise spec.error((), f"a spec is a mapping of keys (spec, name, architectures, ...), "
                             f"not a {'list' if kind == 'list' else kind}")
    return spec


_scalars = yaml.SafeLoader("")


def _construct(node: yaml.Node, path: Path_, spec: Spec, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise SpecError(spec.file, node.start_mark.line + 1, node.start_mark.column + 1,
                        f"the document expands to more than {MAX_NODES} nodes (aliases "
                        "repeated into a bomb?)")
    spec.marks.setdefault(path, (node.start_mark.line + 1, node.start_mark.column + 1))
    if isinstance(node, yaml.MappingNode):
        out: dict = {}
        _scalars.flatten_mapping(node)
        for key_node, value_node in node.value:
            key = _construct(key_node, path, spec, budget)
            if not isinstance(key, (str, int, float, bool)) or key is None:
                raise SpecError(spec.file, key_node.start_mark.line + 1,
                                key_node.start_mark.column + 1, "a key must be a plain scalar")
            if key in out:
                raise SpecError(spec.file, key_node.start_mark.line + 1,
                                key_node.start_mark.column + 1, f"duplicate key {key!r}")
            spec.marks[path + (key,)] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            out[key] = _construct(value_node, path + (key,), spec, budget)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(n, path + (i,), spec, budget) for i, n in enumerate(node.value)]
    return _scalars.construct_object(node, deep=True)
