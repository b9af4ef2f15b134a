"""Reading a layer's token mixers: ``layer.mixer`` (which, per type where a pattern says) and
each mixer's section (``layer.short_conv``, ``layer.selective_scan``, ``layer.ssd``,
``layer.gated_delta``) evaluated into ``runtime.layers.LayerOptions``' mixer fields
(``runtime.blocks``' options of each).

Each section's option defaults name the config fields of the family that brought the mixer
(``Lfm2Config``'s ``conv_L_cache``, ``MambaConfig``'s and ``Mamba2Config``'s ``state_size``,
``Qwen3NextConfig``'s ``linear_num_key_heads`` ...): a spec declares those fields, or names
its own in the section.
"""

from __future__ import annotations

import math
from typing import Any

from iron_spec.operators.causal_conv import CONV_ACTS
from iron_spec.runtime.blocks.delta_rule import DELTA_LAYOUTS, GatedDeltaOptions
from iron_spec.runtime.blocks.selective_scan import SelectiveScanOptions
from iron_spec.runtime.blocks.ssd import SSD_NORMS, SSDOptions
from iron_spec.runtime.blocks.short_conv import ShortConvOptions
from iron_spec.runtime.layers import MIXER_KINDS

from ..config import evaluate_option
from ..loader import Spec
from .reading import LayerReader

#: Each mixer section's options, their defaults (a config field's name, or a literal).
DEFAULTS = {
    "short_conv": {"kernel": "conv_L_cache", "bias": "conv_bias"},
    "selective_scan": {"inner": "intermediate_size", "state": "state_size",
                       "dt_rank": "time_step_rank", "conv_kernel": "conv_kernel",
                       "conv_bias": "use_conv_bias", "bias": "use_bias", "dtbc_norm": None,
                       "eps": "mixer_rms_eps", "act": "hidden_act"},
    "ssd": {"heads": "num_heads", "head_dim": "head_dim", "state": "state_size",
            "groups": "n_groups", "conv_kernel": "conv_kernel", "conv_bias": "use_conv_bias",
            "bias": "use_bias", "time_step_limit": "time_step_limit", "norm": "gate_first",
            "norm_groups": "n_groups", "eps": "layer_norm_epsilon", "inner": None,
            "projection_scales": None, "act": "hidden_act", "out_bias": None,
            "decode_limit": True},
    "gated_delta": {"k_heads": "linear_num_key_heads", "v_heads": "linear_num_value_heads",
                    "k_head_dim": "linear_key_head_dim", "v_head_dim": "linear_value_head_dim",
                    "conv_kernel": "linear_conv_kernel_dim", "layout": "grouped",
                    "eps": "rms_norm_eps", "act": "hidden_act"},
}


def mixer_options(spec: Spec, read: LayerReader) -> dict[str, Any]:
    """The ``LayerOptions`` fields of a layer's token mixers: ``mixer`` (a tuple of
    ``runtime.layers.MIXER_KINDS``), ``mixer_scales`` and the options of each state-carrying
    mixer it names.

    Raises:
        SpecError: at the option, an unknown mixer, a mixer named twice, ``none`` beside
            another, scales that are not one ``[in, out]`` pair per mixer, or what a
            mixer's section refuses.
    """
    raw, at = read.word("mixer", default="attention")
    kinds = tuple(raw) if isinstance(raw, list) else (raw,)
    if not kinds or any(k not in MIXER_KINDS for k in kinds) or len(set(kinds)) != len(kinds) \
            or ("none" in kinds and len(kinds) > 1):
        raise spec.error(at, f"layer mixer {raw!r} is not one of {', '.join(MIXER_KINDS)}, or a "
                             "list of distinct ones summed (none alone)")
    out: dict[str, Any] = {"mixer": kinds, "mixer_scales": _scales(spec, read, len(kinds))}
    for kind in kinds:
        if kind in DEFAULTS:
            out[kind] = BUILD[kind](spec, read)
    return out


