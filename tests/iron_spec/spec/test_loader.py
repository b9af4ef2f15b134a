"""The spec loader: safe YAML only, bounded, every node's place kept."""

from __future__ import annotations

import pytest

from iron_spec.spec.errors import SpecError
from iron_spec.spec.loader import MAX_BYTES, load_spec, parse_spec


def refused(text: str) -> SpecError:
    with pytest.raises(SpecError) as e:
        parse_spec(text, "f.yaml")
    return e.value


def test_places_of_keys_and_values():
    spec = parse_spec("a:\n  b: [1, {c: 2}]\n", "f.yaml")
    assert spec.mark(("a", "b")) == (2, 3)
    assert spec.mark(("a", "b"), value=True) == (2, 6)
    assert spec.mark(("a", "b", 1, "c"), value=True) == (2, 14)
    assert spec.mark(("a", "nope")) == (1, 1)  # nearest ancestor
    assert str(spec.error(("a", "b"), "x", value=True)) == "f.yaml:2:6: error: x"


def test_larger_than_a_mebibyte_is_refused_unread(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("a: " + "x" * MAX_BYTES + "\n")
    with pytest.raises(SpecError, match="larger than a spec may be"):
        load_spec(path)


def test_alias_that_contains_itself():
    assert "nested deeper than 64 levels" in refused("a: &a [*a]\n").message


def test_deep_nesting_in_text():
    assert "nested too deeply" in refused("a: " + "[" * 3000 + "]" * 3000 + "\n").message


def test_billion_laughs_stops_at_the_bound():
    lines = ["a: &a [" + ", ".join(["x"] * 10) + "]"]
    for prev, cur in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 10) + "]")
    e = refused("\n".join(lines))
    assert (e.line, e.col) == (5, 1) and "more than 100000 nodes at 'e'" in e.message


def test_merge_keys_are_plain_data():
    spec = parse_spec("base: &b {x: 1}\nuse: {<<: *b, y: 2}\n")
    assert spec.data["use"] == {"x": 1, "y": 2}


@pytest.mark.parametrize("text, where, message", [
    ("a: !!python/object/apply:os.system [ls]\n", (1, 4), "is not allowed"),
    ("a: !!python/name:os.system ''\n", (1, 4), "could not determine a constructor"),
    ("a: 1\na: 2\n", (2, 1), "duplicate key 'a' (first at line 1, col 1)"),
    ("? [1]\n: x\n", (1, 3), "a key must be plain text"),
    ("1: x\n", (1, 1), "key '1' reads as 1, not text"),
    ("a: 1\n---\nb: 2\n", (3, 1), "one YAML document"),
    ("a:\n\tb: 1\n", (2, 1), "a tab: YAML indents with spaces only"),
    ("", (1, 1), "the file is empty"),
    ("# nothing\n", (1, 1), "the file is empty"),
    ("- 1\n", (1, 1), "not a list"),
    ("just text\n", (1, 1), "not text"),
    ("a: [1\n", (2, 1), "not valid YAML"),
    # Found by a new user's trial: an unclosed brace was reported a line past it, alone.
    ("model: causal\nlayer: {kind: decoder\nnorm: x\n", (3, 5),
     "did not find expected ',' or '}' (a flow mapping opened at line 2, column 8)"),
    ("a:\n  b: [1, 2\n  c: 3\n", (3, 4), "(a flow sequence opened at line 2, column 6)"),
])
def test_refused(text, where, message):
    e = refused(text)
    assert (e.line, e.col) == where and message in e.message, e


def test_not_utf8(tmp_path):
    path = tmp_path / "latin.yaml"
    path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(SpecError, match="not UTF-8"):
        load_spec(path)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such spec file"):
        load_spec(tmp_path / "none.yaml")
