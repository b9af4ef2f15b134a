"""The expression language: random trees of allowed nodes evaluate as Python's own
arithmetic, computed here by an independent walk of the same tree; anything else is refused
with the expression named."""

from __future__ import annotations

import math
import operator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from iron_spec.expr import ExprError, evaluate, names, parse

FIELDS = {"a": 3, "b": 7, "c": 2.5, "d": -4}
OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
       "//": operator.floordiv, "%": operator.mod}


class Undefined(Exception):
    """The tree's value is not a finite real number (division by zero, overflow...)."""


def leaf() -> st.SearchStrategy:
    numbers = st.one_of(st.integers(0, 50), st.floats(0, 50, allow_nan=False).map(
        lambda x: round(x, 3)))
    return st.one_of(numbers.map(lambda v: (repr(v), v)),
                     st.sampled_from(sorted(FIELDS)).map(lambda n: (n, FIELDS[n])))


def combine(children: st.SearchStrategy) -> st.SearchStrategy:
    binary = st.tuples(st.sampled_from(sorted(OPS)), children, children).map(
        lambda t: (f"({t[1][0]} {t[0]} {t[2][0]})", ("op", t[0], t[1][1], t[2][1])))
    unary = children.map(lambda c: (f"-({c[0]})", ("neg", c[1])))
    calls = st.tuples(st.sampled_from(["min", "max"]), st.lists(children, min_size=2,
                                                                max_size=3)).map(
        lambda t: (f"{t[0]}({', '.join(c[0] for c in t[1])})", (t[0], [c[1] for c in t[1]])))
    square = children.map(lambda c: (f"({c[0]}) ** 2", ("sq", c[1])))
    return st.one_of(binary, unary, calls, square)


def value(tree):
    """The tree's value by Python's operators, independently of iron_spec.expr."""
    if not isinstance(tree, tuple):
        return tree
    kind = tree[0]
    try:
        if kind == "op":
            out = OPS[tree[1]](value(tree[2]), value(tree[3]))
        elif kind == "neg":
            out = -value(tree[1])
        elif kind == "sq":
            out = value(tree[1]) ** 2
        else:
            out = (min if kind == "min" else max)(*map(value, tree[1]))
    except (ZeroDivisionError, OverflowError):
        raise Undefined from None
    if isinstance(out, float) and not math.isfinite(out) or isinstance(out, int) and \
            out.bit_length() > 1024:
        raise Undefined
    return out


expressions = st.recursive(leaf(), combine, max_leaves=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expressions)
def test_allowed_trees_evaluate_as_python(case):
    text, tree = case
    try:
        expected = value(tree)
    except Undefined:
        with pytest.raises(ExprError):
            evaluate(text, FIELDS)
        return
    got = evaluate(text, FIELDS)
    assert got == expected or math.isclose(got, expected, rel_tol=1e-12, abs_tol=1e-300)
    assert type(got) is type(expected)


REFUSED = [
    ("a.real", "attribute access"), ("a[0]", "a subscript"), ("abs(a)", "a call"),
    ("lambda: 1", "a lambda"), ("[x for x in a]", "a comprehension"),
    ("{x for x in a}", "a comprehension"), ("(x for x in a)", "a comprehension"),
    ("a < b", "a comparison"), ("a and b", "a boolean operator"), ("a if b else c", "a conditional"),
    ("'text'", "only numbers are literals"), ("True", "only numbers are literals"),
    ("a & b", "BitAnd is not allowed"), ("~a", "Invert is not allowed"), ("not a", "Not is not allowed"),
    ("__import__('os')", "a call"), ("min(a)", "two or more arguments"),
    ("min(*a)", "a call"), ("max(a, key=b)", "a call"), ("1e999", "not a finite number"),
    ("a; b", "is not valid"), ("(a := 1)", "NamedExpr"), ("f'{a}'", "JoinedStr"),
]


@pytest.mark.parametrize("text, what", REFUSED)
def test_refused_constructs_are_named(text, what):
    with pytest.raises(ExprError) as e:
        parse(text)
    assert repr(text) in str(e.value) and what in str(e.value)


disallowed = st.sampled_from([t for t, _ in REFUSED])


@settings(max_examples=200, deadline=None)
@given(expressions, disallowed, st.sampled_from(["+", "*", "//"]))
def test_a_refused_part_anywhere_refuses_the_whole(case, bad, op):
    for text in (f"({case[0]}) {op} ({bad})", f"({bad}) {op} ({case[0]})",
                 f"max({case[0]}, {bad})"):
        with pytest.raises(ExprError):
            evaluate(text, FIELDS)


def test_names_leave_out_the_calls():
    assert names("min(a, max(b, 2)) + c") == {"a", "b", "c"}


@pytest.mark.parametrize("text, message", [
    ("a / 0", "division by zero"), ("2 ** 100000", "too large"), ("e + 1", "no field 'e'"),
    ("(-8) ** 0.5", "not a finite real number"), ("x" * 501, "longer than 500"),
    ("1e300 * 1e300", "not a finite real number"),
])
def test_cannot_be_computed(text, message):
    with pytest.raises(ExprError, match=message):
        evaluate(text, FIELDS)


def test_a_bare_field_gives_its_value_whatever_its_type():
    assert evaluate("act", {"act": "silu"}) == "silu"
    with pytest.raises(ExprError, match="'silu' is not a number"):
        evaluate("act * 2", {"act": "silu"})
