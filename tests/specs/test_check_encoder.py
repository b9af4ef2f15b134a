"""``iron-spec check`` on the encoder spec: its embeddings against transformers' golden."""

from __future__ import annotations

from typer.testing import CliRunner

from iron_spec.cli.app import app
from tests.conftest import SPECS

BERT = (SPECS / "bert.yaml").read_text()


def test_bert_toy_passes_against_its_golden():
    result = CliRunner().invoke(app, ["check", str(SPECS / "bert.yaml"), "--random-weights", "0",
                                      "--toy"])
    assert result.exit_code == 0, result.output
    assert "reference: golden" in result.output and "8/8 checks passed" in result.output
    assert "PASS  config defaults vs transformers" in result.output
    assert "PASS  hidden states vs golden" in result.output
    assert "PASS  float64 vs golden" in result.output


def test_the_tanh_gelu_in_place_of_the_exact_one_fails(tmp_path):
    # BERT's "gelu" is the erf form; the tanh approximation differs by up to ~1e-3 per
    # activation, far past float32 rounding: the golden catches it.
    (tmp_path / "specs").mkdir()
    (tmp_path / "tests" / "goldens").mkdir(parents=True)
    (tmp_path / "tests" / "goldens" / "bert").symlink_to(SPECS.parent / "tests" / "goldens" / "bert")
    spec = tmp_path / "specs" / "bert.yaml"
    # The activation fixed, config.json's hidden_act ignored: a spec lint passes (check
    # refuses one it rejects), wrong only in its numbers.
    field, ignore = "  hidden_act: {json: hidden_act, default: gelu}", "ignore: [architectures,"
    assert field in BERT and ignore in BERT
    spec.write_text(BERT.replace(field, "  hidden_act: {value: gelu_pytorch_tanh}").replace(
        ignore, "ignore: [hidden_act, architectures,"))
    result = CliRunner().invoke(app, ["check", str(spec), "--random-weights", "0", "--toy"])
    assert result.exit_code == 1, result.output
    assert "FAIL  embeddings vs golden" in result.output
