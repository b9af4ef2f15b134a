"""A GGUF file's tokenizer, built with the ``tokenizers`` library from the vocabulary, merges
and special-token ids llama.cpp stores as metadata (``tokenizer.ggml.*``), as transformers'
``integrations/gguf/gguf_tokenizer_mapping.py`` rebuilds it:

- ``tokenizer.ggml.model`` of byte-level BPE (llama.cpp's name "gpt2"): the vocabulary and
  merges as stored, split before merging as ``tokenizer.ggml.pre`` says (``PRE_TOKENIZERS``);
- ``tokenizer.ggml.model`` of a SentencePiece vocabulary (llama.cpp's "llama"): BPE with byte
  fallback, spaces as U+2581, merges recovered from the vocabulary ranked by score (by file
  order where the scores follow it), as transformers' ``GemmaTokenizer`` and
  ``generate_merges``;
- tokens typed control added whole as special tokens, user-defined ones whole as plain ones;
  the chat template from ``tokenizer.chat_template``.

Not for: the model's config or tensors (``runtime.gguf``).
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as _Tokenizer
from tokenizers.models import BPE

from .gguf import GGUFError, GGUFFile
from .tokenizer import Tokenizer

BYTE_LEVEL, SENTENCEPIECE = "gpt2", "llama"  # tokenizer.ggml.model's values
NORMAL, CONTROL, USER_DEFINED = 1, 3, 4  # tokenizer.ggml.token_type's values (llama.cpp)
SPACE = "\u2581"

# tokenizer.ggml.pre -> how text is split before merging (llama.cpp's llama-vocab.cpp
# regex_exprs for that name): "digits" splits every digit off first.
PRE_TOKENIZERS = {
    "default": (),
    "gpt-2": (),
    "smollm": ("digits",),
}
# Texts llama.cpp stops generation at beside the EOS id (llama-vocab.cpp's special_eog_ids),
# where the vocabulary holds them as control tokens.
END_OF_GENERATION = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                     "<EOT>", "<|end_of_text|>")


def tokenizer(file: GGUFFile) -> Tokenizer:
    """``file``'s tokenizer, its chat template and the ids generation stops at.

    Raises:
        GGUFError: a ``tokenizer.ggml`` key missing (named), a tokenizer model or
            pre-tokenizer this builder does not know (naming the value and the known ones),
            or metadata lists of different lengths.
    """
    model = file.get("tokenizer.ggml.model")
    tokens = file.get("tokenizer.ggml.tokens")
    types = file.get("tokenizer.ggml.token_type", [NORMAL] * len(tokens))
    if len(types) != len(tokens):
        raise GGUFError(f"{file.path}: tokenizer.ggml.token_type has {len(types)} entries for "
                        f"{len(tokens)} tokens")
    if model == BYTE_LEVEL:
        tok = _byte_level(file, tokens)
    elif model == SENTENCEPIECE:
        tokens = _spelled(tokens)
        tok = _sentencepiece(file, tokens, types)
    else:
        raise GGUFError(f"{file.path}: tokenizer.ggml.model is {model!r}; this reader builds "
                        f"{BYTE_LEVEL!r} (byte-level BPE) and {SENTENCEPIECE!r} (SentencePiece)")
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t, k in zip(tokens, types) if k == CONTROL])
    # Whole, as llama.cpp matches them; each under its own id (never a new one).
    tok.add_tokens([AddedToken(t, normalized=False, special=False)
                    for t, k in zip(tokens, types) if k == USER_DEFINED])
    if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise GGUFError(f"{file.path}: tokenizer.ggml.tokens holds {len(tokens)} tokens, of "
                        "which some are not distinct")
    ids = {name: file.get(f"tokenizer.ggml.{key}_token_id", None) for name, key in
           (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"),
            ("pad_token", "padding"))}
    for name, i in ids.items():
        if i is not None and not 0 <= i < len(tokens):
            raise GGUFError(f"{file.path}: tokenizer.ggml.{name[:-6]} id {i} is not within the "
                            f"{len(tokens)} tokens")
    if file.get("tokenizer.ggml.add_bos_token", False) and ids["bos_token"] is not None:
        bos = tokens[ids["bos_token"]]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, ids["bos_token"])])
    special = {name: tokens[i] if i is not None else None for name, i in ids.items()}
    eos: dict[int, str] = {}
    for key in ("eos", "eot", "eom"):
        i = file.get(f"tokenizer.ggml.{key}_token_id", None)
        if i is not None:
            eos.setdefault(i, f"{file.path}: tokenizer.ggml.{key}_token_id")
    for i, (t, k) in enumerate(zip(tokens, types)):
        if k == CONTROL and t in END_OF_GENERATION:
            eos.setdefault(i, f"{file.path}: tokenizer.ggml.tokens[{i}] ({t}, an end of "
                              "generation as the GGUF runtime reads it)")
    return Tokenizer.from_parts(tok, file.get("tokenizer.chat_template", None), special, eos,
                                f"{file.path}: tokenizer.chat_template")


def _byte_level(file: GGUFFile, tokens: list[str]) -> _Tokenizer:
    pre = file.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise GGUFError(f"{file.path}: tokenizer.ggml.pre is {pre!r}; this reader splits text as "
                        f"{', '.join(map(repr, PRE_TOKENIZERS))}")
    merges = [tuple(m.split(" ", 1)) for m in file.get("tokenizer.ggml.merges")]
    tok = _Tokenizer(BPE({t: i for i, t in enumerate(tokens)}, merges))
    steps = [pre_tokenizers.Digits(individual_digits=True)] if "digits" in PRE_TOKENIZERS[pre] else []
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def _spelled(tokens: list[str]) -> list[str]:
    """SentencePiece tokens as the model looks them up: one of two or more spaces is stored
    as spaces, and looked up as U+2581s (transformers' gemma_tokenizer respells them so)."""
    return [SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]


def _sentencepiece(file: GGUFFile, tokens: list[str], types: list[int]) -> _Tokenizer:
    vocab = {t: i for i, t in enumerate(tokens)}
    if "tokenizer.ggml.merges" in file.metadata:
        merges = [tuple(m.split(" ", 1)) for m in file.get("tokenizer.ggml.merges")]
    else:
        merges = _merges(vocab, tokens, types, file.get("tokenizer.ggml.scores", None))
    unk = file.get("tokenizer.ggml.unknown_token_id", None)
    tok = _Tokenizer(BPE(vocab, merges, unk_token=tokens[unk] if unk is not None else None,
                         fuse_unk=True, byte_fallback=True))
    prefix = file.get("tokenizer.ggml.add_space_prefix", True)
    tok.normalizer = normalizers.Sequence(
        ([normalizers.Prepend(SPACE)] if prefix else []) + [normalizers.Replace(" ", SPACE)])
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence(
        [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
        + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tok


def _merges(vocab: dict[str, int], tokens: list[str], types: list[int],
            scores: list[float] | None) -> list[tuple[str, str]]:
    """The merges a SentencePiece vocabulary implies, as transformers' ``generate_merges``:
    every split of a token into two tokens, best-ranked merged token first (ties: the
    longer left piece, then the longer right one). A token's rank is its score, or its
    place in the file where the ordinary tokens' scores follow file order (they then say
    the same, and file order also ranks the control tokens, whose scores are placeholders),
    as transformers' gemma_tokenizer."""
    ordinary = [s for s, k in zip(scores or [], types) if k == NORMAL]
    if scores is None or all(a > b for a, b in zip(ordinary, ordinary[1:])):
        rank = [-float(i) for i in range(len(tokens))]
    else:
        rank = list(scores)
    # transformers also orders each token's splits by their pieces' ids first; the sort
    # below orders them all the same (one token's splits differ in their left piece's length).
    found = [(token[:i], token[i:], score) for token, score in zip(tokens, rank)
             for i in range(1, len(token)) if token[:i] in vocab and token[i:] in vocab]
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in found]
