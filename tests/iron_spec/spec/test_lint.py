"""``iron-spec lint``: every broken spec in tests/specs/bad/ reported at the line and column
its header names, with the message it names; the real specs clean; output formats and exit
statuses; the rules that need more than one file or a config.json."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from iron_spec.spec import kinds
from iron_spec.spec import rules
from iron_spec.cli.app import app
from iron_spec.spec.interpreter import expand
from iron_spec.spec.lint import ConfigFile, lint_paths, lint_spec
from iron_spec.spec.loader import parse_spec
from iron_spec.spec.schema import at, known_keys
from tests.conftest import ROOT, SPECS

BAD = ROOT / "tests" / "specs" / "bad"
# A file with no room for a header: its expectations here.
HEADERLESS = {"empty.yaml": ["1:1: the file is empty"]}
runner = CliRunner()


def expectations(path: Path) -> tuple[list[tuple[int, int, str]], list[Path]]:
    """The ``# expect: LINE:COL: TEXT`` lines of a bad spec, and its ``# with: FILE``s."""
    lines = HEADERLESS.get(path.name) or [
        line[len("# expect: "):] for line in path.read_text().splitlines()
        if line.startswith("# expect: ")]
    expect = []
    for line in lines:
        m = re.fullmatch(r"(\d+):(\d+): (.+)", line)
        assert m, f"{path}: malformed expectation {line!r}"
        expect.append((int(m[1]), int(m[2]), m[3]))
    with_ = [ROOT / line[len("# with: "):] for line in path.read_text().splitlines()
             if line.startswith("# with: ")]
    return expect, with_


BAD_SPECS = sorted(BAD.glob("*.yaml"))


@pytest.mark.parametrize("path", BAD_SPECS, ids=lambda p: p.stem)
def test_bad_spec_reported_where_and_as_its_header_says(path):
    expect, with_ = expectations(path)
    assert expect, f"{path} names no expectation"
    problems, _ = lint_paths([*with_, path])
    assert all(p.file == str(path) for p in problems), problems  # the others are clean
    got = [(p.line, p.col, p.message) for p in problems]
    for line, col, text in expect:
        assert any((l, c) == (line, col) and text in m for l, c, m in got), \
            f"expected {line}:{col}: {text!r}; lint said:\n" + "\n".join(map(str, problems))
    # Nothing reported that the header does not expect.
    assert {(l, c) for l, c, _ in got} == {(l, c) for l, c, _ in expect}, problems


def test_the_bad_specs_cover_what_the_issue_lists():
    assert len(BAD_SPECS) >= 30
    names = {p.stem for p in BAD_SPECS}
    assert {"wrong_type", "unknown_key_near_miss", "unknown_layer_kind", "undefined_name",
            "import_attempt", "alias_bomb", "tab_indented", "empty", "list",
            "rename_missing_tensor"} <= names
    assert (BAD / "empty.yaml").read_bytes() == b""


def test_specs_are_clean():
    problems, files = lint_paths([SPECS])
    assert files and not problems, "\n".join(map(str, problems))


def test_every_spec_names_its_schema_and_version():
    for path in SPECS.glob("*.yaml"):
        first = path.read_text().splitlines()[0]
        assert first == "# yaml-language-server: $schema=../iron_spec/spec/spec.schema.json", path
        assert parse_spec(path.read_text()).data["spec"] == 1


def lint(*args):
    return runner.invoke(app, ["lint", *args])


def test_exit_statuses_and_formats():
    bad = str(BAD / "every_problem.yaml")
    clean = lint(str(SPECS))
    assert clean.exit_code == 0 and clean.stdout == ""
    text = lint(bad)
    assert text.exit_code == 1
    assert text.stdout.splitlines()[0] == \
        f"{bad}:5:7: error: spec must be 1, not the number 2"
    data = json.loads(lint(bad, "--format", "json").stdout)
    assert [(d["line"], d["col"]) for d in data] == [(5, 7), (23, 26), (24, 3)]
    github = lint(bad, "--format", "github").stdout.splitlines()
    assert github[0] == f"::error file={bad},line=5,col=7::spec must be 1, not the number 2"
    assert len(github) == 3


def test_refused_input_is_status_1_and_usage_2(tmp_path):
    missing = lint(str(tmp_path / "nope.yaml"))
    assert missing.exit_code == 1 and "nope.yaml: no such file or folder" in missing.output
    assert lint(str(SPECS), "--format", "xml").exit_code == 2
    assert lint(str(SPECS), "--config", str(tmp_path / "none.json")).exit_code == 1
    (tmp_path / "list.json").write_text("[1]")
    assert lint(str(SPECS), "--config", str(tmp_path / "list.json")).exit_code == 1
    assert "Traceback" not in missing.output


