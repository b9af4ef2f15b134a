"""Checking the values a model reads from files (config.json, generation_config.json,
tokenizer_config.json): type, finiteness and range, where they are read, each refusal naming
the file and the key.

JSON carries NaN and Infinity (Python's json reads them), booleans that Python counts as
integers, and numbers of any size; a value nothing checks turns every logit NaN (a RoPE
``factor`` of 0), divides by zero (``rope_theta`` 1 with yarn) or overflows a kernel's
integer (a ``sliding_window`` of 10**30). Every such value passes one of these checks first.

Not for: reading the files (``runtime.files``), a spec's own options (``iron_spec``).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

MAX_INT = 2**31 - 1  # what a kernel's int holds: a context, a window, an id


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    return {dict: "a mapping", list: "a list", str: "text", type(None): "null"}.get(
        type(value), type(value).__name__)


def number(value: Any, where: str, *, above: float | None = None,
           at_least: float | None = None, at_most: float | None = None) -> float:
    """``value`` as a float, where it is a finite number (not a boolean) within the bounds.

    Raises:
        ValueError: naming ``where`` (``FILE: KEY``), the value and what would be valid.
    """
    low = f"above {above:g}" if above is not None else \
        f"at least {at_least:g}" if at_least is not None else None
    high = None if at_most is None else f"at most {at_most:g}"
    valid = "a finite number" + (f" {low} and {high}" if low and high else
                                 f" {low or high}" if low or high else "")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where} is {shown(value)} ({_kind(value)}), not {valid}")
    try:
        x = float(value)
    except OverflowError:
        raise ValueError(f"{where} is {shown(value)}, not {valid}") from None
    if not math.isfinite(x) or (above is not None and not x > above) or (
            at_least is not None and not x >= at_least) or (at_most is not None and not x <= at_most):
        raise ValueError(f"{where} is {shown(value)}, not {valid}")
    return x


def whole(value: Any, where: str, *, at_least: int = 0, at_most: int = MAX_INT) -> int:
    """``value`` where it is a whole number (a JSON integer, not a boolean nor ``2.0``)
    within ``at_least..at_most``.

    Raises:
        ValueError: naming ``where``, the value and the valid range.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not at_least <= value <= at_most:
        raise ValueError(f"{where} is {shown(value)}"
                         + (f" ({_kind(value)})" if not isinstance(value, int) or
                            isinstance(value, bool) else "")
                         + f", not a whole number within {at_least}..{at_most}")
    return value


def flag(value: Any, where: str) -> bool:
    """``value`` where it is a JSON boolean.

    Raises:
        ValueError: naming ``where``.
    """
    if not isinstance(value, bool):
        raise ValueError(f"{where} is {shown(value)} ({_kind(value)}), not true or false")
    return value


def token_ids(value: Any, where: str, vocab: int | None = None) -> set[int]:
    """A config's token id (``eos_token_id``): one id, a list of them, or null (none), each a
    whole number within the vocabulary (``0..vocab - 1``, where ``vocab`` is given).

    Raises:
        ValueError: naming ``where`` and the id (or its index in the list).
    """
    if value is None:
        return set()
    top = MAX_INT if vocab is None else vocab - 1
    if isinstance(value, list):
        return {whole(v, f"{where}[{i}]", at_most=top) for i, v in enumerate(value)}
    return {whole(value, where, at_most=top)}


