"""The expression language: random trees of allowed nodes evaluate as Python's own
arithmetic, computed here by an independent walk of the same tree; anything else is refused
with the expression named."""

from __future__ import annotations

import math
import operator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from iron_spec.spec.expr import ExprError, evaluate, names, parse

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
    """The tree's value by Python's operators, independently of iron_spec.spec.expr."""
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
    ("a is b", "comparison Is is not allowed"),
    ("a < b is c", "comparison Is is not allowed"),
    ("b'x'", "are literals"),
    ("1j", "are literals"), ("...", "are literals"),
    ("a & b", "BitAnd is not allowed"), ("~a", "Invert is not allowed"), ("a | b", "BitOr"),
    ("a if b else c.real", "attribute access"), ("not a[0]", "a subscript"),
    ("__import__('os')", "a call"), ("min()", "takes a list or numbers"),
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
    # a field's own value that is no number names the field (the config key to look at)
    with pytest.raises(ExprError, match="act is 'silu', not a number"):
        evaluate("act * 2", {"act": "silu"})
    with pytest.raises(ExprError, match="hidden_size is '64', not a number"):
        evaluate("hidden_size // heads", {"hidden_size": "64", "heads": 4})


# Logic: each value below is what Python's own operators give on these operands, by hand.
LOGIC = {"t": True, "f": False, "n": None, "a": 3, "b": 7, "act": "silu", "w": 4096}


@pytest.mark.parametrize("text, expected", [
    ("true", True), ("false", False), ("null", None), ("True", True), ("False", False),
    ("None", None), ("a == 3", True), ("a != 3", False), ("a < b", True), ("a <= 3", True),
    ("a > b", False), ("b >= 7.0", True), ("1 < a < b", True), ("1 < b < a", False),
    ("n == null", True), ("w != null", True), ("n != None", False), ("t == true", True),
    ("f == null", False), ("act == act", True), ("act != n", True),
    ("t and f", False), ("t and t", True), ("f or t", True), ("f or f", False),
    ("not t", False), ("not f", True), ("not a > b", True), ("t and not f or f", True),
    ("1 if t else 2", 1), ("1 if f else 2", 2), ("1 if multi_query else a", 3),
    ("null if f else a // 2", 1), ("(a if a > b else b) * 2", 14),
    ("w if w != null else 0", 4096), ("f and a / 0", False), ("t or a / 0", True),
    ("n != null and n > 0", False), ("1 if t else a / 0", 1), ("a / 0 if f else 5", 5),
    ("a == 3 and b == 7 and t", True), ("min(a, b) if t else max(a, b)", 3),
])
def test_logic_gives_what_python_gives(text, expected):
    got = evaluate(text, {**LOGIC, "multi_query": False})
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize("text, message", [
    ("1 if a else 2", "the condition is 3, not true or false"),
    ("1 if n else 2", "the condition is null, not true or false"),
    ("1 if act else 2", "the condition is 'silu', not true or false"),
    ("a and t", "an operand of and is 3, not true or false"),
    ("f or w", "an operand of or is 4096, not true or false"),
    ("t and n", "an operand of and is null"),
    ("not a", "the operand of not is 3"),
    ("t == 1", "compares true with 1: a boolean equals only a boolean or null"),
    ("0 != f", "compares 0 with false"), ("t == act", "compares true with 'silu'"),
    ("n < 1", "n is null, not a number"), ("t > f", "t is true, not a number"),
    ("act < a", "act is 'silu', not a number"), ("t + 1", "t is true, not a number"),
    ("-f", "f is false, not a number"), ("n * 2", "n is null, not a number"),
    ("null < 1", "null is not a number"),
    ("max(t, 1)", "true is not a number"),
    ("1 if t else z", "no field 'z'"), ("1 if z else 2", "no field 'z'"),
])
def test_logic_refusals_say_what_failed(text, message):
    with pytest.raises(ExprError, match=message) as e:
        evaluate(text, LOGIC)
    assert repr(text) in str(e.value)


def test_the_literals_are_not_fields():
    assert names("1 if multi_query and not false else num_key_value_heads") == {
        "multi_query", "num_key_value_heads"}
    assert names("x if x != null else true") == {"x"}


def _llama(tmp_path, kv_heads: str, field: str = "  multi_query: {json: multi_query, default: false}"):
    from tests.conftest import SPECS
    text = (SPECS / "llama3.yaml").read_text()
    anchor = "  mlp_bias: {json: mlp_bias, default: false}\n"
    text = text.replace(anchor, anchor + field + "\n").replace(
        "  attention: {bias: attention_bias, o_bias: attention_bias, rope: default}",
        f"  attention: {{bias: attention_bias, o_bias: attention_bias, rope: default, "
        f"kv_heads: {kv_heads!r}}}")
    path = tmp_path / "llama3.yaml"
    path.write_text(text)
    return path, text


