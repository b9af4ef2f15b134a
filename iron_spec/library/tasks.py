"""An encoder's task head run on texts, as transformers' pipelines give their results:
``fill-mask`` (FillMaskPipeline), ``text-classification`` (TextClassificationPipeline) and
``token-classification`` (TokenClassificationPipeline, no aggregation).

The head is the one a ``*ForMaskedLM``, ``*ForSequenceClassification`` or
``*ForTokenClassification`` checkpoint holds (a spec's ``parts``, ``runtime.encoder_heads``);
each text runs as one call of the compiled encoder, as ``embed`` runs it.

Not for: embeddings (``embed``), checking against goldens (``check``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from iron_spec.spec.build import Loaded

from .embedding import no_tokenizer

#: transformers' TextClassificationPipeline's ``function_to_apply`` choices.
FUNCTIONS = ("softmax", "sigmoid", "none")
#: Labels TokenClassificationPipeline leaves out (its ``ignore_labels`` default).
IGNORE_LABELS = ("O",)


def task(loaded: Loaded) -> str | None:
    """The task of ``loaded``'s head (``runtime.encoder_heads.TASKS``), None without one."""
    head = getattr(loaded.model, "head", None)
    return None if head is None else head.options.task


def require(loaded: Loaded, wanted: str, call: str) -> None:
    """Raises ValueError unless ``loaded``'s head serves ``wanted``, saying what the
    checkpoint holds and which call serves it."""
    have = task(loaded)
    if have == wanted:
        return
    calls = {"fill-mask": "fill_mask() (iron-spec fill-mask)",
             "text-classification": "classify() (iron-spec classify)",
             "token-classification": "classify_tokens() (iron-spec classify)"}
    arch = (loaded.whole_config.get("architectures") or ["?"])[0]
    if have is None:
        raise ValueError(f"{call} runs a {wanted} head, and this checkpoint ({arch}) holds "
                         "none: load a *ForMaskedLM, *ForSequenceClassification or "
                         "*ForTokenClassification checkpoint (its spec's parts read it)")
    raise ValueError(f"{call} runs a {wanted} head; this checkpoint ({arch}) holds a {have} "
                     f"head: it is run by {calls[have]}")


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, in float64 (as the pipelines' numpy softmax)."""
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def mask_id(loaded: Loaded) -> int:
    """The mask token's id: tokenizer_config.json's ``mask_token`` (a string or an added
    token's ``{"content": ...}``) in the tokenizer's vocabulary, else the tokenizer's own
    ``[MASK]`` or ``<mask>``.

    Raises:
        ValueError: the checkpoint's tokenizer names no mask token.
    """
    names = []
    path = Path(loaded.directory) / "tokenizer_config.json"
    if path.is_file():
        try:
            held = json.loads(path.read_text()).get("mask_token")
        except (ValueError, UnicodeDecodeError, AttributeError):
            held = None
        if isinstance(held, dict):
            held = held.get("content")
        if isinstance(held, str):
            names.append(held)
    for name in names + ["[MASK]", "<mask>"]:
        found = loaded.tokenizer.token_id(name)
        if found is not None:
            return int(found)
    raise ValueError(f"{loaded.directory}: its tokenizer names no mask token (tokenizer_config"
                     ".json's mask_token; [MASK] and <mask> are not in tokenizer.json)")


def _encoding(loaded: Loaded, text: str, what: str):
    """The tokenizers Encoding of ``text`` (special tokens added, truncated as ``embed``)."""
    if loaded.tokenizer is None:
        raise ValueError(no_tokenizer(loaded.directory))
    return loaded.tokenizer.encoding(text, what)


def head_scores(loaded: Loaded, ids, types=None) -> np.ndarray:
    """The head's scores (logits) on one text's ``ids``: ``(rows, size)`` for fill-mask and
    token classification, ``(size,)`` for a text's classes, float32 (a copy)."""
    with loaded.model.lock:  # copied before another thread's call reuses the arena
        return np.array(loaded.model.version(head=True)(ids, types))


def fill_mask(loaded: Loaded, text: str, top_k: int = 5) -> list:
    """FillMaskPipeline's result for ``text``: for its mask token, the ``top_k`` most likely
    tokens as ``{"score", "token", "token_str", "sequence"}`` (score: the softmax over the
    vocabulary; sequence: the text with that token in the mask's place, decoded without
    special tokens), most likely first; for several masks, one such list per mask, each
    sequence decoded with its special tokens (as the pipeline does).

    Raises:
        ValueError: no fill-mask head or tokenizer, no mask token in the text, a ``top_k``
            below 1.
    """
    require(loaded, "fill-mask", "fill_mask")
    if top_k < 1:
        raise ValueError(f"top_k is {top_k}, not a count of tokens from 1")
    enc = _encoding(loaded, text, "the text")
    mask = mask_id(loaded)
    ids = np.asarray(enc.ids, np.int64)
    where = np.flatnonzero(ids == mask)
    if where.size == 0:
        name = loaded.tokenizer.decode([mask], skip_special_tokens=False)
        raise ValueError(f"the text holds no mask token ({name}): fill-mask fills one in")
    scores = head_scores(loaded, ids, enc.type_ids if loaded.model.config.token_types else None)
    single = where.size == 1
    out = []
    for row in where:
        probs = softmax(scores[row])
        k = min(top_k, probs.size)
        best = np.argsort(-probs, kind="stable")[:k]
        results = []
        for p in best:
            filled = ids.copy()
            filled[row] = p
            results.append({
                "score": float(probs[p]), "token": int(p),
                "token_str": loaded.tokenizer.decode([int(p)], skip_special_tokens=False),
                "sequence": loaded.tokenizer.decode(filled.tolist(), skip_special_tokens=single)})
        out.append(results)
    return out[0] if single else out


def _function(loaded: Loaded, function_to_apply: str | None) -> str:
    """TextClassificationPipeline's default ``function_to_apply`` by config.json's
    ``problem_type`` and the number of labels, or ``function_to_apply`` itself."""
    if function_to_apply is not None:
        if function_to_apply not in FUNCTIONS:
            raise ValueError(f"function_to_apply is {function_to_apply!r}, not one of "
                             f"{', '.join(FUNCTIONS)}")
        return function_to_apply
    problem = loaded.config_json.get("problem_type")
    labels = len(loaded.expanded.labels)
    if problem == "regression":
        return "none"
    if problem == "multi_label_classification" or labels == 1:
        return "sigmoid"
    return "softmax"


def _apply(scores: np.ndarray, function: str) -> np.ndarray:
    scores = np.asarray(scores, np.float64)
    if function == "softmax":
        return softmax(scores)
    if function == "sigmoid":
        return 1.0 / (1.0 + np.exp(-scores))
    return scores


def classify(loaded: Loaded, texts: list[str], top_k: int | None = 1,
             function_to_apply: str | None = None) -> list:
    """TextClassificationPipeline's result for each text: with ``top_k`` 1 its most likely
    class, ``{"label", "score"}``; else its ``top_k`` classes (None: all), most likely
    first, as a list of those. Scores are the logits through ``function_to_apply`` (default
    the pipeline's: softmax over several labels, sigmoid over one or for
    ``multi_label_classification``, none for ``regression``); labels are config.json's
    ``id2label``.

    Raises:
        ValueError: no text-classification head or tokenizer, a ``top_k`` below 1, a
            ``function_to_apply`` none of ``FUNCTIONS``.
    """
    require(loaded, "text-classification", "classify")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k is {top_k}, not a count of classes from 1 (None: all)")
    function = _function(loaded, function_to_apply)
    labels = loaded.expanded.labels
    out = []
    for i, text in enumerate(texts, 1):
        enc = _encoding(loaded, text, f"TEXT {i}")
        types = enc.type_ids if loaded.model.config.token_types else None
        scores = _apply(head_scores(loaded, enc.ids[:loaded.tokenizer.max_tokens],
                                    None if types is None else types[:loaded.tokenizer.max_tokens]),
                        function)
        ranked = [{"label": labels[j], "score": float(scores[j])}
                  for j in np.argsort(-scores, kind="stable")]
        out.append(ranked[0] if top_k == 1 else ranked[:top_k])
    return out


def classify_tokens(loaded: Loaded, text: str,
                    ignore_labels: tuple[str, ...] = IGNORE_LABELS) -> list[dict[str, Any]]:
    """TokenClassificationPipeline's result for ``text`` (aggregation ``none``): each token
    but the special ones whose most likely label is not among ``ignore_labels``, as
    ``{"entity", "score", "index", "word", "start", "end"}`` (score: the softmax over the
    labels; index: its place among the text's ids; start and end: its characters in the
    text), in the text's order.

    Raises:
        ValueError: no token-classification head or tokenizer.
    """
    require(loaded, "token-classification", "classify_tokens")
    enc = _encoding(loaded, text, "the text")
    n = min(len(enc.ids), loaded.tokenizer.max_tokens)
    types = enc.type_ids[:n] if loaded.model.config.token_types else None
    probs = softmax(head_scores(loaded, enc.ids[:n], types))
    labels = loaded.expanded.labels
    out = []
    for i in range(n):
        if enc.special_tokens_mask[i]:
            continue
        best = int(probs[i].argmax())
        if labels[best] in ignore_labels:
            continue
        start, end = enc.offsets[i]
        out.append({"entity": labels[best], "score": float(probs[i, best]), "index": i,
                    "word": enc.tokens[i], "start": int(start), "end": int(end)})
    return out
