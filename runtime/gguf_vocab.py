"""A GGUF file's tokenizer, built with the ``tokenizers`` library from the vocabulary, merges
and special-token ids llama.cpp stores as metadata (``tokenizer.ggml.*``), as transformers'
``integrations/gguf/gguf_tokenizer_mapping.py`` rebuilds it and llama.cpp's
``llama-vocab.cpp`` reads it:

- ``tokenizer.ggml.model`` of byte-level BPE (llama.cpp's name "gpt2"): the vocabulary and
  merges as stored, the text split before merging as ``tokenizer.ggml.pre`` says
  (``PRE_TOKENIZERS``: llama.cpp's ``regex_exprs`` for that name, in the form of the
  model's own tokenizer.json where llama.cpp adapted it), every token looked up whole first
  where llama.cpp ignores merges for that name (Llama 3's, Tekken's);
- ``tokenizer.ggml.model`` of a SentencePiece vocabulary (llama.cpp's "llama"): BPE with byte
  fallback, spaces as U+2581, merges recovered from the vocabulary ranked by score (by file
  order where the scores follow it), as transformers' ``GemmaTokenizer`` and
  ``generate_merges``;
- ``tokenizer.ggml.model`` "bert" (WordPiece): convert_hf_to_gguf.py's ``BertModel`` stored a
  word's first piece as U+2581 + piece and a continuation without its ``##``; both are put
  back, and the text is normalized and split as BERT's uncased tokenizer does, [CLS] text
  [SEP] around it;
- tokens typed control added whole as special tokens, user-defined ones whole as plain ones;
  the chat template from ``tokenizer.chat_template``.

Every list is checked before the ``tokenizers`` library sees it (tokens strings, each once;
merges pairs of tokens whose join is a token; types and scores one per token; special ids
within the vocabulary), and any error of the library's is turned into a ``GGUFError`` naming
the file: a damaged vocabulary is refused as one, never as the library's bare ``Exception``.

Not for: the model's config or tensors (``runtime.gguf``).
"""

from __future__ import annotations

import math

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as _Tokenizer
from tokenizers.models import BPE, WordPiece

from .gguf import GGUFError, GGUFFile
from .tokenizer import Tokenizer

BYTE_LEVEL, SENTENCEPIECE, WORDPIECE = "gpt2", "llama", "bert"  # tokenizer.ggml.model's values
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # token types (llama.cpp)
SPACE = "\u2581"

# llama.cpp's regular expressions per tokenizer.ggml.pre (llama-vocab.cpp's regex_exprs),
# each split off in turn ("isolated"), then the bytes spelled as GPT-2's byte-level BPE
# spells them. Where llama.cpp adapted an expression of the model's tokenizer.json (a
# case-insensitive group its regex engine lacks), the tokenizer.json form is kept: it is
# what transformers runs, and the same split.
_WORDS = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_DIGITS3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
           r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DIGITS1 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
          r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DIGITS1_MARKS = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}"
           r"\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CASED = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
           r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|"
           r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CASED_DIGITS3 = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
          r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
          r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
          r"[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_UNTIL_PUNCT = r" ?[^(\s|.,!?…。，、।۔،)]+"
# DeepSeek LLM's letters, written as code points (a literal copy can be normalized into
# ranges that run backwards: U+1F7D is NFC U+03CE).
_LETTERS = ("\\s?["
            "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
            "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a"
            "\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556"
            "\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b"
            "\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
            "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
            "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
            "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
            "\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184"
            "\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b"
            "\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
            "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
            "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
            "\U000118a0-\U000118df\U0001e900-\U0001e943"
            "]+")
