"""``iron-spec embed`` and ``iron-spec list``: texts to embeddings and cosines on the real
all-MiniLM-L6-v2 against transformers' numbers (tests/goldens/bert/all-minilm-l6-v2.npz,
recorded by tests/goldens/bert/record.py), the spec picked by architectures, refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from iron_spec.cli.app import app
from iron_spec.cli.embed import cosine
from iron_spec.library.embedding import embed_texts
from iron_spec.spec.encoder import load_encoder
from iron_spec.spec.registry import entries, for_architectures
from tests.conftest import ROOT, SPECS, checkpoint

GOLDEN = ROOT / "tests" / "goldens" / "bert" / "all-minilm-l6-v2.npz"
BERT = str(SPECS / "bert.yaml")
runner = CliRunner()


@pytest.fixture(scope="module")
def minilm():
    return checkpoint("all-minilm-l6-v2")


@pytest.fixture(scope="module")
def golden():
    with np.load(GOLDEN, allow_pickle=False) as f:
        g = {k: f[k] for k in f.files}
    g["texts"], g["ids"] = json.loads(str(g["texts"])), json.loads(str(g["ids"]))
    return g


@pytest.fixture(scope="module")
def loaded(minilm, golden):
    loaded = load_encoder(BERT, checkpoint=minilm)
    assert loaded.fingerprint() == str(golden["fingerprint"]), "stale golden: re-run record.py"
    return loaded


def test_texts_tokenize_as_transformers(loaded, golden):
    for text, ids in zip(golden["texts"], golden["ids"]):
        assert loaded.tokenizer(text)[0] == ids


def test_embeddings_match_transformers_mean_pooling(loaded, golden):
    e = golden["embeddings"]
    got = embed_texts(loaded, golden["texts"])
    # The spec normalizes (sentence-transformers' Normalize module); transformers' mean
    # pooling, recorded unnormalized, normalized here.
    np.testing.assert_allclose(got, e / np.linalg.norm(e, axis=1, keepdims=True), atol=2e-6)
    np.testing.assert_allclose(cosine(got), golden["cosine"], atol=1e-6)


def test_acceptance_similarity_prints_transformers_cosines(minilm, golden):
    texts = golden["texts"][:2]
    result = runner.invoke(app, ["embed", BERT, "--checkpoint", str(minilm), *texts_args(texts),
                                 "--similarity"])
    assert result.exit_code == 0, result.output
    want = [" ".join(f"{x:7.4f}" for x in row) for row in golden["cosine"][:2, :2]]
    assert result.stdout.splitlines() == want
    assert want[0].split()[1] == "0.7553"  # transformers' number, as the issue quotes it


def test_spec_picked_by_architectures_when_not_named(minilm, golden):
    texts = golden["texts"][:3]
    named = runner.invoke(app, ["embed", BERT, "--checkpoint", str(minilm), *texts_args(texts)])
    picked = runner.invoke(app, ["embed", "--checkpoint", str(minilm), *texts_args(texts)])
    assert picked.exit_code == 0, picked.output
    assert picked.stdout == named.stdout
    rows = [list(map(float, line.split())) for line in picked.stdout.splitlines()]
    assert np.array(rows).shape == (3, 384)


def test_spec_by_name_from_another_folder_and_the_library_alike(minilm, golden, tmp_path,
                                                                monkeypatch):
    import iron_spec
    monkeypatch.chdir(tmp_path)
    texts = golden["texts"][:2]
    result = runner.invoke(app, ["embed", "bert", "--checkpoint", str(minilm), *texts_args(texts),
                                 "--similarity"])
    assert result.exit_code == 0, result.output
    want = [" ".join(f"{x:7.4f}" for x in row) for row in golden["cosine"][:2, :2]]
    assert result.stdout.splitlines() == want
    e = iron_spec.load("bert", minilm).embed(texts)
    assert e.shape == (2, 384) and e.dtype == np.float32
    np.testing.assert_allclose(cosine(e), golden["cosine"][:2, :2], atol=1e-6)


def test_list_names_each_spec_and_its_architectures():
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line.split() for line in result.stdout.splitlines()}
    assert lines["bert"][1:3] == ["encoder", "BertModel"]
    assert lines["llama3"][1:3] == ["causal", "LlamaForCausalLM"]


def test_architectures_pick_the_first_served_and_refuse_the_unknown():
    assert for_architectures(["NoSuchModel", "BertModel"], "config.json").name == "bert.yaml"
    with pytest.raises(ValueError, match="no spec serves NoSuchModel.*BertModel"):
        for_architectures(["NoSuchModel"], "config.json")
    with pytest.raises(ValueError, match="not a list"):
        for_architectures("BertModel", "config.json")
    assert {e.name for e in entries()} >= {"bert", "llama3"}


def texts_args(texts) -> list[str]:
    """``--text T`` for each of ``texts``: SPEC is embed's one argument."""
    return [a for t in texts for a in ("--text", t)]


