"""GGUF files of every family llama.cpp converts that a spec serves (issue 29, item 5): each
case's checkpoint (``tests/specs/gguf/``, drawn by name) written as llama.cpp's converter
lays it out (``tests/specs/gguf/convert.py``: its tensor names, permutations, fused and
stacked tensors, shifted norms and metadata), run from the GGUF file alone, judged against
transformers' own logits on the checkpoint (the committed golden): the float32 KL gate, no
top-1 mismatch, and transformers' greedy tokens."""

from __future__ import annotations

import pytest

from iron_spec.spec.build import load_model
from iron_spec.spec.registry import for_checkpoint
from iron_spec.runtime.golden import Golden
from tests.specs.gguf import cases, convert
from tests.specs.test_goldens import judge


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Each case's checkpoint directory and its GGUF file, written once."""
    root, out = tmp_path_factory.mktemp("gguf"), {}

    def get(name: str):
        if name not in out:
            directory = cases.materialize(name, root / name)
            c = cases.case(name)
            path = convert.write(root / f"{name}.gguf", cases.family(name), c["config"],
                                 cases.draw(c["tensors"]))
            out[name] = directory, path
        return out[name]
    return get


@pytest.mark.parametrize("name", cases.names())
def test_a_gguf_gives_transformers_greedy_tokens(name: str, written):
    directory, path = written(name)
    # The golden is of the checkpoint the file was converted from.
    theirs = load_model(cases.spec_file(name), checkpoint=directory, prefill_chunk=16)
    golden = Golden.read(cases.golden_file(name), theirs.fingerprint())
    ours = load_model(cases.spec_file(name), checkpoint=path, prefill_chunk=16)
    judge(ours, golden)
    # The file alone picks its spec, by general.architecture.
    assert for_checkpoint(path) == cases.spec_file(name)


def test_a_bert_gguf_gives_transformers_hidden_states(tmp_path):
    # BERT's toy (the encoder goldens' seed-0 checkpoint), its pooler dropped as llama.cpp's
    # converter drops it, against transformers' hidden states on it (tests/goldens/bert/).
    import dataclasses

    import numpy as np

    from iron_spec.cli.check import golden_path
    from iron_spec.spec.gates import ENCODER_ATOL
    from iron_spec.spec.encoder import load_encoder
    from iron_spec.runtime import checks
    from iron_spec.runtime.encoder_golden import EncoderGolden
    from tests.conftest import SPECS

    toy = load_encoder(SPECS / "bert.yaml", random_weights=0, toy=True)
    golden = EncoderGolden.read(golden_path(toy), toy.fingerprint())
    path = convert.write(tmp_path / "bert.gguf", "bert", dict(toy.config_json),
                         {n: np.asarray(t) for n, t in toy.weights().items()})
    ours = load_encoder(SPECS / "bert.yaml", checkpoint=path)
    assert ours.config_json["add_pooling_layer"] is False and ours.config_json["is_decoder"] is False
    states = ours.model.version(dataclasses.replace(ours.model.config.pooling, kind="none",
                                                    normalize=False))
    for k, ((ids, types), want) in enumerate(zip(golden.probes, golden.hidden)):
        got = states(ids, types, **checks.call_keywords(golden.global_masks, k))
        assert np.abs(got - want).max() <= ENCODER_ATOL
    # The vocabulary back in WordPiece's form: [CLS] (2), hello (90), world (91), cat (86)
    # and the continuation ##x (68, stored as "x"), [SEP] (3): convert.wordpieces' ids.
    assert ours.tokenizer("Hello world catx")[0] == [2, 90, 91, 86, 68, 3]