_SPLITS = {
    "default": [r"[\p{P}\$\+<=>\^~\|]+", _WORDS, r"\p{N}+", r"[0-9][0-9][0-9]"],
    "words": [_WORDS],
    "digit_words": [r"\p{N}", _WORDS],
    "digits3": [_DIGITS3],
    "digits1": [_DIGITS1],
    "digits1_marks": [_DIGITS1_MARKS],
    "punct_words_digits3": [r"[\p{P}\$\+<=>\^~\|`]+", _WORDS, r"[0-9][0-9][0-9]"],
    "letters_cjk": [r"[\r\n]", _LETTERS,
                     r"\s?[!-/:-~！-／：-～‘-‟　-。]+", r"\s+$", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}+"],
    "letters_punct_cjk": [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"],
    "digits3_cjk_punct": [r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+",
                    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?"
                    r"[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "until_punct": [_UNTIL_PUNCT],
    "until_punct_digits": [_UNTIL_PUNCT, r"\p{N}"],
    "cased": [_CASED],
    "cased_digits3": [_CASED_DIGITS3],
}
# tokenizer.ggml.pre -> (its splits, whether a word found whole in the vocabulary is taken
# whole before any merge: llama.cpp's ignore_merges), as llama-vocab.cpp's load().
PRE_TOKENIZERS: dict[str, tuple[str, bool]] = {
    **{n: ("default", False) for n in ("default",)},
    **{n: ("digits3", True) for n in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1",
                                     "pixtral", "midm-2.0", "lfm2", "jina-v5-nano")},
    **{n: ("digits3", False) for n in ("dbrx", "smaug-bpe", "chatglm-bpe")},
    "glm4": ("digits3", True),
    **{n: ("words", False) for n in ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat",
                                    "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
                                    "modern-bert", "mpt", "olmo", "jais", "trillion",
                                    "granite-docling", "exaone4", "jina-v1-en",
                                    "jina-v2-code", "roberta-bpe")},
    **{n: ("digit_words", False) for n in ("starcoder", "refact", "command-r", "smollm",
                                         "codeshell", "exaone", "minerva-7b", "mellum2")},
    **{n: ("digits1", False) for n in ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2",
                                     "stablelm2", "megrez", "hunyuan", "solar-open")},
    "qwen35": ("digits1_marks", False),
    "falcon": ("punct_words_digits3", False),
    "deepseek-llm": ("letters_cjk", False),
    "deepseek-coder": ("letters_punct_cjk", False),
    **{n: ("digits3_cjk_punct", False) for n in ("deepseek-v3", "hunyuan-dense", "joyai-llm")},
    **{n: ("until_punct", False) for n in ("bloom", "poro-chat", "gpt3-finnish")},
    "viking": ("until_punct_digits", False),
    "tekken": ("cased", True),
    **{n: ("cased_digits3", False) for n in ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2")},
}
# Texts llama.cpp stops generation at beside the EOS id (llama-vocab.cpp's special_eog_ids),
# where the vocabulary holds them as control tokens.
END_OF_GENERATION = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                     "<EOT>", "<|end_of_text|>")
# tokenizer.ggml.<key>_token_id -> tokenizer_config.json's name of that special token.
SPECIAL_IDS = (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"),
               ("pad_token", "padding"))


def tokenizer(file: GGUFFile) -> Tokenizer:
    """``file``'s tokenizer, its chat template and the ids generation stops at.

    Raises:
        GGUFError: a ``tokenizer.ggml`` key missing (named), of the wrong type, or out of
            range (a special id past the vocabulary), a token listed twice (both places
            named), a merge that is not a pair of tokens whose join is a token, lists of
            different lengths, a tokenizer model or pre-tokenizer this builder does not know
            (naming the value and the known ones), or any other refusal of the
            ``tokenizers`` library (its message, under the file's name).
    """
    try:
        return _tokenizer(file)
    except GGUFError:
        raise
    except Exception as e:  # tokenizers raises bare Exceptions: a damaged vocabulary
        raise GGUFError(f"{file.path}: the tokenizer.ggml metadata does not build a "
                        f"tokenizer: {type(e).__name__}: {str(e)[:300]}") from None


