"""Every encoder spec against transformers' own encoder on the same weights, read from
committed goldens (tests/goldens/<spec>/, recorded by ``iron-spec check ... --record-golden``
through transformers' AutoModel): last hidden states and pooled embeddings within
``ENCODER_ATOL``. Reading them needs neither torch nor transformers."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from iron_spec.cli.check import ENCODER_ATOL, golden_path
from iron_spec.spec.gates import encoder_float64_gate
from iron_spec.cli.app import app
from iron_spec.spec.encoder import load_encoder
from iron_spec.spec.loader import load_spec
from iron_spec.runtime import checks
from iron_spec.runtime.encoder_golden import EncoderGolden
from tests.conftest import SPECS, golden_extra

ENCODERS = sorted(p for p in SPECS.glob("*.yaml") if load_spec(p).get("model") == "encoder")


@pytest.mark.parametrize("spec", ENCODERS, ids=lambda p: p.stem)
def test_toy_matches_transformers(spec: Path):
    loaded = load_encoder(spec, random_weights=0, toy=True)
    judge_encoder(loaded, EncoderGolden.read(golden_path(loaded), loaded.fingerprint()))


def judge_encoder(loaded, golden: EncoderGolden) -> float:
    """Assert ``loaded``'s pooled embeddings and last hidden states match ``golden``'s within
    ``ENCODER_ATOL`` on its probes, and our float64 reference its float64 outputs by the
    float64 gate; returns the hidden states' max absolute error."""
    model = loaded.model
    pooling = model.config.pooling if golden.pooling == "spec" else dataclasses.replace(
        model.config.pooling, kind="mean", normalize=False)
    pooled = model.version(pooling)
    masks = golden.global_masks
    for k, ((ids, types), want) in enumerate(zip(golden.probes, golden.pooled)):
        assert np.abs(pooled(ids, types, **checks.call_keywords(masks, k)) - want).max() \
            <= ENCODER_ATOL
    assert golden.hidden is not None, "the golden holds transformers' hidden states"
    states = model.version(dataclasses.replace(pooling, kind="none", normalize=False))
    worst = 0.0
    for k, ((ids, types), want) in enumerate(zip(golden.probes, golden.hidden)):
        error = float(np.abs(states(ids, types, **checks.call_keywords(masks, k)) - want).max())
        assert error <= ENCODER_ATOL
        worst = max(worst, error)
    # Our float64 reference() against transformers' encoder run in float64.
    assert golden.hidden64 is not None, "the golden holds transformers' float64 outputs"
    float64 = checks.float64_encoder_against(states, pooled, golden.probes, golden.hidden64,
                                             golden.pooled64,
                                             encoder_float64_gate(golden, loaded.expanded.spec),
                                             masks)
    assert float64.passed, float64.figure
    return worst


def _copy(tmp_path: Path, name: str, edit=None) -> Path:
    """The spec ``name`` (edited by ``edit``) in a checkout of its own beside its goldens."""
    (tmp_path / "specs").mkdir(exist_ok=True)
    (tmp_path / "tests" / "goldens").mkdir(parents=True, exist_ok=True)
    shutil.copytree(SPECS.parent / "tests" / "goldens" / name, tmp_path / "tests" / "goldens" / name,
                    dirs_exist_ok=True)
    text = (SPECS / f"{name}.yaml").read_text()
    path = tmp_path / "specs" / f"{name}.yaml"
    path.write_text(edit(text) if edit else text)
    return path


def _check(path: Path):
    return CliRunner().invoke(app, ["check", str(path), "--random-weights", "0", "--toy"])


def _fails_edited(tmp_path: Path, name: str, old: str, new: str):
    """``check`` of spec ``name`` with ``old`` replaced by ``new``, asserting it fails its
    hidden states against the golden; the result, for more assertions."""
    def edit(text):
        assert old in text
        return text.replace(old, new)
    result = _check(_copy(tmp_path, name, edit))
    assert result.exit_code == 1, result.output
    assert "reference: golden" in result.output
    assert "FAIL  hidden states vs golden" in result.output
    return result


def test_roberta_toy_is_judged_against_its_golden():
    result = _check(SPECS / "roberta.yaml")
    assert result.exit_code == 0, result.output
    assert "reference: golden" in result.output
    assert "PASS  hidden states vs golden" in result.output
    assert "PASS  embeddings vs golden" in result.output


@pytest.mark.parametrize("drop", [("  position_offset: \"pad_token_id + 1\"\n",
                                   "  position_padding: pad_token_id\n"),
                                  ("  position_padding: pad_token_id\n",)],
                         ids=["no offset", "offset without padding"])
