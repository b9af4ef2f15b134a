"""The expression language of specs: arithmetic and logic over config fields, and nothing else.

Accepted: numbers, field names, the literals ``true``/``false``/``null`` (and Python's
``True``/``False``/``None``), quoted words (``'sparse'``: a config word, compared with
``==`` and ``!=`` or looked for with ``in``, only), ``+ - * / // % **``, unary minus and
plus, parentheses, ``min(...)`` and ``max(...)`` (of two or more numbers, or of one: a
number, or a list of numbers a config key holds, as LongformerConfig's per-layer
``attention_window``), ``int(x)`` (one number truncated toward zero, as Python's ``int`` and
so transformers' config classes and RoPE functions truncate: ``int(head_dim *
partial_rotary_factor)``), ``log(x)`` (the natural log of a number above 0: YaRN's ``0.1 *
mscale * log(factor) + 1``), ``len(x)`` (the items of a list or the characters of a text a
config key holds: NemotronHConfig's layers are ``len(layers_block_type)``), comparisons
``== != < <= > >=`` (chained as in Python), ``in`` and ``not in`` of a list a config key
holds (``layer in moe_layers``: Llama4TextConfig's list of layer indices), ``and``/``or``/
``not`` over booleans, and the conditional ``a if c else b``. Everything else (attribute
access, subscripts, other calls, lambdas, comprehensions, ``is``, bitwise operators) is
refused with an error naming the expression. Expressions are
parsed by ``ast`` and walked here; nothing is ever ``eval``-ed.

Strict where Python is loose: a condition and the operands of ``and``/``or``/``not`` are
booleans (``sliding_window != null``, never a number's truthiness); ``and``/``or`` give a
boolean; a boolean equals only a boolean or null (``true == 1`` is refused, not true);
ordering compares numbers only. The branch a conditional does not take, and the right of
an ``and``/``or`` that the left decides, are not evaluated (``x != null and x > 0``).
"""

from __future__ import annotations

import ast
import math
import operator
import threading
from typing import Any, Mapping

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt,
            ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge}
_ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_MEMBERSHIP = (ast.In, ast.NotIn)
# int: one number, truncated; log: the natural log of one number above 0 (both in walk)
_CALLS = {"min": min, "max": max, "int": None, "log": None, "len": len}
LITERALS = {"true": True, "false": False, "null": None}  # YAML's and JSON's spellings
MAX_EXPONENT = 64  # a power past this is refused (2 ** 10 ** 10 would never end)
MAX_BITS = 1024  # an integer result past this many bits is refused, so nesting cannot blow up
MAX_LENGTH = 500
_LANGUAGE = ("only numbers, field names, true/false/null, quoted words, + - * / // % **, "
             "parentheses, min, max, int, log and len, == != < <= > >=, in and not in a list, "
             "and/or/not, a if c else b")


class ExprError(ValueError):
    """An expression that is not in the language, names an unknown field, or cannot be
    computed (division by zero, a non-number operand, a non-boolean condition)."""


def _describe(node: ast.AST) -> str:
    return {ast.Attribute: "attribute access", ast.Subscript: "a subscript",
            ast.Call: "a call", ast.Lambda: "a lambda", ast.ListComp: "a comprehension",
            ast.GeneratorExp: "a comprehension", ast.SetComp: "a comprehension",
            ast.DictComp: "a comprehension"}.get(type(node), type(node).__name__)


# CPython 3.11 counts ast.parse's depth in interpreter-wide state: two threads parsing at once
# (two models loading) can fail with SystemError "AST constructor recursion depth mismatch".
_PARSING = threading.Lock()


def _show(v: Any) -> str:
    return {True: "true", False: "false", None: "null"}.get(v, repr(v)) \
        if v is None or isinstance(v, bool) else repr(v)


