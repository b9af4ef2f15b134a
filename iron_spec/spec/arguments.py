"""The library entry points' arguments, refused by name before anything loads or changes.

``iron_spec.load(max_seq_len="64")`` must fail as a Python call does on a bad argument,
naming the argument, what it got and what would be valid; not as a TypeError deep inside
the sizing code, and not by going on with ``64.5`` or ``True`` (a bool is an int to Python,
never a count or a seed to a user). The CLI's flags reach the same checks through typer's
own (``min=``), so a message here names the argument as the library spells it.

Not for: the range a value must fall in that only the spec and the checkpoint know
(``max_seq_len`` past the model's own context: ``build.load_model``).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterable, Iterator

import numpy as np

_UNSAID = object()
#: The arguments the call in progress took from a YAML file (a serve file's model entry),
#: named as the file spells them: ``given_in``.
_FILE_KEYS: ContextVar[frozenset] = ContextVar("iron_spec_file_keys", default=frozenset())


def _held(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def whole(value: Any, name: str, low: int = 1, high: int | None = None,
          what: str = "") -> int | None:
    """``value`` as an int where it is None or a whole number (a Python or numpy int, not a
    bool) within ``low..high``; ``what`` says what it counts, for the message.

    Raises:
        TypeError: not an int (a float, a str, a bool), the argument named.
        ValueError: outside ``low..high``, the argument and the range named.
    """
    if value is None:
        return None
    span = f"{low}..{high}" if high is not None else f">= {low}"
    said = f" ({what})" if what else ""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} is {_held(value)}; it is a whole number {span}{said}")
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name} is {int(value)}; it is a whole number {span}{said}")
    return int(value)


def flag(value: Any, name: str) -> bool:
    """``value`` where it is a bool.

    Raises:
        TypeError: anything else (``"no"`` is true to Python), the argument named.
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} is {_held(value)}; it is True or False")
    return bool(value)


def callable_or_none(value: Any, name: str, takes: str) -> None:
    """Raises TypeError where ``value`` is neither None nor callable (``takes`` says with
    what it is called)."""
    if value is not None and not callable(value):
        raise TypeError(f"{name} is {_held(value)}; it is None or a callable taking {takes}")


def only_for(kind: str, given: dict[str, Any], spec: str) -> None:
    """Raises TypeError naming each argument of ``given`` that is set (not None, not its
    default) although ``spec``, a ``kind`` model, has no use for it: silently dropped, a
    ``max_tokens`` meant to bound a causal model's context would bound nothing."""
    set_ = [name for name, (value, default, _) in given.items() if value != default]
    if set_:
        name = set_[0]
        raise TypeError(f"{name} is for {given[name][2]}; {spec} is {article(kind)} {kind} model "
                        f"(model: {kind}), which takes no {', '.join(set_)}")


def article(word: str) -> str:
    """The indefinite article before ``word`` ("an encoder", "a causal")."""
    return "an" if word[:1].lower() in "aeiou" else "a"


def said(name: str, value: Any = _UNSAID, *, placeholder: str | None = None) -> str:
    """The argument ``name`` (``iron_spec.load``'s keyword, ``max_seq_len``) as the caller
    wrote it, with ``value`` (or a ``placeholder`` such as ``SEED``) where given:
    ``max_seq_len=64`` from Python, ``--max-seq-len 64`` inside an ``iron-spec`` command (a
    typer command runs), ``max_seq_len: 64`` where a YAML file gave it (``given_in``: a serve
    file's model entry), so a message never tells a library user of a flag, nor a shell user
    of a keyword, nor a file's writer of either. A flag's True is the switch alone
    (``--toy``; ``toy: true`` in a file)."""
    from typer.main import get_current_context  # typer's own click, on first use

    shown = placeholder if placeholder is not None else None if value is _UNSAID else value
    if name in _FILE_KEYS.get():
        if shown is None:
            return name
        return f"{name}: {str(shown).lower() if isinstance(shown, bool) else shown}"
    if get_current_context(silent=True) is not None:
        flag = "--" + name.replace("_", "-")
        return flag if shown is None or shown is True else f"{flag} {shown}"
    if shown is None:
        return f"{name}="
    return f"{name}={shown if placeholder is not None else repr(shown)}"


@contextmanager
def given_in(keys: Iterable[str]) -> Iterator[None]:
    """Inside the ``with`` block (on this thread), ``said`` names each of ``keys`` as a YAML
    file does (``max_seq_len: 64``): the arguments a file gave a call, or could have (a
    serve file's model entry; the caller names the file and the entry). Blocks nest: the
    innermost's keys."""
    token = _FILE_KEYS.set(frozenset(keys))
    try:
        yield
    finally:
        _FILE_KEYS.reset(token)
