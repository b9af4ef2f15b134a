"""A broken spec must fail ``iron-spec check``, saying which check and by how much.

Each mutation is a plausible porting mistake; the goldens (transformers' logits on the same
config and weights) are what catch it.
"""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from iron_spec.spec.build import load_model
from iron_spec.cli.check import golden_path
from iron_spec.cli.app import app
from iron_spec.runtime import checks
from iron_spec.runtime.golden import Golden
from tests.conftest import SPECS

LLAMA = (SPECS / "llama3.yaml").read_text()
BOUNDS = {"mean": 1e-6, "p90": 2e-6, "max": 1e-5}


def mutated(tmp_path, old: str, new: str):
    assert old in LLAMA
    # The golden is found beside the spec's folder: keep the mutant in specs/'s place.
    (tmp_path / "specs").mkdir(exist_ok=True)
    path = tmp_path / "specs" / "llama3.yaml"
    path.write_text(LLAMA.replace(old, new, 1))
    goldens = tmp_path / "tests" / "goldens"
    goldens.mkdir(parents=True, exist_ok=True)
    (goldens / "llama3").symlink_to(SPECS.parent / "tests" / "goldens" / "llama3")
    return path


def kl_figure(output: str) -> float:
    return float(re.search(r"FAIL  KL vs golden .*? mean ([0-9.e+-]+)", output).group(1))


@pytest.mark.parametrize("old,new", [
    # The llama3 RoPE scaling dropped: the toy's original_max_position_embeddings is 64.
    ("  rope_scaling: {json: rope_parameters, default: null}", "  rope_scaling: {value: null}"),
    # rope_theta read 100 times too small.
    ("  default: {theta: rope_theta, scaling: rope_scaling}",
     "  default: {theta: \"rope_theta / 100\", scaling: rope_scaling}"),
], ids=["no-llama3-scaling", "theta-100x-small"])
def test_toy_mutation_fails_check(tmp_path, old, new):
    spec = mutated(tmp_path, old, new)
    # Past the config accounting, should a mutant leave a key unread.
    result = CliRunner().invoke(app, ["check", str(spec), "--random-weights", "0", "--toy",
                                      "--allow-unread-config"])
    assert result.exit_code == 1, result.output
    assert "reference: golden" in result.output
    assert kl_figure(result.output) > 1e-3, result.output


def test_an_epsilon_1000x_too_large_fails_check(tmp_path):
    # The subtlest flip a new user's trial found: RMSNorm's eps 1e-5 read as 1e-2 moves the
    # toy's logits by KL ~2e-5, which a gate of 1e-4 once passed as verified.
    line = next(t for t in LLAMA.splitlines() if t.startswith("  norm: {kind: rms, eps: "))
    spec = mutated(tmp_path, line, line.replace("eps: rms_norm_eps", 'eps: "rms_norm_eps * 1000"'))
    result = CliRunner().invoke(app, ["check", str(spec), "--random-weights", "0", "--toy"])
    assert result.exit_code == 1, result.output
    assert 1e-6 < kl_figure(result.output) < 1e-3, result.output


def test_a_mutant_reading_a_key_no_more_is_refused_at_load(tmp_path):
    spec = mutated(tmp_path, "  hidden_act: {json: hidden_act, default: silu}",
                   "  hidden_act: {value: silu}")
    result = CliRunner().invoke(app, ["check", str(spec), "--random-weights", "0", "--toy"])
    assert result.exit_code == 1  # input refused, as run (2 is a usage error)
    assert ("toy.config: key 'hidden_act' (= 'silu'), a field of LlamaConfig, is neither mapped"
            in result.output)


def test_swapped_gate_and_up_fail_against_the_smollm2_golden(smollm2, tmp_path):
    path = tmp_path / "llama3.yaml"
    # Renames compose, so a swap goes through a name of neither.
    path.write_text(LLAMA + "\ncheckpoint:\n  renames: {mlp.gate_proj: mlp.swap, "
                    "mlp.up_proj: mlp.gate_proj, mlp.swap: mlp.up_proj}\n")
    broken = load_model(path, checkpoint=smollm2, max_seq_len=1024)
    right = load_model(SPECS / "llama3.yaml", checkpoint=smollm2, max_seq_len=1024)
    golden = Golden.read(golden_path(right), right.fingerprint())
    # Same files, same fingerprint: the golden judges the swapped reading of them.
    assert broken.fingerprint() == golden.fingerprint
    result = checks.kl_against(broken.lm, BOUNDS, golden, [], golden.steps)
    assert not result.passed
    assert result.numbers["mean"] > 0.1 and result.numbers["top1_mismatches"] > 10, result.figure