def _tokenizer(file: GGUFFile) -> Tokenizer:
    model = file.text("tokenizer.ggml.model")
    tokens = file.array("tokenizer.ggml.tokens", "string")
    if not tokens:
        raise GGUFError(f"{file.path}: tokenizer.ggml.tokens is empty")
    types = file.array("tokenizer.ggml.token_type", "integer", [NORMAL] * len(tokens))
    if len(types) != len(tokens):
        raise GGUFError(f"{file.path}: tokenizer.ggml.token_type has {len(types)} entries for "
                        f"{len(tokens)} tokens")
    _distinct(file, tokens, "lists {token} twice")
    ids = {name: file.count(f"tokenizer.ggml.{key}_token_id", None, least=0)
           for name, key in SPECIAL_IDS}
    for name, i in ids.items():
        if i is not None and i >= len(tokens):
            raise GGUFError(f"{file.path}: tokenizer.ggml.{dict(SPECIAL_IDS)[name]}_token_id "
                            f"{i} is not within the {len(tokens)} tokens")
    if model == BYTE_LEVEL:
        tok = _byte_level(file, tokens)
    elif model == SENTENCEPIECE:
        tokens = _spelled(tokens)
        tok = _sentencepiece(file, tokens, types, ids["unk_token"])
    elif model == WORDPIECE:
        tokens = _wordpieces(tokens, types)
        tok = _wordpiece(file, tokens, ids["unk_token"])
    else:
        raise GGUFError(f"{file.path}: tokenizer.ggml.model is {model!r}; this reader builds "
                        f"{BYTE_LEVEL!r} (byte-level BPE), {SENTENCEPIECE!r} (SentencePiece) and "
                        f"{WORDPIECE!r} (WordPiece)")
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t, k in zip(tokens, types) if k == CONTROL])
    # Whole, as llama.cpp matches them; each under its own id (never a new one).
    tok.add_tokens([AddedToken(t, normalized=False, special=False)
                    for t, k in zip(tokens, types) if k == USER_DEFINED])
    if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise GGUFError(f"{file.path}: tokenizer.ggml.tokens holds {len(tokens)} tokens, of "
                        f"which the tokenizer holds {tok.get_vocab_size(with_added_tokens=True)}")
    if model != WORDPIECE and file.flag("tokenizer.ggml.add_bos_token", False) \
            and ids["bos_token"] is not None:
        bos = tokens[ids["bos_token"]]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, ids["bos_token"])])
    special = {name: tokens[i] if i is not None else None for name, i in ids.items()}
    eos: dict[int, str] = {}
    for key in ("eos", "eot", "eom"):
        i = file.count(f"tokenizer.ggml.{key}_token_id", None, least=0)
        if i is not None and i < len(tokens):
            eos.setdefault(i, f"{file.path}: tokenizer.ggml.{key}_token_id")
    for i, (t, k) in enumerate(zip(tokens, types)):
        if k == CONTROL and t in END_OF_GENERATION:
            eos.setdefault(i, f"{file.path}: tokenizer.ggml.tokens[{i}] ({t}, an end of "
                              "generation as the GGUF runtime reads it)")
    return Tokenizer.from_parts(tok, file.text("tokenizer.chat_template", None), special, eos,
                                f"{file.path}: tokenizer.chat_template")


def _distinct(file: GGUFFile, tokens: list[str], says: str) -> None:
    """Refuse a token that is there twice (``says``, with ``{token}``, and both ids): an id
    per token, a token per id."""
    seen: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if t in seen:
            raise GGUFError(f"{file.path}: tokenizer.ggml.tokens {says.format(token=repr(t[:40]))} "
                            f"(ids {seen[t]} and {i}): an id per token, a token per id")
        seen[t] = i


def _merges(file: GGUFFile, vocab: dict[str, int]) -> list[tuple[str, str]]:
    """``tokenizer.ggml.merges``: each "left right", both tokens and their join one too."""
    out = []
    for i, m in enumerate(file.array("tokenizer.ggml.merges", "string")):
        pair = m.split(" ")
        if len(pair) != 2 or not all(pair):
            raise GGUFError(f"{file.path}: tokenizer.ggml.merges[{i}] is {m[:60]!r}, not two "
                            "tokens with one space between")
        missing = [p for p in pair + ["".join(pair)] if p not in vocab]
        if missing:
            raise GGUFError(f"{file.path}: tokenizer.ggml.merges[{i}] ({m[:60]!r}) names "
                            f"{missing[0][:40]!r}, which is not in tokenizer.ggml.tokens")
        out.append((pair[0], pair[1]))
    return out


