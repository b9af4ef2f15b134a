"""The expression language of specs: arithmetic over config fields, and nothing else.

Accepted: numbers, field names, ``+ - * / // % **``, unary minus and plus, parentheses,
``min(...)`` and ``max(...)``. Everything else (attribute access, subscripts, other calls,
lambdas, comprehensions, strings, comparisons) is refused with an error naming the
expression. Expressions are parsed by ``ast`` and walked here; nothing is ever ``eval``-ed.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any, Mapping

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_CALLS = {"min": min, "max": max}
MAX_EXPONENT = 64  # a power past this is refused (2 ** 10 ** 10 would never end)
MAX_BITS = 1024  # an integer result past this many bits is refused, so nesting cannot blow up
MAX_LENGTH = 500


class ExprError(ValueError):
    """An expression that is not in the language, names an unknown field, or cannot be
    computed (division by zero, a non-number operand)."""


def _describe(node: ast.AST) -> str:
    return {ast.Attribute: "attribute access", ast.Subscript: "a subscript",
            ast.Call: "a call", ast.Lambda: "a lambda", ast.ListComp: "a comprehension",
            ast.GeneratorExp: "a comprehension", ast.SetComp: "a comprehension",
            ast.DictComp: "a comprehension", ast.Compare: "a comparison",
            ast.BoolOp: "a boolean operator", ast.IfExp: "a conditional"}.get(
        type(node), type(node).__name__)


def parse(text: str) -> ast.Expression:
    """The checked syntax tree of ``text``. Raises ExprError naming what is refused."""
    if not isinstance(text, str):
        raise ExprError(f"an expression is text, not {text!r}")
    if len(text) > MAX_LENGTH:
        raise ExprError(f"expression of {len(text)} characters is longer than {MAX_LENGTH}")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ExprError(f"expression {text!r} is not valid: {e.msg}") from None
    except (RecursionError, MemoryError):
        raise ExprError(f"expression {text!r} nests too deeply") from None
    for node in ast.walk(tree):
        if isinstance(node, (ast.Expression, ast.Name, ast.Load)) or type(node) in _BINARY \
                or type(node) in _UNARY:
            continue
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
                raise ExprError(f"expression {text!r}: only numbers are literals, not "
                                f"{node.value!r}")
            if not math.isfinite(node.value):
                raise ExprError(f"expression {text!r}: {node.value} is not a finite number")
            continue
        if isinstance(node, (ast.BinOp, ast.UnaryOp)):
            op = node.op
            if type(op) not in _BINARY and type(op) not in _UNARY:
                raise ExprError(f"expression {text!r}: operator {type(op).__name__} is not "
                                "allowed (only + - * / // % **)")
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in _CALLS and not node.keywords \
                and not any(isinstance(a, ast.Starred) for a in node.args):
            if len(node.args) < 2:
                raise ExprError(f"expression {text!r}: {node.func.id}() takes two or more "
                                "arguments")
            continue
        if isinstance(node, ast.Name):
            continue
        raise ExprError(f"expression {text!r}: {_describe(node)} is not allowed (only numbers, "
                        "field names, + - * / // % **, parentheses, min and max)")
    return tree


def names(text: str) -> set[str]:
    """The field names ``text`` reads (``min`` and ``max`` when called are not fields)."""
    tree = parse(text)
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in called}


def evaluate(text: str, fields: Mapping[str, Any]) -> Any:
    """The value of ``text`` over ``fields``. A bare field name gives the field's value,
    whatever its type; arithmetic takes numbers only.

    Raises:
        ExprError: refused syntax, an unknown field (with the known ones), a non-number
            operand, division by zero, or an integer power past ``MAX_EXPONENT``.
    """
    tree = parse(text)

    def number(v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ExprError(f"expression {text!r}: {v!r} is not a number")
        return v

    def walk(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in fields:
                raise ExprError(f"expression {text!r}: no field {node.id!r} (fields: "
                                f"{', '.join(sorted(fields))})")
            return fields[node.id]
        if isinstance(node, ast.UnaryOp):
            return _UNARY[type(node.op)](number(walk(node.operand)))
        if isinstance(node, ast.BinOp):
            a, b = number(walk(node.left)), number(walk(node.right))
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
        if isinstance(node, ast.Call):
            return _CALLS[node.func.id](*(number(walk(a)) for a in node.args))
        raise ExprError(f"expression {text!r}: {_describe(node)} is not allowed")

    return walk(tree)
