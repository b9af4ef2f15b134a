"""The float64 gate sees what float32's KL cannot (read from committed goldens; no torch).

On a toy, activations are of order one, so an RMSNorm epsilon 100x too large moves the
logits by less than float32's own spread against transformers' float32 golden: the float32
KL gate passes it. transformers' model run in float64 on the golden's tokens (the golden's
float64 rows) has a floor some 1e4 below the signal, and the float64 gate fails it.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from iron_spec.spec.build import load_model
from iron_spec.cli.check import golden_path
from iron_spec.spec.gates import FLOAT64_KL, float64_gate
from iron_spec.cli.app import app
from iron_spec.runtime import checks
from iron_spec.runtime.golden import Golden, GoldenError, kl_stats, teacher_forced
from iron_spec.runtime.session import Session
from tests.conftest import SPECS

NORM = "norm: {kind: rms, eps: rms_norm_eps}"


def _edited(tmp_path: Path, name: str, old: str, new: str) -> Path:
    """Spec ``name`` with ``old`` replaced by ``new``, in a checkout beside its goldens."""
    text = (SPECS / f"{name}.yaml").read_text()
    assert old in text
    (tmp_path / "specs").mkdir()
    (tmp_path / "tests" / "goldens").mkdir(parents=True)
    (tmp_path / "tests" / "goldens" / name).symlink_to(SPECS.parent / "tests" / "goldens" / name)
    path = tmp_path / "specs" / f"{name}.yaml"
    path.write_text(text.replace(old, new, 1))
    return path


def test_an_epsilon_100x_off_passes_float32_and_fails_float64(tmp_path):
    path = _edited(tmp_path, "llama3", NORM, "norm: {kind: rms, eps: rms_norm_eps * 100}")
    loaded = load_model(path, random_weights=0, toy=True)
    golden = Golden.read(golden_path(loaded), loaded.fingerprint())
    float32 = kl_stats(teacher_forced(golden, Session(loaded.lm).logits))
    for k, bound in loaded.expanded.spec.get("validation", "kl").items():
        assert float32[k] <= bound, (k, float32)  # float32's gate cannot see it
    assert float32["top1_mismatches"] == 0
    float64 = checks.float64_against(loaded.lm, golden, float64_gate(golden))
    assert not float64.passed, float64.figure
    # Measured: mean 2.7e-7, 2.7e4x the gate; the unedited spec's floor is 4e-15.
    assert float64.numbers["mean"] > 1e3 * FLOAT64_KL["mean"], float64.figure


@pytest.mark.parametrize("factor", ["0.5", "1.5"])
def test_an_epsilon_halved_passes_the_shared_gate_and_fails_the_goldens_floor(tmp_path, factor):
    # Found by a new user's trial: rms_norm_eps x 0.5 gave float64 KL mean 7.0e-12, inside
    # the gate every family shares (1e-11), 1600x the unedited spec's floor (4.4e-15).
    path = _edited(tmp_path, "llama3", NORM, f"norm: {{kind: rms, eps: rms_norm_eps * {factor}}}")
    loaded = load_model(path, random_weights=0, toy=True)
    golden = Golden.read(golden_path(loaded), loaded.fingerprint())
    floor = golden.meta["float64"]["floor"]
    assert floor["mean"] < 1e-14 and floor["max"] < 1e-13, floor  # measured 4.4e-15, 7.6e-15
    shared = checks.float64_against(loaded.lm, golden, FLOAT64_KL)
    assert shared.passed, shared.figure
    own = checks.float64_against(loaded.lm, golden, float64_gate(golden))
    assert not own.passed, own.figure
    assert own.numbers["mean"] > 100 * floor["mean"], own.figure


def test_the_goldens_floor_tightens_the_gate_and_never_loosens_it():
    meta = {"float64": {"floor": {"mean": 4e-15, "max": 1e-12}}}
    golden = SimpleNamespace(meta=meta, steps=40)
    assert float64_gate(golden) == pytest.approx({"mean": 1.2e-13, "max": 3e-11}, rel=1e-9, abs=0)
    # Over fewer steps a part's mean may exceed the whole's: bounded by the floor's max
    # (30 x 1e-12 = 3e-11, above the shared 1e-11, which stands).
    assert float64_gate(golden, 10) == pytest.approx({"mean": 1e-11, "max": 3e-11}, rel=1e-9, abs=0)
    loose = SimpleNamespace(meta={"float64": {"floor": {"mean": 1e-10, "max": 1e-8}}}, steps=40)
    assert float64_gate(loose) == FLOAT64_KL  # a floor above the shared gate loosens nothing
    tiny = SimpleNamespace(meta={"float64": {"floor": {"mean": 1e-20, "max": 1e-19}}}, steps=40)
    assert float64_gate(tiny) == {"mean": 1e-16, "max": 1e-15}  # never below FLOOR_LEAST
    assert float64_gate(SimpleNamespace(meta={}, steps=40)) == FLOAT64_KL


def test_check_steps_judge_a_cut_golden_by_its_floors_max():
    # check --steps N judges golden.first(N): the first N steps' KL mean may exceed the
    # mean over all 40 the floor was measured over, never their max.
    golden = Golden.read(SPECS.parent / "tests" / "goldens" / "llama3" / "toy-seed0.npz")
    floor = golden.meta["float64"]["floor"]
    assert floor["max"] > floor["mean"]
    assert float64_gate(golden.first(10))["mean"] == pytest.approx(
        min(FLOAT64_KL["mean"], 30 * floor["max"]), rel=1e-9, abs=0)
    assert float64_gate(golden.first(40)) == float64_gate(golden)


def test_check_exits_1_on_the_float64_gate_alone(tmp_path):
    path = _edited(tmp_path, "llama3", NORM, "norm: {kind: rms, eps: rms_norm_eps * 100}")
    result = CliRunner().invoke(app, ["check", str(path), "--random-weights", "0", "--toy"])
    assert result.exit_code == 1, result.output
    assert "PASS  KL vs golden" in result.output
    assert "FAIL  float64 KL vs golden" in result.output
    assert "float64 reference vs transformers float64, 40 steps: KL mean" in result.output
    assert "(40 steps, float64 rows)" in result.output


def test_a_golden_cut_short_is_refused(tmp_path):
    loaded = load_model(SPECS / "llama3.yaml", random_weights=0, toy=True)
    golden = Golden.read(golden_path(loaded), loaded.fingerprint())
    assert golden.meta["steps"] == golden.steps == 40
    with np.load(golden_path(loaded), allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    cut = {**arrays, **{k: arrays[k][:30] for k in ("top_ids", "top_logprobs", "tail",
                                                    "top_logprobs64", "tail64")}}
    np.savez(tmp_path / "cut.npz", **cut)
    with pytest.raises(GoldenError, match="63 tokens are more than a prompt of 24 and the 29 greedy"):
        Golden.read(tmp_path / "cut.npz")
    cut["tokens"] = arrays["tokens"][:24 + 29]  # tokens cut too: the meta's steps refuse it
    np.savez(tmp_path / "cut.npz", **cut)
    with pytest.raises(GoldenError, match="its meta claims 40 steps, and it holds 30 rows"):
        Golden.read(tmp_path / "cut.npz")


def test_a_golden_without_float64_rows_still_reads_and_judges_float32(tmp_path):
    loaded = load_model(SPECS / "llama3.yaml", random_weights=0, toy=True)
    with np.load(golden_path(loaded), allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files if k not in ("top_logprobs64", "tail64")}
    np.savez(tmp_path / "old.npz", **arrays)
    golden = Golden.read(tmp_path / "old.npz", loaded.fingerprint())
    assert not golden.has_float64
    stats = kl_stats(teacher_forced(golden, Session(loaded.lm).logits))
    assert stats["mean"] <= 1e-6 and stats["top1_mismatches"] == 0


@pytest.mark.parametrize("weights", [["--decode-weights", "int8"],
                                     ["--decode-weights", "bfloat16-rounded"],
                                     ["--prefill-weights", "bfloat16"]])
def test_reduced_weights_keep_the_float64_gate(tmp_path, weights):
    # Found by a new user's trial: with reduced decode weights check skipped its float64
    # check and the reduced KL gate (mean 1e-3) passed an epsilon doubled as "verified".
    # The float64 reference reads the weights as loaded, so it judges the spec whatever the
    # kernels read.
    path = _edited(tmp_path, "llama3", NORM, "norm: {kind: rms, eps: rms_norm_eps * 2}")
    result = CliRunner().invoke(app, ["check", str(path), "--random-weights", "0", "--toy",
                                      *weights])
    assert result.exit_code == 1, result.output
    assert "FAIL  float64 KL vs golden" in result.output, result.output
