"""A gate loosened in a spec says why: ``validation.float64`` (a float32 island in
transformers' float64 model) and ``validation.kl`` above its default each need a ``why``,
which lint asks for and check prints beside the loosened gate."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from iron_spec.cli.app import app
from iron_spec.spec.lint import lint_paths
from iron_spec.runtime.golden import load_arrays
from tests.conftest import SPECS, golden_extra

GOLDENS = SPECS.parent / "tests" / "goldens"
XLM = (SPECS / "xlm.yaml").read_text()
LLAMA = (SPECS / "llama3.yaml").read_text()
ISLAND = '''validation:
  float64:
    gate: {max: 5.0e-6}
    why: "MultiHeadAttention's softmax(scores.float())"
'''
KL = "validation:\n  kl: {mean: 1.0e-6, p90: 2.0e-6, max: 1.0e-5}\n"
runner = CliRunner()


def check(*args):
    return runner.invoke(app, ["check", *map(str, args)])


def written(tmp_path, name: str, text: str):
    path = tmp_path / "elsewhere" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def problems(path) -> list[str]:
    return [str(p) for p in lint_paths([path])[0]]


def test_a_float32_island_passes_by_its_specs_gate_and_says_why(tmp_path):
    assert ISLAND in XLM
    golden = GOLDENS / "xlm" / "toy-seed0.npz"
    result = check(SPECS / "xlm.yaml", "--toy", "--random-weights", "0", "--golden", golden)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert ("gate loosened by " f"{SPECS / 'xlm.yaml'}'s validation.float64 (max 5e-06 over "
            "1e-12): MultiHeadAttention's softmax(scores.float())") in said
    # Without it the shared gate judges: the island's floor (1.5e-7, add_floor) is 1e5 over.
    plain = written(tmp_path, "xlm", XLM.replace(ISLAND, ""))
    result = check(plain, "--toy", "--random-weights", "0", "--golden", golden)
    assert result.exit_code == 1, result.output
    assert "FAIL  float64 vs golden" in result.output


def test_a_float64_gate_without_a_reason_is_refused_by_lint(tmp_path):
    spec = written(tmp_path, "xlm", XLM.replace(ISLAND, "validation:\n  float64:\n"
                                                "    gate: {max: 5.0e-6}\n"))
    found = problems(spec)
    assert any("validation.float64 lacks the required key 'why'" in p for p in found), found
    line = next(i for i, t in enumerate(spec.read_text().splitlines(), 1) if "float64:" in t)
    assert any(p.startswith(f"{spec}:{line}:") for p in found), found


def test_an_encoders_float64_gate_takes_no_mean(tmp_path):
    spec = written(tmp_path, "xlm", XLM.replace("gate: {max: 5.0e-6}",
                                                "gate: {mean: 1.0e-9, max: 5.0e-6}"))
    found = problems(spec)
    assert any("an encoder's float64 gate is max alone" in p for p in found), found


def test_a_kl_gate_above_its_default_needs_a_reason(tmp_path):
    assert KL in LLAMA
    loose = written(tmp_path, "llama3", LLAMA.replace(KL, "validation:\n  kl: {mean: 1.0e-5}\n"))
    found = problems(loose)
    line = next(i for i, t in enumerate(loose.read_text().splitlines(), 1) if "kl:" in t)
    assert any(p.startswith(f"{loose}:{line}:") and "validation.kl.mean 1e-05 is above the "
               "default 1e-06 with no reason" in p for p in found), found
    # A tighter bound needs none; a loosened one with its reason passes lint.
    assert problems(written(tmp_path, "llama3", LLAMA.replace(KL, "validation:\n  kl: {mean: 5.0e-7}\n"))) == []


def test_check_prints_a_loosened_kl_gate_and_its_reason(tmp_path):
    why = "a made-up reason for this test"
    # One bound given: the others keep their defaults (p90 2e-6, max 1e-5).
    spec = written(tmp_path, "llama3", LLAMA.replace(
        KL, f"validation:\n  kl: {{mean: 2.0e-6, why: {why}}}\n"))
    assert problems(spec) == []
    result = check(spec, "--toy", "--random-weights", "0",
                   "--golden", GOLDENS / "llama3" / "toy-seed0.npz")
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert f"gate loosened by {spec}'s validation.kl (mean 2e-06 over 1e-06): {why}" in said
    kl_line = next(t for t in result.output.splitlines() if "PASS  KL vs golden" in t)
    assert "loosened" in kl_line


@golden_extra
def test_a_user_recorded_golden_of_an_island_gets_its_floor_under_the_specs_gate(tmp_path):
    path = tmp_path / "xlm.npz"
    result = check(SPECS / "xlm.yaml", "--toy", "--random-weights", "0", "--record-golden",
                   "--golden", path)
    assert result.exit_code == 0, result.output
    floor = json.loads(str(load_arrays(path)["meta"]))["float64"]["floor"]
    committed = json.loads(str(load_arrays(GOLDENS / "xlm" / "toy-seed0.npz")["meta"]))
    assert floor == pytest.approx(committed["float64"]["floor"], rel=0.1, abs=0)