def test_config_json_keys_transformers_reads_and_the_spec_does_not(tmp_path):
    config = json.loads(json.dumps(parse_spec((SPECS / "llama3.yaml").read_text()).data["toy"]
                                   ["config"]))
    config.update({"rope_thetaa": 1.0, "initializer_range": 0.02, "sliding_window": 4096})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = lint(str(SPECS / "llama3.yaml"), "--config", str(path))
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    # initializer_range is in ignore:; rope_thetaa is read by nothing of transformers' either
    # (it loads unread); sliding_window is read by transformers' cache and masks.
    assert len(lines) == 1, lines
    assert "key 'sliding_window' (= 4096), read by cache_utils.py, masking_utils.py ..., is " \
        "neither mapped under config: nor listed in ignore:" in lines[0]


def test_config_json_of_another_architecture(tmp_path):
    spec = parse_spec((SPECS / "llama3.yaml").read_text(), "llama3.yaml")
    config = dict(spec.data["toy"]["config"], architectures=["Qwen3ForCausalLM"],
                  model_type="qwen3")
    problems = lint_spec(spec, ConfigFile("q/config.json", config))
    assert [p.message for p in problems] == [
        "q/config.json is Qwen3ForCausalLM (model_type qwen3); this spec serves "
        "LlamaForCausalLM (model_type llama, as its toy config): the architecture does not "
        "match (iron-spec list shows which spec serves it)"]
    # A name no spec serves on a model type this one does: transformers builds it by its
    # model type (LlamaForCausalLM), and so does the spec.
    config["model_type"] = "llama"
    assert lint_spec(spec, ConfigFile("q/config.json", config)) == []


def test_smollm2_config_is_fully_mapped(smollm2):
    result = lint(str(SPECS / "llama3.yaml"), "--config", str(smollm2 / "config.json"))
    assert result.exit_code == 0, result.output


def test_kinds_table_names_what_the_schema_has():
    for row in kinds.KINDS:
        by = at(row.chosen_by[:-1])["properties"][row.chosen_by[-1]]
        assert set(row.only) <= set(by["enum"]), row
        for options in row.only.values():
            assert set(options) <= set(known_keys(at(row.section))), row


def test_an_option_only_another_kind_takes():
    text = (SPECS / "llama3.yaml").read_text().replace("norm: {kind: rms,", "norm: {kind: rms, bias: false,")
    problems = rules.kinds(parse_spec(text, "x.yaml"))
    line, col = next((i, l.index("bias: false") + 1)
                     for i, l in enumerate(text.splitlines(), 1) if "rms, bias: false" in l)
    assert [(p.line, p.col, p.message) for p in problems] == [
        (line, col, "layer.norm.kind 'rms' does not take layer.norm.bias (only layer and no_norm "
                    "take it)")]


def test_rename_shadowed_by_an_earlier_one():
    # `h` becomes `model.layers` first, so no name still holds `h.{layer}.mlp` for the second.
    spec = parse_spec("checkpoint:\n  renames: {h: model.layers, 'h.{layer}.mlp': 'model.layers.{layer}.mlp'}\n")
    names = ["model.layers.0.mlp.up_proj.weight", "model.layers.1.mlp.up_proj.weight"]
    problems = rules.renames(spec, names)
    assert [(p.line, p.col) for p in problems] == [(2, 30)]
    assert "an earlier rename renames first" in problems[0].message


def test_renames_tying_for_one_parameter_are_refused():
    spec = parse_spec("checkpoint:\n  renames: {a: model, b: model}\n")
    problems = rules.renames(spec, ["model.norm.weight"])
    assert len(problems) == 1
    assert "from both a.norm.weight and b.norm.weight" in problems[0].message


# Found by a new user's trial: a rename onto a name another tensor already has made two
# checkpoint tensors one name, and lint said nothing (load then named an unexpected tensor).
def test_a_rename_onto_another_parameters_name_is_refused_naming_both():
    spec = parse_spec("checkpoint:\n  renames: {self_attn.q_proj: self_attn.k_proj}\n")
    q, k = "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"
    problems = rules.renames(spec, [q, k])
    assert [(p.line, p.col) for p in problems] == [(2, 13)]
    assert f"renames {q} onto {k}: the checkpoint's own {k} and its {q} would both become " \
           f"{k}" in problems[0].message, problems[0].message


