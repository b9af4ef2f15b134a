"""``iron-spec fill-mask`` and ``iron-spec classify``: an encoder checkpoint's task head on
texts, as transformers' pipelines of those names give their results (``tasks``).

Arguments as ``embed``'s: ``[SPEC]`` (optional: the checkpoint's config.json architectures
pick it, a part's among them, said on stderr), ``--text`` (repeatable; else stdin, one text
a line), ``--checkpoint``, ``--max-tokens``, ``--decimals``, ``--allow-unread-config``;
``--json`` prints the pipeline's result as JSON.

Not for: embeddings (``embed``), checking a head against transformers (``check``).
"""

from __future__ import annotations

import json
import sys
from typing import List, Optional

import typer

from iron_spec.library import tasks
from iron_spec.library.api import load
from iron_spec.runtime.checkpoint import CheckpointError
from iron_spec.spec.config import ALLOW_UNREAD, ALLOW_UNREAD_HELP
from iron_spec.spec.errors import FlagError, SpecError
from iron_spec.spec.loader import load_spec

from .command import (CHECKPOINT_HELP, CHECKPOINT_METAVAR, SPEC_HELP, log_to_stderr, pick_spec,
                      refuse, stages)
from .embed import TEXT, _texts, _utf8

SPEC = typer.Argument(None, metavar="[SPEC]", help=SPEC_HELP)
CHECKPOINT = typer.Option(None, metavar=CHECKPOINT_METAVAR, help=CHECKPOINT_HELP)
MAX_TOKENS = typer.Option(None, min=2, help="ids a text keeps, the rest truncated (default: "
                                            "the spec's)")
DECIMALS = typer.Option(4, min=0, max=12, help="decimals printed")
AS_JSON = typer.Option(False, "--json", help="print transformers' pipeline result as JSON")


def _loaded(spec, given, checkpoint, max_tokens, allow_unread_config, task: str):
    """The model of SPEC on ``checkpoint`` holding a ``task`` head, and the texts
    (``given``, else stdin's lines); refused (before anything loads where it can be) as
    ``embed`` refuses."""
    if checkpoint is None:
        raise FlagError("give --checkpoint DIR (its head scores the texts, its tokenizer "
                        "encodes them)")
    spec_path = pick_spec(spec, checkpoint, "--text")
    texts = _texts(given)
    _utf8(texts)
    spec = load_spec(spec_path)
    if spec.get("model") != "encoder":
        raise ValueError(f"{spec_path} is model {spec.get('model')!r}: a task head is an "
                         "encoder's (model: encoder)")
    with stages() as shown:
        model = load(spec_path, checkpoint, max_tokens=max_tokens, progress=shown.reporter(),
                     allow_unread_config=allow_unread_config)
    wanted = ("fill-mask",) if task == "fill-mask" else \
        ("text-classification", "token-classification")
    if model.task not in wanted:
        tasks.require(model.loaded, wanted[0], f"iron-spec {task}")
    return model, texts


def fill_mask_command(
    spec: Optional[str] = SPEC,
    checkpoint: Optional[str] = CHECKPOINT,
    text: Optional[List[str]] = TEXT,
    top_k: int = typer.Option(5, min=1, help="tokens given per mask, likeliest first"),
    max_tokens: Optional[int] = MAX_TOKENS,
    decimals: int = DECIMALS,
    as_json: bool = AS_JSON,
    allow_unread_config: bool = typer.Option(False, ALLOW_UNREAD, help=ALLOW_UNREAD_HELP),
) -> None:
    """Fill each text's mask token ([MASK], <mask>: the tokenizer's) with a *ForMaskedLM
    checkpoint's likeliest tokens: one line per token, score (the softmax over the
    vocabulary), token and the text filled in, as pipeline("fill-mask")."""
    with log_to_stderr():
        try:
            model, texts = _loaded(spec, text, checkpoint, max_tokens, allow_unread_config,
                                   "fill-mask")
            results = [model.fill_mask(t, top_k) for t in texts]
        except (SpecError, CheckpointError, FileNotFoundError, ValueError) as err:
            refuse(err)
    if as_json:
        sys.stdout.write(json.dumps(results if len(results) > 1 else results[0]) + "\n")
        return
    for text, result in zip(texts, results):
        masks = result if result and isinstance(result[0], list) else [result]
        for m, found in enumerate(masks):
            if len(texts) > 1 or len(masks) > 1:
                sys.stdout.write(f"# {text}" + (f" (mask {m + 1})" if len(masks) > 1 else "")
                                 + "\n")
            for r in found:
                sys.stdout.write(f"{r['score']:.{decimals}f}\t{r['token_str']}\t"
                                 f"{r['sequence']}\n")


def classify_command(
    spec: Optional[str] = SPEC,
    checkpoint: Optional[str] = CHECKPOINT,
    text: Optional[List[str]] = TEXT,
    top_k: Optional[int] = typer.Option(1, min=1, help="a text's classes given, likeliest "
                                        "first (text classification)"),
    all_labels: bool = typer.Option(False, "--all", help="every class of a text, likeliest "
                                    "first (top_k None)"),
    function: Optional[str] = typer.Option(None, "--function", metavar="|".join(tasks.FUNCTIONS),
                                           help="what turns the logits into scores (default: "
                                                "the pipeline's, by problem_type and the "
                                                "number of labels)"),
    max_tokens: Optional[int] = MAX_TOKENS,
    decimals: int = DECIMALS,
    as_json: bool = AS_JSON,
    allow_unread_config: bool = typer.Option(False, ALLOW_UNREAD, help=ALLOW_UNREAD_HELP),
) -> None:
    """Classify texts with a *ForSequenceClassification checkpoint (a text's classes: label
    and score per line, as pipeline("text-classification")) or a *ForTokenClassification
    one (each token's label but O: word, label, score and its characters in the text, as
    pipeline("token-classification"))."""
    with log_to_stderr():
        try:
            if function is not None and function not in tasks.FUNCTIONS:
                raise FlagError(f"--function {function} is not one of "
                                f"{', '.join(tasks.FUNCTIONS)}")
            model, texts = _loaded(spec, text, checkpoint, max_tokens, allow_unread_config,
                                   "classify")
            if model.task == "token-classification":
                if function is not None or all_labels or top_k != 1:
                    raise FlagError("--function, --top-k and --all are a text's classes': "
                                    "this checkpoint labels each token")
                results = [model.classify_tokens(t) for t in texts]
            else:
                results = model.classify(texts, None if all_labels else top_k, function)
        except (SpecError, CheckpointError, FileNotFoundError, ValueError) as err:
            refuse(err)
    if as_json:
        sys.stdout.write(json.dumps(results if len(results) > 1 else results[0]) + "\n")
        return
    for text, result in zip(texts, results):
        if len(texts) > 1:
            sys.stdout.write(f"# {text}\n")
        if model.task == "token-classification":
            for r in result:
                sys.stdout.write(f"{r['word']}\t{r['entity']}\t{r['score']:.{decimals}f}\t"
                                 f"{r['start']}-{r['end']}\n")
            continue
        for r in result if isinstance(result, list) else [result]:
            sys.stdout.write(f"{r['label']}\t{r['score']:.{decimals}f}\n")
