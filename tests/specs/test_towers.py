"""Specs with towers (``towers:``) on composite toys (published configs shrunk, built and
saved by transformers with a tokenizer, the published chat template and the family's
processor: tests/checkpoints/make_towers.py), judged by the goldens transformers' own
processor and ``*ForConditionalGeneration`` recorded: the prompt's ids, the pixel values, the
soft tokens and the logits (KL within the spec's gates); and what a session does with images
(a tower runs once per image; a changed image forgets the caches from its first
placeholder)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from iron_spec import load
from iron_spec.library.multimodal_golden import OtherInputs, judge, messages_with
from iron_spec.runtime.session import Session
from iron_spec.spec.errors import SpecError
from iron_spec.spec.loader import load_spec
from tests.conftest import SPECS

TOYS = Path(__file__).resolve().parents[1] / "checkpoints"
GOLDENS = Path(__file__).resolve().parents[1] / "goldens" / "towers"
CASES = [("gemma3", "gemma3-vision-toy"), ("llama3", "llava-1.5-toy"),
         ("qwen2", "qwen2-audio-toy"), ("llama3", "smolvlm2-toy"),
         ("gemma4", "gemma4-audio-toy")]


def gates(spec: str) -> dict:
    return load_spec(SPECS / f"{spec}.yaml").get("validation", "kl")


@pytest.fixture(scope="module")
def gemma3():
    return load("gemma3", TOYS / "gemma3-vision-toy")


@pytest.mark.parametrize("spec,toy", CASES)
@pytest.mark.parametrize("chunk", [None, 24])
def test_logits_over_a_prompt_with_an_image_meet_transformers(spec, toy, chunk):
    # A chunk of 24 ids ends where the image's rows would be cut: they run in the next.
    model = load(spec, TOYS / toy, prefill_chunk=chunk)
    golden = np.load(GOLDENS / spec / f"{toy}.npz")
    j = judge(model, golden)
    assert j.ids_equal
    assert j.pixels == 0.0 if "image" in golden else j.pixels < 1e-5  # features: float math
    assert j.soft < 1e-5
    g = gates(spec)
    assert j.kl["mean"] <= g["mean"] and j.kl["p90"] <= g["p90"] and j.kl["max"] <= g["max"], j.kl
    assert j.kl["top1_mismatches"] == 0
    if chunk == 24 and spec == "gemma3":
        placed = [c for c in j.calls if c[0] == "placed"]
        assert placed and placed[0][1] == 23  # the image's first placeholder starts a chunk


def test_an_image_whose_rows_see_only_backwards_fails_the_gates(gemma3):
    golden = np.load(GOLDENS / "gemma3" / "gemma3-vision-toy.npz")
    (run,) = gemma3.multimodal.towers.values()
    run.bidirectional = False
    try:
        j = judge(gemma3, golden)
    finally:
        run.bidirectional = True
    assert j.kl["mean"] > 100 * gates("gemma3")["mean"]


def flipped(tmp_path, toy: str, **keys) -> Path:
    """A copy of ``toy`` whose config.json sets ``keys``."""
    copy = tmp_path / toy
    shutil.copytree(TOYS / toy, copy)
    config = json.loads((copy / "config.json").read_text())
    config.update(keys)
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def test_llava_reads_the_hidden_state_its_config_names(tmp_path):
    golden = np.load(GOLDENS / "llama3" / "llava-1.5-toy.npz")
    model = load("llama3", flipped(tmp_path, "llava-1.5-toy", vision_feature_layer=-1))
    with pytest.raises(OtherInputs):
        judge(model, golden)  # a golden judges the inputs it was recorded on alone
    j = judge(model, golden, other_inputs=True)
    assert j.ids_equal and j.pixels == 0.0
    assert j.soft > 1e-2 and j.kl["mean"] > 100 * gates("llama3")["mean"]


def test_llavas_full_strategy_keeps_the_class_row(tmp_path):
    model = load("llama3", flipped(tmp_path, "llava-1.5-toy",
                                   vision_feature_select_strategy="full"))
    tower = model.loaded.towers[0]
    assert tower.count(None) == 17  # 16 patches and the class row


def test_idefics3_is_smolvlm_2s_architecture_under_its_other_name(tmp_path):
    # Idefics3ForConditionalGeneration (SmolVLM 1, Idefics3-8B) computes what
    # SmolVLMForConditionalGeneration does over the same tensors and processor.
    golden = np.load(GOLDENS / "llama3" / "smolvlm2-toy.npz")
    toy = flipped(tmp_path, "smolvlm2-toy", architectures=["Idefics3ForConditionalGeneration"],
                  model_type="idefics3")
    j = judge(load("llama3", toy), golden, other_inputs=True)
    g = gates("llama3")
    assert j.ids_equal and j.pixels == 0.0 and j.kl["max"] <= g["max"]


def test_an_image_cut_into_tiles_writes_each_tiles_row_and_column():
    model = load("llama3", TOYS / "smolvlm2-toy")
    tower = model.loaded.towers[0]
    golden = np.load(GOLDENS / "llama3" / "smolvlm2-toy.npz")
    # 40x70 pixels: the longest side to 64, then 64x64 in whole 32-pixel tiles: 2x2 and the
    # global image, 2x2 soft tokens each after a pixel shuffle of 8x8 patches by 4.
    assert tower.layout(golden["image"]) == (4, 2, 2)
    assert tower.count(golden["image"]) == 20
    text = model.tokenizer.decode(golden["prompt_ids"].tolist(), skip_special_tokens=False)
    assert "<row_2_col_1>" + "<image>" * 4 + "<fake_token_around_image><row_2_col_2>" in text
    # 90x20: 64x14 after the first resize, then 64x32: two rows of one tile.
    assert tower.layout(np.zeros((90, 20, 3), np.uint8)) == (4, 2, 1)


def count_tower_runs(model) -> list:
    tower = model.loaded.towers[0]
    runs = []
    inner = tower.tower.version

    class Counting:
        def __call__(self, rows):
            runs.append(1)
            return inner(rows)

    tower.tower._version = Counting()
    return runs


def test_a_later_turn_reuses_an_images_soft_tokens_and_caches():
    model = load("gemma3", TOYS / "gemma3-vision-toy", prefill_chunk=16)
    runs = count_tower_runs(model)
    golden = np.load(GOLDENS / "gemma3" / "gemma3-vision-toy.npz")

    def conversation():
        chat = model.chat()
        chat.send("What is it?", images=[golden["image"]], max_new_tokens=2, temperature=0)
        before = len(chat.session.calls)
        chat.send("And the colours?", max_new_tokens=2, temperature=0)
        held = chat.session.caches.tokens[:chat.session.held].tolist()
        return chat.session.calls[before:], held, chat.session.logits(held).copy()

    calls, held, logits = conversation()
    assert len(runs) == 1  # the tower ran for the first turn alone
    assert calls[0][1] >= 32  # resumed past the image (its placeholders at 21..24)
    # The whole history run from the start by a fresh session: the same logits but for the
    # rounding of the keys and values the decode steps wrote (a decode step's sums are not
    # a prompt row's), and it leaves another conversation in the caches.
    fresh = Session(model.loaded.lm)
    model.multimodal.place(fresh, held, {model.loaded.towers[0].placeholder: [golden["image"]]})
    np.testing.assert_allclose(logits, fresh.logits(held), rtol=0, atol=1e-5)
    # Bit for bit a fresh chat making the same calls.
    again = conversation()
    assert again[0] == calls and again[1] == held
    assert again[2].tobytes() == logits.tobytes()


def test_a_changed_image_forgets_the_caches_from_its_first_placeholder():
    model = load("gemma3", TOYS / "gemma3-vision-toy", prefill_chunk=16)
    golden = np.load(GOLDENS / "gemma3" / "gemma3-vision-toy.npz")
    messages = messages_with(golden)
    ids = model.encode(messages)
    token = model.loaded.towers[0].placeholder
    first = ids.index(token)
    other = golden["image"][::-1].copy()
    session = Session(model.loaded.lm)
    model.multimodal.place(session, ids, {token: [golden["image"]]})
    session.logits(ids)
    n = len(session.calls)
    model.multimodal.place(session, ids, {token: [golden["image"]]})
    session.logits(ids)
    assert len(session.calls) == n  # the same image: nothing runs again
    model.multimodal.place(session, ids, {token: [other]})
    changed = session.logits(ids)
    # From the chunk holding the first stale placeholder, or before it where a sliding
    # window's ring no longer holds the window before that chunk (here: from 0).
    assert session.calls[n][1] <= first
    fresh = Session(model.loaded.lm)
    model.multimodal.place(fresh, ids, {token: [other]})
    np.testing.assert_array_equal(changed, fresh.logits(ids))


def test_a_llava_chat_keeps_its_turns_as_items():
    model = load("llama3", TOYS / "llava-1.5-toy")
    golden = np.load(GOLDENS / "llama3" / "llava-1.5-toy.npz")
    chat = model.chat()
    chat.send("What is it?", images=[golden["image"]], max_new_tokens=2, temperature=0)
    chat.send("And then?", max_new_tokens=2, temperature=0)
    assert [m["role"] for m in chat.messages] == ["user", "assistant"] * 2
    assert all(isinstance(m["content"], list) for m in chat.messages)


def test_placeholders_and_images_that_differ_in_number_are_refused(gemma3):
    golden = np.load(GOLDENS / "gemma3" / "gemma3-vision-toy.npz")
    ids = gemma3.encode(messages_with(golden))
    token = gemma3.loaded.towers[0].placeholder
    session = Session(gemma3.loaded.lm)
    with pytest.raises(ValueError, match="placeholders"):
        gemma3.multimodal.place(session, ids, {token: [golden["image"]] * 2})
    assert session.placement is None  # refused before anything changed
    with pytest.raises(ValueError, match="image marker"):
        gemma3.stream("<start_of_image> twice <start_of_image>", images=[golden["image"]])


def test_an_image_by_url_is_not_fetched(gemma3):
    messages = [{"role": "user", "content": [{"type": "image", "url": "http://x/y.png"},
                                              {"type": "text", "text": "hi"}]}]
    with pytest.raises(ValueError, match="not fetched"):
        gemma3.generate(messages, max_new_tokens=1)


def test_an_unread_tower_config_key_is_refused(tmp_path):
    toy = tmp_path / "toy"
    shutil.copytree(TOYS / "gemma3-vision-toy", toy)
    config = json.loads((toy / "config.json").read_text())
    config["vision_config"]["made_up"] = 1
    (toy / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecError, match="made_up"):
        load("gemma3", toy)


def test_a_refused_front_end_setting_is_named(tmp_path):
    toy = tmp_path / "toy"
    shutil.copytree(TOYS / "gemma3-vision-toy", toy)
    processor = json.loads((toy / "processor_config.json").read_text())
    processor["image_processor"]["do_pan_and_scan"] = True
    (toy / "processor_config.json").write_text(json.dumps(processor))
    with pytest.raises(SpecError, match="pan and scan"):
        load("gemma3", toy)


def test_a_sounds_soft_tokens_follow_its_length():
    model = load("qwen2", TOYS / "qwen2-audio-toy")
    golden = np.load(GOLDENS / "qwen2" / "qwen2-audio-toy.npz")
    tower = model.loaded.towers[0]
    # Qwen2AudioProcessor's num_audio_tokens: (((frames - 1) // 2 + 1) - 2) // 2 + 1.
    frames = int(golden["feature_frames"])
    assert tower.count(golden["audio"]) == (((frames - 1) // 2 + 1) - 2) // 2 + 1 == \
        len(golden["soft_tokens"])
    half = golden["audio"][: len(golden["audio"]) // 2]
    assert tower.count(half) < tower.count(golden["audio"])
    ids = model.encode([{"role": "user", "content": [{"type": "audio", "audio": half},
                                                     {"type": "text", "text": "hi"}]}])
    assert ids.count(tower.placeholder) == tower.count(half)


def test_run_takes_an_image_file_and_refuses_a_tower_the_model_lacks(tmp_path):
    from PIL import Image
    from typer.testing import CliRunner

    from iron_spec.cli.app import app

    golden = np.load(GOLDENS / "gemma3" / "gemma3-vision-toy.npz")
    picture = tmp_path / "picture.png"
    Image.fromarray(golden["image"]).save(picture)
    runner = CliRunner()
    r = runner.invoke(app, ["run", "--checkpoint", str(TOYS / "gemma3-vision-toy"), "--image",
                            str(picture), "--chat", "--prompt", "What is it?", "--num-tokens",
                            "2", "--temperature", "0", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.splitlines()[0])["prompt_tokens"] == len(
        load("gemma3", TOYS / "gemma3-vision-toy").encode(
            [{"role": "user", "content": [{"type": "image", "image": str(picture)},
                                          {"type": "text", "text": "What is it?"}]}]))
    sound = tmp_path / "sound.wav"  # a sound that reads (an image is refused as no sound first)
    try:
        import soundfile
        soundfile.write(str(sound), np.zeros(1600, np.float32), 16000)
    except ImportError:  # no audio extra: the file is not read before the tower's refusal
        sound = picture
    r = runner.invoke(app, ["run", "--checkpoint", str(TOYS / "gemma3-vision-toy"), "--audio",
                            str(sound), "--prompt", "x", "--num-tokens", "1"])
    assert r.exit_code == 1 and "audio tower" in r.output, r.output
    r = runner.invoke(app, ["run", "--checkpoint", str(TOYS / "gemma3-vision-toy"), "--image",
                            str(tmp_path / "missing.png"), "--prompt", "x"])
    assert r.exit_code == 1 and "no such file" in r.output
