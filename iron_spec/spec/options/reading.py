"""Reading one option of a spec: its value evaluated over the config fields (``config``)
and typed (a flag, a number, a whole number), each refusal naming the option's own line;
and ``LayerReader``, a layer's options read per type under ``layer/pattern``.

Not for: what any one option means (the modules beside this one).
"""

from __future__ import annotations

import math
from typing import Any

from ..config import Resolved, chosen, evaluate_option
from ..loader import Spec


_ABSENT = object()
FLAG = "true or false"  # what a flag option takes, as its refusals say


def _option(spec: Spec, resolved: Resolved, path: tuple, default: Any,
            expects: str | None = None) -> Any:
    raw = spec.get(*path, default=default)
    return evaluate_option(spec, path, raw, resolved, expects)


def _typed(spec: Spec, path: tuple, value: Any, kind: type | tuple, what: str) -> Any:
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise spec.error(path, f"{'.'.join(map(str, path))} is {value!r}, not {what}")
    if value is not None and not isinstance(value, kind):
        raise spec.error(path, f"{'.'.join(map(str, path))} is {value!r}, not {what}")
    return value


def _flag(spec: Spec, path: tuple, value: Any) -> bool:
    """A YAML or JSON boolean (null: false). A string such as ``"false"`` is refused rather
    than read as true, as Python's ``bool`` would."""
    return bool(_typed(spec, path, value, bool, "true or false"))


def _flag_option(spec: Spec, resolved: Resolved, path: tuple, default: bool) -> bool:
    """The boolean option at ``path`` (``_flag``), evaluated as any option."""
    return _flag(spec, path, _option(spec, resolved, path, default, FLAG))


def _number(spec: Spec, path: tuple, value: Any) -> float | None:
    """A finite number (NaN and infinities are refused where config.json smuggles them in)."""
    if value is None:
        return None
    value = float(_typed(spec, path, value, (int, float), "a number"))
    if not math.isfinite(value):
        raise spec.error(path, f"{'.'.join(map(str, path))} is {value}, not a finite number")
    return value


def _positive(spec: Spec, path: tuple, value: Any) -> float:
    """A finite number above zero (an eps, a rope theta)."""
    value = _number(spec, path, value)
    if value is None or value <= 0:
        raise spec.error(path, f"{'.'.join(map(str, path))} is {value}, not a number above 0")
    return value


def _whole(spec: Spec, path: tuple, value: Any) -> int | None:
    """A whole number; an integral float (``head_dim * 0.5``) counts. A fraction an
    expression gave is refused naming the expression, and how to truncate it as a config
    class's ``int()`` does (the expression language's own ``int``)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    raw = spec.get(*path, default=None)
    if isinstance(value, float) and math.isfinite(value) and isinstance(raw, str):
        raise spec.error(path, f"{'.'.join(map(str, path))} is {value!r}, not a whole number: "
                               f"the expression {raw!r} gives it; where the config class "
                               f"truncates, say so as it does: \"int({raw})\"")
    return _typed(spec, path, value, int, "a whole number")


class LayerReader:
    """The options of a layer of type ``t`` (``layer/pattern``'s type; None: no pattern),
    each read at ``layer/pattern/options/t``'s entry where it gives one, else at ``layer``'s
    own, over the fields ``r``; each option path read so (and so settable per type) is added
    to ``per_type``."""

    def __init__(self, spec: Spec, r: Resolved, t: Any, per_type: set | None = None):
        self.spec, self.r, self.t, self.per_type = spec, r, t, per_type

    def word(self, *path, default=None):
        """The raw value at ``path`` under ``layer`` (or its override) and where it is."""
        spec, r, t, per_type = self.spec, self.r, self.t, self.per_type
        at = ("layer",) + path
        if per_type is not None:
            per_type.add(path)
        over = ("layer", "pattern", "options", t) + path
        if t is not None and spec.get(*over, default=_ABSENT) is not _ABSENT:
            at = over
        return chosen(spec, at, spec.get(*at, default=default), r)

    def opt(self, *path, default=None, expects=None):
        raw, at = self.word(*path, default=default)
        return evaluate_option(self.spec, at, raw, self.r, expects), at

    def number(self, *path, default=None):
        value, at = self.opt(*path, default=default, expects="a number")
        return _number(self.spec, at, value)

    def whole(self, *path, default=None):
        value, at = self.opt(*path, default=default, expects="a whole number")
        return None if value is None else _whole(self.spec, at, value)

    def flag(self, *path, default=False):
        value, at = self.opt(*path, default=default, expects=FLAG)
        return _flag(self.spec, at, value)