def parse(text: str) -> ast.Expression:
    """The checked syntax tree of ``text``. Raises ExprError naming what is refused."""
    if not isinstance(text, str):
        raise ExprError(f"an expression is text, not {text!r}")
    if len(text) > MAX_LENGTH:
        raise ExprError(f"expression of {len(text)} characters is longer than {MAX_LENGTH}")
    try:
        with _PARSING:
            tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ExprError(f"expression {text!r} is not valid: {e.msg}") from None
    except (RecursionError, MemoryError):
        raise ExprError(f"expression {text!r} nests too deeply") from None
    # A quoted word is a config word to compare: an operand of == or !=, or what in / not in
    # looks for in a list, and nothing else (a word as an option's value is a field's,
    # {value: silu}, where a review reads it).
    compared = {id(o) for node in ast.walk(tree) if isinstance(node, ast.Compare)
                and all(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops)
                for o in [node.left, *node.comparators]}
    compared |= {id(node.left) for node in ast.walk(tree) if isinstance(node, ast.Compare)
                 and len(node.ops) == 1 and isinstance(node.ops[0], _MEMBERSHIP)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in compared:
            raise ExprError(f"expression {text!r}: only numbers, true, false and null are "
                            f"literals, not {node.value!r} (a quoted word is compared with == "
                            "or != or looked for with in; a word as a value is a field's: "
                            "{value: ...})")
        if isinstance(node, (ast.Expression, ast.Name, ast.Load, ast.IfExp, ast.And, ast.Or,
                             ast.Not)) or type(node) in _BINARY or type(node) in _UNARY \
                or type(node) in _COMPARE or isinstance(node, _MEMBERSHIP):
            continue
        if isinstance(node, ast.Constant):
            v = node.value
            if v is not None and not isinstance(v, (bool, int, float, str)):
                raise ExprError(f"expression {text!r}: only numbers, quoted words, true, false "
                                f"and null are literals, not {v!r}")
            if isinstance(v, float) and not math.isfinite(v):
                raise ExprError(f"expression {text!r}: {v} is not a finite number")
            continue
        if isinstance(node, (ast.BinOp, ast.UnaryOp)):
            op = node.op
            if type(op) not in _BINARY and type(op) not in _UNARY and not isinstance(op, ast.Not):
                raise ExprError(f"expression {text!r}: operator {type(op).__name__} is not "
                                "allowed (only + - * / // % ** and not)")
            continue
        if isinstance(node, ast.BoolOp):
            continue
        if isinstance(node, ast.Compare):
            bad = [type(o).__name__ for o in node.ops
                   if type(o) not in _COMPARE and not isinstance(o, _MEMBERSHIP)]
            if bad:
                raise ExprError(f"expression {text!r}: comparison {bad[0]} is not allowed "
                                "(only == != < <= > >= in, not in)")
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in _CALLS and not node.keywords \
                and not any(isinstance(a, ast.Starred) for a in node.args):
            if node.func.id == "int" and len(node.args) != 1:
                raise ExprError(f"expression {text!r}: int() takes one number")
            if not node.args:
                raise ExprError(f"expression {text!r}: {node.func.id}() takes a list or "
                                "numbers")
            continue
        if isinstance(node, ast.Name):
            continue
        raise ExprError(f"expression {text!r}: {_describe(node)} is not allowed ({_LANGUAGE})")
    return tree


def names(text: str) -> set[str]:
    """The field names ``text`` reads (``min``, ``max``, ``int``, ``log`` and ``len`` when
    called, and the literals ``true``/``false``/``null``, are not fields)."""
    tree = parse(text)
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in called
            and n.id not in LITERALS}