def shown(value: Any) -> str:
    """A value as a message quotes it: its repr, cut to 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# mrope: Qwen2-VL's multimodal RoPE, the default frequencies (its config classes rename it
# default; the sections are mrope_section's, read by a field).
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope", "proportional",
              "mrope")
# Each rope type's numbers: (key, needed, check) with check "positive" (finite, above 0),
# "number" (finite), "whole" (1..MAX_INT), "flag", or "factors" (a list of positive numbers).
ROPE_KEYS = {
    "linear": [("factor", True, "positive")],
    "dynamic": [("factor", True, "positive")],
    "llama3": [("factor", True, "positive"), ("low_freq_factor", True, "positive"),
               ("high_freq_factor", True, "positive"),
               ("original_max_position_embeddings", True, "whole")],
    "yarn": [("factor", True, "positive"), ("original_max_position_embeddings", True, "whole"),
             ("attention_factor", False, "positive"), ("beta_fast", False, "positive"),
             ("beta_slow", False, "positive"), ("mscale", False, "number"),
             ("mscale_all_dim", False, "number"), ("truncate", False, "flag")],
    "longrope": [("short_factor", True, "factors"), ("long_factor", True, "factors"),
                 ("factor", False, "positive"), ("attention_factor", False, "positive"),
                 ("original_max_position_embeddings", False, "whole")],
    "proportional": [("factor", False, "positive"), ("partial_rotary_factor", False, "positive")],
}


def rope_scaling(scaling: Any, where: str, theta: float) -> None:
    """A RoPE scaling table (transformers' ``rope_parameters`` / ``rope_scaling``) whose every
    number ``operators.rope`` reads is usable: its type one of ``ROPE_TYPES``; each parameter
    the type reads present where transformers requires it (``_validate_*_rope_parameters``)
    and finite, positive where it divides or scales, a whole number where it counts
    positions; llama3's ``high_freq_factor`` above its ``low_freq_factor`` (the band between
    divides by their difference); yarn with a ``theta`` above 1 (its correction range
    divides by ``log(theta)``); longrope's original context at least 2 (its attention factor
    divides by its log). A null (or empty) table is no scaling.

    Raises:
        ValueError: naming ``where`` and the key (``...: rope_parameters.factor is nan, not
            a finite number above 0``).
    """
    if scaling is None:
        return
    if not isinstance(scaling, Mapping):
        raise ValueError(f"{where} is {shown(scaling)} ({_kind(scaling)}), not a mapping of "
                         "RoPE parameters or null")
    if not scaling:
        return
    type_key = "rope_type" if "rope_type" in scaling else "type"
    kind = scaling.get(type_key, "default")
    if kind is None:
        kind = "default"
    if not isinstance(kind, str) or kind not in ROPE_TYPES:
        raise ValueError(f"{where}.{type_key} is {shown(kind)}, not one of {', '.join(ROPE_TYPES)}")
    for key, needed, check in ROPE_KEYS.get(kind, []):
        at = f"{where}.{key}"
        if scaling.get(key) is None:
            if needed:
                raise ValueError(f"{at} is missing: rope_type {kind} needs it")
            continue
        CHECKS[check](scaling[key], at)
    if kind == "llama3" and scaling["high_freq_factor"] < scaling["low_freq_factor"]:
        # Equal factors are an empty band (Llama-4-Scout's 1.0 and 1.0): every frequency is
        # scaled or kept, none smoothed, as transformers' _compute_llama3_parameters gives.
        raise ValueError(f"{where}.high_freq_factor {scaling['high_freq_factor']} is below "
                         f"low_freq_factor {scaling['low_freq_factor']} (the band between them "
                         "is from low to high)")
    if kind == "longrope" and scaling.get("original_max_position_embeddings") is not None \
            and scaling["original_max_position_embeddings"] < 2:
        raise ValueError(f"{where}.original_max_position_embeddings is "
                         f"{scaling['original_max_position_embeddings']}: longrope's attention "
                         "factor divides by its log, so it must be at least 2")
    if kind == "yarn" and not theta > 1:
        raise ValueError(f"rope_theta {theta:g} with {where}.rope_type yarn: yarn's correction "
                         "range divides by log(rope_theta), so it must be above 1")
    if kind == "proportional" and scaling.get("partial_rotary_factor") is not None:
        number(scaling["partial_rotary_factor"], f"{where}.partial_rotary_factor", above=0,
               at_most=1)


def _factors(value: Any, at: str) -> None:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{at} is {shown(value)}, not a list of numbers")
    for i, v in enumerate(value):
        number(v, f"{at}[{i}]", above=0)


#: The named checks the tables above and below use: each takes (value, where) and raises
#: ValueError naming where.
CHECKS = {
    "positive": lambda v, at: number(v, at, above=0),
    "number": lambda v, at: number(v, at),
    "whole": lambda v, at: whole(v, at, at_least=1),
    "count": lambda v, at: whole(v, at),
    "flag": lambda v, at: flag(v, at),
    "factors": _factors,
    "temperature": lambda v, at: number(v, at, at_least=0),
    "top_p": lambda v, at: number(v, at, above=0, at_most=1),
    "probability": lambda v, at: number(v, at, at_least=0, at_most=1),
}


# generation_config.json's keys a run reads, each with its check.
GENERATION = {"do_sample": "flag", "temperature": "temperature", "top_k": "count",
              "top_p": "top_p", "min_p": "probability", "repetition_penalty": "positive",
              "presence_penalty": "number"}
TOKEN_KEYS = ("eos_token_id", "bos_token_id", "pad_token_id")


def generation_config(data: Mapping[str, Any], source: str, vocab: int | None = None) -> None:
    """generation_config.json's settings a run reads, each where it is not null: ``do_sample``
    a boolean, ``temperature`` a finite number >= 0, ``top_k`` a whole number >= 0,
    ``top_p`` and ``min_p`` within 0..1, ``repetition_penalty`` above 0, ``presence_penalty``
    finite; its token ids as ``token_ids``.

    Raises:
        ValueError: naming ``source`` and the key.
    """
    for key, check in GENERATION.items():
        value = data.get(key)
        if value is None:
            continue
        CHECKS[check](value, f"{source}: {key}")
    for key in TOKEN_KEYS:
        token_ids(data.get(key), f"{source}: {key}", vocab)


def architectures(data: Mapping[str, Any], source: str) -> None:
    """config.json's ``architectures``, where given: a list of class names, as transformers
    writes it (a bare name would be read letter by letter).

    Raises:
        ValueError: naming ``source`` and the key.
    """
    archs = data.get("architectures")
    if archs is None:
        return
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        hint = f" (write [{archs!r}])" if isinstance(archs, str) else ""
        raise ValueError(f"{source}: architectures is {shown(archs)}, not a list of class "
                         f"names{hint}")

