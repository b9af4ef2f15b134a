"""A ``towers`` entry of ``kind: axial``: Gemma 4's vision tower
(``runtime.towers.axial``) and its ``aspect_patches`` front end
(``runtime.towers.aspect_images``).

Its encoder is read from the entry's ``layer`` as any tower's (heads, kv heads, head_dim,
intermediate size, the RMSNorm's eps, the MLP's act: ``encoder.expand_encoder``); beside it:
``patches.size`` (pixels a side), ``pool`` (``pooling_kernel_size``), ``positions`` (the 2-D
position table's places a side, ``position_embedding_size``), ``rope`` (the axial RoPE's
theta), ``rope_type`` (``axial``, the only one) and ``standardize`` (``(x - std_bias) * std_scale`` after pooling).

Not for: SigLIP- and CLIP-style towers (``towers``), building the tree (``spec.towers``).
"""

from __future__ import annotations

from typing import Any, Mapping

from iron_spec.runtime.towers.aspect_images import AspectPatchProcessor
from iron_spec.runtime.towers.axial import AxialTowerOptions

from ..config import Resolved
from .reading import _flag_option, _number, _option, _whole

KINDS = ("encoder", "axial", "conformer")


def kind(entry) -> str:
    """The tower's kind: ``encoder`` (default: ``runtime.towers.tower``), ``axial`` or
    ``conformer`` (``conformer_towers``: Gemma 4's audio tower).

    Raises:
        SpecError: another.
    """
    k = entry.view.get("kind", default="encoder")
    if k not in KINDS:
        raise entry.view.error(("kind",), f"tower kind {k!r} is not one of {', '.join(KINDS)}")
    return k


def vision_options(entry, r: Resolved, encoder, text_hidden: int) -> AxialTowerOptions:
    """The options of a ``axial`` tower over its resolved fields ``r`` and encoder
    options ``encoder`` (``runtime.encoder_options.EncoderOptions``).

    Raises:
        SpecError: at the option's line, a size, window or table that is no whole number from
            1, a theta that is no number, or layers of differing shapes.
    """
    v = entry.view
    values = {}
    for path in (("patches", "size"), ("pool",), ("positions",)):
        value = _whole(v, path, _option(v, r, path, None))
        if value is None or value < 1:
            raise v.error(path, f"{'.'.join(path)} is {value!r}, not a whole number from 1")
        values[path[-1]] = value
    kind = _option(v, r, ("rope_type",), "axial")
    if kind != "axial":
        # Gemma4VisionRotaryEmbedding raises on any other.
        raise v.error(("rope_type",), f"rope_type is {kind!r}: an axial tower's RoPE is axial, "
                                      "no other")
    theta = _number(v, ("rope",), _option(v, r, ("rope",), None))
    if theta is None or theta <= 0:
        raise v.error(("rope",), f"rope is {theta!r}: the axial RoPE's theta, a number above 0")
    layers = encoder.layers
    first = layers[0]
    if any((lo.heads, lo.kv_heads, lo.head_dim, lo.intermediate_size, lo.act)
           != (first.heads, first.kv_heads, first.head_dim, first.intermediate_size, first.act)
           for lo in layers):
        raise v.error(("layer",), "a axial tower's layers share one shape")
    return AxialTowerOptions(
        hidden_size=encoder.hidden_size, layers=len(layers), heads=first.heads,
        kv_heads=first.kv_heads or first.heads, head_dim=first.head_dim,
        intermediate_size=first.intermediate_size, eps=first.norm.eps, act=first.act,
        patch=values["size"], pool=values["pool"], positions=values["positions"],
        rope_theta=theta, text_hidden=text_hidden,
        standardize=_flag_option(v, r, ("standardize",), False))


def image_front(entry, settings: Mapping[str, Any], source: str, front_settings
                ) -> AspectPatchProcessor:
    """The ``aspect_patches`` front end on ``settings`` (preprocessor_config.json's, or
    processor_config.json's ``image_processor``) over ``front.defaults``, each key read,
    ignored or refused (``front_settings``: ``towers._front_settings``).

    Raises:
        SpecError: at ``front``, an unread or refused key, or settings the processor refuses.
    """
    known = {"patch_size", "max_soft_tokens", "pooling_kernel_size", "resample", "do_resize",
             "do_rescale", "rescale_factor", "do_normalize", "image_mean", "image_std",
             "do_convert_rgb"}
    merged = front_settings(entry, settings, source, known)
    try:
        return AspectPatchProcessor(**{k: tuple(x) if isinstance(x, list) else x
                                       for k, x in merged.items()})
    except (TypeError, ValueError) as e:
        raise entry.view.error(("front",), f"{source}: {e}") from None


def check_front(front: AspectPatchProcessor, o: AxialTowerOptions) -> None:
    """The front end's patches and pooling are the tower's (checked where an image is
    given, not at load: a composite checkpoint without its processor's files still serves
    text).

    Raises:
        ValueError: a patch_size or pooling_kernel_size other than the tower's.
    """
    if (front.patch_size, front.pooling_kernel_size) != (o.patch, o.pool):
        raise ValueError(f"the image processor gives patches of {front.patch_size} pixels "
                         f"pooled {front.pooling_kernel_size}x (patch_size, "
                         f"pooling_kernel_size), the tower takes {o.patch}-pixel patches "
                         f"pooled {o.pool}x (preprocessor_config.json, else the class "
                         "defaults, against vision_config)")
