"""An image to Qwen2-VL's (and Qwen2.5-VL's) patch rows, as transformers'
``Qwen2VLImageProcessorPil`` computes them (the processor transformers picks wherever
torchvision is absent; its torchvision twin resizes by torch and differs by grey levels).

``GridProcessor(image)`` gives the ``pixel_values`` rows ``(h * w, channels * temporal *
patch * patch)`` float32 and the grid ``(h, w)`` in patches: the image converted to RGB,
resized by Pillow with ``resample`` to ``smart_resize``'s size (both sides whole multiples of
``patch * merge``, the area within ``[min_pixels, max_pixels]``, the aspect ratio kept as
closely as that allows), rescaled and normalized as ``images.ImageProcessor``, then cut into
patches written block by block (each ``merge`` x ``merge`` block of patches consecutive),
each patch repeated ``temporal`` times (an image is a video of one frame, copied to the
Conv3d's temporal kernel).

Not for: the tower (``qwen_vision``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .images import ImageProcessor, resized


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int
                 ) -> tuple[int, int]:
    """The (height, width) Qwen2-VL's processor resizes an image of ``height`` x ``width``
    to, as transformers' ``smart_resize``: each side rounded to a multiple of ``factor``,
    then scaled down (floor) where the area passes ``max_pixels`` or up (ceil) where it is
    under ``min_pixels``.

    Raises:
        ValueError: an aspect ratio over 200 (transformers' refusal).
    """
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"an image of {height}x{width}: its aspect ratio "
                         f"{max(height, width) / min(height, width):g} is over 200")
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


@dataclass(frozen=True)
class GridProcessor(ImageProcessor):
    """Qwen2VLImageProcessor's settings (``preprocessor_config.json``'s): ``size``
    ``{"shortest_edge": min_pixels, "longest_edge": max_pixels}`` (areas, not sides),
    ``patch_size``, ``temporal_patch_size``, ``merge_size``, and ``ImageProcessor``'s
    rescaling and normalization (resample 3, bicubic, by default)."""

    size: dict = None
    resample: int = 3
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2

    def __post_init__(self):
        if not isinstance(self.size, dict) or set(self.size) != {"shortest_edge",
                                                                 "longest_edge"}:
            raise ValueError(f"size {self.size!r} is {{shortest_edge, longest_edge}} "
                             "(min_pixels and max_pixels)")
        for name in ("patch_size", "temporal_patch_size", "merge_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} is {value!r}, not a whole number from 1")

    def resized_shape(self, height: int, width: int) -> tuple[int, int]:
        return smart_resize(height, width, self.patch_size * self.merge_size,
                            int(self.size["shortest_edge"]), int(self.size["longest_edge"]))

    def grid(self, image) -> tuple[int, int]:
        """The grid ``(h, w)`` in patches ``image`` gives (no pixel computed)."""
        from .images import open_image
        width, height = open_image(image).size
        h, w = self.resized_shape(height, width)
        return h // self.patch_size, w // self.patch_size

    def __call__(self, image) -> tuple[np.ndarray, tuple[int, int]]:
        """The patch rows ``(h * w, 3 * temporal * patch * patch)`` float32 of ``image`` (a
        path, a PIL image or a uint8 array), equal to transformers' ``pixel_values`` from
        this processor's PIL backend, and the grid ``(h, w)``.

        Raises:
            as ``ImageProcessor.__call__``.
        """
        array = self.rgb(image)
        if self.do_resize:
            array = resized(array, *self.resized_shape(*array.shape[:2]), self.resample)
        pixels = self.scaled(array)
        C, H, W = pixels.shape
        p, m, T = self.patch_size, self.merge_size, self.temporal_patch_size
        if H % (p * m) or W % (p * m):
            raise ValueError(f"an image of {H}x{W} pixels is not whole {p * m}-pixel merged "
                             "patches (do_resize false on an image of another size)")
        h, w = H // p, W // p
        x = pixels.reshape(C, h // m, m, p, w // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
        x = np.broadcast_to(x[:, :, :, :, :, None], x.shape[:5] + (T, p, p))
        return np.ascontiguousarray(x.reshape(h * w, C * T * p * p), np.float32), (h, w)
