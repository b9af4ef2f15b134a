"""An image to a vision tower's input, as transformers' image processors compute it.

``ImageProcessor`` holds a processor's settings (a checkpoint's ``preprocessor_config.json``
over the processor class's defaults) and gives the pixel values ``(3, height, width)``
float32 its ``pixel_values`` hold: converted to RGB (transparency composited onto white),
resized by Pillow itself with the processor's ``resample`` (transformers' PIL backend,
``PilBackend.resize``: the default wherever torchvision is absent), cut at the centre where
the processor crops, rescaled (``uint8 * rescale_factor`` in float64, then float32, as
``image_transforms.rescale``) and normalized in float32 (``(x - mean) / std``, as
``image_transforms.normalize``). Resizing with Pillow is what makes the pixels equal to
transformers' bit for bit: any other resampler differs by up to a grey level.

``TileProcessor`` gives an image as tiles beside a global image, as Idefics3's (SmolVLM's)
image processor cuts it.

``patches`` cuts pixel values into the rows a patch embedding reads: a convolution whose
stride is its kernel is a reshape and a GEMM.

Not for: the tower that reads them (``tower``), audio (``audio``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: Pillow's resampling filters by the number transformers' ``PILImageResampling`` gives them.
RESAMPLE = {0: "NEAREST", 1: "LANCZOS", 2: "BILINEAR", 3: "BICUBIC", 4: "BOX", 5: "HAMMING"}


def pillow():
    """Pillow's ``PIL.Image``, imported where an image is first read.

    Raises:
        ImportError: Pillow is not installed, saying how to install it.
    """
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - a dependency of the package
        raise ImportError("reading an image needs Pillow: pip install pillow") from None
    return Image


def open_image(source: Any):
    """``source`` as a Pillow image: a path to an image file (any format Pillow reads), a
    Pillow image, or an array ``(height, width, 3)`` (or ``(height, width)``) of uint8.

    Raises:
        FileNotFoundError: a path that is not there.
        ValueError: a file Pillow cannot read as an image, or an array of another shape or
            dtype (the fact named).
        TypeError: anything else.
    """
    Image = pillow()
    if isinstance(source, Image.Image):
        return source
    if isinstance(source, (str, Path)):
        path = Path(source).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no image file there")
        try:
            with Image.open(path) as image:
                image.load()
                return image
        except (OSError, Image.DecompressionBombError) as e:
            raise ValueError(f"{path}: not an image Pillow can read ({e})") from None
    if isinstance(source, np.ndarray):
        if source.dtype != np.uint8 or source.ndim not in (2, 3) or (
                source.ndim == 3 and source.shape[2] not in (3, 4)):
            raise ValueError(f"an image array is (height, width, 3) uint8, not {source.shape} "
                             f"{source.dtype}")
        return Image.fromarray(source)
    raise TypeError(f"an image is a file path, a PIL image or a uint8 array, not "
                    f"{type(source).__name__}")


@dataclass(frozen=True)
class ImageProcessor:
    """An image processor's settings, as its ``preprocessor_config.json`` names them.

    ``size``: ``{"height", "width"}`` (resized to exactly that), or ``{"shortest_edge"}``
    (the shorter side to it, the longer ``int(edge * long / short)``, as
    ``get_resize_output_image_size``); ``resample``: ``PILImageResampling``'s number;
    ``crop_size``: ``{"height", "width"}`` cut at the centre after resizing where
    ``do_center_crop``; ``rescale_factor``, ``image_mean``, ``image_std`` (three each, or
    one for every channel).
    """

    size: dict
    resample: int = 2
    do_resize: bool = True
    do_center_crop: bool = False
    crop_size: dict | None = None
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple = (0.5, 0.5, 0.5)
    image_std: tuple = (0.5, 0.5, 0.5)
    do_convert_rgb: bool = True

    def __post_init__(self):
        if self.resample not in RESAMPLE:
            raise ValueError(f"resample {self.resample!r} is not one of PILImageResampling's "
                             f"{sorted(RESAMPLE)}")
        if not (set(self.size) == {"height", "width"} or set(self.size) == {"shortest_edge"}):
            raise ValueError(f"size {self.size!r} is {{height, width}} or {{shortest_edge}}")
        if self.do_center_crop and (not isinstance(self.crop_size, dict)
                                    or set(self.crop_size) != {"height", "width"}):
            raise ValueError(f"crop_size {self.crop_size!r} is {{height, width}}")

    def resized_shape(self, height: int, width: int) -> tuple[int, int]:
        """The (height, width) an image of this size is resized to."""
        if "height" in self.size:
            return int(self.size["height"]), int(self.size["width"])
        edge = int(self.size["shortest_edge"])
        short, long = (width, height) if width <= height else (height, width)
        new_long = int(edge * long / short)
        return (new_long, edge) if width <= height else (edge, new_long)

    def rgb(self, image) -> np.ndarray:
        """``image`` (``open_image``'s sources) as ``(height, width, 3)`` uint8, transparency
        composited onto white, as transformers' ``convert_to_rgb``."""
        Image = pillow()
        image = open_image(image)
        if self.do_convert_rgb:
            if "A" in image.getbands() or image.info.get("transparency") is not None:
                rgba = image.convert("RGBA")
                white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
                image = Image.alpha_composite(white, rgba).convert("RGB")
            else:
                image = image.convert("RGB")
        array = np.asarray(image)
        if array.ndim != 3 or array.shape[2] != 3 or array.dtype != np.uint8:
            raise ValueError(f"an image of mode {image.mode} is {array.shape} {array.dtype}, "
                             "not RGB: the processor converts it only with do_convert_rgb")
        return array

    def __call__(self, image) -> np.ndarray:
        """The pixel values ``(3, height, width)`` float32 of ``image`` (a path, a PIL image
        or a uint8 array), equal to transformers' ``pixel_values`` from this processor's
        PIL backend.

        Raises:
            as ``open_image``; ValueError: an image that is not RGB without
                ``do_convert_rgb``.
        """
        array = self.rgb(image)
        if self.do_resize:
            array = resized(array, *self.resized_shape(*array.shape[:2]), self.resample)
        if self.do_center_crop:
            array = center_crop(array, int(self.crop_size["height"]),
                                int(self.crop_size["width"]))
        return self.scaled(array)

    def scaled(self, array: np.ndarray) -> np.ndarray:
        """``array`` ``(height, width, 3)`` uint8 as pixel values ``(3, height, width)``
        float32: rescaled (``uint8 * rescale_factor`` in float64, then float32, as
        ``image_transforms.rescale``) and normalized in float32, where the settings say."""
        x = array.transpose(2, 0, 1)
        if self.do_rescale:
            x = (x.astype(np.float64) * self.rescale_factor).astype(np.float32)
        else:
            x = x.astype(np.float32)
        if self.do_normalize:
            mean = np.broadcast_to(np.asarray(self.image_mean, np.float32), (3,))
            std = np.broadcast_to(np.asarray(self.image_std, np.float32), (3,))
            x = (x - mean[:, None, None]) / std[:, None, None]
        return np.ascontiguousarray(x, np.float32)


def resized(array: np.ndarray, height: int, width: int, resample: int) -> np.ndarray:
    """``array`` ``(h, w, 3)`` uint8 resized to ``height`` x ``width`` by Pillow with
    ``PILImageResampling``'s filter ``resample``, as transformers' PIL backend resizes a
    uint8 image (``image_transforms.resize``)."""
    Image = pillow()
    out = Image.fromarray(array).resize(
        (width, height), resample=getattr(Image.Resampling, RESAMPLE[resample]))
    return np.asarray(out)


#: Idefics3ImageProcessor's largest side for any resize (its ``MAX_IMAGE_SIZE``).
MAX_IMAGE_SIZE = 4096


@dataclass(frozen=True)
class TileProcessor(ImageProcessor):
    """An image cut into tiles beside a global image, as transformers' Idefics3 (SmolVLM)
    image processor computes them (``Idefics3ImageProcessorPil``): resized so its longest
    side is ``size["longest_edge"]`` (the other side ``int`` of the aspect ratio, rounded up
    to even; then kept below 4096 pixels), resized again to whole multiples of the tile side
    ``max_image_size["longest_edge"]`` on both sides, and, where that is more than one tile,
    cut into ``rows`` x ``cols`` tiles (row-major) followed by the whole image resized to
    one tile (the global image); an image of one tile is that tile alone (``rows`` = ``cols``
    = 0). Without ``do_image_splitting``, resized to one tile. Every resize is Pillow's on
    the uint8 image, with ``resample`` (LANCZOS by default); then rescaled and normalized as
    ``ImageProcessor``. Every tile is a full square (so ``do_pad`` pads nothing for one
    image).
    """

    size: dict = None
    resample: int = 1
    max_image_size: dict = None
    do_image_splitting: bool = True
    do_pad: bool = True

    def __post_init__(self):
        if self.resample not in RESAMPLE:
            raise ValueError(f"resample {self.resample!r} is not one of PILImageResampling's "
                             f"{sorted(RESAMPLE)}")
        for name in ("size", "max_image_size"):
            value = getattr(self, name)
            if not isinstance(value, dict) or not (set(value) == {"longest_edge"} or (
                    name == "size" and set(value) == {"height", "width"})):
                raise ValueError(f"{name} {value!r} is {{longest_edge}}"
                                 + (" or {height, width}" if name == "size" else ""))

    @property
    def tile(self) -> int:
        """A tile's side in pixels."""
        return int(self.max_image_size["longest_edge"])

    def first_shape(self, height: int, width: int) -> tuple[int, int]:
        """The (height, width) the first resize gives (Idefics3's ``resize`` with ``size``:
        ``_resize_output_size_rescale_to_max_len`` then ``_scale_below_upper_bound``)."""
        if "height" in self.size:
            return int(self.size["height"]), int(self.size["width"])
        edge = int(self.size["longest_edge"])
        aspect = width / height
        if width >= height:
            width, height = edge, int(edge / aspect)
            height += height % 2
        else:
            height, width = edge, int(edge * aspect)
            width += width % 2
        height, width = max(height, 1), max(width, 1)
        aspect = width / height
        if width >= height and width > MAX_IMAGE_SIZE:
            width, height = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE / aspect)
        elif height > width and height > MAX_IMAGE_SIZE:
            height, width = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE * aspect)
        return max(height, 1), max(width, 1)

    def tiled_shape(self, height: int, width: int) -> tuple[int, int]:
        """The (height, width), whole tiles, the second resize gives (Idefics3's
        ``resize_for_vision_encoder``)."""
        T = self.tile
        aspect = width / height
        if width >= height:
            width = math.ceil(width / T) * T
            height = math.ceil(int(width / aspect) / T) * T
        else:
            height = math.ceil(height / T) * T
            width = math.ceil(int(height * aspect) / T) * T
        return height, width

    def tiles(self, image) -> tuple[np.ndarray, int, int]:
        """The pixel values ``(tiles, 3, tile, tile)`` float32 of ``image`` (a path, a PIL
        image or a uint8 array), equal to transformers' ``pixel_values[0]`` from this
        processor's PIL backend, and the ``rows`` and ``cols`` of tiles the image was cut
        into (0 and 0: one tile, no global image).

        Raises:
            as ``ImageProcessor.__call__``.
        """
        array = self.rgb(image)
        if self.do_resize:
            array = resized(array, *self.first_shape(*array.shape[:2]), self.resample)
        T, rows, cols = self.tile, 0, 0
        if self.do_image_splitting:
            array = resized(array, *self.tiled_shape(*array.shape[:2]), self.resample)
            height, width = array.shape[:2]
            if height > T or width > T:
                rows, cols = (height - T) // T + 1, (width - T) // T + 1
                frames = [array[r * T:(r + 1) * T, c * T:(c + 1) * T]
                          for r in range(rows) for c in range(cols)]
                frames.append(resized(array, T, T, self.resample))
            else:
                frames = [array]
        else:
            frames = [resized(array, T, T, self.resample)]
        return np.stack([self.scaled(f) for f in frames]), rows, cols

    def __call__(self, image) -> np.ndarray:
        """The tiles' pixel values ``(tiles, 3, tile, tile)`` float32 (``tiles``)."""
        return self.tiles(image)[0]


