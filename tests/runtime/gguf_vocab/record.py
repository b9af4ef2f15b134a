"""Record each pre-tokenizer case's ids from an independent reader of the same GGUF file
(never run by the tests): transformers' own GGUF tokenizer where it splits for that
``tokenizer.ggml.pre`` (``GGUF_PRE_TOKENIZER_SPLITS``), else llama.cpp's (llama-cpp-python,
``vocab_only``, special tokens parsed as transformers parses them), else not recorded. ``python -m tests.runtime.gguf_vocab.record``."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from iron_spec.runtime.gguf_vocab import PRE_TOKENIZERS

from .files import HERE, TEXTS, write


def by_transformers(path: Path) -> list[list[int]]:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]


def by_llama_cpp(path: Path) -> list[list[int]] | None:
    try:
        import llama_cpp
    except ImportError:
        return None
    model = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    return [model.tokenize(t.encode(), add_bos=False, special=True) for t in TEXTS]


def main() -> None:
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for pre in sorted(PRE_TOKENIZERS):
            path = write(Path(d) / f"{pre}.gguf", pre)
            if pre in GGUF_PRE_TOKENIZER_SPLITS:
                out[pre] = {"source": "transformers", "ids": by_transformers(path)}
                continue
            ids = by_llama_cpp(path)
            if ids is not None:
                out[pre] = {"source": "llama.cpp", "ids": ids}
    (HERE / "ids.json").write_text(json.dumps(out, indent=0))
    print({pre: v["source"] for pre, v in out.items()})


if __name__ == "__main__":
    main()
