"""Reading a spec's RoPE tables (``rope/NAME``) into ``runtime.blocks.rope.RopeOptions``:
theta, scaling, partial rotary width, the NTK alpha and the queries' scale; a table of its
own for layers whose per-layer fields change it; each error at the option's own line.

Not for: which table a layer reads (``attention``), computing the tables
(``runtime.blocks.rope``).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from iron_spec.operators.rope import ntk_alpha_theta, rope_inv_freq
from iron_spec.runtime.blocks.rope import RopeOptions
from iron_spec.runtime.values import rope_scaling

from ..config import Resolved
from ..loader import Spec
from .reading import _flag_option, _number, _option, _positive, _typed, _whole


def _own_tables(spec: Spec, built: dict, fields: dict, ropes: dict[str, RopeOptions],
                source: str) -> None:
    """Give each layer whose own fields (read per layer, ``{layer}``) make its rope table's
    options differ from the table's (over its first reader's fields) a table of its own,
    ``NAME#i``, shared by the layers those options agree for: GraniteSWAModel's one rotary
    embedding per distinct ``layer_rope_theta``. ``built`` (layer key -> options) and
    ``ropes`` are updated in place; ``fields``: each key's resolved fields."""
    for key, lo in list(built.items()):
        name = lo.attention.rope
        if name is None or name not in ropes:
            continue
        mine = rope_options(spec, fields[key], name, source)
        if mine == ropes[name]:
            continue
        same = [n for n, ro in ropes.items() if n.startswith(name + "#") and ro == mine]
        table = same[0] if same else f"{name}#{sum(n.startswith(name + '#') for n in ropes) + 1}"
        ropes[table] = mine
        built[key] = replace(lo, attention=replace(lo.attention, rope=table))


def rope_options(spec: Spec, r: Resolved, name: str, source: str) -> RopeOptions:
    """The options of the RoPE table ``rope/name`` over ``r``'s fields.

    Raises:
        SpecError: at the option's own line, a value of the wrong type, an unknown or
            incomplete scaling, or frequencies float32 cannot hold.
    """
    p = ("rope", name)
    scaling = _option(spec, r, p + ("scaling",), None)
    _typed(spec, p + ("scaling",), scaling, dict, "a rope_scaling mapping or null")
    original = _option(spec, r, p + ("original_max_position_embeddings",), None)
    if scaling and original is not None and "original_max_position_embeddings" not in scaling:
        scaling = {**scaling, "original_max_position_embeddings": _whole(
            spec, p + ("original_max_position_embeddings",), original)}
    theta = _positive(spec, p + ("theta",), _option(spec, r, p + ("theta",), None))
    try:
        rope_scaling(scaling, _key(spec, r, p + ("scaling",), source), theta)
    except ValueError as e:
        raise spec.error(p + ("scaling",), str(e)) from None
    rotary_dim = _whole(spec, p + ("rotary_dim",), _option(spec, r, p + ("rotary_dim",), "head_dim"))
    theta, scaling = _ntk_alpha(spec, r, p, theta, scaling, rotary_dim)
    rope = RopeOptions(
        theta=theta,
        rotary_dim=rotary_dim,
        scaling=scaling,
        max_position_embeddings=_whole(spec, p + ("max_position_embeddings",), _option(
            spec, r, p + ("max_position_embeddings",), "max_position_embeddings")),
        interleaved=_flag_option(spec, r, p + ("interleaved",), False),
        negated=_flag_option(spec, r, p + ("negated",), False),
        query_scale=_query_scale(spec, r, p),
        sections=_sections(spec, r, p, rotary_dim))
    _finite_frequencies(spec, p, rope, f"{_key(spec, r, p + ('theta',), source)} "
                        f"and {_key(spec, r, p + ('scaling',), source)}")
    return rope