def _scales(spec: Spec, read: LayerReader, count: int):
    raw, at = read.word("mixer_scales", default=None)
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) != count or not all(
            isinstance(p, list) and len(p) == 2 for p in raw):
        raise spec.error(at, f"mixer_scales are one [in, out] pair per mixer ({count}), not "
                             f"{raw!r}")
    return tuple(tuple(_evaluate(spec, read, at + (i, j), item) for j, item in enumerate(pair))
                 for i, pair in enumerate(raw))


def _evaluate(spec: Spec, read: LayerReader, at: tuple, raw: Any) -> float:
    """One number of a list option (``mixer_scales``, ``projection_scales``): a literal or an
    expression over the config fields."""
    value = evaluate_option(spec, at, raw, read.r, "a number") if isinstance(raw, str) \
        else raw
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise spec.error(at, f"{'.'.join(map(str, at))} is {value!r}, not a finite number")
    return float(value)


def _positive_whole(spec: Spec, read: LayerReader, *path) -> int:
    value = read.whole(*path, default=DEFAULTS[path[0]][path[1]])
    if value is None or value < 1:
        raise spec.error(read.word(*path)[1], f"{'.'.join(path)} is {value}, not a whole number "
                                              ">= 1")
    return value


def _maybe_flag(spec: Spec, read: LayerReader, section: str, name: str) -> bool | None:
    value, at = read.opt(section, name, default=DEFAULTS[section][name])
    if value is not None and not isinstance(value, bool):
        raise spec.error(at, f"{section}.{name} is {value!r}, not true, false or null")
    return value


def _eps(spec: Spec, read: LayerReader, section: str) -> float:
    value = read.number(section, "eps", default=DEFAULTS[section]["eps"])
    if value is None or not value > 0:
        raise spec.error(read.word(section, "eps")[1], f"{section}.eps is {value}, not a number "
                                                       "above 0")
    return value


def _word(spec: Spec, read: LayerReader, section: str, name: str, allowed) -> Any:
    value, at = read.word(section, name, default=DEFAULTS[section][name])
    if value not in allowed:
        raise spec.error(at, f"{section}.{name} is {value!r}, not one of "
                             f"{', '.join(map(str, allowed))}")
    return value


def _act(spec: Spec, read: LayerReader, section: str) -> str:
    """The convolution's activation: a field holding an ACT2FN name the causal convolution
    applies (silu, swish)."""
    value, at = read.opt(section, "act", default=DEFAULTS[section]["act"], expects="an activation")
    if value not in CONV_ACTS or value is None:
        raise spec.error(at, f"{section}.act is {value!r}: the causal convolution applies "
                             f"{', '.join(a for a in CONV_ACTS if a)} (transformers' "
                             "causal_conv1d_fn takes silu alone)")
    return value


def _short_conv(spec: Spec, read: LayerReader) -> ShortConvOptions:
    kernel = _positive_whole(spec, read, "short_conv", "kernel")
    if kernel < 2:
        raise spec.error(read.word("short_conv", "kernel")[1], "short_conv.kernel is 1: a "
                         "causal convolution of one tap carries no state (2 or more)")
    return ShortConvOptions(kernel=kernel, bias=read.flag("short_conv", "bias",
                                                           default=DEFAULTS["short_conv"]["bias"]))


def _selective_scan(spec: Spec, read: LayerReader) -> SelectiveScanOptions:
    s = "selective_scan"
    norm = _word(spec, read, s, "dtbc_norm", (None, "weighted", "weightless"))
    return SelectiveScanOptions(
        inner=_positive_whole(spec, read, s, "inner"), state=_positive_whole(spec, read, s, "state"),
        dt_rank=_positive_whole(spec, read, s, "dt_rank"),
        conv_kernel=_positive_whole(spec, read, s, "conv_kernel"),
        conv_bias=read.flag(s, "conv_bias", default=DEFAULTS[s]["conv_bias"]),
        bias=read.flag(s, "bias", default=DEFAULTS[s]["bias"]), dtbc_norm=norm,
        eps=_eps(spec, read, s) if norm is not None else 1e-6, act=_act(spec, read, s))


