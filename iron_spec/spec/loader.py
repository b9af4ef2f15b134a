"""Reading a spec file: safe YAML only, bounded in size, nesting and alias expansion, every
node's place kept so an error can name its line and column.

Not for: what the spec means (``schema``, ``config``, ``interpreter``, ``rules``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from iron_spec.runtime.files import FileError, read_bytes, regular

from .errors import SpecError

# A spec is a page of YAML (the largest in specs/ is 8 KB); anything larger is refused unread.
# At 1 MiB pure-Python YAML alone took 3 s and lint 9 s; at this bound lint takes under 2 s.
MAX_BYTES = 2**18
MAX_NODES = 100_000  # nodes after alias expansion: a billion-laughs file stops here
MAX_DEPTH = 64  # nesting; a spec needs under ten, a self-referencing alias never ends

Path_ = tuple  # a node's place: the keys and indices leading to it
PATTERN_OPTIONS = ("layer", "pattern", "options")  # the one mapping whose keys may be numbers


@dataclass
class Spec:
    """A parsed spec: ``data`` (plain dicts, lists and scalars) and, by each node's path of
    keys and indices, its place (line, col), 1-based: ``marks`` holds a mapping entry's key
    (or a list item, or the top level), ``values`` the value node itself."""

    file: str
    data: Any
    marks: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    values: dict[Path_, tuple[int, int]] = field(default_factory=dict)

    def mark(self, path: Path_, value: bool = False) -> tuple[int, int]:
        """The place of ``path`` (its value node with ``value``), or of its nearest ancestor
        that has one."""
        path = tuple(path)
        if value and path in self.values:
            return self.values[path]
        while path and path not in self.marks:
            path = path[:-1]
        return self.marks.get(path, (1, 1))

    def error(self, path: Path_, message: str, value: bool = False) -> SpecError:
        """A SpecError at ``path``'s key (at its value node with ``value``)."""
        line, col = self.mark(path, value)
        error = SpecError(self.file, line, col, message)
        error.path = tuple(path)
        return error

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
        SpecError: larger than ``MAX_BYTES``, not UTF-8, or anything ``parse_spec`` refuses.
    """
    path = Path(path)
    try:
        regular(path, "spec file")
    except FileError as e:
        raise SpecError(str(path), 1, 1, str(e).removeprefix(f"{path}: ")) from None
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise SpecError(str(path), 1, 1, f"{size} bytes is larger than a spec may be "
                                         f"({MAX_BYTES} bytes, 256 KiB)")
    try:
        text = read_bytes(path, MAX_BYTES, "spec file").decode("utf-8")
    except FileError as e:
        raise SpecError(str(path), 1, 1, str(e).removeprefix(f"{path}: ")) from None
    except UnicodeDecodeError as e:
        raise SpecError(str(path), 1, 1, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    return parse_spec(text, str(path))


def parse_spec(text: str, file: str = "<spec>") -> Spec:
    """``load_spec`` on ``text`` already read; ``file`` names it in errors.

    Raises:
        SpecError: longer than ``MAX_BYTES``, not YAML (a tab in the indentation, a bad
            token), empty, more than one document, nested deeper than ``MAX_DEPTH``, aliases
            expanding past ``MAX_NODES`` nodes, a key that is not text or is repeated, or a
            top level that is not a mapping.
    """
    if len(text) > MAX_BYTES:
        raise SpecError(file, 1, 1, f"{len(text)} characters is larger than a spec may be "
                                    f"({MAX_BYTES} bytes, 256 KiB)")
    try:
        docs = list(yaml.compose_all(text, Loader=_COMPOSER))
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        problem = e.problem or str(e)
        if "nesting depth" in problem:  # libyaml's own bound (1000 levels)
            raise SpecError(file, line, col, f"nested too deeply (a spec nests under "
                                             f"{MAX_DEPTH} levels)") from None
        lines = text.splitlines()
        if line - 1 < len(lines) and "\t" in lines[line - 1][:col]:
            problem += " (a tab: YAML indents with spaces only)"
        start = e.context_mark
        if e.problem_mark is not None and start is not None and e.context and \
                start.line != e.problem_mark.line:
            # An unclosed bracket is found where the text stops making sense, lines after
            # it: say where it opened (PyYAML's context, "while parsing a flow mapping").
            problem += (f" ({e.context.removeprefix('while parsing ')} opened at line "
                        f"{start.line + 1}, column {start.column + 1})")
        raise SpecError(file, line, col, f"not valid YAML: {problem}") from None
    except yaml.YAMLError as e:
        raise SpecError(file, 1, 1, f"not valid YAML: {e}") from None
    except RecursionError:
        raise SpecError(file, 1, 1, f"nested too deeply (a spec nests under {MAX_DEPTH} "
                                    "levels)") from None
    if not docs or docs[0] is None:
        raise SpecError(file, 1, 1, "the file is empty; a spec is a mapping starting with `spec: 1`")
    if len(docs) > 1:
        m = docs[1].start_mark
        raise SpecError(file, m.line + 1, m.column + 1, "a spec is one YAML document, not several")
    spec = Spec(file, None)
    spec.data = _Builder(spec, aliases="*" in text).build(docs[0], ())
    if not isinstance(spec.data, dict):
        kind = {list: "a list", str: "text", int: "a number", float: "a number",
                bool: "a boolean"}.get(type(spec.data), type(spec.data).__name__)
        raise spec.error((), f"a spec is a mapping of keys (spec, name, architectures, ...), "
                             f"not {kind}")
    return spec


# libyaml composes 5x faster than pure Python where PyYAML was built with it (a 200 KB flow
# list: 1.6 s against 8 s); the nodes, marks and errors are the same.
_COMPOSER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_scalars = yaml.SafeLoader("")
_PLAIN = ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")


def _at(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


class _Builder:
    """Plain data from a composed YAML tree, counting every node it builds (an alias is
    built again at each use, so a bomb spends the budget) and recording places."""

    def __init__(self, spec: Spec, aliases: bool = True):
        self.spec, self.budget, self.aliases = spec, MAX_NODES, aliases

    def refuse(self, node: yaml.Node, message: str) -> SpecError:
        return SpecError(self.spec.file, *_at(node), message)

    def build(self, node: yaml.Node, path: Path_) -> Any:
        self.budget -= 1
        if self.budget < 0:
            line, col = self.spec.marks.get(path[:1], _at(node))
            raise SpecError(self.spec.file, line, col,
                            f"the document expands to more than {MAX_NODES} nodes at "
                            f"{path[0] if path else 'the top level'!r}"
                            + (" (aliases repeated into a bomb?)" if self.aliases else
                               " (a spec holds a few hundred)"))
        if len(path) > MAX_DEPTH:
            raise self.refuse(node, f"nested deeper than {MAX_DEPTH} levels (an alias that "
                                    "contains itself?)")
        self.spec.marks.setdefault(path, _at(node))
        self.spec.values.setdefault(path, _at(node))
        if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)) and node.tag not in _PLAIN:
            raise self.refuse(node, f"tag {node.tag!r} is not allowed: a spec is plain "
                                    "mappings, lists and scalars (safe YAML)")
        if isinstance(node, yaml.MappingNode):
            return self.mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(n, path + (i,)) for i, n in enumerate(node.value)]
        return self.scalar(node)

    def scalar(self, node: yaml.ScalarNode) -> Any:
        """A scalar as safe YAML reads it; a tag safe YAML has no constructor for, or a
        value its resolver claims but cannot build (``2024-13-45`` resolves as a date),
        refused at the node."""
        try:
            return _scalars.construct_object(node, deep=True)
        except yaml.constructor.ConstructorError as e:
            raise self.refuse(node, f"not valid YAML: {e.problem}") from None
        except (ValueError, OverflowError) as e:
            kind = node.tag.rsplit(":", 1)[-1]
            raise self.refuse(node, f"{node.value!r} reads as a YAML {kind} but is not one "
                                    f"({e}); quote it to mean text: '{node.value}'") from None

    def mapping(self, node: yaml.MappingNode, path: Path_) -> dict:
        out: dict = {}
        try:
            _scalars.flatten_mapping(node)  # `<<` merge keys
        except yaml.constructor.ConstructorError as e:
            raise self.refuse(node, f"not valid YAML: {e.problem}") from None
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise self.refuse(key_node, "a key must be plain text, not a list or mapping")
            key = self.scalar(key_node)
            # A per-layer list of flags or integers names its types by value (`0:`, `true:`).
            typed = path == PATTERN_OPTIONS and isinstance(key, int)
            if not isinstance(key, str) and not typed:
                raise self.refuse(key_node, f"key {key_node.value!r} reads as {key!r}, not "
                                            f"text; quote it: '{key_node.value}'")
            if key in out:
                line, col = self.spec.marks[path + (key,)]
                raise self.refuse(key_node, f"duplicate key {key!r} (first at line {line}, "
                                            f"col {col})")
            self.spec.marks[path + (key,)] = _at(key_node)
            out[key] = self.build(value_node, path + (key,))
        return out
