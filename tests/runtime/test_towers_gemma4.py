"""Gemma 4's vision tower (specs/gemma4.yaml ``towers``) against transformers 5.25: its front
end against Gemma4ImageProcessorPil on a real photograph (matplotlib's grace_hopper.jpg) and
on the sizes its resize gives, its soft tokens against ``get_image_features``, and the model
with its image against Gemma4ForConditionalGeneration's logits (goldens recorded by
tests/checkpoints/make_axial_towers.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from iron_spec.library.api import load
from iron_spec.library.multimodal_golden import divergence
from iron_spec.runtime.golden import kl_stats
from iron_spec.runtime.session import Session
from iron_spec.runtime.towers.aspect_images import AspectPatchProcessor, aspect_preserving_size
from tests.conftest import SPECS, edited_spec

TESTS = Path(__file__).resolve().parents[1]
TOY = TESTS / "checkpoints" / "gemma4-vision-toy"
GOLDEN = TESTS / "goldens" / "towers" / "gemma4" / "gemma4-vision-toy.npz"
FRONT = TESTS / "goldens" / "towers" / "front_ends" / "gemma4_grace_hopper.npz"
IMAGE, EOI = 250, 252


@pytest.fixture(scope="module")
def golden():
    return dict(np.load(GOLDEN))


@pytest.fixture(scope="module")
def front():
    return dict(np.load(FRONT))


@pytest.fixture(scope="module")
def model():
    return load(SPECS / "gemma4.yaml", TOY)


def judge(model, golden) -> dict:
    """KL of our logits against transformers' at every position from the image's last
    placeholder on (each a history holding the whole image)."""
    ids = golden["ids"].tolist()
    session = Session(model.loaded.lm)
    results = []
    for k in range(ids.index(EOI), len(ids) + 1):
        history = ids[:k]
        model.multimodal.place(session, history, {IMAGE: [golden["image"]]})
        logits = session.logits(model.multimodal.lookup(history))
        results.append(divergence(golden["logits"][k - 1], logits))
    return kl_stats(results)


@pytest.mark.parametrize("budget", [70, 280, 1120])
def test_the_resized_sizes_are_the_processors(front, budget):
    sizes = [aspect_preserving_size(h, w, 16, budget * 9, 3) for h, w in front["sizes"]]
    assert sizes == [tuple(s) for s in front[f"sizes.{budget}"].tolist()]


@pytest.mark.parametrize("budget", [70, 280])
def test_a_photographs_patches_equal_the_processors(front, budget):
    matplotlib = pytest.importorskip("matplotlib")
    photograph = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
    pixels, grid = AspectPatchProcessor(max_soft_tokens=budget)(photograph)
    assert grid == tuple(front[f"{budget}.grid"].tolist())
    assert grid[0] * grid[1] // 9 == int(front[f"{budget}.soft"])
    assert np.array_equal(pixels.reshape(-1)[::1009], front[f"{budget}.samples"])
    assert hashlib.sha256(pixels.tobytes()).hexdigest() == str(front[f"{budget}.sha256"])


def test_the_toys_pixels_and_soft_tokens_are_transformers(model, golden):
    tower = model.loaded.towers[0]
    pixels, grid = tower.processor(golden["image"])
    assert np.array_equal(pixels, golden["pixel_values"][0])  # max difference 0
    positions = golden["image_position_ids"]
    assert grid == (positions[:, 1].max() + 1, positions[:, 0].max() + 1) == (18, 33)
    soft = tower.soft_tokens(golden["image"])
    want = golden["soft_tokens"]
    assert soft.shape == want.shape == (66, 64)
    assert np.abs(soft - want).max() <= 1e-5 * np.abs(want).max()
    assert tower.count(golden["image"]) == list(golden["ids"]).count(IMAGE)
    # The float64 reference: its RoPE tables and positions float32, as transformers forms
    # them in float32 (its float64 model keeps float32 angles but not float32 cos and sin).
    reference = tower.tower.version(grid).reference(pixels)
    assert np.abs(reference - want).max() <= 2e-6 * np.abs(want).max()


def test_the_model_with_its_image_is_transformers(model, golden):
    kl = judge(model, golden)
    assert kl["mean"] <= 1e-6 and kl["max"] <= 1e-5 and kl["top1_mismatches"] == 0, kl


def test_placeholders_read_as_pad_for_the_per_layer_inputs(tmp_path, golden):
    # Gemma4Model reads pad_token_id's per-layer embedding at every placeholder: read as the
    # placeholder itself, the same soft tokens give other logits, past the gate (mean 1e-6).
    spec = edited_spec(tmp_path, "gemma4", "    read_as: 0\n", "")
    kl = judge(load(spec, TOY), golden)
    assert kl["mean"] > 1e-5, kl


SOUNDS = TESTS / "goldens" / "towers" / "front_ends" / "gemma4_sounds.npz"


@pytest.fixture(scope="module")
def sounds():
    return dict(np.load(SOUNDS))


def pygame_sound(name: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec("pygame")
    if spec is None:
        pytest.skip("pygame (the test extra) ships the recorded sounds")
    return Path(spec.origin).parent / "examples" / "data" / name


@pytest.mark.parametrize("sound", ["boom.wav", "punch.wav", "house_lo.wav"])
@pytest.mark.parametrize("name", ["default", "every-step", "plain-preemphasis"])
def test_log_mel_equals_gemma4_audio_feature_extractor(sounds, sound, name):
    import json

    from iron_spec.runtime.towers.audio import read_audio
    from iron_spec.runtime.towers.semicausal_log_mel import SemicausalLogMel

    wave = read_audio(pygame_sound(sound), 16000)
    assert hashlib.sha256(wave.tobytes()).hexdigest() == str(sounds[f"{sound}.wave_sha256"]), \
        "soundfile and soxr read the sound otherwise than when the golden was recorded"
    settings = json.loads(str(sounds["extractors"]))[name]
    front = SemicausalLogMel(**{k: tuple(v) if isinstance(v, list) else v
                            for k, v in settings.items()})
    features, frames = front(wave)
    key = f"{sound}.{name}"
    assert features.shape == tuple(sounds[f"{key}.shape"])
    # Within 1e-5 (the bound); in fact equal to the bit, as the extractor computes.
    assert np.abs(features.reshape(-1)[::97] - sounds[f"{key}.samples"]).max() <= 1e-5
    assert hashlib.sha256(features.tobytes()).hexdigest() == str(sounds[f"{key}.sha256"])
    assert frames == int(sounds[f"{key}.frames"])
    assert SemicausalLogMel.soft(frames, len(features)) == int(sounds[f"{key}.soft"])


def test_log_mel_refuses_dither_and_a_per_bin_table_of_another_width():
    from iron_spec.runtime.towers.semicausal_log_mel import SemicausalLogMel

    with pytest.raises(ValueError, match="dither 0.1: random noise"):
        SemicausalLogMel(dither=0.1)
    with pytest.raises(ValueError, match="per_bin_mean holds 3 values for 128 mel bins"):
        SemicausalLogMel(per_bin_mean=(0.0, 0.0, 0.0))


VISION_MODE = TESTS / "goldens" / "towers" / "gemma4" / "gemma4-vision-toy-vision-mode.npz"


def vision_mode_toy(tmp_path) -> Path:
    """The toy as its golden was recorded under use_bidirectional_attention "vision"."""
    from tests.checkpoints.make_gemma4_towers import vision_mode

    return vision_mode(TOY, tmp_path / "vision-mode")


def test_vision_mode_lets_an_images_rows_see_each_other_in_sliding_layers_alone(tmp_path,
                                                                             golden):
    # use_bidirectional_attention "vision": transformers' sliding layers let one image's rows
    # see each other both ways, its full-attention layers stay causal.
    want = {**golden, **dict(np.load(VISION_MODE))}
    toy = vision_mode_toy(tmp_path)
    kl = judge(load(SPECS / "gemma4.yaml", toy), want)
    assert kl["mean"] <= 1e-6 and kl["max"] <= 1e-5 and kl["top1_mismatches"] == 0, kl
    # Both ways in every layer (Gemma 3's), or causal everywhere: other logits.
    every = edited_spec(tmp_path, "gemma4", "          reach: false\n", "")
    assert judge(load(every, toy), want)["mean"] > 1e-3
    causal = edited_spec(tmp_path, "gemma4", "    bidirectional: true\n", "")
    assert judge(load(causal, toy), want)["mean"] > 1e-3


def test_the_image_marker_expands_as_gemma4_processor_writes_it(tmp_path, golden):
    # Gemma4Processor.replace_image_token: f"{boi_token}{image_token * n}{eoi_token}" for each
    # image token of the text; the spec names the tokens by id (boi_token_id, image_token_id,
    # eoi_token_id), their texts read from the checkpoint's tokenizer.
    import shutil

    from tokenizers import Tokenizer, models, pre_tokenizers

    from iron_spec.library.multimodal import encode

    copy = tmp_path / "toy"
    shutil.copytree(TOY, copy)
    vocab = {f"w{i}": i for i in range(256)}
    for text, i in (("<pad>", 0), ("<bos>", 2), ("<|image|>", IMAGE), ("<|image>", 251),
                    ("<image|>", EOI)):
        del vocab[f"w{i}"]
        vocab[text] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w3"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<pad>", "<bos>", "<|image|>", "<|image>", "<image|>"])
    tok.save(str(copy / "tokenizer.json"))
    model = load(SPECS / "gemma4.yaml", copy)
    tower = model.loaded.towers[0]
    assert tower.prompt.marker == "<|image|>"
    assert tower.prompt.of(66) == "<|image>" + "<|image|>" * 66 + "<image|>"
    ids, inputs = encode(model, "w17 <|image|> w60", {"image": [golden["image"]]})
    assert ids == [17, 251] + [IMAGE] * 66 + [EOI, 60]
    assert list(inputs) == [IMAGE]


def test_an_image_splits_across_prompt_chunks_where_no_layer_sees_it_both_ways(tmp_path,
                                                                              golden):
    # Without use_bidirectional_attention vision no layer reaches: an image of 66 soft tokens
    # runs through prompt chunks of 16 as transformers' causal mask sees it.
    kl = judge(load(SPECS / "gemma4.yaml", TOY, prefill_chunk=16), golden)
    assert kl["mean"] <= 1e-6 and kl["max"] <= 1e-5 and kl["top1_mismatches"] == 0, kl
    # Under vision mode its rows see each other in the sliding layers: a chunk must hold them.
    want = {**golden, **dict(np.load(VISION_MODE))}
    with pytest.raises(ValueError, match="an image's 66 soft tokens .* give a prefill_chunk "
                                         "of at least 66"):
        judge(load(SPECS / "gemma4.yaml", vision_mode_toy(tmp_path), prefill_chunk=16), want)


def test_a_rope_other_than_axial_is_refused(tmp_path):
    import json
    import shutil

    from iron_spec.spec.errors import SpecError

    copy = tmp_path / "toy"
    shutil.copytree(TOY, copy)
    config = json.loads((copy / "config.json").read_text())
    config["vision_config"]["rope_parameters"] = {"rope_type": "default", "rope_theta": 100.0}
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecError, match="rope_type is 'default': an axial tower's RoPE is axial, no other"):
        load(SPECS / "gemma4.yaml", copy)
