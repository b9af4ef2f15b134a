"""Gemma 4's audio tower (specs/gemma4.yaml ``towers``, kind ``conformer``) against
transformers 5.25: a composite toy with an audio tower (tests/checkpoints/gemma4-audio-toy,
recorded by tests/checkpoints/make_gemma4_towers.py ``audio``: clipped projections whose
bounds bite, a logit cap and a gradient clip small enough to change the soft tokens), its
frames and soft tokens against Gemma4AudioFeatureExtractor's and ``get_audio_features``', and
the model with its sound against Gemma4ForConditionalGeneration's logits."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from iron_spec.library.api import load
from iron_spec.library.multimodal_golden import judge
from iron_spec.runtime.towers.conformer import ConformerTower
from tests.conftest import SPECS, edited_spec

TESTS = Path(__file__).resolve().parents[1]
TOY = TESTS / "checkpoints" / "gemma4-audio-toy"
GOLDEN = TESTS / "goldens" / "towers" / "gemma4" / "gemma4-audio-toy.npz"
AUDIO, BOA, EOA = 253, 254, 255


@pytest.fixture(scope="module")
def golden():
    return dict(np.load(GOLDEN))


@pytest.fixture(scope="module")
def model():
    return load(SPECS / "gemma4.yaml", TOY)


def within_gate(kl: dict) -> bool:
    return kl["mean"] <= 1e-6 and kl["max"] <= 1e-5 and kl["top1_mismatches"] == 0


def test_the_toys_frames_and_soft_tokens_are_transformers(model, golden):
    tower = model.loaded.towers[0]
    assert tower.name == "audio" and isinstance(tower.tower, ConformerTower)
    features, frames = tower.processor(golden["audio"])
    assert np.array_equal(features[:frames], golden["input_features"][0])  # max difference 0
    soft = tower.soft_tokens(golden["audio"])
    want = golden["soft_tokens"]
    assert soft.shape == want.shape
    assert np.abs(soft - want).max() <= 1e-5  # the bound; 3.9e-6 measured
    assert tower.count(golden["audio"]) == list(golden["ids"]).count(AUDIO)


def test_the_sounds_own_frames_give_what_transformers_gives_it_padded_in_a_batch(model,
                                                                                golden):
    # transformers runs a batch's padded frames and masks them (the convolutions' inputs,
    # the keys); ours runs the sound's own: the same soft tokens.
    assert int(golden["padded_frames"]) > 0
    soft = model.loaded.towers[0].soft_tokens(golden["audio"])
    assert np.abs(soft - golden["soft_tokens_in_batch"]).max() <= 1e-5


@pytest.mark.parametrize("chunk", [None, 16])
def test_the_model_with_its_sound_is_transformers(model, golden, chunk):
    # Whole, and through prompt chunks of 16 that split the sound's 28 soft tokens.
    if chunk is not None:
        model = load(SPECS / "gemma4.yaml", TOY, prefill_chunk=chunk)
    j = judge(model, golden)
    assert j.ids_equal and j.pixels == 0.0 and j.soft <= 1e-5
    assert within_gate(j.kl), j.kl


@pytest.mark.parametrize("old,new", [
    ("      logit_cap: attention_logit_cap\n", "      logit_cap: 1.0e6\n"),
    ("      clip: gradient_clipping\n", "      clip: 1.0e10\n"),
    ("      residual_weight: residual_weight\n", "      residual_weight: 1.0\n"),
    ("      eps: rms_norm_eps\n", "      eps: 1.0\n"),
])
def test_each_of_the_conformers_options_reaches_the_soft_tokens(tmp_path, golden, old, new):
    # The toy's clips, cap and scales all bite: a spec leaving one out is judged wrong.
    tower = load(edited_spec(tmp_path, "gemma4", old, new), TOY).loaded.towers[0]
    assert np.abs(tower.soft_tokens(golden["audio"]) - golden["soft_tokens"]).max() > 1e-3


def test_the_clipped_projections_read_their_bounds_from_the_checkpoint(tmp_path, golden):
    # Every bound of the toy's Gemma4ClippableLinears made infinite: nothing clips, and the
    # soft tokens move (by up to 2 in transformers too).
    from safetensors.numpy import load_file, save_file

    copy = tmp_path / "toy"
    shutil.copytree(TOY, copy)
    tensors = load_file(copy / "model.safetensors")
    for name in tensors:
        if name.endswith(("_min", "_max")):
            tensors[name] = np.array(-np.inf if name.endswith("_min") else np.inf, np.float32)
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    tower = load(SPECS / "gemma4.yaml", copy).loaded.towers[0]
    assert np.abs(tower.soft_tokens(golden["audio"]) - golden["soft_tokens"]).max() > 0.1


def test_placeholders_read_as_pad_for_the_per_layer_inputs(tmp_path, golden):
    # Gemma4Model reads pad_token_id at every audio placeholder for the per-layer inputs.
    spec = SPECS / "gemma4.yaml"
    text = spec.read_text()
    at = text.index("  - name: audio")
    edited = tmp_path / "gemma4.yaml"
    edited.write_text(text[:at] + text[at:].replace("    read_as: 0\n", "", 1))
    j = judge(load(edited, TOY), golden)
    assert j.kl["mean"] > 1e-5, j.kl


def test_a_compiled_version_equals_its_float64_reference(model, golden):
    tower = model.loaded.towers[0].tower
    features = golden["input_features"][0]
    version = tower.version(len(features))
    assert version is tower.version(len(features))  # compiled once
    got, want = version(features), version.reference(features)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_sounds_of_every_length_give_the_processors_count(model):
    # Gemma4Processor.replace_audio_token's count: two stride-2 convolutions of the frames.
    from iron_spec.runtime.towers.semicausal_log_mel import SemicausalLogMel

    tower = model.loaded.towers[0]
    for samples in (100, 321, 481, 1600, 5000):
        wave = np.random.default_rng(samples).uniform(-0.5, 0.5, samples).astype(np.float32)
        features, frames = tower.processor(wave)
        want = SemicausalLogMel.soft(frames, len(features))
        assert tower.count(wave) == want
        assert len(tower.soft_tokens(wave)) == want


def test_the_audio_marker_expands_as_gemma4_processor_writes_it(tmp_path, golden):
    # Gemma4Processor.replace_audio_token: f"{boa_token}{audio_token * n}{eoa_token}" for each
    # audio token of the text, the tokens named by id (audio_token_id, boa_token_id,
    # eoa_token_index) and their texts read from the checkpoint's tokenizer.
    from tokenizers import Tokenizer, models, pre_tokenizers

    from iron_spec.library.multimodal import encode

    copy = tmp_path / "toy"
    shutil.copytree(TOY, copy)
    vocab = {f"w{i}": i for i in range(256)}
    for text, i in (("<pad>", 0), ("<bos>", 2), ("<|audio|>", AUDIO), ("<|audio>", BOA),
                    ("<audio|>", EOA)):
        del vocab[f"w{i}"]
        vocab[text] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w3"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<pad>", "<bos>", "<|audio|>", "<|audio>", "<audio|>"])
    tok.save(str(copy / "tokenizer.json"))
    model = load(SPECS / "gemma4.yaml", copy)
    tower = model.loaded.towers[0]
    assert tower.prompt.marker == "<|audio|>"
    assert tower.prompt.of(28) == "<|audio>" + "<|audio|>" * 28 + "<audio|>"
    ids, inputs = encode(model, "w17 <|audio|> w60", {"audio": [golden["audio"]]})
    assert ids == [17, BOA] + [AUDIO] * 28 + [EOA, 60]
    assert list(inputs) == [AUDIO]


def test_mel_bins_the_projection_does_not_take_are_refused(tmp_path):
    from iron_spec.spec.errors import SpecError

    copy = tmp_path / "toy"
    shutil.copytree(TOY, copy)
    settings = json.loads((copy / "preprocessor_config.json").read_text())
    settings["feature_size"] = 64
    (copy / "preprocessor_config.json").write_text(json.dumps(settings))
    with pytest.raises(SpecError, match="64 mel bins leave 16 after the subsampling's two "
                                        "stride-2 convolutions"):
        load(SPECS / "gemma4.yaml", copy)


def test_a_masked_logit_that_would_weigh_is_refused(tmp_path):
    from iron_spec.spec.errors import SpecError

    copy = tmp_path / "toy"
    shutil.copytree(TOY, copy)
    config = json.loads((copy / "config.json").read_text())
    config["audio_config"]["attention_invalid_logits_value"] = -10.0
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecError, match="a key outside the window would weigh"):
        load(SPECS / "gemma4.yaml", copy)


def test_a_tower_declared_not_built_refuses_its_input_naming_its_config_key(tmp_path):
    # A spec may declare a tower not_built: its checkpoint still serves text, and an input
    # for it is refused saying why, naming the config key.
    from iron_spec.library.multimodal import encode

    text = (SPECS / "gemma4.yaml").read_text()
    at = text.index("  - name: audio")
    edited = tmp_path / "gemma4.yaml"
    edited.write_text(text[:at] + "  - name: audio\n    architectures: "
                      "[Gemma4ForConditionalGeneration]\n    from: audio_config\n"
                      "    not_built: \"not today\"\n")
    model = load(edited, TOY)
    assert model.loaded.towers == []
    with pytest.raises(ValueError, match=r"this model's audio tower is not built \(audio_config: "
                                         r"not today"):
        encode(model, "hear this", {"audio": [np.zeros(1600, np.float32)]})


#: google/gemma-4's released audio_config, every key as published (quoted from ollama's
#: x/models/gemma4 tests, releasedGemma4AudioConfig), the sizes shrunk to the toy's tensors.
RELEASED_AUDIO_CONFIG = {
    "model_type": "gemma4_audio", "attention_chunk_size": 12, "attention_context_left": 13,
    "attention_context_right": 0, "attention_invalid_logits_value": -1000000000.0,
    "attention_logit_cap": 50.0, "conv_kernel_size": 5, "gradient_clipping": 10000000000.0,
    "hidden_size": 1024, "num_attention_heads": 8, "num_hidden_layers": 12,
    "output_proj_dims": 1536, "residual_weight": 0.5, "rms_norm_eps": 0.000001,
    "subsampling_conv_channels": [128, 32], "use_clipped_linears": True}
SHRUNK = {"hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 2,
          "output_proj_dims": 24, "subsampling_conv_channels": [128, 8]}


def test_the_released_audio_config_loads_every_key_read(tmp_path, golden):
    copy = tmp_path / "toy"
    shutil.copytree(TOY, copy)
    config = json.loads((copy / "config.json").read_text())
    config["audio_config"] = {**RELEASED_AUDIO_CONFIG, **SHRUNK}
    (copy / "config.json").write_text(json.dumps(config))
    tower = load(SPECS / "gemma4.yaml", copy).loaded.towers[0]
    o = tower.tower.options
    assert (o.chunk, o.left, o.right, o.logit_cap, o.clip, o.clipped, o.conv_kernel) == \
        (12, 13, 0, 50.0, 1e10, True, 5)
    assert tower.soft_tokens(golden["audio"]).shape == golden["soft_tokens"].shape