def _ssd(spec: Spec, read: LayerReader) -> SSDOptions:
    s = "ssd"
    raw, at = read.word(s, "time_step_limit", default=DEFAULTS[s]["time_step_limit"])
    if isinstance(raw, list):  # [min, max], each a literal or an expression (Zamba2's
        # (time_step_min, inf): Zamba2MambaMixer's time_step_limit)
        limit = [evaluate_option(spec, at + (i,), v, read.r, "a number") for i, v in
                 enumerate(raw)]
    else:
        limit, at = read.opt(s, "time_step_limit", default=DEFAULTS[s]["time_step_limit"])
    if not isinstance(limit, (list, tuple)) or len(limit) != 2 or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) for v in limit) or \
            not 0 <= limit[0] <= limit[1]:
        raise spec.error(at, f"ssd.time_step_limit is {limit!r}, not [min, max] with 0 <= "
                             "min <= max (clamping nothing: (0.0, inf))")
    norm = _word(spec, read, s, "norm", SSD_NORMS)
    heads, head_dim = _positive_whole(spec, read, s, "heads"), _positive_whole(spec, read, s, "head_dim")
    groups = _positive_whole(spec, read, s, "groups")
    if heads % groups:
        raise spec.error(read.word(s, "groups")[1], f"the SSD's {heads} heads do not split into "
                                                    f"{groups} groups")
    inner = read.whole(s, "inner", default=None)
    if inner is not None and inner != heads * head_dim:
        raise spec.error(read.word(s, "inner")[1], f"ssd.inner is {inner}, not its {heads} "
                         f"heads of {head_dim} (the scan's width)")
    norm_groups = _positive_whole(spec, read, s, "norm_groups") if norm != "none" else 1
    if (heads * head_dim) % norm_groups:
        raise spec.error(read.word(s, "norm_groups")[1], f"the SSD's norm groups {norm_groups} "
                         f"do not divide its width {heads * head_dim}")
    raw, at = read.word(s, "projection_scales", default=None)
    scales = None
    if raw is not None:
        if not isinstance(raw, list) or len(raw) != 5:
            value, _ = read.opt(s, "projection_scales", default=None)
            raw = value
        if not isinstance(raw, (list, tuple)) or len(raw) != 5:
            raise spec.error(at, f"ssd.projection_scales are five factors over in_proj's z, "
                                 f"x, B, C and dt (a list, or a field holding one), not {raw!r}")
        scales = tuple(_evaluate(spec, read, at + (i,), v) for i, v in enumerate(raw))
    return SSDOptions(
        heads=heads, head_dim=head_dim, state=_positive_whole(spec, read, s, "state"),
        groups=groups, conv_kernel=_positive_whole(spec, read, s, "conv_kernel"),
        conv_bias=read.flag(s, "conv_bias", default=DEFAULTS[s]["conv_bias"]),
        bias=read.flag(s, "bias", default=DEFAULTS[s]["bias"]),
        dt_min=float(limit[0]), dt_max=float(limit[1]), norm=norm, norm_groups=norm_groups,
        eps=_eps(spec, read, s), projection_scales=scales, act=_act(spec, read, s),
        out_bias=_maybe_flag(spec, read, s, "out_bias"),
        decode_limit=read.flag(s, "decode_limit", default=DEFAULTS[s]["decode_limit"]))


def _gated_delta(spec: Spec, read: LayerReader) -> GatedDeltaOptions:
    s = "gated_delta"
    k_heads, v_heads = _positive_whole(spec, read, s, "k_heads"), _positive_whole(spec, read, s, "v_heads")
    if v_heads % k_heads:
        raise spec.error(read.word(s, "v_heads")[1], f"the delta rule's {v_heads} value heads do "
                         f"not group over its {k_heads} key heads")
    return GatedDeltaOptions(
        k_heads=k_heads, v_heads=v_heads, k_head_dim=_positive_whole(spec, read, s, "k_head_dim"),
        v_head_dim=_positive_whole(spec, read, s, "v_head_dim"),
        conv_kernel=_positive_whole(spec, read, s, "conv_kernel"),
        layout=_word(spec, read, s, "layout", DELTA_LAYOUTS), eps=_eps(spec, read, s),
        act=_act(spec, read, s))


BUILD = {"short_conv": _short_conv, "selective_scan": _selective_scan, "ssd": _ssd,
         "gated_delta": _gated_delta}
