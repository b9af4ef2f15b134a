"""``iron-spec check`` on a composite checkpoint: each tower's compiled soft tokens against
its float64 reference, and the model with its towers against the golden transformers
recorded on these inputs (tests/checkpoints/make_towers.py), after the text model's lines."""

from __future__ import annotations

import json
import re
import shutil

from typer.testing import CliRunner

from iron_spec.cli.app import app
from tests.conftest import SPECS, edited_spec

TOYS = SPECS.parent / "tests" / "checkpoints"
GOLDENS = SPECS.parent / "tests" / "goldens" / "towers"
runner = CliRunner()


def check(*args):
    return runner.invoke(app, ["check", *map(str, args)])


def test_a_tower_is_checked_against_its_reference_and_transformers_golden():
    result = check("gemma3", "--checkpoint", TOYS / "gemma3-vision-toy")
    out = result.output
    assert re.search(r"PASS  image tower = reference +max \|compiled - reference\| \S+, \S+ of "
                     r"the largest soft token \(at most 0.0001\), on a drawn 56x72 image", out), out
    line = re.search(r"PASS  towers KL vs golden +(.*)", out).group(1)
    assert line.startswith("ids equal, pixels within 0, soft tokens within ")
    assert f"golden {GOLDENS / 'gemma3' / 'gemma3-vision-toy.npz'}" in line
    assert "0 top-1 mismatches over 9 positions" in line
    # The text model has no golden of its own here: the verdict stays "not verified".
    assert result.exit_code == 3, out


def test_an_audio_tower_and_a_tiled_one_are_checked_too():
    out = check("qwen2", "--checkpoint", TOYS / "qwen2-audio-toy", "--json").output
    assert re.search(r"PASS  audio tower = reference .* on 2 s of drawn noise", out), out
    assert re.search(r"PASS  towers KL vs golden +ids equal, features within", out), out
    out = check("llama3", "--checkpoint", TOYS / "smolvlm2-toy").output
    # A 56x72 image: 2x2 tiles of SmolVLM 2's toy and the global image, each a run.
    assert re.search(r"PASS  image tower = reference .* on a drawn 56x72 image \(5 tiles\)", out), out
    assert "PASS  towers KL vs golden" in out


def test_an_image_whose_rows_see_only_backwards_fails_the_towers_golden(tmp_path):
    # Gemma 3's image rows see each other both ways (transformers' blockwise overlay): a
    # spec without it runs a causal image and fails the golden, which is found by the inputs'
    # fingerprint wherever the spec is.
    spec = edited_spec(tmp_path, "gemma3", "    bidirectional: true\n", "")
    result = check(spec, "--checkpoint", TOYS / "gemma3-vision-toy")
    assert result.exit_code == 1, result.output
    mean = float(re.search(r"FAIL  towers KL vs golden .*? KL mean ([0-9.e+-]+)",
                           result.output).group(1))
    assert mean > 1e-4, result.output
    assert "PASS  image tower = reference" in result.output  # the tower itself is right


def test_a_golden_of_other_inputs_does_not_judge_the_towers(tmp_path):
    # The same weights with another processor setting: the golden's pixels were not these.
    copy = tmp_path / "toy"
    shutil.copytree(TOYS / "gemma3-vision-toy", copy)
    processor = json.loads((copy / "processor_config.json").read_text())
    processor["image_processor"]["image_mean"] = [0.4, 0.5, 0.5]
    (copy / "processor_config.json").write_text(json.dumps(processor))
    result = check("gemma3", "--checkpoint", copy)
    assert "----  towers KL vs golden              no golden of these inputs in " in result.output
    assert "PASS  image tower = reference" in result.output
    assert result.exit_code == 3, result.output


def test_a_front_end_unlike_the_tower_fails_its_check(tmp_path):
    # Gemma 3 4B's toy keeps the published config's shape with image_size 28; without its
    # preprocessor_config.json, Gemma3ImageProcessor's class default size is 224x224, which no
    # image given to this model could pass through its tower.
    copy = tmp_path / "toy"
    shutil.copytree(TOYS / "gemma-3-4b-it-toy", copy)
    (copy / "preprocessor_config.json").unlink()
    result = check("gemma3", "--checkpoint", copy, "--self-only")
    assert result.exit_code == 1, result.output
    assert ("FAIL  image tower = reference          the front end does not meet the tower: it "
            "gives 224x224 pixels, the tower takes 28x28 (image_size)") in result.output
    assert "towers KL vs golden" not in result.output  # --self-only judges by no golden


def test_the_published_processor_file_meets_its_tower():
    # The toy's preprocessor_config.json is gemma-3-4b-it's, every key kept (nulls are the
    # class defaults; do_pan_and_scan null is off), its size shrunk with the tower's.
    result = check("gemma3", "--checkpoint", TOYS / "gemma-3-4b-it-toy", "--self-only")
    assert result.exit_code == 0, result.output
    assert re.search(r"PASS  image tower = reference .* on a drawn 56x72 image", result.output), \
        result.output


def test_gemma4s_image_tower_is_checked_against_its_golden():
    # Gemma 4's tower (kind axial): a version per patch grid, its golden over given
    # ids (make_axial_towers.py: no tokenizer), found by the inputs' fingerprint.
    out = check("gemma4", "--checkpoint", TOYS / "gemma4-vision-toy").output
    assert re.search(r"PASS  image tower = reference .* on a drawn 56x72 image \(21x27 "
                     r"patches\)", out), out
    line = re.search(r"PASS  towers KL vs golden +(.*)", out).group(1)
    assert line.startswith("ids equal, pixels within 0, soft tokens within ")
    assert "0 top-1 mismatches over 7 positions" in line
    # The composite toy's processor file gives its tower's 4-pixel patches.
    result = check("gemma4", "--checkpoint", TOYS / "gemma4-composite-toy", "--self-only")
    assert result.exit_code == 0, result.output


def test_gemma4s_audio_tower_is_checked_against_its_golden():
    # Gemma 4's audio tower (kind conformer): a version per sound's frames, its golden over
    # given ids (make_gemma4_towers.py audio), found by the inputs' fingerprint.
    out = check("gemma4", "--checkpoint", TOYS / "gemma4-audio-toy").output
    assert re.search(r"PASS  audio tower = reference .* on 2 s of drawn noise \(199 frames\)",
                     out), out
    line = re.search(r"PASS  towers KL vs golden +(.*)", out).group(1)
    assert line.startswith("ids equal, features within 0, soft tokens within ")
    assert "0 top-1 mismatches over 7 positions" in line


def test_a_composites_verdict_without_a_text_golden_says_it_is_the_text_models():
    # Found by a new user's trial: "PASS towers KL vs golden" then "NOT VERIFIED against
    # transformers: no golden for these inputs" read as a contradiction.
    toy = TOYS / "qwen2-audio-toy"
    result = CliRunner().invoke(app, ["check", "--checkpoint", str(toy)], env={"COLUMNS": "400"})
    said = " ".join(result.output.split())
    assert result.exit_code == 3, result.output
    assert "PASS towers KL vs golden" in said
    assert "NOT VERIFIED against transformers: the text model, whose towers are judged above: " \
        "no golden for these inputs" in said
