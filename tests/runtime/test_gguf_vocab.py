"""A GGUF file's byte-level tokenizer splits text as ``tokenizer.ggml.pre`` says: the same
vocabulary and merges (``gguf_vocab/vocab.json``, whose merges cross every split) under each
pre-tokenizer name give the ids an independent reader of the same file gave
(``gguf_vocab/ids.json``: transformers' GGUF tokenizer, or llama.cpp's; ``record.py``)."""

from __future__ import annotations

import json

import pytest

from iron_spec.runtime.gguf import GGUFFile
from iron_spec.runtime.gguf_vocab import PRE_TOKENIZERS, tokenizer
from tests.runtime.gguf_vocab.files import HERE, TEXTS, write

RECORDED = json.loads((HERE / "ids.json").read_text())


@pytest.mark.parametrize("pre", sorted(RECORDED))
def test_the_splits_of_each_pre_tokenizer_are_the_recorded_readers(pre, tmp_path):
    tok = tokenizer(GGUFFile(write(tmp_path / f"{pre}.gguf", pre)))
    for text, want in zip(TEXTS, RECORDED[pre]["ids"]):
        assert tok.encode(text, add_special_tokens=False) == want, (RECORDED[pre]["source"], text)


def test_the_pre_tokenizers_split_differently():
    # The cases judge something: the names' splits give different ids for the same text.
    assert len({json.dumps(v["ids"]) for v in RECORDED.values()}) >= 3
    assert set(RECORDED) <= set(PRE_TOKENIZERS)
