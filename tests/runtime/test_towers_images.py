"""The image front end against transformers' own image processors (their PIL backends, the
default without torchvision) on a real photograph shipped in a registry package
(matplotlib's sample grace_hopper.jpg): pixel values recorded by transformers
(tests/checkpoints/make_towers.py), equal to the last bit."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from iron_spec.runtime.towers.images import ImageProcessor, center_crop, open_image, patches

GOLDEN = Path(__file__).resolve().parents[1] / "goldens" / "towers" / "front_ends" / "grace_hopper.npz"


def photograph() -> Path:
    matplotlib = pytest.importorskip("matplotlib")  # the test extra installs it
    return Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"


@pytest.fixture(scope="module")
def golden():
    return np.load(GOLDEN)


def test_the_photograph_decodes_as_when_the_golden_was_recorded(golden):
    decoded = np.asarray(open_image(photograph()).convert("RGB"))
    assert decoded.shape == (600, 512, 3)
    assert hashlib.sha256(decoded.tobytes()).hexdigest() == str(golden["decoded_sha256"]), (
        f"Pillow decodes grace_hopper.jpg otherwise than Pillow {golden['pillow']} did when "
        "the golden was recorded: every front end below then sees other pixels")


@pytest.mark.parametrize("name", ["gemma3-896", "gemma3-64", "clip-336", "clip-60"])
def test_pixel_values_equal_transformers(golden, name):
    settings = json.loads(str(golden[f"{name}.settings"]))
    ours = ImageProcessor(**{k: tuple(v) if isinstance(v, list) else v
                             for k, v in settings.items()})(photograph())
    assert ours.shape == tuple(golden[f"{name}.shape"])
    assert ours.dtype == np.float32
    if f"{name}.pixels" in golden:
        assert np.abs(ours - golden[f"{name}.pixels"]).max() == 0.0
    else:
        assert np.abs(ours.reshape(-1)[::1009] - golden[f"{name}.samples"]).max() == 0.0
    assert hashlib.sha256(ours.tobytes()).hexdigest() == str(golden[f"{name}.sha256"])


def test_transparency_is_composited_onto_white():
    rgba = np.zeros((4, 4, 4), np.uint8)
    rgba[..., 0], rgba[..., 3] = 255, 0  # red, fully transparent
    rgba[0, 0, 3] = 255
    rgb = ImageProcessor(size={"height": 4, "width": 4}).rgb(rgba)
    assert rgb[0, 0].tolist() == [255, 0, 0] and rgb[1, 1].tolist() == [255, 255, 255]


def test_center_crop_pads_a_small_image_at_its_centre():
    a = np.arange(2 * 3 * 1, dtype=np.uint8).reshape(2, 3, 1) + 1
    out = center_crop(a, 4, 5)
    assert out.shape == (4, 5, 1)
    np.testing.assert_array_equal(out[1:3, 1:4, 0], a[..., 0])
    assert out.sum() == a.sum()


def test_patches_are_a_stride_kernel_convolution_as_a_gemm():
    rng = np.random.default_rng(0)
    pixels = rng.standard_normal((3, 8, 12)).astype(np.float32)
    weight = rng.standard_normal((5, 3, 4, 4)).astype(np.float32)
    rows = patches(pixels, 4)
    assert rows.shape == (6, 48)
    by_gemm = rows @ weight.reshape(5, -1).T  # (patches, out)
    # The convolution itself, patch by patch, row-major over the grid.
    conv = np.array([[np.sum(weight[o] * pixels[:, 4 * i: 4 * i + 4, 4 * j: 4 * j + 4])
                      for o in range(5)] for i in range(2) for j in range(3)])
    np.testing.assert_allclose(by_gemm, conv, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="whole number"):
        patches(pixels[:, :7], 4)


def test_bad_images_are_refused_by_name(tmp_path):
    with pytest.raises(FileNotFoundError, match="no image file"):
        open_image(tmp_path / "missing.png")
    (tmp_path / "text.png").write_text("not an image")
    with pytest.raises(ValueError, match="not an image Pillow can read"):
        open_image(tmp_path / "text.png")
    with pytest.raises(ValueError, match="uint8"):
        open_image(np.zeros((4, 4, 3), np.float32))
    with pytest.raises(TypeError):
        open_image(3)
