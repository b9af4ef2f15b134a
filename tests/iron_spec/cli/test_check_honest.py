"""``iron-spec check`` says "wrong" or "not verified", never "verified", for a spec that is
wrong where its goldens cannot see: a spec lint rejects, a config default transformers'
config class does not share; and a golden of another model, another fingerprint at the
path recorded into, a file that is no golden, ``--steps`` past the golden, each said as it
is."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from iron_spec.library import goldens
from iron_spec.cli.app import app
from iron_spec.library.config_defaults import of
from iron_spec.spec.lint import lint_paths
from iron_spec.spec.loader import load_spec
from iron_spec.library.config_defaults import compare
from iron_spec.runtime.golden import NOT_A_GOLDEN, load_arrays
from tests.conftest import SPECS, golden_extra

LLAMA = (SPECS / "llama3.yaml").read_text()
GOLDENS = SPECS.parent / "tests" / "goldens"
TOY_GOLDEN = GOLDENS / "llama3" / "toy-seed0.npz"
runner = CliRunner()


def check(*args):
    return runner.invoke(app, ["check", *map(str, args)])


def outside(tmp_path, text: str, folder: str = "elsewhere"):
    path = tmp_path / folder / "llama3.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


def fingerprint(path) -> str:
    with np.load(path, allow_pickle=False) as f:
        return str(f["fingerprint"])


def test_a_spec_lint_rejects_fails_with_lints_own_lines(tmp_path):
    # A literal epsilon where the field belongs: config.rms_norm_eps then reads nothing.
    norm = "  norm: {kind: rms, eps: rms_norm_eps}"
    assert norm in LLAMA
    spec = outside(tmp_path, LLAMA.replace(norm, "  norm: {kind: rms, eps: 1.0e-6}"))
    problems, _ = lint_paths([spec])
    assert problems
    result = check(spec, "--toy", "--random-weights", "0")
    assert result.exit_code == 1, result.output
    for p in problems:  # FILE:LINE:COL: error: MESSAGE, as lint prints it
        assert str(p) in result.output
    assert f"{spec}:20:3: error: config.rms_norm_eps is read by nothing" in result.output
    assert re.search(r"FAIL  lint +1 problem \(printed above, as iron-spec lint", result.output)
    assert "FAILED (lint" in result.output and "verified" not in result.output


def test_a_wrong_config_default_fails_naming_the_field_and_both_defaults(tmp_path):
    # LlamaConfig's rope_theta default is 10000.0 (transformers' own class): config.json
    # holds every field, so no golden's numbers can see the spec's default.
    field = "  rope_theta: {json: rope_parameters.rope_theta, default: 10000.0}"
    assert field in LLAMA
    spec = outside(tmp_path, LLAMA.replace(field, field.replace("10000.0", "20000.0")))
    result = check(spec, "--toy", "--random-weights", "0")
    assert result.exit_code == 1, result.output
    assert "FAIL  config defaults vs transformers" in result.output
    assert ("rope_theta: the spec's default 20000.0, transformers' LlamaConfig's 10000.0"
            in result.output)
    assert "PASS  KL vs golden" in result.output  # the golden alone would have said verified
    assert "verified against" not in result.output


def test_the_right_defaults_pass(tmp_path):
    result = check(SPECS / "llama3.yaml", "--toy", "--random-weights", "0")
    assert result.exit_code == 0, result.output
    assert re.search(r"PASS  config defaults vs transformers +7 defaults match LlamaConfig's",
                     result.output), result.output


def test_a_golden_without_the_defaults_record_is_not_verified(tmp_path):
    data = load_arrays(TOY_GOLDEN)
    meta = json.loads(str(data["meta"]))
    del meta["config_defaults"]
    data["meta"] = np.asarray(json.dumps(meta))
    older = tmp_path / "older.npz"
    np.savez_compressed(older, **data)
    result = check(SPECS / "llama3.yaml", "--toy", "--random-weights", "0", "--golden", older)
    assert result.exit_code == 3, result.output
    assert "----  config defaults vs transformers" in result.output
    assert "not verified: the golden records no transformers config class defaults" in \
        result.output
    assert "NOT VERIFIED against transformers in full" in result.output


@golden_extra
def test_a_recorded_golden_holds_what_it_was_recorded_from(tmp_path):
    path = tmp_path / "mine.npz"
    result = check(SPECS / "llama3.yaml", "--toy", "--random-weights", "0", "--record-golden",
                   "--golden", path)
    assert result.exit_code == 0, result.output
    meta = json.loads(str(load_arrays(path)["meta"]))
    assert (meta["model"], meta["model_type"], meta["spec"]) == ("LlamaForCausalLM", "llama",
                                                                 "llama3")
    assert meta["config_defaults"]["class"] == "LlamaConfig"
    import transformers
    assert meta["config_defaults"]["values"]["rms_norm_eps"] == \
        transformers.LlamaConfig().rms_norm_eps
    # The same inputs again: recorded over, no refusal.
    assert check(SPECS / "llama3.yaml", "--toy", "--random-weights", "0", "--record-golden",
                 "--golden", path).exit_code == 0


@golden_extra
def test_a_golden_a_user_records_holds_its_floor_and_judges_later_edits_by_it(tmp_path):
    # Recorded as a user records one: the floor is written at record time, as
    # tests/goldens/add_floor.py writes the committed goldens' (llama3's toy: mean 4.4e-15).
    path = tmp_path / "mine.npz"
    result = check(SPECS / "llama3.yaml", "--toy", "--random-weights", "0", "--record-golden",
                   "--golden", path)
    assert result.exit_code == 0, result.output
    assert "float64 floor recorded (mean" in result.output
    floor = json.loads(str(load_arrays(path)["meta"]))["float64"]["floor"]
    committed = json.loads(str(load_arrays(TOY_GOLDEN)["meta"]))["float64"]["floor"]
    for k in ("mean", "max"):  # the same spec and inputs as add_floor measured
        assert floor[k] == pytest.approx(committed[k], rel=0.1, abs=0), (floor, committed)
    # An epsilon halved passes the shared gate (KL mean 7e-12 < 1e-11) and fails the floor's.
    norm = "  norm: {kind: rms, eps: rms_norm_eps}"
    edited = outside(tmp_path, LLAMA.replace(norm, "  norm: {kind: rms, eps: rms_norm_eps * 0.5}"))
    result = check(edited, "--toy", "--random-weights", "0", "--golden", path)
    assert result.exit_code == 1, result.output
    assert "FAIL  float64 KL vs golden" in result.output


@golden_extra
def test_the_record_reads_transformers_config_class():
    import transformers
    record = of(transformers.Qwen2Config)
    assert record["class"] == "Qwen2Config"
    # __post_init__ nulls the window where use_sliding_window is false; the field declares it.
    assert record["values"]["sliding_window"] is None
    assert record["fields"]["sliding_window"] == 4096
    assert of(transformers.CohereConfig)["values"]["rope_parameters"]["rope_theta"] == 500000.0


@pytest.mark.parametrize("golden", sorted(GOLDENS.glob("*/*.npz")), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_committed_golden_records_the_defaults_and_its_spec_matches_them(golden):
    meta = json.loads(str(load_arrays(golden)["meta"]))
    assert "values" in meta.get("config_defaults", {}), golden
    result = compare(load_spec(SPECS / f"{golden.parent.name}.yaml"), meta["config_defaults"],
                     str(golden))
    assert result.passed and result.verified, result.figure


def test_a_spec_outside_specs_records_into_no_checkouts_store(tmp_path, golden_stores):
    (tmp_path / "repo" / "tests" / "goldens").mkdir(parents=True)
    copied = outside(tmp_path / "repo", LLAMA)
    assert goldens.checkout_store(copied) is None
    assert goldens.record_store(copied) == golden_stores
    assert tmp_path / "repo" / "tests" / "goldens" not in goldens.stores(copied)
    inside = outside(tmp_path / "repo", LLAMA, "specs")
    assert goldens.record_store(inside) == tmp_path / "repo" / "tests" / "goldens"


@golden_extra
def test_recording_over_a_golden_of_other_inputs_is_refused_naming_both(tmp_path):
    theirs = tmp_path / "theirs.npz"
    shutil.copy(TOY_GOLDEN, theirs)
    before = theirs.read_bytes()
    result = check(SPECS / "llama3.yaml", "--toy", "--random-weights", "1", "--record-golden",
                   "--golden", theirs)
    assert result.exit_code == 1, result.output
    assert f"holds a golden of other inputs (fingerprint {fingerprint(TOY_GOLDEN)})" in \
        result.output
    assert "not overwritten" in result.output and "--golden PATH" in result.output
    assert "--overwrite-golden" in result.output
    assert theirs.read_bytes() == before


def test_a_golden_of_another_model_is_said_so_not_stale():
    result = check(SPECS / "llama3.yaml", "--toy", "--random-weights", "0", "--golden",
                   GOLDENS / "gemma3" / "toy-seed0.npz")
    assert result.exit_code == 1, result.output
    said = " ".join(result.output.split())
    assert "is a golden of another model (model type gemma3_text, not llama" in said
    assert "stale" not in said


def test_a_golden_of_this_model_from_other_weights_says_it_may_be_stale():
    result = check(SPECS / "llama3.yaml", "--toy", "--random-weights", "1", "--golden",
                   TOY_GOLDEN)
    assert result.exit_code == 1, result.output
    said = " ".join(result.output.split())
    assert "is a golden of this model (model LlamaForCausalLM, spec llama3)" in said
    assert "stale if these are the inputs it was recorded from" in said


def test_steps_fewer_than_the_golden_holds_judge_its_first_rows():
    result = check(SPECS / "llama3.yaml", "--toy", "--random-weights", "0", "--steps", "10")
    assert result.exit_code == 0, result.output
    assert "its first 10 of 40 steps, --steps" in result.output
    assert "vs golden, 10 steps:" in result.output
    assert "float64 reference vs transformers float64, 10 steps" in result.output


def test_steps_more_than_the_golden_holds_are_refused():
    result = check(SPECS / "llama3.yaml", "--toy", "--random-weights", "0", "--steps", "50")
    # a flag past what its input allows, as --max-seq-len past the model's own: usage
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.replace("│", " ").split())
    assert "--steps 50: the golden" in said and "holds 40 steps" in said


@pytest.mark.parametrize("content", [b"garbage, no archive", "pickle"])
def test_a_file_that_is_no_golden_is_named_as_such(tmp_path, content):
    path = tmp_path / "golden.npz"
    if content == "pickle":
        np.save(path.with_suffix(".npy"), np.array([{"a": 1}], dtype=object), allow_pickle=True)
        path.with_suffix(".npy").rename(path)
    else:
        path.write_bytes(content)
    result = check(SPECS / "llama3.yaml", "--toy", "--random-weights", "0", "--golden", path)
    assert result.exit_code == 1, result.output
    assert f"{path}: {NOT_A_GOLDEN}" in " ".join(result.output.split())
    assert "pickle" not in result.output


def test_each_check_line_says_how_long_it_took():
    result = check(SPECS / "llama3.yaml", "--toy", "--random-weights", "0")
    times = re.findall(r"  \((<1|\d+(?:\.\d+)?) (s|ms)\)\n", result.output)
    assert len(times) == 10, result.output
    # Toys' checks take milliseconds: "0.0 s" on every line said nothing.
    assert all(t == "<1" or float(t) > 0 for t, _ in times), result.output
    assert sum(float(t) for t, unit in times if unit == "ms" and t != "<1") > 5, result.output


@pytest.mark.parametrize("spec_name, old, new", [
    ("llama3", "mlp: {kind: gated, act: hidden_act", "mlp: {kind: gated, act: {value: silu}"),
    ("bert", "  kind: encoder\n", "  kind: encoder\n  atention: {}\n"),
    # the load words it otherwise (its config's source named): the same problem all the same
    ("llama3", "  prefill_chunk: 16\n  config:\n", "  prefill_chunk: 16\n  config:\n    sliding_window: 3\n")])
def test_a_spec_that_does_not_expand_has_its_error_said_once(tmp_path, spec_name, old, new):
    # Found by a new user's trial: lint's line printed, then the same line again as the
    # refusal of the expansion that failed on it.
    text = (SPECS / f"{spec_name}.yaml").read_text()
    assert old in text
    spec = outside(tmp_path, text.replace(old, new, 1))
    (problem,), _ = lint_paths([spec])
    for flags in ([], ["--json"]):
        result = check(spec, "--toy", "--random-weights", "0", *flags)
        assert result.exit_code == 1, result.output
        assert result.stderr.count(str(problem)) == 1, result.output  # (--json holds it too)
        assert "no other check ran" in result.output
    assert json.loads(result.stdout)["verdict"] == "failed"
