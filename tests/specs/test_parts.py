"""Checkpoints that hold a spec's model as a part of a bigger one (a spec's ``parts``):
published configs shrunk to toys, built and saved by transformers (tests/checkpoints), judged
by the goldens transformers' own ``*For<Task>`` and ``Gemma3ForConditionalGeneration`` classes
recorded on them; the task heads' results against transformers' pipelines; the part's
tensors and config accounted for."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from typer.testing import CliRunner

from iron_spec import load
from iron_spec.cli.app import app
from iron_spec.cli.check import golden_path
from iron_spec.spec.build import load_model
from iron_spec.spec.encoder import load_encoder
from iron_spec.spec.errors import SpecError
from iron_spec.spec.gates import ENCODER_ATOL
from iron_spec.spec.registry import find
from iron_spec.runtime.checkpoint import Checkpoint, CheckpointError
from iron_spec.runtime.encoder_golden import EncoderGolden
from iron_spec.runtime.golden import Golden
from iron_spec.runtime.parts import moved, stored, subtree
from iron_spec.runtime.session import Session
from tests.conftest import SPECS
from tests.specs.test_goldens import judge

TOYS = Path(__file__).resolve().parents[1] / "checkpoints"
ENCODER_TOYS = [("bert", "bert-base-uncased-toy"), ("bert", "bert-sequence-classification-toy"),
                ("bert", "bert-token-classification-toy"), ("roberta", "roberta-base-toy"),
                ("roberta", "roberta-sequence-classification-toy"),
                ("xlm_roberta", "xlm-roberta-base-toy"), ("modernbert", "modernbert-base-toy"),
                ("nomic_bert", "nomic-embed-text-v1.5-toy")]
PIPELINES = json.loads((TOYS / "pipelines.json").read_text())


def judged(spec: str, name: str, checkpoint: Path | None = None):
    """The encoder of ``spec`` on toy ``name`` (or ``checkpoint``) and the golden transformers
    recorded on toy ``name``."""
    loaded = load_encoder(SPECS / f"{spec}.yaml", checkpoint=checkpoint or TOYS / name)
    golden = EncoderGolden.read(SPECS.parent / "tests" / "goldens" / spec / f"{name}.npz",
                                load_encoder(SPECS / f"{spec}.yaml",
                                             checkpoint=TOYS / name).fingerprint())
    return loaded, golden


def outputs_match(loaded, golden) -> None:
    """Hidden states, the spec's embedding and (where held) the head's logits within
    ``ENCODER_ATOL`` of transformers', on the golden's probes."""
    model = loaded.model
    states = model.version(dataclasses.replace(model.config.pooling, kind="none",
                                               normalize=False))
    pooled = model.version()
    for (ids, types), hidden, want in zip(golden.probes, golden.hidden, golden.pooled):
        assert np.abs(states(ids, types) - hidden).max() <= ENCODER_ATOL
        assert np.abs(pooled(ids, types) - want).max() <= ENCODER_ATOL
    if golden.logits is not None:
        head = model.version(head=True)
        for (ids, types), want in zip(golden.probes, golden.logits):
            got = head(ids, types)
            assert got.shape == want.shape
            assert np.abs(got - want).max() <= ENCODER_ATOL
            assert (np.atleast_2d(got).argmax(1) == np.atleast_2d(want).argmax(1)).all()


@pytest.mark.parametrize("spec,name", ENCODER_TOYS, ids=[n for _, n in ENCODER_TOYS])
def test_published_encoder_checkpoints_match_transformers(spec, name):
    # The published config.json, every key kept (no --allow-unread-config), the layout
    # transformers' save_pretrained writes: the encoder under its prefix, the head beside.
    loaded, golden = judged(spec, name)
    assert (golden.logits is not None) == (loaded.model.head is not None)
    outputs_match(loaded, golden)


def test_the_masked_lm_toy_is_the_acceptance_pair():
    # bert-base-uncased as published (BertForMaskedLM): embed's hidden states and fill-mask's
    # logits, each against transformers' BertForMaskedLM on the same weights.
    loaded, golden = judged("bert", "bert-base-uncased-toy")
    assert golden.meta["model"] == "BertForMaskedLM" and golden.meta["head"] == "fill-mask"
    assert loaded.model.head.options.tied
    assert loaded.model.head.out.weight is loaded.model.embeddings.word_embeddings.weight
    assert loaded.model.pooler is None
    outputs_match(loaded, golden)


@pytest.mark.parametrize("spec,name,cls,tower", [
    ("gemma3", "gemma-3-4b-it-toy", "Gemma3ForConditionalGeneration", "vision_tower."),
    ("mistral", "mistral-small-3.1-toy", "Mistral3ForConditionalGeneration", "vision_tower."),
    ("ministral3", "ministral-3-3b-toy", "Mistral3ForConditionalGeneration", "vision_tower."),
    ("gemma4", "gemma4-composite-toy", "Gemma4ForConditionalGeneration", "vision_tower."),
    ("qwen3_5_text", "qwen3.5-0.8b-toy", "Qwen3_5ForConditionalGeneration", "model.visual.")])
def test_a_text_model_from_its_conditional_generation_checkpoint(spec, name, cls, tower):
    # A *ForConditionalGeneration (gemma-3-4b-it's, Mistral Small 3.1's, Qwen3.5-0.8B's
    # config, shrunk; bfloat16 where published so): its text model against the composite on
    # text alone, 40 steps teacher-forced (KL, top-1, greedy tokens, float64); the towers'
    # tensors left unread.
    loaded = load_model(SPECS / f"{spec}.yaml", checkpoint=TOYS / name)
    golden = Golden.read(golden_path(loaded), loaded.fingerprint())
    assert golden.meta["model"] == cls
    assert loaded.lm.config.tied
    assert any(tower in n for n in loaded.report.ignored)
    judge(loaded, golden)


def test_llama_4_scout_from_its_conditional_generation_checkpoint():
    # meta-llama/Llama-4-Scout-17B-16E's config (as printed), shrunk: its text model (chunked
    # attention, NoPE layers, the mixture on every layer, llama3 RoPE with an empty band)
    # against Llama4ForConditionalGeneration on text alone, 40 steps teacher-forced; the head
    # untied by text_config's own tie_word_embeddings; the vision model left unread.
    loaded = load_model(SPECS / "llama4_text.yaml", checkpoint=TOYS / "llama-4-scout-toy")
    golden = Golden.read(golden_path(loaded), loaded.fingerprint())
    assert golden.meta["model"] == "Llama4ForConditionalGeneration" and golden.routing
    assert not loaded.lm.config.tied
    assert any("vision_model." in n for n in loaded.report.ignored)
    judge(loaded, golden)


def test_qwen3_5s_multi_token_prediction_tensors_are_left_unread(tmp_path):
    # Qwen3.5's published files hold its multi-token-prediction layers (mtp.*) beside the
    # text model; transformers' Qwen3_5ForConditionalGeneration leaves them unread, so do we,
    # and the text model is the one without them.
    shutil.copytree(TOYS / "qwen3.5-0.8b-toy", tmp_path / "c")
    path = tmp_path / "c" / "model.safetensors"
    tensors = load_file(path)
    mtp = {"mtp.fc.weight": np.ones((32, 64), np.float32),
           "mtp.layers.0.input_layernorm.weight": np.ones(32, np.float32),
           "mtp.norm.weight": np.ones(32, np.float32)}
    save_file({**tensors, **mtp}, path)
    loaded = load_model(SPECS / "qwen3_5_text.yaml", checkpoint=tmp_path / "c")
    assert set(mtp) <= set(loaded.report.ignored)
    base = load_model(SPECS / "qwen3_5_text.yaml", checkpoint=TOYS / "qwen3.5-0.8b-toy")
    ids = list(range(1, 40))
    assert Session(loaded.lm).logits(ids).tobytes() == Session(base.lm).logits(ids).tobytes()


def test_a_qwen3_5_moe_composite_reads_its_text_model(tmp_path):
    # Every published Qwen3.5 MoE checkpoint is a Qwen3_5MoeForConditionalGeneration (text
    # model in text_config, a vision tower beside it): it loads through the spec's part, and
    # its text model is the text config's own (specs/qwen3_5_moe_text.yaml's toy, whose golden
    # judges it against transformers), the same weights drawn under the composite's names.
    import yaml

    text = {k: v for k, v in yaml.safe_load((SPECS / "qwen3_5_moe_text.yaml").read_text())
            ["toy"]["config"].items() if k != "architectures"}
    config = {"architectures": ["Qwen3_5MoeForConditionalGeneration"],
              "model_type": "qwen3_5_moe", "image_token_id": 248056, "video_token_id": 248057,
              "vision_start_token_id": 248053, "vision_end_token_id": 248054,
              "tie_word_embeddings": False, "text_config": text,
              "vision_config": {"depth": 1, "hidden_size": 32, "intermediate_size": 64,
                                "num_heads": 4, "out_hidden_size": 64,
                                "model_type": "qwen3_5_moe"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    composite = load_model(SPECS / "qwen3_5_moe_text.yaml", checkpoint=tmp_path, random_weights=0)
    toy = load_model(SPECS / "qwen3_5_moe_text.yaml", random_weights=0, toy=True)
    assert composite.part is not None
    ids = list(range(1, 60))
    assert Session(composite.lm).logits(ids).tobytes() == Session(toy.lm).logits(ids).tobytes()


def test_the_part_config_reads_text_config_and_the_composites_keys(tmp_path):
    shutil.copytree(TOYS / "gemma-3-4b-it-toy", tmp_path / "c")
    config = json.loads((tmp_path / "c" / "config.json").read_text())
    loaded = load_model(SPECS / "gemma3.yaml", checkpoint=tmp_path / "c")
    assert loaded.config_json["hidden_size"] == config["text_config"]["hidden_size"]
    assert loaded.whole_config == config
    # A top-level key neither the text model's, read nor ignored is refused by name.
    (tmp_path / "c" / "config.json").write_text(json.dumps({**config, "vision_feature": 3}))
    with pytest.raises(SpecError, match="vision_feature"):
        load_model(SPECS / "gemma3.yaml", checkpoint=tmp_path / "c")
    load_model(SPECS / "gemma3.yaml", checkpoint=tmp_path / "c", allow_unread_config=True)
    # The composite's tie_word_embeddings is the head's (Gemma3Config's, default true).
    untied = {**config, "tie_word_embeddings": False}
    (tmp_path / "c" / "config.json").write_text(json.dumps(untied))
    with pytest.raises(CheckpointError, match="lm_head.weight"):
        load_model(SPECS / "gemma3.yaml", checkpoint=tmp_path / "c")
    (tmp_path / "c" / "config.json").write_text(json.dumps(
        {k: v for k, v in config.items() if k != "text_config"}))
    with pytest.raises(SpecError, match="text_config is absent"):
        load_model(SPECS / "gemma3.yaml", checkpoint=tmp_path / "c")


def test_transformers_5s_own_module_names_load_too(tmp_path):
    # model.language_model.* beside lm_head: a composite saved with transformers 5's module
    # names (newer releases publish so) reads as the hub's language_model.model.* does.
    shutil.copytree(TOYS / "gemma-3-4b-it-toy", tmp_path / "c")
    tensors = load_file(str(tmp_path / "c" / "model.safetensors"))
    renamed = {("model." + k if k.startswith(("vision_tower", "multi_modal")) else
                k.replace("language_model.model.", "model.language_model.")): v
               for k, v in tensors.items()}
    save_file(renamed, str(tmp_path / "c" / "model.safetensors"))
    ours = load_model(SPECS / "gemma3.yaml", checkpoint=tmp_path / "c")
    base = load_model(SPECS / "gemma3.yaml", checkpoint=TOYS / "gemma-3-4b-it-toy")
    for name, array in base.weights().items():
        np.testing.assert_array_equal(ours.weights()[name], array)


def test_bert_base_uncased_as_the_hub_holds_it(tmp_path):
    # bert-base-uncased's file: TensorFlow's LayerNorm.gamma/beta (transformers' legacy
    # renames), the pooler and the next-sentence head of pretraining, which the masked LM
    # never reads.
    shutil.copytree(TOYS / "bert-base-uncased-toy", tmp_path / "c")
    tensors = load_file(str(tmp_path / "c" / "model.safetensors"))
    legacy = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                       "LayerNorm.beta"): v
              for k, v in tensors.items()}
    rng = np.random.default_rng(1)
    extra = {"bert.pooler.dense.weight": rng.standard_normal((32, 32), np.float32),
             "bert.pooler.dense.bias": np.zeros(32, np.float32),
             "cls.seq_relationship.weight": rng.standard_normal((2, 32), np.float32),
             "cls.seq_relationship.bias": np.zeros(2, np.float32)}
    save_file({**legacy, **extra}, str(tmp_path / "c" / "model.safetensors"))
    loaded, golden = judged("bert", "bert-base-uncased-toy", tmp_path / "c")
    assert set(extra) <= set(loaded.report.ignored)
    outputs_match(loaded, golden)


def test_drawn_weights_are_written_as_the_part_lays_them_out():
    # A checkpoint's config with drawn weights: written under the names the checkpoint uses.
    for spec, name in (("bert", "bert-base-uncased-toy"), ("modernbert", "modernbert-base-toy"),
                       ("roberta", "roberta-sequence-classification-toy")):
        drawn = load_encoder(SPECS / f"{spec}.yaml", checkpoint=TOYS / name, random_weights=0)
        assert set(drawn.checkpoint_tensors()) == set(Checkpoint(TOYS / name).tensors), name


@pytest.mark.parametrize("name", ["bert-base-uncased-toy"])
def test_fill_mask_is_transformers_pipeline(name):
    model = load(None, TOYS / name)
    assert model.task == "fill-mask"
    recorded = PIPELINES[name]
    for text, want in zip(recorded["texts"], recorded["results"]):
        got = model.fill_mask(text)
        masks = (got, want) if isinstance(want[0], list) else ([got], [want])
        for g_mask, w_mask in zip(*masks):
            assert [g["token"] for g in g_mask] == [w["token"] for w in w_mask]
            assert [g["token_str"] for g in g_mask] == [w["token_str"] for w in w_mask]
            assert [g["sequence"] for g in g_mask] == [w["sequence"] for w in w_mask]
            np.testing.assert_allclose([g["score"] for g in g_mask],
                                       [w["score"] for w in w_mask], atol=1e-6)


def test_classify_is_transformers_pipeline():
    name = "bert-sequence-classification-toy"
    model = load(None, TOYS / name)
    recorded = PIPELINES[name]
    for got, want in zip(model.classify(recorded["texts"]), recorded["results"]):
        want = want[0] if isinstance(want, list) else want
        assert got["label"] == want["label"] and abs(got["score"] - want["score"]) < 1e-6
    for got, want in zip(model.classify(recorded["texts"], top_k=None), recorded["all"]):
        assert [g["label"] for g in got] == [w["label"] for w in want]
        np.testing.assert_allclose([g["score"] for g in got], [w["score"] for w in want],
                                   atol=1e-6)
    with pytest.raises(ValueError, match="fill_mask"):
        load(None, TOYS / "bert-base-uncased-toy").classify("a text")


def test_classify_tokens_is_transformers_pipeline():
    name = "bert-token-classification-toy"
    model = load(None, TOYS / name)
    recorded = PIPELINES[name]
    for text, want in zip(recorded["texts"], recorded["results"]):
        got = model.classify_tokens(text)
        assert [(g["entity"], g["index"], g["word"], g["start"], g["end"]) for g in got] == \
            [(w["entity"], w["index"], w["word"], w["start"], w["end"]) for w in want]
        np.testing.assert_allclose([g["score"] for g in got], [w["score"] for w in want],
                                   atol=1e-6)


def test_the_commands():
    runner = CliRunner()
    out = runner.invoke(app, ["fill-mask", "--checkpoint", str(TOYS / "bert-base-uncased-toy"),
                              "--text", "paris is the [MASK] of france.", "--top-k", "2"])
    assert out.exit_code == 0, out.output
    want = PIPELINES["bert-base-uncased-toy"]["results"][0][:2]
    assert out.stdout.splitlines() == [f"{w['score']:.4f}\t{w['token_str']}\t{w['sequence']}"
                                       for w in want]
    out = runner.invoke(app, ["classify", "bert", "--checkpoint",
                              str(TOYS / "bert-sequence-classification-toy"), "--text",
                              "i love this movie"])
    assert out.exit_code == 0, out.output
    want = PIPELINES["bert-sequence-classification-toy"]["results"][0]
    want = want[0] if isinstance(want, list) else want
    assert out.stdout.splitlines() == [f"{want['label']}\t{want['score']:.4f}"]
    out = runner.invoke(app, ["fill-mask", "--checkpoint",
                              str(TOYS / "bert-sequence-classification-toy"), "--text", "a [MASK]"])
    assert out.exit_code == 1 and "iron-spec classify" in out.output


def test_the_registry_picks_a_spec_by_its_parts():
    assert find(None, TOYS / "gemma-3-4b-it-toy").name == "gemma3.yaml"
    assert find(None, TOYS / "mistral-small-3.1-toy").name == "mistral.yaml"
    assert find(None, TOYS / "ministral-3-3b-toy").name == "ministral3.yaml"
    assert find(None, TOYS / "qwen3.5-0.8b-toy").name == "qwen3_5_text.yaml"
    assert find(None, TOYS / "roberta-sequence-classification-toy").name == "roberta.yaml"
    assert find(None, TOYS / "xlm-roberta-base-toy").name == "xlm_roberta.yaml"


def test_an_encoder_takes_an_eos_id_outside_its_vocabulary(tmp_path):
    # A decoder's token ids in a shared config: an encoder reads none but its padding id.
    shutil.copytree(TOYS / "roberta-base-toy", tmp_path / "c")
    config = json.loads((tmp_path / "c" / "config.json").read_text())
    (tmp_path / "c" / "config.json").write_text(json.dumps(
        {**config, "eos_token_id": 250001, "bos_token_id": 250000}))
    load_encoder(SPECS / "roberta.yaml", checkpoint=tmp_path / "c")
    (tmp_path / "c" / "config.json").write_text(json.dumps({**config, "pad_token_id": 250001}))
    with pytest.raises(ValueError, match="pad_token_id"):
        load_encoder(SPECS / "roberta.yaml", checkpoint=tmp_path / "c")


def test_nomic_refuses_its_own_keys_that_build_another_model(tmp_path):
    shutil.copytree(TOYS / "nomic-embed-text-v1.5-toy", tmp_path / "c")
    config = json.loads((tmp_path / "c" / "config.json").read_text())
    for key, value in (("prenorm", True), ("qkv_proj_bias", True), ("rotary_emb_fraction", 0.5),
                       ("activation_function", "gelu")):
        (tmp_path / "c" / "config.json").write_text(json.dumps({**config, key: value}))
        with pytest.raises(SpecError, match=key):
            load_encoder(SPECS / "nomic_bert.yaml", checkpoint=tmp_path / "c")


def test_a_part_view_moves_keeps_and_leaves_out(tmp_path):
    moves = {"model.language_model": "model", "language_model.model": "model"}
    assert moved("model.language_model.layers.0.w", moves) == "model.layers.0.w"
    assert moved("lm_head.weight", moves) is None
    assert stored("model.layers.0.w", moves) == "model.language_model.layers.0.w"
    head = {"bert": "", "cls.predictions.bias": "head.out.bias"}
    assert stored("head.out.bias", head) == "cls.predictions.bias"
    assert stored("embeddings.x", head) == "bert.embeddings.x"
    save_file({"a.b.w": np.zeros(2, np.float32), "a.c.w": np.ones(2, np.float32),
               "tower.w": np.zeros(1, np.float32), "x.LayerNorm.gamma": np.ones(1, np.float32)},
              str(tmp_path / "model.safetensors"))
    part = subtree(Checkpoint(tmp_path), {"a": ""}, ["tower"])
    assert sorted(part.tensors) == ["b.w", "c.w", "x.LayerNorm.weight"]
    assert part.left == ["tower.w"] and part.source("b.w") == "a.b.w"
    np.testing.assert_array_equal(part.read("c.w"), np.ones(2, np.float32))
    with pytest.raises(CheckpointError, match="both read as b.w"):
        subtree(Checkpoint(tmp_path), {"a": "", "a.c": "b"}, ["tower"])
    with pytest.raises(CheckpointError, match="no tensor is under"):
        subtree(Checkpoint(tmp_path), {"model": ""})


def test_show_places_a_parts_tensors_by_the_files_names():
    out = CliRunner().invoke(app, ["show", "bert", "--checkpoint",
                                   str(TOYS / "bert-base-uncased-toy")])
    assert out.exit_code == 0, out.output
    assert "<- cls.predictions.transform.dense.weight" in out.stdout
    out = CliRunner().invoke(app, ["show", "gemma3", "--checkpoint",
                                   str(TOYS / "gemma-3-4b-it-toy")])
    assert out.exit_code == 0, out.output
    assert "<- language_model.model.embed_tokens.weight" in out.stdout
    # The tower's tensors are its own (the spec's towers:), placed after the text model's.
    assert "<- vision_tower.post_layernorm.weight (BF16 [16])" in out.stdout
    assert "unused: vision_tower" not in out.stdout


def test_lint_config_reads_a_part(tmp_path):
    # lint --config on a composite or task checkpoint's config.json judges the part's keys,
    # and the whole file's keys around it.
    for spec, name in (("gemma3", "gemma-3-4b-it-toy"), ("bert", "bert-base-uncased-toy"),
                       ("nomic_bert", "nomic-embed-text-v1.5-toy")):
        out = CliRunner().invoke(app, ["lint", str(SPECS / f"{spec}.yaml"), "--config",
                                       str(TOYS / name / "config.json")])
        assert out.exit_code == 0, out.output
    config = json.loads((TOYS / "gemma-3-4b-it-toy" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "extra_top": 1}))
    out = CliRunner().invoke(app, ["lint", str(SPECS / "gemma3.yaml"), "--config",
                                   str(tmp_path / "config.json")])
    assert out.exit_code == 1 and "extra_top" in out.output
