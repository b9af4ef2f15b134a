"""Reading an encoder spec's option sections into their runtime options: the layer's
bottleneck, feedforwards, pointwise groups and span convolution, its attention's
disentangled, landmark and relative-position variants, the word transform and the languages, each
error at the option's own line.

Not for: the whole expansion and loading (``iron_spec.spec.encoder``).
"""

from __future__ import annotations

from typing import Any

from iron_spec.runtime.encoder_options import BottleneckOptions, DisentangledOptions, \
    LandmarkOptions, PointwiseGroups, RelativeBiasOptions
from iron_spec.runtime.values import MAX_INT

from ..config import Resolved, whole_option
from ..loader import Spec
from .reading import _flag_option, _option


def _number(spec: Spec, r: Resolved, path: tuple, default: Any) -> float:
    v = _option(spec, r, path, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise spec.error(path, f"{'.'.join(map(str, path))} is {v!r}, not a number")
    return float(v)


def _whole(spec: Spec, r: Resolved, path: tuple, default: Any) -> int:
    """The option at ``path`` (``default`` where absent), a whole number within 0..MAX_INT
    (``config.whole_option``, as the causal parts read theirs)."""
    return whole_option(spec, r, path, spec.get(*path, default=default), 0, MAX_INT)


def _bottleneck(spec: Spec, r: Resolved) -> BottleneckOptions | None:
    """``layer.bottleneck``: its ``size`` (a whole number from 1), ``shared_query_key`` and
    ``attention_input``; None where the spec has none or its ``enabled`` is false.

    Raises:
        SpecError: at the option's line, a size that is no whole number from 1, or a flag
            that is no boolean.
    """
    p = ("layer", "bottleneck")
    if spec.get(*p) is None or not _flag_option(spec, r, p + ("enabled",), True):
        return None
    size = _whole(spec, r, p + ("size",), None)
    if size < 1:
        raise spec.error(p + ("size",), "a bottleneck of width 0: at least 1")
    return BottleneckOptions(size, _flag_option(spec, r, p + ("shared_query_key",), False),
                             _flag_option(spec, r, p + ("attention_input",), False))


def _pointwise(spec: Spec, r: Resolved) -> PointwiseGroups | None:
    """``layer.pointwise``: each projection's groups (whole numbers from 1, default 1), or
    None where the spec has none.

    Raises:
        SpecError: at the option's line, a count that is no whole number from 1.
    """
    p = ("layer", "pointwise")
    if spec.get(*p) is None:
        return None
    groups = {}
    for name in PointwiseGroups.__dataclass_fields__:
        g = _whole(spec, r, p + (name,), 1)
        if g < 1:
            raise spec.error(p + (name,), f"{name} in 0 groups: at least 1")
        groups[name] = g
    return PointwiseGroups(**groups)


def _counted(spec: Spec, r: Resolved, p: tuple, what: str) -> int | None:
    """The option at ``p``: a whole number from 1, or None where it is unset or null.

    Raises:
        SpecError: at the option's line, anything else.
    """
    if _option(spec, r, p, None) is None:
        return None
    k = _whole(spec, r, p, None)
    if k < 1:
        raise spec.error(p, f"{what} of 0: at least 1")
    return k


def _odd_kernel(spec: Spec, r: Resolved, p: tuple, what: str) -> int | None:
    """The option at ``p``: a convolution's kernel, an odd whole number, or None.

    Raises:
        SpecError: at the option's line, anything else.
    """
    k = _counted(spec, r, p, f"{what}'s kernel")
    if k is not None and k % 2 == 0:
        raise spec.error(p, f"{what}'s kernel is {k}: an odd number from 1 (an even one "
                            "pads the rows unevenly, past the queries' rows)")
    return k


def _span_conv(spec: Spec, r: Resolved) -> int | None:
    """``layer.attention.span_conv``: the dynamic convolution's kernel, an odd whole number
    (ConvBERT's ``conv_kernel_size``), or None.

    Raises:
        SpecError: at the option's line, anything else.
    """
    return _odd_kernel(spec, r, ("layer", "attention", "span_conv"), "a span convolution")


def _landmarks(spec: Spec, r: Resolved) -> LandmarkOptions | None:
    """``layer.attention.landmarks``: ``count`` landmarks over ``segment`` rows (whole
    numbers from 1, ``segment`` a multiple of ``count``) and ``iterations`` of the
    pseudo-inverse (default 6); None where the spec has none.

    Raises:
        SpecError: at the option's line, a value outside those.
    """
    p = ("layer", "attention", "landmarks")
    if spec.get(*p) is None:
        return None
    count, segment = _whole(spec, r, p + ("count",), None), _whole(spec, r, p + ("segment",), None)
    if count < 1 or segment < 1 or segment % count:
        raise spec.error(p + ("segment",), f"{segment} rows do not split into {count} landmark "
                                           "segments: segment a multiple of count, both from 1")
    return LandmarkOptions(count, segment, _whole(spec, r, p + ("iterations",), 6))


def _lsh_expectation(spec: Spec, r: Resolved) -> int | None:
    """``layer.attention.lsh_expectation``: the hash bits (YOSO's ``hash_code_len``), a
    whole number from 1, or None.

    Raises:
        SpecError: at the option's line, anything else.
    """
    return _counted(spec, r, ("layer", "attention", "lsh_expectation"),
                    "LSH-expectation attention's hash bits")


def _value_conv(spec: Spec, r: Resolved) -> int | None:
    """``layer.attention.value_conv``: the values' convolution's kernel, an odd whole number
    (Nystromformer's ``conv_kernel_size``), or None.

    Raises:
        SpecError: at the option's line, anything else.
    """
    return _odd_kernel(spec, r, ("layer", "attention", "value_conv"), "a value convolution")


def _feedforwards(spec: Spec, r: Resolved) -> int:
    """``layer.feedforwards``: MLPs per layer, a whole number from 1 (default 1).

    Raises:
        SpecError: at the option's line, anything else.
    """
    n = _whole(spec, r, ("layer", "feedforwards"), 1)
    if n < 1:
        raise spec.error(("layer", "feedforwards"), "0 feedforwards: at least the layer's own 1")
    return n


def _word_transform(spec: Spec, r: Resolved) -> dict[str, Any]:
    """``embedding.word_transform``: the word table's ``size`` and ``trigram``, as
    ``EncoderOptions``' ``word_size`` and ``trigram`` (none: ``{}``).

    Raises:
        SpecError: at the option's line, a size that is no whole number from 1, or a trigram
            flag that is no boolean.
    """
    p = ("embedding", "word_transform")
    if spec.get(*p) is None:
        return {}
    size = _whole(spec, r, p + ("size",), None)
    if size < 1:
        raise spec.error(p + ("size",), "word embeddings of width 0: at least 1")
    return {"word_size": size, "trigram": _flag_option(spec, r, p + ("trigram",), False)}


def _no_attention_options(spec: Spec) -> None:
    """A layer mixing its rows without attention (``layer/mixing`` other than ``attention``)
    reads no attention option and no RoPE table.

    Raises:
        SpecError: at the first attention option or the ``rope:`` section.
    """
    a = ("layer", "attention")
    for key in spec.get(*a, default=None) or {}:
        raise spec.error(a + (key,), f"layer/mixing {spec.get('layer', 'mixing')!r} holds no "
                                     f"attention: leave layer/attention/{key} out")
    if spec.get("rope", default=None):
        raise spec.error(("rope",), "a layer mixing its rows without attention turns nothing "
                                    "by RoPE: leave rope: out")


DISENTANGLED_TYPES = ("c2p", "p2c")


def _disentangled(spec: Spec, r: Resolved) -> DisentangledOptions | None:
    """``layer.attention.disentangled``: its ``span`` (``max_relative_positions``), the
    terms ``types`` lists (pos_att_type: a list, or words joined by ``|`` as DebertaConfig's
    ``__post_init__`` splits them; null: none), ``qv_bias``, DeBERTa-v2's ``buckets`` (0 or
    null: none) with ``max_position``, ``share_att_key``, ``pos_key_bias`` and ``norm_rel``;
    None where the spec has none.

    Raises:
        SpecError: at the option's line, a span that is no whole number from 1, types that
            are not a list of ``c2p``/``p2c`` (each once), a flag that is no boolean, or
            log buckets fewer than 4 or not below twice ``max_position - 1``.
    """
    p = ("layer", "attention", "disentangled")
    if spec.get(*p) is None:
        return None
    span = _whole(spec, r, p + ("span",), None)
    if span < 1:
        raise spec.error(p + ("span",), "disentangled attention's span is 0: at least 1 "
                                        "relative position each side")
    types = _option(spec, r, p + ("types",), None)
    if isinstance(types, str):
        types = [t.strip() for t in types.lower().split("|")]
    types = [] if types is None else types
    if not isinstance(types, list) or any(t not in DISENTANGLED_TYPES for t in types) \
            or len(set(types)) != len(types):
        raise spec.error(p + ("types",), f"disentangled attention's types are {types!r}: a "
                                         f"list of {', '.join(DISENTANGLED_TYPES)}, each once "
                                         "(or one string of them joined by |)")
    buckets = _option(spec, r, p + ("buckets",), 0)
    buckets = 0 if buckets is None else _whole(spec, r, p + ("buckets",), 0)
    top = _whole(spec, r, p + ("max_position",), 0) if buckets else 0
    if buckets and (buckets < 4 or top - 1 <= buckets // 2):
        raise spec.error(p + ("buckets",), f"{buckets} log buckets up to max_position {top}: "
                                           "at least 4 buckets, and max_position - 1 past "
                                           "half of them")
    return DisentangledOptions(span, "c2p" in types, "p2c" in types, 1 + len(types),
                               _flag_option(spec, r, p + ("qv_bias",), False), buckets, top,
                               _flag_option(spec, r, p + ("share_att_key",), False),
                               _flag_option(spec, r, p + ("pos_key_bias",), False),
                               _flag_option(spec, r, p + ("norm_rel",), False))


def _languages(spec: Spec, r: Resolved) -> dict[str, int]:
    """``embedding.languages``: the language table's ``rows`` (0: none) and the ``default``
    language of a call that names none, as ``EncoderOptions``' ``languages`` and
    ``language``.

    Raises:
        SpecError: at the option's line, rows or a default that is no whole number, or a
            default outside the table's rows.
    """
    p = ("embedding", "languages")
    if spec.get(*p) is None:
        return {}
    rows = _whole(spec, r, p + ("rows",), None)
    if not rows:
        return {}
    default = _whole(spec, r, p + ("default",), 0)
    if default >= rows:
        raise spec.error(p + ("default",), f"default language {default} is outside the "
                                           f"language table's rows 0..{rows - 1}")
    return {"languages": rows, "language": default}


def _relative_bias(spec: Spec, r: Resolved, layers) -> RelativeBiasOptions | None:
    """``layer.attention.relative_bias``: the table's ``rows``, the bucket function's
    ``buckets`` and ``max_distance`` (``RelativeBiasOptions``); None where the spec has none.

    Raises:
        SpecError: at the option's line, a count that is no whole number, buckets fewer than
            4 or past the table's rows, a max_distance not past the exact buckets, or layers
            of different head counts (one table serves them all).
    """
    p = ("layer", "attention", "relative_bias")
    if spec.get(*p) is None:
        return None
    rows = _whole(spec, r, p + ("rows",), None)
    buckets = _whole(spec, r, p + ("buckets",), 32)
    distance = _whole(spec, r, p + ("max_distance",), 128)
    if buckets < 4 or buckets > rows:
        raise spec.error(p + ("buckets",), f"{buckets} relative buckets: at least 4, and no "
                                           f"more than the table's {rows} rows")
    if distance <= buckets // 4:
        raise spec.error(p + ("max_distance",), f"max_distance {distance} is not past the "
                                                f"{buckets // 4} exact buckets of a half")
    if len({lo.heads for lo in layers}) != 1:
        raise spec.error(p, "one relative bias table serves every layer: their head counts differ")
    for name, default in (("bidirectional", True), ("segment_pairs", False)):
        if _flag_option(spec, r, p + (name,), default) != default:
            raise spec.error(p + (name,), f"an encoder's relative bias is bidirectional, by "
                                          f"distance alone: {name} is a causal model's option")
    return RelativeBiasOptions(rows, buckets, distance)