def center_crop(array: np.ndarray, height: int, width: int) -> np.ndarray:
    """The centre ``height`` x ``width`` of ``array`` ``(h, w, c)``, zero-padded (centred)
    where it is smaller, as transformers' ``image_transforms.center_crop``."""
    h, w = array.shape[:2]
    top, left = (h - height) // 2, (w - width) // 2
    if top >= 0 and left >= 0 and top + height <= h and left + width <= w:
        return array[top: top + height, left: left + width]
    H, W = max(height, h), max(width, w)
    padded = np.zeros((H, W) + array.shape[2:], array.dtype)
    tp, lp = -(-(H - h) // 2), -(-(W - w) // 2)
    padded[tp: tp + h, lp: lp + w] = array
    top, left = top + tp, left + lp
    return padded[max(top, 0): max(top, 0) + height, max(left, 0): max(left, 0) + width]


def patches(pixels: np.ndarray, patch: int) -> np.ndarray:
    """Pixel values ``(channels, height, width)`` cut into ``(height // patch * width //
    patch, channels * patch * patch)`` rows, row-major over the patch grid, each in the
    order of a ``Conv2d`` weight ``(out, channels, patch, patch)`` flattened: a convolution
    of stride ``patch`` (SiglipVisionEmbeddings' ``patch_embedding``) is then one GEMM of
    these rows by the weight ``(out, channels * patch * patch)``.

    Raises:
        ValueError: a side that is not a whole number of patches.
    """
    C, H, W = pixels.shape
    if H % patch or W % patch:
        raise ValueError(f"an image of {H}x{W} pixels is not a whole number of {patch}x{patch} "
                         "patches")
    h, w = H // patch, W // patch
    rows = pixels.reshape(C, h, patch, w, patch).transpose(1, 3, 0, 2, 4)
    return np.ascontiguousarray(rows.reshape(h * w, C * patch * patch), np.float32)