def test_a_rename_onto_a_name_a_later_rename_reads_is_refused_naming_both():
    spec = parse_spec("checkpoint:\n  renames: {ln_2: ln_1, ln_1: input_layernorm}\n")
    names = ["model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight"]
    problems = rules.renames(spec, names)
    assert [(p.line, p.col) for p in problems] == [(2, 13)]
    assert "a checkpoint's 'ln_2' and 'ln_1' tensors would both become 'input_layernorm'" in \
        problems[0].message, problems[0].message


def test_renames_composing_over_the_layer_index_lint_clean():
    spec = parse_spec("checkpoint:\n  renames: {transformer.h: model.layers, attn.c_attn: "
                      "self_attn.qkv_proj, '*.ln_1': '*.input_layernorm'}\n")
    names = ["model.layers.0.self_attn.qkv_proj.weight", "model.layers.1.input_layernorm.weight"]
    assert rules.renames(spec, names) == []


def test_rename_whose_sides_hold_other_holes():
    spec = parse_spec("checkpoint:\n  renames: {'h.{layer}': model.layers}\n")
    problems = rules.renames(spec, ["model.layers.0.w"])
    assert len(problems) == 1 and "the same holes" in problems[0].message


def test_transposed_pattern_matching_no_matrix():
    spec = parse_spec("checkpoint:\n  transposed: ['model.layers.{layer}.mlp.c_fc.weight', "
                      "'model.layers.{layer}.mlp.up_proj.weight']\n")
    problems = rules.patterns(spec, ["model.layers.0.mlp.up_proj.weight"])
    assert [(p.line, p.col) for p in problems] == [(2, 16)]
    assert "matches no matrix of the model" in problems[0].message


def test_rename_that_drops_a_run_is_checked_against_the_model():
    spec = parse_spec("checkpoint:\n  renames: {language_model: ''}\n")
    assert rules.renames(spec, ["model.norm.weight"]) == []


DIFFERENTIAL = ("    differential: {lambda_base: 0.8, lambda_amplitude: 0.6, lambda_decay: 0.3, "
                "eps: rms_norm_eps}\n")
LATENT = ("    latent: {q_lora_rank: q_lora_rank, kv_lora_rank: kv_lora_rank,\n"
          "             qk_nope_head_dim: qk_nope_head_dim, qk_rope_head_dim: qk_rope_head_dim,\n"
          "             v_head_dim: v_head_dim}\n")


@pytest.mark.parametrize("name, option, key", [("diffllama", DIFFERENTIAL, "differential"),
                                               ("minicpm3", LATENT, "latent")])
def test_an_option_a_pattern_would_ignore_is_refused_at_its_line(tmp_path, name, option, key):
    text = (SPECS / f"{name}.yaml").read_text()
    assert option in text
    # The option moved under a pattern's entry: built once for every layer, it is read from
    # layer.attention alone, so there it was dropped without a word.
    moved = textwrap.indent(option.strip("\n"), " " * 6)
    pattern = ("  pattern:\n    every: 2\n    nth: one\n    other: two\n    options:\n"
               f"      one:\n        attention:\n{moved}\n      two: {{}}\n")
    edited = text.replace(option, "").replace("  mlp: {kind: gated", pattern + "  mlp: {kind: gated", 1)
    assert pattern in edited
    spec = parse_spec(edited, str(tmp_path / f"{name}.yaml"))
    options = expand(spec, spec.get("toy", "config")).options
    assert all(getattr(lo.attention, key) is None for lo in options.layers)  # ignored
    line = next(i for i, t in enumerate(edited.splitlines(), 1) if t.strip().startswith(f"{key}:"))
    problems = [p for p in lint_spec(spec) if "is never read" in p.message]
    assert [(p.line, p.message.split(":")[0]) for p in problems] == [
        (line, f"layer.pattern.options.one.attention.{key} is never read")], problems


def test_a_field_read_only_by_a_nested_choice_the_toy_does_not_take_is_read(tmp_path):
    # falcon_h1's gated norm: `norm: {when: "not mamba_rms_norm", then: none, else: {when:
    # mamba_norm_before_gate, ...}}`. A toy without the norm never reaches the inner choice,
    # and lint called mamba_norm_before_gate "read by nothing" (found writing a spec from the
    # docs alone).
    text = (SPECS / "falcon_h1.yaml").read_text()
    assert "    mamba_rms_norm: true" in text
    path = tmp_path / "falcon_h1.yaml"
    path.write_text(text.replace("    mamba_rms_norm: true", "    mamba_rms_norm: false"))
    result = lint(str(path))
    assert result.exit_code == 0, result.output
    assert "read by nothing" not in result.output
