"""An image to an axial tower's patch rows, resized keeping its aspect ratio within a patch budget,
as transformers' ``Gemma4ImageProcessorPil`` (Gemma 4's).

Resized (Pillow, ``resample``; bicubic by default) to the largest size of its aspect ratio
whose sides are multiples of ``pooling_kernel_size * patch_size`` and whose patches number at
most ``max_soft_tokens * pooling_kernel_size ** 2`` (``get_aspect_ratio_preserving_size``),
rescaled (not normalized: the tower takes ``2 * (x - 0.5)`` itself), then cut into row-major
patches of ``patch_size ** 2 * 3`` values, channels last (``convert_image_to_patches``).
The processor pads the rows to its budget with positions (-1, -1), which its tower masks
out: here the image's own rows and its grid are given.

Not for: the tower (``axial``), other families' processors (``images``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .images import ImageProcessor, resized

#: The soft-token budgets AspectPatchProcessor takes (its ``_SUPPORTED_SOFT_TOKENS``).
SOFT_TOKEN_BUDGETS = (70, 140, 280, 560, 1120)


def aspect_preserving_size(height: int, width: int, patch: int, max_patches: int,
                           pool: int) -> tuple[int, int]:
    """The ``(height, width)`` an image is resized to, as transformers'
    ``get_aspect_ratio_preserving_size``.

    Raises:
        ValueError: an image that would be resized to nothing, or past the budget.
    """
    factor = math.sqrt(max_patches * patch ** 2 / (height * width))
    side = pool * patch
    h = int(math.floor(factor * height / side)) * side
    w = int(math.floor(factor * width / side)) * side
    if h == 0 and w == 0:
        raise ValueError(f"an image of {height}x{width} pixels resizes to nothing at "
                         f"{side}-pixel multiples")
    longest = (max_patches // pool ** 2) * side
    if h == 0:
        h, w = side, min(int(math.floor(width / height)) * side, longest)
    elif w == 0:
        w, h = side, min(int(math.floor(height / width)) * side, longest)
    if h * w > max_patches * patch ** 2:
        raise ValueError(f"an image of {height}x{width} pixels resized to {h}x{w} exceeds "
                         f"{max_patches} patches of {patch} pixels")
    return h, w


@dataclass(frozen=True)
class AspectPatchProcessor:
    """``Gemma4ImageProcessorPil``'s settings (its preprocessor_config.json over the class
    defaults): ``patch_size``, ``max_soft_tokens`` (one of ``SOFT_TOKEN_BUDGETS``),
    ``pooling_kernel_size``, ``resample``, ``do_resize``, ``do_rescale``, ``rescale_factor``,
    ``do_normalize``, ``image_mean``, ``image_std``, ``do_convert_rgb``."""

    patch_size: int = 16
    max_soft_tokens: int = 280
    pooling_kernel_size: int = 3
    resample: int = 3
    do_resize: bool = True
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = False
    image_mean: tuple = (0.0, 0.0, 0.0)
    image_std: tuple = (1.0, 1.0, 1.0)
    do_convert_rgb: bool = True

    def __post_init__(self):
        if self.max_soft_tokens not in SOFT_TOKEN_BUDGETS:
            raise ValueError(f"max_soft_tokens {self.max_soft_tokens!r} is not one of "
                             f"{SOFT_TOKEN_BUDGETS} (AspectPatchProcessor's)")

    @property
    def max_patches(self) -> int:
        return self.max_soft_tokens * self.pooling_kernel_size ** 2

    def _pixels(self) -> ImageProcessor:
        # The shared RGB conversion, rescale and normalize (ImageProcessor's); its size unread.
        return ImageProcessor(size={"height": 1, "width": 1}, resample=self.resample,
                              do_resize=False, do_rescale=self.do_rescale,
                              rescale_factor=self.rescale_factor,
                              do_normalize=self.do_normalize, image_mean=self.image_mean,
                              image_std=self.image_std, do_convert_rgb=self.do_convert_rgb)

    def __call__(self, image) -> tuple[np.ndarray, tuple[int, int]]:
        """The pixel rows ``(rows * cols, patch_size ** 2 * 3)`` float32 of ``image`` (a
        path, a PIL image or a uint8 array), equal to the unpadded rows of transformers'
        ``pixel_values``, and the grid ``(rows, cols)`` of patches.

        Raises:
            as ``images.open_image``; ValueError: an image the resize refuses.
        """
        front = self._pixels()
        array = front.rgb(image)
        if self.do_resize:
            h, w = aspect_preserving_size(array.shape[0], array.shape[1], self.patch_size,
                                          self.max_patches, self.pooling_kernel_size)
            if (h, w) != array.shape[:2]:
                array = resized(array, h, w, self.resample)
        x = front.scaled(array)  # (3, H, W)
        p = self.patch_size
        C, H, W = x.shape
        rows, cols = H // p, W // p
        x = x[:, :rows * p, :cols * p].reshape(C, rows, p, cols, p).transpose(1, 3, 2, 4, 0)
        return np.ascontiguousarray(x.reshape(rows * cols, -1), np.float32), (rows, cols)