def _error(result) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    return result.output


def test_a_causal_spec_is_refused(minilm):
    out = _error(runner.invoke(app, ["embed", str(SPECS / "llama3.yaml"), "--checkpoint",
                                     str(minilm), "--text", "hello"]))
    assert "embed runs encoder specs" in out


def test_run_refuses_an_encoder_spec():
    out = _error(runner.invoke(app, ["run", BERT, "--random-weights", "0", "--toy"]))
    assert "encoder spec" in out and "iron-spec embed" in out


def test_no_checkpoint_no_texts():
    for args in (["embed", BERT, "--text", "hello"], ["embed", "--text", "hello"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and "--checkpoint" in result.output  # a usage error


@pytest.mark.parametrize("command", ["embed", "fill-mask", "classify"])
@pytest.mark.parametrize("texts, says", [
    (["", "hello"], "--text '' (text 1) is empty; give some text"),
    (["hello", "   "], "--text '   ' (text 2) is empty but for white space; give some text"),
    (["-", "hello"], "--text - reads the texts from stdin, one a line; give it alone")])
def test_an_empty_text_is_a_usage_error_before_anything_loads(command, texts, says, tmp_path):
    # As run --prompt '': exit 2 naming the option, before a weight is read.
    from tests.conftest import toy_config
    directory = toy_config(tmp_path, "bert")
    result = runner.invoke(app, [command, "--checkpoint", str(directory), *texts_args(texts)])
    assert result.exit_code == 2, result.output
    assert " ".join(says.split()) in " ".join(result.output.replace("│", " ").split()), \
        result.output
    assert "loading" not in result.output


def test_text_dash_reads_stdin_and_says_the_blank_lines_skipped(minilm):
    # --text - reads stdin, one text a line, as run --prompt - does (it embedded "-").
    given = runner.invoke(app, ["embed", BERT, "--checkpoint", str(minilm), "--text", "hello",
                                "--text", "world"])
    piped = runner.invoke(app, ["embed", BERT, "--checkpoint", str(minilm), "--text", "-"],
                          input="hello\n\n  \nworld\n")
    assert given.exit_code == 0 and piped.exit_code == 0, piped.output
    assert piped.stdout == given.stdout
    assert "[2 blank lines on stdin skipped: 2 texts]" in piped.stderr
    assert "skipped" not in given.stderr


def test_max_tokens_below_cls_and_sep_is_refused():
    result = runner.invoke(app, ["embed", BERT, "--max-tokens", "1", "--text", "hello"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--max-tokens" in result.output and "2" in result.output


def test_max_tokens_past_the_position_table_is_capped_and_said(minilm):
    result = runner.invoke(app, ["embed", BERT, "--checkpoint", str(minilm), "--text", "hello",
                                 "--max-tokens", "1000"])
    assert result.exit_code == 0, result.output
    assert "--max-tokens 1000 is capped at 512" in result.stderr
    at_cap = runner.invoke(app, ["embed", BERT, "--checkpoint", str(minilm), "--text", "hello",
                                 "--max-tokens", "512"])
    assert result.stdout == at_cap.stdout and "capped" not in at_cap.stderr


def test_truncated_texts_are_said_once(minilm):
    # "hello world again": [CLS] hello world again [SEP], five ids (one wordpiece a word in
    # BERT's uncased vocabulary), so past --max-tokens 4; "hello" is three.
    texts = ["hello", "hello world again", "hello world again"]
    result = runner.invoke(app, ["embed", BERT, "--checkpoint", str(minilm), *texts_args(texts),
                                 "--max-tokens", "4"])
    assert result.exit_code == 0, result.output
    assert result.stderr.count("truncated") == 1, result.stderr
    assert "2 of 3 texts were truncated at 4 tokens" in result.stderr
    whole = runner.invoke(app, ["embed", BERT, "--checkpoint", str(minilm), *texts_args(texts)])
    assert whole.exit_code == 0 and "truncated" not in whole.stderr


def test_a_text_that_is_not_utf8_is_refused_naming_the_byte(tmp_path):
    # Python hands a command line's non-UTF-8 bytes over as lone surrogates; refused before
    # anything loads (no checkpoint at tmp_path is read).
    out = _error(runner.invoke(app, ["embed", BERT, "--checkpoint", str(tmp_path), "--text", "ok",
                                     "--text", "caf\udce9"]))
    assert "error: text 2 is not UTF-8 text: byte 0xe9 at position 3" in out


def test_embed_texts_refuses_a_text_that_is_not_utf8(loaded):
    with pytest.raises(ValueError, match="TEXT 1 is not UTF-8 text: byte 0xe9 at position 3"):
        embed_texts(loaded, ["caf\udce9"])


def _toy_encoder_dir(tmp_path):
    """A bert toy checkpoint directory: config.json and model.safetensors, no tokenizer."""
    import json

    from safetensors.numpy import save_file

    from iron_spec.spec.encoder import load_encoder

    loaded = load_encoder(SPECS / "bert.yaml", random_weights=0, toy=True)
    (tmp_path / "config.json").write_text(json.dumps(loaded.config_json))
    save_file({k: np.ascontiguousarray(v) for k, v in loaded.checkpoint_tensors().items()},
              str(tmp_path / "model.safetensors"))
    return tmp_path


def test_embed_without_tokenizer_json_names_the_directory_and_the_file(tmp_path):
    # Found by a new user's trial: "texts need the checkpoint's tokenizer.json", no path.
    import iron_spec

    directory = _toy_encoder_dir(tmp_path)
    result = runner.invoke(app, ["embed", str(SPECS / "bert.yaml"), "--checkpoint",
                                 str(directory), "--text", "hello"])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert f"{directory} holds no tokenizer.json" in result.output, result.output
    (directory / "vocab.txt").write_text("[PAD]\n[CLS]\n[SEP]\nhello\n")
    with pytest.raises(ValueError, match="vocab.txt .a slow tokenizer's. is not read here"):
        iron_spec.load(str(SPECS / "bert.yaml"), directory).embed("hello")


@pytest.mark.parametrize("text, says", [("{not json", "not valid JSON"), ("[]", "holds a list"),
                                        ('{"max_seq_length": "128"}', "max_seq_length is '128'")])
def test_a_broken_sentence_bert_config_is_refused_naming_the_file(tmp_path, text, says):
    # Found by trying: a JSONDecodeError or AttributeError traceback naming no file.
    directory = _toy_encoder_dir(tmp_path)
    (directory / "sentence_bert_config.json").write_text(text)
    result = runner.invoke(app, ["embed", str(SPECS / "bert.yaml"), "--checkpoint",
                                 str(directory), "--text", "hello"])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert str(directory / "sentence_bert_config.json") in result.output and says in \
        result.output, result.output


def test_no_text_is_ever_taken_for_the_spec(minilm):
    # Found by a new user's trial: `embed --checkpoint DIR bert gpt2 --similarity` printed a
    # 1x1 matrix, "bert" taken as the spec. SPEC is embed's one argument; texts are --text's
    # (or stdin's lines), so two texts give a 2x2 matrix whatever they say.
    both = runner.invoke(app, ["embed", "--checkpoint", str(minilm), "--text", "bert",
                               "--text", "gpt2", "--similarity"])
    assert both.exit_code == 0, both.output
    rows = [line.split() for line in both.stdout.splitlines()]
    assert len(rows) == 2 and all(len(r) == 2 for r in rows)
    assert "[spec bert:" in both.stderr  # the spec picked, said
    piped = runner.invoke(app, ["embed", "--checkpoint", str(minilm), "--similarity"],
                          input="bert\n\ngpt2\n")
    assert piped.exit_code == 0 and piped.stdout == both.stdout, piped.output
    # The old form: the first word is SPEC (a spec named bert exists), the second no argument.
    extra = runner.invoke(app, ["embed", "--checkpoint", str(minilm), "bert", "gpt2"])
    assert extra.exit_code == 2 and "gpt2" in extra.output, extra.output
    # A text where SPEC goes is no spec: said, with where texts go.
    text = runner.invoke(app, ["embed", "--checkpoint", str(minilm), "a text"])
    assert text.exit_code == 1, text.output
    assert "is no spec name or path" in text.output and "a text is given with --text" in text.output


def test_two_specs_of_one_architecture_are_told_apart_by_model_type():
    # transformers builds Glm4MoeForCausalLM for model types glm4_moe, param2moe and sarvam_moe.
    assert for_architectures(["Glm4MoeForCausalLM"], "config.json",
                             config={"model_type": "param2moe"}).name == "param2moe.yaml"
    assert for_architectures(["Glm4MoeForCausalLM"], "config.json",
                             config={"model_type": "glm4_moe"}).name == "glm4_moe.yaml"
    with pytest.raises(ValueError, match="served by 3 specs"):
        for_architectures(["Glm4MoeForCausalLM"], "config.json")