def evaluate(text: str, fields: Mapping[str, Any]) -> Any:
    """The value of ``text`` over ``fields``. A bare field name gives the field's value,
    whatever its type; arithmetic and ordering take numbers, logic takes booleans.

    Raises:
        ExprError: refused syntax, an unknown field (with the known ones), a non-number
            operand of arithmetic or ordering, a non-boolean condition or operand of
            and/or/not, a boolean compared with a number or text, division by zero, or an
            integer power past ``MAX_EXPONENT``.
    """
    tree = parse(text)
    unknown = sorted(names(text) - set(fields))
    if unknown:  # anywhere, a branch not taken too
        raise ExprError(f"expression {text!r}: no field {unknown[0]!r} (fields: "
                        f"{', '.join(sorted(fields))})")

    def number(v: Any, node: ast.AST | None = None) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            # a field's own value names the field: the config key to look at
            field = f"{node.id} is " if isinstance(node, ast.Name) and \
                node.id not in LITERALS else ""
            raise ExprError(f"expression {text!r}: {field}{_show(v)}, not a number" if field
                            else f"expression {text!r}: {_show(v)} is not a number")
        return v

    def boolean(v: Any, what: str) -> bool:
        if not isinstance(v, bool):
            raise ExprError(f"expression {text!r}: {what} is {_show(v)}, not true or false "
                            "(compare it: x != null, x > 0)")
        return v

    def compare(op: ast.cmpop, a: Any, b: Any, an: ast.AST, bn: ast.AST) -> bool:
        if isinstance(op, _MEMBERSHIP):
            if not isinstance(b, list):
                field = f"{bn.id} is " if isinstance(bn, ast.Name) else ""
                raise ExprError(f"expression {text!r}: {field}{_show(b)}, not a list (in and "
                                "not in look in a list a config key holds)")
            found = any(a == v and isinstance(a, bool) == isinstance(v, bool) for v in b)
            return found if isinstance(op, ast.In) else not found
        if isinstance(op, _ORDER):
            return _COMPARE[type(op)](number(a, an), number(b, bn))
        if a is not None and b is not None and isinstance(a, bool) != isinstance(b, bool):
            raise ExprError(f"expression {text!r}: compares {_show(a)} with {_show(b)}: a "
                            "boolean equals only a boolean or null")
        return _COMPARE[type(op)](a, b)

    def walk(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in LITERALS:
                return LITERALS[node.id]
            return fields[node.id]
        if isinstance(node, ast.IfExp):
            test = boolean(walk(node.test), "the condition")
            return walk(node.body if test else node.orelse)
        if isinstance(node, ast.BoolOp):
            stop = isinstance(node.op, ast.Or)  # the value that decides it
            what = "an operand of or" if stop else "an operand of and"
            for value in node.values:
                if boolean(walk(value), what) is stop:
                    return stop
            return not stop
        if isinstance(node, ast.Compare):
            left, left_node = walk(node.left), node.left
            for op, right_node in zip(node.ops, node.comparators):
                right = walk(right_node)
                if not compare(op, left, right, left_node, right_node):
                    return False
                left, left_node = right, right_node
            return True
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.Not):
                return not boolean(walk(node.operand), "the operand of not")
            return _UNARY[type(node.op)](number(walk(node.operand), node.operand))
        if isinstance(node, ast.BinOp):
            a, b = number(walk(node.left), node.left), number(walk(node.right), node.right)
            if isinstance(node.op, ast.Pow) and (abs(b) > MAX_EXPONENT or (
                    isinstance(a, int) and isinstance(b, int) and a.bit_length() * b > MAX_BITS)):
                raise ExprError(f"expression {text!r}: a power to {b} is too large")
            try:
                value = _BINARY[type(node.op)](a, b)
            except ZeroDivisionError:
                raise ExprError(f"expression {text!r}: division by zero") from None
            except OverflowError:
                raise ExprError(f"expression {text!r}: overflows") from None
            if isinstance(value, int) and value.bit_length() > MAX_BITS:
                raise ExprError(f"expression {text!r}: an integer past {MAX_BITS} bits")
            if isinstance(value, complex) or (isinstance(value, float) and not math.isfinite(value)):
                raise ExprError(f"expression {text!r}: gives {value}, not a finite real number")
            return value
        if isinstance(node, ast.Call) and node.func.id == "int":
            return int(number(walk(node.args[0])))  # toward zero, as Python's int()
        if isinstance(node, ast.Call) and node.func.id == "len":
            values = [walk(a) for a in node.args]
            if len(values) != 1 or not isinstance(values[0], (list, str)):
                raise ExprError(f"expression {text!r}: len() takes one list or text a config "
                                f"key holds, not {', '.join(map(_show, values))}")
            return len(values[0])
        if isinstance(node, ast.Call):
            values = [walk(a) for a in node.args]
            if len(values) == 1:
                # One argument: a number, or a config key's list of them (one per layer).
                values = values[0] if isinstance(values[0], list) else values
                if not values:
                    raise ExprError(f"expression {text!r}: {node.func.id}() of an empty list")
            if node.func.id == "log":
                if len(values) != 1 or not number(values[0]) > 0:
                    raise ExprError(f"expression {text!r}: log() takes one number above 0")
                return math.log(values[0])
            return _CALLS[node.func.id]([number(v) for v in values])
        raise ExprError(f"expression {text!r}: {_describe(node)} is not allowed")

    return walk(tree)