def _byte_level(file: GGUFFile, tokens: list[str]) -> _Tokenizer:
    pre = file.text("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise GGUFError(f"{file.path}: tokenizer.ggml.pre is {pre!r}; this reader splits text as "
                        f"GGUF's loader does for {', '.join(sorted(PRE_TOKENIZERS))}")
    splits, whole = PRE_TOKENIZERS[pre]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = _Tokenizer(BPE(vocab, _merges(file, vocab), ignore_merges=whole))
    steps = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in _SPLITS[splits]]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def _spelled(tokens: list[str]) -> list[str]:
    """SentencePiece tokens as the model looks them up: one of two or more spaces is stored
    as spaces, and looked up as U+2581s (transformers' gemma_tokenizer respells them so)."""
    return [SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]


def _sentencepiece(file: GGUFFile, tokens: list[str], types: list[int],
                   unk: int | None) -> _Tokenizer:
    vocab = {t: i for i, t in enumerate(tokens)}
    if "tokenizer.ggml.merges" in file.metadata:
        merges = _merges(file, vocab)
    else:
        scores = file.array("tokenizer.ggml.scores", "number", None)
        if scores is not None and (len(scores) != len(tokens)
                                   or not all(math.isfinite(s) for s in scores)):
            raise GGUFError(f"{file.path}: tokenizer.ggml.scores holds {len(scores)} scores "
                            f"for {len(tokens)} tokens, or one that is not finite")
        merges = _sentencepiece_merges(vocab, tokens, types, scores)
    tok = _Tokenizer(BPE(vocab, merges, unk_token=tokens[unk] if unk is not None else None,
                         fuse_unk=True, byte_fallback=True))
    prefix = file.flag("tokenizer.ggml.add_space_prefix", True)
    tok.normalizer = normalizers.Sequence(
        ([normalizers.Prepend(SPACE)] if prefix else []) + [normalizers.Replace(" ", SPACE)])
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence(
        [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
        + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tok


def _sentencepiece_merges(vocab: dict[str, int], tokens: list[str], types: list[int],
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


def _wordpieces(tokens: list[str], types: list[int]) -> list[str]:
    """BERT's vocabulary as its tokenizer.json holds it, from convert_hf_to_gguf.py's
    "phantom space" form: a word's first piece stored as U+2581 + piece, a continuation
    without its ``##``, control tokens as they are."""
    return [t if k == CONTROL else t[1:] if t.startswith(SPACE) else "##" + t
            for t, k in zip(tokens, types)]


def _wordpiece(file: GGUFFile, tokens: list[str], unk: int | None) -> _Tokenizer:
    _distinct(file, tokens, "spells the word piece {token} twice")
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = _Tokenizer(WordPiece(vocab, unk_token=tokens[unk] if unk is not None else "[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=None, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    # [CLS] is the BOS id (llama.cpp's cls_token_id is deprecated); [SEP] the separator.
    cls = file.count("tokenizer.ggml.cls_token_id", None, least=0)
    cls = file.count("tokenizer.ggml.bos_token_id", None, least=0) if cls is None else cls
    sep = file.count("tokenizer.ggml.seperator_token_id", None, least=0)
    if cls is not None and sep is not None and max(cls, sep) < len(tokens):
        tok.post_processor = processors.TemplateProcessing(
            single=f"{tokens[cls]} $A {tokens[sep]}",
            pair=f"{tokens[cls]} $A {tokens[sep]} $B:1 {tokens[sep]}:1",
            special_tokens=[(tokens[cls], cls), (tokens[sep], sep)])
    return tok
