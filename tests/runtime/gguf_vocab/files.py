"""The pre-tokenizer cases' GGUF files: the shared byte-level vocabulary (``vocab.json``)
under one ``tokenizer.ggml.pre`` each, in a llama file holding no tensors (a vocabulary
alone, as llama.cpp's ``vocab_only`` reads one)."""

from __future__ import annotations

import json
from pathlib import Path

import gguf

HERE = Path(__file__).resolve().parent
TEXTS = [
    "The cat's 12345 toys aren't here; they'll be back at 10:30.",
    "Hello, World!!! 2024-01-01 it's   spaced\n\n\tnew line",
    "naïve café — 日本語 テスト 😀 ÀÉÎ ñ 100,000.50 $5 +3 <=> ^~| `x`",
    "def f(x):\n    return x**2  # square\n",
    "I'M SHOUTING, you're whispering... We've 1,234 USD.",
    "   leading spaces and trailing   ",
    "a\n\n\nb\r\nc 1234567 '''s 'S 'LL",
    "ÜBER-größe 3.14159 x+=1;y<=2",
    "two texts<|endoftext|>!!! 99",
]


def vocab() -> dict:
    return json.loads((HERE / "vocab.json").read_text())


def write(path: Path, pre: str) -> Path:
    v = vocab()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(64)
    w.add_feed_forward_length(64)
    w.add_head_count(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    # The vocabulary, and a control token to end texts with (added whole by every reader).
    w.add_token_list(v["tokens"] + ["<|endoftext|>"])
    w.add_token_types([gguf.TokenType.NORMAL] * len(v["tokens"]) + [gguf.TokenType.CONTROL])
    w.add_token_merges(v["merges"])
    w.add_bos_token_id(len(v["tokens"]))
    w.add_eos_token_id(len(v["tokens"]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