def test_all_minilm_as_a_gguf_embeds_as_transformers(tmp_path):
    # The real all-MiniLM-L6-v2 written as llama.cpp lays it out (float32, its WordPiece
    # vocabulary in phantom-space form): transformers' token ids and embeddings
    # (tests/goldens/bert/all-minilm-l6-v2.npz, recorded by tests/goldens/bert/record.py).
    import json

    import gguf
    import numpy as np

    from iron_spec.library.embedding import embed_texts
    from iron_spec.spec.encoder import load_encoder
    from iron_spec.runtime.checkpoint import Checkpoint
    from tests.conftest import ROOT, SPECS, checkpoint

    directory = checkpoint("all-minilm-l6-v2")
    with np.load(ROOT / "tests" / "goldens" / "bert" / "all-minilm-l6-v2.npz") as f:
        texts, ids, e = json.loads(str(f["texts"])), json.loads(str(f["ids"])), f["embeddings"]
    spec = json.loads((directory / "tokenizer.json").read_text())
    vocab = sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])
    special = {t["id"] for t in spec["added_tokens"] if t["special"]}
    tokens = [t for t, _ in vocab]
    types = [gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL
             for i in range(len(tokens))]
    ck = Checkpoint(directory)
    weights = {n: ck.raw(n).astype(np.float32) for n in ck.tensors}
    config = json.loads((directory / "config.json").read_text())
    path = convert.write(tmp_path / "all-minilm.gguf", "bert", config, weights,
                         vocab=(tokens, types))
    ours = load_encoder(SPECS / "bert.yaml", checkpoint=path)
    for text, want in zip(texts, ids):
        assert ours.tokenizer(text)[0] == want, text
    got = embed_texts(ours, texts)
    np.testing.assert_allclose(got, e / np.linalg.norm(e, axis=1, keepdims=True), atol=2e-6)


def test_llama3_rope_scaling_as_rope_freqs_gives_transformers_tokens(tmp_path):
    # The llama3 toy (llama3 RoPE scaling: factor 8, original context 64) as llama.cpp writes
    # it, the scaling as the per-frequency factors rope_freqs; judged by the toy's golden.
    import numpy as np

    from iron_spec.cli.check import golden_path
    from tests.conftest import SPECS

    toy = load_model(SPECS / "llama3.yaml", random_weights=0, toy=True)
    golden = Golden.read(golden_path(toy), toy.fingerprint())
    path = convert.write(tmp_path / "llama3.gguf", "llama", dict(toy.config_json),
                         {n: np.asarray(t) for n, t in toy.weights().items()})
    ours = load_model(SPECS / "llama3.yaml", checkpoint=path, prefill_chunk=16)
    assert ours.config_json["rope_scaling"]["rope_type"] == "longrope"
    judge(ours, golden)


@pytest.mark.parametrize("name", ["gguf-llama", "gguf-gpt_neox", "gguf-falcon", "gguf-stablelm",
                                  "gguf-gpt2", "gguf-gemma"])
def test_quantized_blocks_in_transformers_row_order_are_the_values_read(name, tmp_path):
    # A Q8_0 file: every tensor's blocks as a kernel reads them (rows put back in
    # transformers' order: q/k unpermuted, a fused q/k/v regrouped, a stacked norm's row)
    # dequantize to the values the model reads; the tensors whose values change on read
    # (a norm stored as 1 + w, a Conv1D matrix stored [out, in]) are refused by blocks().
    import gguf
    import numpy as np

    from iron_spec.runtime.gguf import GGUFError
    from iron_spec.runtime.quants import dequantize

    c = cases.case(name)
    path = convert.write(tmp_path / f"{name}.gguf", cases.family(name), c["config"],
                         cases.draw(c["tensors"]), qtype=gguf.GGMLQuantizationType.Q8_0)
    ckpt = load_model(cases.spec_file(name), checkpoint=path, prefill_chunk=16).checkpoint
    refused = 0
    for n in ckpt.tensors:
        try:
            fmt, rows = ckpt.blocks(n)
        except GGUFError:
            refused += 1
            continue
        got = dequantize(rows, fmt).reshape(ckpt.tensors[n].shape)
        assert got.tobytes() == ckpt.raw(n).tobytes(), n
    assert (refused > 0) == (name in ("gguf-gpt2", "gguf-gemma")), refused
