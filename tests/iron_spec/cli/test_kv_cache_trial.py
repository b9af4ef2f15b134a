"""Tests from new users' trials of check under reduced precision (``--kv-cache bfloat16``,
``--decode-weights int8``): each a bug found there, and fixed."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from iron_spec.cli.app import app
from tests.conftest import SPECS

runner = CliRunner()


@pytest.mark.parametrize("command", ["run", "check"])
def test_a_kv_cache_value_with_a_space_is_no_crash_nor_a_library_error(command):
    # The option's callback (command.choice) accepts ' bfloat16' by its stripped form but
    # hands on the unstripped one: `check` dies with KeyError: ' bfloat16' in
    # build._footprint (exit 1, a traceback), `run` says kv_cache=' bfloat16' (the
    # library's name, exit 1). Expected: the value taken as bfloat16, or exit 2 naming
    # --kv-cache. (--decode-weights ' int8' and --prefill-weights ' bfloat16' do the same.)
    extra = ["--num-tokens", "2"] if command == "run" else ["--self-only"]
    result = runner.invoke(app, [command, str(SPECS / "llama3.yaml"), "--toy",
                                 "--random-weights", "0", "--kv-cache", " bfloat16", *extra])
    assert result.exit_code in (0, 2), result.output
    if result.exit_code == 2:
        assert "--kv-cache" in result.output


def test_a_correct_spec_passes_check_on_a_bfloat16_kv_cache():
    # gpt_neo's toy passes every check on the float32 cache; on the bfloat16 one its
    # "compiled = reference (greedy)" fails at step 0 ("0 vs 122": the golden's first step
    # is a near tie, p 0.366 / 0.350) though its KL line passes the reduced gate that
    # allows 2 top-1 mismatches. The greedy check stays exact under a lossy cache.
    result = runner.invoke(app, ["check", str(SPECS / "gpt_neo.yaml"), "--toy",
                                 "--random-weights", "0", "--kv-cache", "bfloat16"])
    assert result.exit_code == 0, result.output


def test_a_wrong_spec_is_not_verified_by_the_loose_kv_cache_gate(tmp_path):
    # hyperclovax's committed pre-norm golden holds no float64 rows, so the KL line alone
    # judges the spec. RoPE's base 1.5x too large fails it on the float32 cache (KL mean
    # 3.1e-6 > 1e-6), but on the bfloat16 cache the gate is mean 1e-3 and check says
    # "verified against transformers", exit 0.
    text = (SPECS / "hyperclovax.yaml").read_text()
    old = "default: {theta: rope_theta, scaling: rope_scaling}"
    assert old in text
    spec = tmp_path / "hyperclovax.yaml"
    spec.write_text(text.replace(old, 'default: {theta: "rope_theta * 1.5", scaling: rope_scaling}'))
    config = dict(yaml.safe_load((SPECS / "hyperclovax.yaml").read_text())["toy"]["config"],
                  use_post_norm=False)
    checkpoint = tmp_path / "pre"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps(config))
    golden = SPECS.parent / "tests" / "goldens" / "hyperclovax" / "pre-norm-seed0.npz"
    args = ["check", str(spec), "--checkpoint", str(checkpoint), "--random-weights", "0",
            "--prefill-chunk", "16", "--golden", str(golden)]
    assert runner.invoke(app, args).exit_code == 1  # the float32 cache: KL vs golden fails
    result = runner.invoke(app, [*args, "--kv-cache", "bfloat16"])
    assert result.exit_code != 0, result.output


def test_json_says_what_ran_in_which_precision_and_the_gate():
    # Found by a new user's trial: --json held no word of the KV cache, weights or gate.
    result = runner.invoke(app, ["check", str(SPECS / "llama3.yaml"), "--toy", "--random-weights",
                                 "0", "--kv-cache", "bfloat16", "--json"])
    precision = json.loads(result.stdout)["precision"]
    assert (precision["decode_weights"], precision["prefill_weights"], precision["kv_cache"]) \
        == ("float32", "float32", "bfloat16")
    assert precision["kl_gate"]["mean"] == 1e-3 and precision["reduced"] == ["KV cache bfloat16"]


def test_a_failure_of_the_rounding_alone_is_said_so_and_a_wrong_spec_is_not(tmp_path):
    # gemma4_unified_text's toy at int8: its KL mean is 1.5e-3 over the int8 gate's 1e-3 (the
    # random toy's weights round worse than a trained model's), while its float64 reference
    # matches transformers'. The summary says the rounding cost it, not the spec.
    args = ["--toy", "--random-weights", "0", "--decode-weights", "int8"]
    result = runner.invoke(app, ["check", str(SPECS / "gemma4_unified_text.yaml"), *args])
    assert result.exit_code == 1, result.output
    assert "FAILED (KL vs golden): decode weights int8 cost more" in result.output
    assert "the spec itself passed the float64 check" in result.output
    # A wrong RMSNorm epsilon under the same weights fails the float64 line: no such words.
    text = (SPECS / "gemma3.yaml").read_text()
    spec = tmp_path / "gemma3.yaml"
    spec.write_text(text.replace("eps: rms_norm_eps", 'eps: "rms_norm_eps * 100"'))
    assert spec.read_text() != text
    golden = SPECS.parent / "tests" / "goldens" / "gemma3" / "toy-seed0.npz"
    result = runner.invoke(app, ["check", str(spec), *args, "--golden", str(golden)])
    assert result.exit_code == 1, result.output
    assert "float64 KL vs golden" in result.output.split("FAILED")[-1]
    assert "the spec itself passed" not in result.output
