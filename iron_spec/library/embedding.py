"""Texts' embeddings under an encoder spec: each text one call of the compiled encoder (its
own rows, nothing shared between texts), pooled and normalized as the spec's ``pooling``
says; ``EncoderModel.embed`` (``api``) calls it.

Not for: the command and its output (``iron_spec.cli.embed``), loading the encoder
(``iron_spec.spec.encoder``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from iron_spec.spec.build import Loaded

log = logging.getLogger("iron_spec")


def embed_texts(loaded: Loaded, texts: list[str], lang: int | None = None) -> np.ndarray:
    """The spec's embedding of each text, ``(len(texts), hidden)`` float32. A text past the
    model's ``max_tokens`` is truncated there (as sentence-transformers truncates it), a
    warning on the ``iron_spec`` logger saying how many were, once per call. ``lang``: every
    text's language id, for a model with a language table (XLMModel's ``langs``; None: the
    spec's default language).

    Raises:
        ValueError: the model has no tokenizer, its pooling keeps every token (``none``), a
            text is not UTF-8 text, or ``lang`` is outside the language table (or given to
            a model without one).
    """
    if loaded.tokenizer is None:
        raise ValueError(no_tokenizer(loaded.directory))
    version = loaded.model.version()
    if version.pooling.kind == "none":
        raise ValueError("the spec's pooling is 'none': it gives one vector per token, not one "
                         "per text")
    rows, cut = [], 0
    for i, text in enumerate(texts, 1):
        ids, types, truncated = loaded.tokenizer.encode(text, f"TEXT {i}")
        cut += truncated
        with loaded.model.lock:  # copied before another thread's call reuses the arena
            rows.append(np.array(version(ids, types, lang)))
    if cut:
        n = loaded.tokenizer.max_tokens
        log.warning("%d of %d text%s truncated at %d tokens, the most a text keeps here (as "
                    "sentence-transformers truncates): the rest is not embedded", cut,
                    len(texts), "s were" if len(texts) != 1 else " was", n)
    return np.stack(rows)


def no_tokenizer(directory: Path | None) -> str:
    """Why texts cannot be encoded without a tokenizer: the directory searched and the file
    expected, and what to do where a slow tokenizer's files are there instead."""
    if directory is None:
        return ("texts need a checkpoint's tokenizer.json, and a --toy model has none: give "
                "--checkpoint DIR")
    slow = sorted(p.name for p in Path(directory).glob("*") if p.name in SLOW_FILES)
    return (f"texts need a tokenizer, and {directory} holds no tokenizer.json (the tokenizers "
            "library's file, as transformers' fast tokenizers save it)"
            + (f"; {', '.join(slow)} (a slow tokenizer's) is not read here: write "
               "tokenizer.json with transformers' AutoTokenizer.from_pretrained(DIR)"
               ".save_pretrained(DIR)" if slow else ""))


#: A slow (Python) tokenizer's files, which transformers converts and this does not read.
SLOW_FILES = ("vocab.txt", "vocab.json", "merges.txt", "sentencepiece.bpe.model",
              "spiece.model", "tokenizer.model")
