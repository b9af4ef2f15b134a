"""A ``towers`` entry whose front end is ``grid`` (Qwen2-VL's and Qwen2.5-VL's smart resize):
its tower's options (``runtime.towers.qwen_vision.QwenVisionOptions``) and its front end
(``runtime.towers.qwen_images.GridProcessor``).

The entry's own keys beside ``options.towers``' shared ones:

- ``patches``: ``{size, channels, temporal}`` (the Conv3d's kernel: ``patch_size``,
  ``in_channels``, ``temporal_patch_size``); ``merge``: the merger's block side
  (``spatial_merge_size``);
- ``windows``: ``{size, full}``: a window's side in pixels (``window_size``) and the blocks
  attending within the whole image (``fullatt_block_indexes``); absent: every block within the
  whole image (Qwen2-VL);
- ``layer``: read as an encoder layer's (``norm.kind`` rms or layer, ``norm.eps``,
  ``mlp.kind`` gated or plain, ``mlp.act``); ``rope_theta``: the 2-D RoPE's base (10000).

Not for: building the tree (``iron_spec.spec.towers``).
"""

from __future__ import annotations

from typing import Any, Mapping

from iron_spec.operators.activation import ACTIVATIONS
from iron_spec.runtime.blocks.norms import NormOptions
from iron_spec.runtime.towers.qwen_images import GridProcessor
from iron_spec.runtime.towers.qwen_vision import MLPS, QwenVisionOptions

from ..config import Resolved
from .reading import _option, _whole
from .towers import TowerEntry, _front_settings


def qwen_vision_options(entry: TowerEntry, r: Resolved, text_hidden: int) -> QwenVisionOptions:
    """The tower's options over its resolved fields ``r``, projecting to ``text_hidden``
    (which the tower's ``out_hidden_size`` must equal).

    Raises:
        SpecError: at the option's line, a size that is no whole number from 1, a full
            block list that is no list of whole numbers, a norm, MLP or activation not
            built, or an output width other than the text model's.
    """
    v = entry.view

    def whole(path: tuple, default, least: int = 1) -> int:
        value = _whole(v, path, _option(v, r, path, default))
        if value is None or value < least:
            raise v.error(path, f"{'.'.join(map(str, path))} is {value!r}, not a whole "
                                f"number from {least}")
        return value

    values = r.values
    hidden, heads = values["hidden_size"], values["num_attention_heads"]
    full = _option(v, r, ("windows", "full"), None) or []
    if not isinstance(full, (list, tuple)) or any(
            isinstance(i, bool) or not isinstance(i, int) for i in full):
        raise v.error(("windows", "full"), f"windows.full is {full!r}, not a list of block "
                                           "indexes")
    norm_kind = v.get("layer", "norm", "kind", default="rms")
    if norm_kind not in ("rms", "layer"):
        raise v.error(("layer", "norm", "kind"), f"norm {norm_kind!r}: rms or layer")
    eps = float(_option(v, r, ("layer", "norm", "eps"), 1e-6))
    mlp = v.get("layer", "mlp", "kind", default="gated")
    if mlp not in MLPS:
        raise v.error(("layer", "mlp", "kind"), f"mlp {mlp!r} is not one of {', '.join(MLPS)}")
    act = _option(v, r, ("layer", "mlp", "act"), "silu")
    if act not in ACTIVATIONS:
        raise v.error(("layer", "mlp", "act"), f"act {act!r} is not one of "
                                               f"{', '.join(ACTIVATIONS)}")
    out = whole(("out",), values.get("out_hidden_size", text_hidden))
    if out != text_hidden:
        raise v.error(("out",), f"the tower's soft tokens are {out} wide "
                                f"(out_hidden_size), the text model {text_hidden}")
    return QwenVisionOptions(
        hidden=hidden, heads=heads, intermediate=values["intermediate_size"],
        depth=values["num_hidden_layers"], out=out,
        channels=whole(("patches", "channels"), 3), patch=whole(("patches", "size"), None),
        temporal=whole(("patches", "temporal"), 2), merge=whole(("merge",), 2),
        window=whole(("windows", "size"), 0, least=0), full=tuple(full),
        norm=NormOptions(norm_kind, eps), mlp=mlp, act=act,
        theta=float(_option(v, r, ("rope_theta",), 10000.0)))


def grid_processor(entry: TowerEntry, settings: Mapping[str, Any], source: str,
                   o: QwenVisionOptions) -> GridProcessor:
    """The ``grid`` front end on ``settings`` (preprocessor_config.json's) over the front
    end's ``defaults``, each key read, ignored or refused (as ``options.towers.processor``);
    ``min_pixels`` and ``max_pixels`` (the published files' spelling) are ``size``'s
    ``shortest_edge`` and ``longest_edge``, as Qwen2VLImageProcessor reads them.

    Raises:
        SpecError: at ``front``, as ``processor``, or patches other than the tower's.
    """
    known = {"size", "resample", "do_resize", "do_rescale", "rescale_factor", "do_normalize",
             "image_mean", "image_std", "do_convert_rgb", "patch_size",
             "temporal_patch_size", "merge_size"}
    settings = dict(settings)
    size = dict(settings.get("size") or {})
    for old, new in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
        if settings.get(old) is not None:
            size[new] = settings.pop(old)
    size = {k: size[k] for k in ("shortest_edge", "longest_edge") if k in size}
    if size:
        defaults = entry.view.get("front", "defaults", "size", default={}) or {}
        settings["size"] = {**defaults, **size}
    merged = _front_settings(entry, settings, source, known)
    try:
        front = GridProcessor(**{k: tuple(x) if isinstance(x, list) else x
                                 for k, x in merged.items()})
    except (TypeError, ValueError) as e:
        raise entry.view.error(("front",), f"{source}: {e}") from None
    mine = (front.patch_size, front.temporal_patch_size, front.merge_size)
    if mine != (o.patch, o.temporal, o.merge):
        raise entry.view.error(("front",), f"{source}: patches of {mine} (patch_size, "
                               f"temporal_patch_size, merge_size) for a tower of "
                               f"{(o.patch, o.temporal, o.merge)}")
    return front
