"""Qwen2.5-VL through specs/qwen2.yaml (its parts and towers entries) on its composite toy
(Qwen/Qwen2.5-VL-3B-Instruct's config.json, every key kept, the sizes shrunk; and a
Qwen2-VL toy of Qwen2VLConfig's keys:
tests/checkpoints/make_qwen_vl.py), judged by the golden transformers' own processor and
Qwen2_5_VLForConditionalGeneration recorded: the ids (the chat template and the processor's
expansion of <|image_pad|>), the pixel values, the soft tokens, the M-RoPE positions
(get_rope_index) and the logits; the front end against transformers' pixels of a real
photograph at the published settings."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from iron_spec import load
from iron_spec.library.multimodal_golden import judge
from iron_spec.runtime.session import Session
from iron_spec.runtime.towers import multimodal
from iron_spec.runtime.towers.mrope import rope_positions
from iron_spec.runtime.towers.qwen_images import GridProcessor, smart_resize
from iron_spec.runtime.towers.qwen_vision import vision_positions, window_order
from iron_spec.spec.errors import SpecError
from iron_spec.spec.loader import load_spec
from iron_spec.spec.options import towers as tower_options
from iron_spec.spec.towers import tower_tree
from tests.checkpoints.make_qwen_vl import QWEN2_5_VL_3B_INSTRUCT, QWEN2_5_VL_TOY
from tests.conftest import SPECS

TOY = Path(__file__).resolve().parents[1] / "checkpoints" / "qwen2.5-vl-toy"
GOLDENS = Path(__file__).resolve().parents[1] / "goldens" / "towers"
GOLDEN = GOLDENS / "qwen2" / "qwen2.5-vl-toy.npz"


def gates() -> dict:
    return load_spec(SPECS / "qwen2.yaml").get("validation", "kl")


@pytest.fixture(scope="module")
def golden():
    return dict(np.load(GOLDEN))


def within(kl: dict) -> bool:
    g = gates()
    return kl["mean"] <= g["mean"] and kl["p90"] <= g["p90"] and kl["max"] <= g["max"]


@pytest.mark.parametrize("toy", ["qwen2.5-vl-toy", "qwen2-vl-toy"])
@pytest.mark.parametrize("chunk", [None, 24])
def test_logits_over_a_prompt_with_an_image_meet_transformers(toy, chunk):
    # A chunk of 24 ids cuts the image's 28 soft tokens (rows 58..85) at 72: its rows are
    # causal, each chunk turning its own by their M-RoPE positions. Qwen2-VL: LayerNorm
    # blocks, a plain MLP, no windows, the same M-RoPE.
    model = load("qwen2", TOY.parent / toy, prefill_chunk=chunk)
    session = Session(model.loaded.lm)
    j = judge(model, np.load(GOLDENS / "qwen2" / f"{toy}.npz"), session=session)
    assert j.ids_equal
    assert j.pixels == 0.0  # Pillow's bicubic resize, as transformers' PIL backend
    assert j.soft < 1e-5
    assert within(j.kl) and j.kl["top1_mismatches"] == 0, j.kl
    assert j.positions == 9  # the prompt's last row, then 8 decode steps (rope delta + step)
    if chunk == 24:
        placed = [c for c in j.calls if c[0] == "placed"]
        assert [c[1] for c in placed[:2]] == [48, 72]


@pytest.mark.parametrize("toy", ["qwen2.5-vl-toy", "qwen2-vl-toy"])
def test_m_rope_positions_are_get_rope_indexs(toy):
    golden = dict(np.load(GOLDENS / "qwen2" / f"{toy}.npz"))
    ids = golden["ids"]
    at = np.flatnonzero(ids == QWEN2_5_VL_TOY["image_token_id"])
    (t, h, w), = golden["image_grid_thw"]
    m = QWEN2_5_VL_TOY["vision_config"]["spatial_merge_size"]
    positions, delta = rope_positions(len(ids), [(int(at[0]), (int(t), h // m, w // m))])
    np.testing.assert_array_equal(positions, golden["rope_positions"])
    assert delta == int(golden["rope_delta"])


def test_rows_turned_by_their_index_fail_the_gates(golden, monkeypatch):
    # The same model, its rows turned as a text's (every axis the row's index): the test of
    # M-RoPE can fail.
    def by_index(n, images):
        return np.repeat(np.arange(n, dtype=np.int32)[:, None], 3, axis=1), 0

    monkeypatch.setattr(multimodal, "rope_positions", by_index)
    j = judge(load("qwen2", TOY), np.load(GOLDEN))
    assert j.ids_equal and j.soft < 1e-5
    assert j.kl["mean"] > 100 * gates()["mean"]


def test_windows_and_positions_by_hand():
    # 8x14 patches, merged 2x2: a 4x7 grid in windows of 2x2 merged rows, the last column of
    # windows one wide (transformers pads to whole windows and leaves the padding out).
    order, bounds = window_order(8, 14, 2, 2)
    assert order[:8].tolist() == [0, 1, 7, 8, 2, 3, 9, 10]
    assert order[12:14].tolist() == [6, 13]
    assert bounds == (0, 16, 32, 48, 56, 72, 88, 104, 112)
    # The processor writes each 2x2 block's patches together: (row, column) of the first 6.
    assert vision_positions(8, 14, 2)[:6].tolist() == [[0, 0], [0, 1], [1, 0], [1, 1],
                                                        [0, 2], [0, 3]]


def test_smart_resize_by_hand():
    # 40x70 at factor 8: 40x72 is over 2048 pixels, so scaled down by sqrt(2800 / 2048).
    assert smart_resize(40, 70, 8, 256, 2048) == (32, 56)
    assert smart_resize(10, 10, 28, 56 * 56, 28 * 28 * 1280) == (56, 56)  # scaled up
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(1, 300, 28, 1, 10 ** 9)


def test_a_photograph_gives_transformers_pixels():
    # matplotlib's grace_hopper.jpg (512x600), through Qwen2VLImageProcessorPil at the 3B's
    # published settings and the toy's: the same grid, bit for bit the same pixels.
    import matplotlib

    photo = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
    golden = dict(np.load(GOLDENS / "front_ends" / "qwen2vl_grace_hopper.npz"))
    for name in golden["names"]:
        settings = json.loads(str(golden[f"{name}.settings"]))
        size = {"shortest_edge": settings.pop("min_pixels"),
                "longest_edge": settings.pop("max_pixels")}
        front = GridProcessor(size=size, **{k: tuple(v) if isinstance(v, list) else v
                                            for k, v in settings.items()})
        rows, (h, w) = front(photo)
        assert [1, h, w] == golden[f"{name}.grid"].tolist()
        assert rows.shape == tuple(golden[f"{name}.shape"])
        assert np.array_equal(rows.reshape(-1)[::1009], golden[f"{name}.samples"])
        assert hashlib.sha256(rows.tobytes()).hexdigest() == str(golden[f"{name}.sha256"])


def test_the_toy_is_the_published_config_with_the_sizes_shrunk():
    toy = json.loads((TOY / "config.json").read_text())
    assert list(toy) == list(QWEN2_5_VL_3B_INSTRUCT)
    assert list(toy["vision_config"]) == list(QWEN2_5_VL_3B_INSTRUCT["vision_config"])


def test_the_published_3b_config_builds_its_tower():
    # Every key of the published file accounted, its tower's tree at full size (no weights).
    spec = load_spec(SPECS / "qwen2.yaml")
    (entry,) = [e for e in tower_options.entries(spec)
                if "Qwen2_5_VLForConditionalGeneration" in e.architectures]
    built = tower_tree(spec, entry, QWEN2_5_VL_3B_INSTRUCT, None, 2048)
    o = built.options
    assert (o.hidden, o.heads, o.depth, o.intermediate, o.out) == (1280, 16, 32, 3420, 2048)
    assert (o.patch, o.temporal, o.merge, o.window, o.full) == (14, 2, 2, 112, (7, 15, 23, 31))
    assert built.front.size == {"shortest_edge": 3136, "longest_edge": 1003520}
    # 448x448 pixels: 32x32 patches, 256 soft tokens.
    assert built.tree.soft(32, 32) == 256
    with pytest.raises(SpecError, match="out_hidden_size"):
        tower_tree(spec, entry, QWEN2_5_VL_3B_INSTRUCT, None, 3584)


def test_an_image_of_another_size_gives_its_own_grid(golden):
    model = load("qwen2", TOY)
    tower = model.loaded.towers[0]
    assert tower.count(golden["image"]) == 28
    assert tower.grid(golden["image"]) == (1, 4, 7)
    # 64x64: 64 pixels a side is 4096 > 2048, scaled down to 40x40: 10x10 patches, 25.
    assert tower.count(np.zeros((64, 64, 3), np.uint8)) == 25
    soft = tower.soft_tokens(np.zeros((64, 64, 3), np.uint8))
    assert soft.shape == (25, 64) and np.isfinite(soft).all()


def test_transformers_5s_tensor_names_load_the_same_model(tmp_path):
    # transformers 5 names the text model's tensors model.language_model.* and the tower's
    # model.visual.* (Qwen2_5_VLModel's own tree); published files name them model.* and
    # visual.*. Either loads the same numbers.
    import shutil

    from safetensors.numpy import load_file, save_file

    copy = tmp_path / "qwen2.5-vl-toy"
    shutil.copytree(TOY, copy)
    tensors = load_file(copy / "model.safetensors")
    renamed = {("model.language_model." + k[len("model."):] if k.startswith("model.") else
                "model." + k if k.startswith("visual.") else k): v for k, v in tensors.items()}
    assert any(k.startswith("model.visual.") for k in renamed)
    save_file(renamed, copy / "model.safetensors", metadata={"format": "pt"})
    j = judge(load("qwen2", copy), np.load(GOLDEN), other_inputs=True)
    assert j.ids_equal and j.pixels == 0.0 and j.soft < 1e-5
    assert within(j.kl) and j.kl["top1_mismatches"] == 0


def test_two_images_positions_by_hand():
    # Rows 0-1 text; image A (1x2x2) at 2..5 from position 2; row 6 text at 2 + max(2, 2) = 4;
    # image B (1x1x2) at 7..8 from 5; row 9 at 5 + 2 = 7; later rows: index - 2.
    positions, delta = rope_positions(10, [(7, (1, 1, 2)), (2, (1, 2, 2))])
    assert positions.tolist() == [
        [0, 0, 0], [1, 1, 1], [2, 2, 2], [2, 2, 3], [2, 3, 2], [2, 3, 3], [4, 4, 4],
        [5, 5, 5], [5, 5, 6], [7, 7, 7]]
    assert delta == -2
    with pytest.raises(ValueError, match="overlaps"):
        rope_positions(10, [(2, (1, 2, 2)), (4, (1, 1, 1))])


def test_greedy_generation_draws_transformers_tokens(golden):
    # Through the library's generation (its engine: M-RoPE sessions decode one at a time),
    # the tokens transformers' generate drew after the prompt.
    from iron_spec.library.multimodal_golden import messages_with

    model = load("qwen2", TOY)
    done = model.complete(messages_with(golden), max_new_tokens=8, temperature=0)
    assert done.prompt_tokens == len(golden["prompt_ids"])
    assert done.token_ids == golden["ids"][len(golden["prompt_ids"]):].tolist()


def test_a_later_turn_reuses_the_caches_and_equals_a_fresh_run(golden):
    # A second turn's history past the image and its text: the held session runs only the
    # new rows (positions past the image by the delta) and gives what a fresh session does.
    from iron_spec.library import multimodal as library_multimodal
    from iron_spec.library.multimodal_golden import messages_with

    model = load("qwen2", TOY, prefill_chunk=16)
    ids, inputs = library_multimodal.encode(model, messages_with(golden))
    later = ids + golden["ids"][len(ids):].tolist() + [1, 92, 90, 76, 89, 206]
    held = Session(model.loaded.lm)
    calls = []
    for history in (ids, later):
        model.multimodal.place(held, history, inputs)
        got = held.logits(model.multimodal.lookup(history))
        calls.append(list(held.calls))
    # The second turn resumes at a chunk start the first held (112), past the image.
    last_placeholder = int(np.flatnonzero(np.asarray(ids) == 6)[-1])
    assert min(c[1] for c in calls[1][len(calls[0]):]) > last_placeholder
    fresh = Session(model.loaded.lm)
    model.multimodal.place(fresh, later, inputs)
    want = fresh.logits(model.multimodal.lookup(later))
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_an_image_files_refusal_names_the_file(tmp_path):
    # Found by a new user's trial: an image of aspect ratio over 200 was refused as "an image
    # of 2x500" with no word of which file.
    from PIL import Image

    path = tmp_path / "strip.png"
    Image.new("RGB", (500, 2)).save(path)
    tower = load("qwen2", TOY).loaded.towers[0]
    for call in (tower.count, tower.soft_tokens):
        with pytest.raises(ValueError) as raised:
            call(str(path))
        assert str(raised.value).startswith(f"{path}: an image of 2x500: its aspect ratio 250")