def test_a_conditional_option_selects_one_kv_head(tmp_path):
    from iron_spec.spec.interpreter import expand
    from iron_spec.spec.loader import load_spec
    path, _ = _llama(tmp_path, "1 if multi_query else num_key_value_heads")
    spec = load_spec(path)
    toy = dict(spec.get("toy", "config"))
    assert [lo.attention.kv_heads for lo in expand(spec, toy).options.layers] == [2, 2]
    toy["multi_query"] = True
    assert [lo.attention.kv_heads for lo in expand(spec, toy).options.layers] == [1, 1]


def test_a_refused_condition_names_the_options_line_and_column(tmp_path):
    from iron_spec.spec.errors import SpecError
    from iron_spec.spec.interpreter import expand
    from iron_spec.spec.loader import load_spec
    path, text = _llama(tmp_path, "1 if num_attention_heads else num_key_value_heads")
    spec = load_spec(path)
    with pytest.raises(SpecError) as e:
        expand(spec, spec.get("toy", "config"))
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "kv_heads:" in t)
    col = text.splitlines()[line - 1].index("kv_heads") + 1
    assert str(e.value).startswith(f"{path}:{line}:{col}: error: ")
    assert "the condition is 4, not true or false" in str(e.value)


def test_a_config_field_expression_is_refused_at_its_own_line(tmp_path):
    from iron_spec.spec.errors import SpecError
    from iron_spec.spec.interpreter import expand
    from iron_spec.spec.loader import load_spec
    path, text = _llama(tmp_path, "num_key_value_heads",
                        "  multi_query: {expr: 'hidden_size > 0 and vocab_size'}")
    spec = load_spec(path)
    with pytest.raises(SpecError) as e:
        expand(spec, spec.get("toy", "config"))
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "multi_query:" in t)
    assert str(e.value).startswith(f"{path}:{line}:")
    assert "an operand of and is 256, not true or false" in str(e.value)


@pytest.mark.parametrize("text, fields, want", [
    ("max(w)", {"w": [4, 8, 6]}, 8), ("min(w) // 2", {"w": [4, 8, 6]}, 2),
    ("max(w)", {"w": 512}, 512), ("min(w) == max(w)", {"w": [6, 6]}, True),
])
def test_min_and_max_of_one_argument_reduce_a_list_or_keep_a_number(text, fields, want):
    # LongformerConfig's attention_window: one even number, or a list of one per layer.
    assert evaluate(text, fields) == want


@pytest.mark.parametrize("text, fields, what", [
    ("max(w)", {"w": []}, "an empty list"), ("max(w)", {"w": [4, "a"]}, "is not a number"),
    ("min(w, 2)", {"w": [4]}, "is not a number"),
])
def test_min_and_max_refuse_empty_lists_and_lists_of_other_things(text, fields, what):
    with pytest.raises(ExprError, match=what):
        evaluate(text, fields)


# Words and lists, as a mixture's layer choice reads them (Llama4TextConfig's moe_layers,
# MiniCPM5MoeConfig's mlp_layer_types entries).
WORDS = {"layer": 3, "moe_layers": [1, 3, 5], "flags": [True], "kind": "sparse", "none": None,
         "kinds": ["dense", "sparse"]}


@pytest.mark.parametrize("text, expected", [
    ("layer in moe_layers", True), ("layer not in moe_layers", False),
    ("layer + 1 in moe_layers", False), ("not (layer in moe_layers)", False),
    ("kind == 'sparse'", True), ("kind != 'dense'", True), ("'dense' == kind", False),
    ("'sparse' in kinds", True), ("'other' not in kinds", True),
    ("1 in flags", False),  # a boolean list holds no number: true == 1 is refused as ever
])
def test_words_and_membership(text, expected):
    assert evaluate(text, WORDS) == expected


@pytest.mark.parametrize("text, what", [
    ("layer in none", "none is null, not a list"), ("layer in layer", "layer is 3, not a list"),
    ("kind < 'z'", "compared with == or !="), ("kind + 'x'", "compared with == or !="),
    ("'silu'", "compared with == or !="), ("'a' if layer < 1 else 'b'", "compared with == or !="),
    ("kind in ['sparse']", "not allowed|compared with == or !="),
])
def test_membership_needs_a_list_and_words_only_compare(text, what):
    with pytest.raises(ExprError, match=what):
        evaluate(text, WORDS)


def test_log_is_yarns_mscale():
    # transformers' yarn_get_mscale(40, 1.0) = 0.1 * ln(40) + 1, squared in DeepSeek's scale.
    assert evaluate("(0.1 * m * log(f) + 1) ** 2", {"m": 1.0, "f": 40.0}) == \
        pytest.approx((0.1 * math.log(40.0) + 1) ** 2, rel=1e-15)
    for bad in ("log(0)", "log(-1)", "log(1, 2)"):
        with pytest.raises(ExprError, match="log"):
            evaluate(bad, {})