def _query_scale(spec: Spec, r: Resolved, path: tuple) -> tuple[float, int] | None:
    """``rope/NAME/query_scale``: ``(beta, period)`` (``RopeOptions.query_scale``); None where
    it or its beta is null.

    Raises:
        SpecError: at the option, a beta that is no finite number, or a period that is not a
            whole number >= 1.
    """
    at = path + ("query_scale",)
    if spec.get(*at) is None:
        return None
    beta = _number(spec, at + ("beta",), _option(spec, r, at + ("beta",), None))
    if beta is None:
        return None
    period = _whole(spec, at + ("period",), _option(spec, r, at + ("period",), None))
    if period is None or period < 1:
        raise spec.error(at + ("period",), f"query_scale.period is {period}, not a whole number "
                         ">= 1 (the context past which queries grow)")
    return beta, period


def _sections(spec: Spec, r: Resolved, path: tuple, rotary_dim: int) -> tuple[int, ...] | None:
    """``rope/NAME/sections``: the M-RoPE sections of the table's ``rotary_dim // 2``
    columns (``RopeOptions.sections``, Qwen2-VL's ``mrope_section``); None where null.

    Raises:
        SpecError: at the option, sections that are no list of whole numbers from 1
            summing to ``rotary_dim // 2``.
    """
    at = path + ("sections",)
    value = _option(spec, r, at, None)
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not value or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value) \
            or sum(value) != rotary_dim // 2:
        raise spec.error(at, f"sections is {value!r}: whole numbers from 1 summing to the "
                             f"table's {rotary_dim // 2} column pairs (rotary_dim // 2)")
    return tuple(value)


def _ntk_alpha(spec: Spec, r: Resolved, path: tuple, theta: float, scaling: dict | None,
               dim: int | None) -> tuple[float, dict | None]:
    """``rope/NAME/ntk_alpha`` applied: where it is set (not null, not 0) and ``scaling``'s
    rope_type is ``dynamic``, the table is static, at base ``theta * alpha ** (dim / (dim -
    2))`` and no scaling, as HunYuanDenseV1RotaryEmbedding (rope_type ``ntk_alpha``, which
    ``dynamic_rope_update`` leaves alone); with another rope_type ``alpha`` is not read, as
    there. Else ``theta`` and ``scaling`` as they are.

    Raises:
        SpecError: at the option, an alpha that is not a number above 0, or a table of 2
            columns (the power divides by ``dim - 2``).
    """
    at = path + ("ntk_alpha",)
    alpha = _number(spec, at, _option(spec, r, at, None))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type"))
    if not alpha or kind != "dynamic":
        return theta, scaling
    if alpha < 0:
        raise spec.error(at, f"ntk_alpha is {alpha:g}, not a number above 0")
    try:
        return ntk_alpha_theta(theta, alpha, dim), None
    except ValueError as e:
        raise spec.error(at, str(e)) from None


def _finite_frequencies(spec: Spec, path: tuple, rope: RopeOptions, where: str) -> None:
    """Refuse a RoPE table whose parameters, each valid alone, give frequencies float32
    cannot hold (a theta of 1e-300 is 0 in float32, and every angle then NaN); ``where``
    names the keys they came from."""
    with np.errstate(all="ignore"):
        try:
            inv, attention = rope_inv_freq(rope.rotary_dim, rope.theta, rope.scaling)
        except (ValueError, OverflowError, ZeroDivisionError) as e:
            raise spec.error(path, f"rope table {path[-1]!r}: {e}") from None
    if not (np.isfinite(inv).all() and math.isfinite(attention)):
        raise spec.error(path, f"rope table {path[-1]!r}: theta {rope.theta:g} and scaling "
                               f"{rope.scaling} ({where}) give frequencies float32 cannot "
                               "hold (NaN or infinite)")


def _key(spec: Spec, r: Resolved, path: tuple, source: str) -> str:
    """Where the option at ``path`` comes from, as an error names it: ``FILE: KEY`` of the
    config.json key its one field reads, else the option itself."""
    raw = spec.get(*path)
    got = r.sources.get(raw, "") if isinstance(raw, str) else ""
    if got.startswith(f"{source}: "):
        return got.split(" (from ")[0].split(" if_null")[0]
    return ".".join(map(str, path))