def test_roberta_without_its_positions_fails_against_the_golden(tmp_path, drop):
    # RobertaEmbeddings: row k + padding_idx + 1 for the k-th id that is not padding, and
    # the golden's probes hold the padding id inside them; BERT's positions 0.. are wrong.
    def edit(text):
        for line in drop:
            assert line in text
            text = text.replace(line, "")
        return text
    result = _check(_copy(tmp_path, "roberta", edit))
    assert result.exit_code == 1, result.output
    assert "reference: golden" in result.output
    assert "FAIL  hidden states vs golden" in result.output
    assert "FAIL  embeddings vs golden" in result.output


@pytest.mark.parametrize("old, new", [
    ("  default: {theta: rope_theta, scaling: rope_scaling}\n",
     "  default: {theta: rope_theta, scaling: rope_scaling, interleaved: true}\n"),
    ("  default: {theta: rope_theta, scaling: rope_scaling}\n",
     "  default: {theta: rope_theta, scaling: null}\n"),
    ("  attention: {bias: attention_bias, o_bias: attention_bias, rope: default}\n"
     "  mlp: {kind: gated, act: hidden_act, bias: mlp_bias}\n\n"
     "rope:\n  default: {theta: rope_theta, scaling: rope_scaling}\n",
     "  attention: {bias: attention_bias, o_bias: attention_bias}\n"
     "  mlp: {kind: gated, act: hidden_act, bias: mlp_bias}\n"),
], ids=["interleaved pairs", "linear scaling unread", "no rope"])
def test_eurobert_with_another_rope_fails_against_the_golden(tmp_path, old, new):
    # EuroBertAttention turns q and k by LlamaAttention's rotate_half (halves, not pairs),
    # by the toy's rope_parameters (linear, factor 2), at every layer.
    _fails_edited(tmp_path, "eurobert", old, new)


@pytest.mark.parametrize("new", ['window: "sliding_window + 1", rope: sliding', "rope: sliding"],
                         ids=["window one wider", "no window"])
def test_ultrabert_with_another_window_fails_against_the_golden(tmp_path, new):
    # create_bidirectional_sliding_window_mask: |q - kv| <= sliding_window on the
    # sliding_attention layers (the toy's window 3 of a 24-row call); UltrabertAttention's
    # sliding_window + 1 is a flash-attention kernel's argument, not the mask's.
    _fails_edited(tmp_path, "ultrabert", "window: sliding_window, rope: sliding", new)


def test_electra_embeddings_are_narrower_and_projected():
    # ElectraEmbeddings: tables and LayerNorm embedding_size wide; ElectraModel:
    # embeddings_project = nn.Linear(embedding_size, hidden_size) where the two differ.
    shapes = {n: p.shape for n, p in load_encoder(SPECS / "electra.yaml", random_weights=0,
                                                  toy=True).model.named_params()}
    assert shapes["embeddings.word_embeddings.weight"] == (128, 16)
    assert shapes["embeddings.position_embeddings.weight"] == (24, 16)
    assert shapes["embeddings.LayerNorm.weight"] == (16,)
    assert shapes["embeddings_project.weight"] == (32, 16)
    assert shapes["embeddings_project.bias"] == (32,)
    bert = {n for n, _ in load_encoder(SPECS / "bert.yaml", random_weights=0,
                                       toy=True).model.named_params()}
    assert not any(n.startswith("embeddings_project") for n in bert)


