"""Make the byte-level BPE vocabulary the pre-tokenizer cases share (``vocab.json``: tokens
and merges), trained by the tokenizers library on ``CORPUS`` with no pre-tokenization, so
its merges cross what each pre-tokenizer splits apart (digits, contractions, spaces before
words, newlines, punctuation runs): a text's ids then say where it was split. Run once;
the committed file is the vocabulary (never run by the tests)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = Path(__file__).resolve().parent
CORPUS = [
    "The cat's 12345 toys aren't here; they'll be back at 10:30.",
    "Hello, World!!! 2024-01-01 it's   spaced\n\n\tnew line",
    "naïve café — 日本語 テスト 😀 ÀÉÎ ñ 100,000.50 $5 +3 <=> ^~| `x`",
    "def f(x):\n    return x**2  # square\n",
    "I'M SHOUTING, you're whispering... We've 1,234 USD.",
] * 20


def main() -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    (HERE / "vocab.json").write_text(json.dumps(
        {"tokens": [t for t, _ in vocab], "merges": merges}, ensure_ascii=False, indent=0))


if __name__ == "__main__":
    main()
