"""Reading a causal spec's ``head`` options that shape lm_head: the transform before it
(``head.transform``) and its rows (``head.vocab_size``); each error at the option's own line.

Not for: the head's flags and scales read beside the model's shape (``interpreter``).
"""

from __future__ import annotations

from iron_spec.operators.activation import ACTIVATIONS
from iron_spec.runtime.causal import HeadTransformOptions

from ..config import Resolved
from ..loader import Spec
from .reading import _flag_option, _number, _option, _whole


def _head_transform(spec: Spec, r: Resolved) -> HeadTransformOptions | None:
    """``head.transform``: ``{act, bias}`` of the dense + activation + norm before lm_head
    (``runtime.causal.HeadTransformOptions``), None where the spec has none.

    Raises:
        SpecError: at the option's own line, an activation no operator has or a bias that
            is not a boolean.
    """
    p = ("head", "transform")
    if spec.get(*p) is None:
        return None
    act = _option(spec, r, p + ("act",), "hidden_act")
    if act not in ACTIVATIONS:
        raise spec.error(p + ("act",), f"activation {act!r} is not one of {', '.join(ACTIVATIONS)}")
    return HeadTransformOptions(act=act, bias=_flag_option(spec, r, p + ("bias",), False))


def _head_rows(spec: Spec, r: Resolved, vocab: int) -> int | None:
    """``head.vocab_size``: lm_head's rows (null: the embedding's ``vocab_size``).

    Raises:
        SpecError: at the option, rows that are not a whole number within 1..vocab_size, or
            fewer than vocab_size under a tied head.
    """
    at = ("head", "vocab_size")
    rows = _whole(spec, at, _option(spec, r, at, None))
    if rows is None or rows == vocab:
        return None
    if not 1 <= rows <= vocab:
        raise spec.error(at, f"head.vocab_size is {rows}, not a whole number within 1..{vocab} "
                             "(the embedding's vocab_size)")
    if _flag_option(spec, r, ("head", "tied"), False):
        raise spec.error(at, f"head.vocab_size {rows} is narrower than the embedding "
                             f"({vocab}): a tied lm_head is the embedding, all its rows")
    return rows


def _final_eps(spec: Spec, r: Resolved) -> float | None:
    """``head.norm_eps``: the final norm's eps where it differs from the layers' (None:
    theirs).

    Raises:
        SpecError: at the option, an eps that is not a number above 0.
    """
    at = ("head", "norm_eps")
    eps = _number(spec, at, _option(spec, r, at, None))
    if eps is not None and not eps > 0:
        raise spec.error(at, f"head.norm_eps is {eps}, not a number above 0 (null: the layers')")
    return eps