@golden_extra
@pytest.mark.parametrize("name", ["roberta", "dpr", "dpr_context", "ibert"])
def test_record_then_check_a_toy(tmp_path, name):
    # In a subprocess: this test process never imports torch. dpr: DPRQuestionEncoder's
    # output has no last_hidden_state, and it masks its pad id unless given a mask;
    # dpr_context: recorded through DPRContextEncoder, not AutoModel's DPRQuestionEncoder;
    # ibert: transformers' model holds buffers the drawn weights lack (checkpoint.unused).
    path = _copy(tmp_path, name)
    shutil.rmtree(tmp_path / "tests" / "goldens" / name)
    cli = [str(Path(sys.executable).with_name("iron-spec")), "check", str(path), "--random-weights", "0",
           "--toy"]
    first = subprocess.run(cli + ["--record-golden"], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr + first.stdout
    written = tmp_path / "tests" / "goldens" / name / "toy-seed0.npz"
    assert f"recorded {written}" in first.stderr
    again = subprocess.run(cli, capture_output=True, text=True)
    assert again.returncode == 0 and f"reference: golden {written}" in again.stdout, again.stdout
    assert "PASS  hidden states vs golden" in again.stdout


def test_distilbert_drawn_weights_carry_distilberts_own_names():
    # DistilBertModel's state dict (transformers 5.24): no token-type table, q_lin/k_lin/
    # v_lin/out_lin, sa_layer_norm, ffn.lin1/lin2, output_layer_norm under transformer.layer.N.
    names = set(load_encoder(SPECS / "distilbert.yaml", random_weights=0,
                             toy=True).checkpoint_tensors())
    per_layer = ["attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin",
                 "sa_layer_norm", "ffn.lin1", "ffn.lin2", "output_layer_norm"]
    want = {f"transformer.layer.{i}.{m}.{p}" for i in range(3) for m in per_layer
            for p in ("weight", "bias")}
    want |= {"embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
             "embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias"}
    assert names == want


@golden_extra
def test_a_config_transformers_refuses_is_one_line_naming_it(tmp_path):
    # RobertaEmbeddings' nn.Embedding(..., padding_idx=pad_token_id) refuses a padding id
    # past the vocabulary; the toy's own table holds it (max_position_embeddings 300).
    path = _copy(tmp_path, "roberta", lambda t: t.replace("    pad_token_id: 1\n",
                                                          "    pad_token_id: 200\n").replace(
        "    max_position_embeddings: 26\n", "    max_position_embeddings: 300\n"))
    shutil.rmtree(tmp_path / "tests" / "goldens" / "roberta")
    cli = [str(Path(sys.executable).with_name("iron-spec")), "check", str(path),
           "--random-weights", "0", "--toy", "--record-golden"]
    run = subprocess.run(cli, capture_output=True, text=True)
    assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr
    # Refused at load as transformers refuses it, before anything is recorded: one line
    # naming the file and the key (issue 13: token ids checked against the vocabulary).
    assert run.stderr.strip().splitlines()[-1] == (
        f"error: {path} toy.config: pad_token_id is 200, not a whole number within 0..127"), \
        run.stderr


@pytest.mark.parametrize("old, new", [
    ("    offset: 0\n", ""),
    ('window: "local_attention // 2"', 'window: "local_attention // 2 + 1"'),
], ids=["full layers from the third", "window one wider"])
def test_modernbert_with_another_pattern_fails_against_the_golden(tmp_path, old, new):
    # ModernBertConfig: layer i slides where i % global_attn_every_n_layers (full at 0 and
    # 3 of the toy's 4), seeing rows at most local_attention // 2 away (sliding_window).
    _fails_edited(tmp_path, "modernbert", old, new)


def test_modernbert_drawn_weights_carry_modernberts_own_names():
    # ModernBertModel's state dict (transformers 5.24): one Wqkv (3 * hidden, hidden) per
    # layer, and no attn_norm at layer 0 (ModernBertEncoderLayer's nn.Identity there).
    shapes = {n: t.shape for n, t in load_encoder(SPECS / "modernbert.yaml", random_weights=0,
                                                  toy=True).checkpoint_tensors().items()}
    assert shapes["layers.0.attn.Wqkv.weight"] == (192, 64)
    assert shapes["layers.3.attn.Wqkv.bias"] == (192,)
    per_layer = {"attn.Wqkv", "attn.Wo", "attn_norm", "mlp.Wi", "mlp.Wo", "mlp_norm"}
    want = {f"layers.{i}.{m}.{p}" for i in range(4) for m in per_layer for p in ("weight", "bias")
            if (i, m) != (0, "attn_norm")}
    want |= {"embeddings.tok_embeddings.weight", "embeddings.norm.weight",
             "embeddings.norm.bias", "final_norm.weight", "final_norm.bias"}
    assert set(shapes) == want


@pytest.mark.parametrize("row, holds", [(0, False), (1, True), (2, True)])
def test_ernie_adds_task_type_zero_to_every_token(row, holds):
    # ErnieEmbeddings with use_task_id: task_type_ids default to zeros, so row 0 of
    # task_type_embeddings is added to every token and rows 1.. are never read: the golden
    # holds with those rows scrambled, not with row 0 scrambled.
    loaded = load_encoder(SPECS / "ernie.yaml", random_weights=0, toy=True)
    golden = EncoderGolden.read(golden_path(loaded), loaded.fingerprint())
    params = dict(loaded.model.named_params())
    table = params["embeddings.task_type_embeddings.weight"]
    assert table.shape == (3, 32)
    table.array[row] = np.random.default_rng(1).standard_normal(32).astype(np.float32)
    states = loaded.model.version(dataclasses.replace(loaded.model.config.pooling, kind="none"))
    errors = [np.abs(states(ids, types) - want).max()
              for (ids, types), want in zip(golden.probes, golden.hidden)]
    assert (max(errors) <= ENCODER_ATOL) == holds, errors


@pytest.mark.parametrize("new", [
    "  token_dropout: {enabled: false, mask_id: mask_token_id, ratio: 0.12}\n",
    "  token_dropout: {enabled: token_dropout, mask_id: mask_token_id, ratio: 0.0}\n",
    "  scale: 0.88\n",
], ids=["no rescale", "ratio 0", "fixed scale 1 - 0.12"])
def test_esm_without_its_token_dropout_fails_against_the_golden(tmp_path, new):
    # EsmEmbeddings with token_dropout: mask rows zeroed, every row times (1 - 0.15 * 0.8)
    # / (1 - the call's share of masks); the golden's probes hold the mask id, so a fixed
    # 0.88 (right only for a call with no mask) fails as well.
    _fails_edited(tmp_path, "esm",
                  "  token_dropout: {enabled: token_dropout, mask_id: mask_token_id, ratio: 0.12}\n",
                  new)


@pytest.mark.parametrize("new", ['  residual_scale: 1.0\n', '  residual_scale: "(num_hidden_layers / 36) ** 0.5"\n'],
                         ids=["unscaled", "multiplied, not divided"])
def test_esmc_without_its_residual_scale_fails_against_the_golden(tmp_path, new):
    # EsmcLayer: residual + out / sqrt(num_hidden_layers / 36), attention and MLP alike.
    _fails_edited(tmp_path, "esmc", '  residual_scale: "1 / (num_hidden_layers / 36) ** 0.5"\n',
                  new)


def test_esmc_drawn_weights_carry_esmcs_own_names():
    # EsmcModel's state dict (transformers 5.24): q_norm and k_norm LayerNorm(hidden_size,
    # bias=False), biased input/post-attention LayerNorms, a final norm without bias.
    shapes = {n: t.shape for n, t in load_encoder(SPECS / "esmc.yaml", random_weights=0,
                                                  toy=True).checkpoint_tensors().items()}
    assert shapes["layers.0.self_attn.q_norm.weight"] == (64,)
    assert shapes["layers.1.self_attn.k_norm.weight"] == (64,)
    per_layer = [f"self_attn.{p}_proj.{w}" for p in "qkvo" for w in ("weight", "bias")] + [
        f"mlp.{p}_proj.{w}" for p in ("gate", "up", "down") for w in ("weight", "bias")] + [
        f"{n}.{w}" for n in ("input_layernorm", "post_attention_layernorm")
        for w in ("weight", "bias")] + ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
    want = {f"layers.{i}.{m}" for i in range(2) for m in per_layer}
    assert set(shapes) == want | {"embed_tokens.weight", "norm.weight"}


def test_albert_runs_its_shared_layers_in_albert_transformers_order():
    # AlbertTransformer: depth i runs group int(i / (num_hidden_layers / num_hidden_groups)),
    # 0, 0, 1, 1 for the toy's 4 depths over 2 groups; the golden holds for that order only.
    loaded = load_encoder(SPECS / "albert.yaml", random_weights=0, toy=True)
    assert loaded.model.config.layer_order == (0, 0, 1, 1)
    assert len(loaded.model.encoder.layer) == 2
    golden = EncoderGolden.read(golden_path(loaded), loaded.fingerprint())
    states = dataclasses.replace(loaded.model.config.pooling, kind="none", normalize=False)

    def worst(model):
        run = model.version(states)
        return max(np.abs(run(ids, types) - want).max()
                   for (ids, types), want in zip(golden.probes, golden.hidden))

    assert worst(loaded.model) <= ENCODER_ATOL
    params = dict(loaded.model.named_params())
    for name, p in params.items():
        if name.startswith("encoder.layer.0."):
            other = params[name.replace("encoder.layer.0.", "encoder.layer.1.", 1)]
            p.array, other.array = other.array.copy(), p.array.copy()
    swapped = load_encoder(SPECS / "albert.yaml", random_weights=0, toy=True)
    for name, p in dict(swapped.model.named_params()).items():
        p.array = params[name].array
    assert worst(swapped.model) > 1e-2


def test_albert_drawn_weights_carry_alberts_own_names():
    # AlbertModel's state dict (transformers 5.24): one layer per group, the embeddings
    # (16 wide) mapped in to hidden 32 by embedding_hidden_mapping_in, pooler a bare Linear.
    shapes = {n: t.shape for n, t in load_encoder(SPECS / "albert.yaml", random_weights=0,
                                                  toy=True).checkpoint_tensors().items()}
    assert shapes["encoder.embedding_hidden_mapping_in.weight"] == (32, 16)
    assert shapes["embeddings.word_embeddings.weight"] == (128, 16)
    assert shapes["pooler.weight"] == (32, 32)
    per_layer = ["attention.query", "attention.key", "attention.value", "attention.dense",
                 "attention.LayerNorm", "ffn", "ffn_output", "full_layer_layer_norm"]
    layers = {f"encoder.albert_layer_groups.{g}.albert_layers.0.{m}.{w}" for g in range(2)
              for m in per_layer for w in ("weight", "bias")}
    assert {n for n in shapes if ".albert_layer" in n} == layers
