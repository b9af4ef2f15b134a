"""``iron-spec embed``: the embeddings of texts under an encoder spec, or their cosine matrix.

Each text runs as one call of the compiled encoder (its own rows, nothing shared between
texts), pooled and normalized as the spec's ``pooling`` says (``library.embedding``).

Not for: generation (``run``), checking against goldens (``check``).
"""

from __future__ import annotations

import sys
from typing import List, Optional

import numpy as np
import typer

from iron_spec.runtime.checkpoint import CheckpointError
from iron_spec.runtime.tokenizer import utf8_text

from iron_spec.spec.config import ALLOW_UNREAD, ALLOW_UNREAD_HELP
from iron_spec.spec.errors import FlagError, SpecError
from iron_spec.spec.loader import load_spec
from iron_spec.library.api import load

from .command import (CHECKPOINT_HELP, CHECKPOINT_METAVAR, SPEC_HELP, log_to_stderr, pick_spec,
                      refuse, stages)


def _utf8(texts: list[str]) -> None:
    """Raises ValueError naming the first text that is not UTF-8 text (the tokenizers library
    would raise a bare TypeError)."""
    for i, text in enumerate(texts, 1):
        utf8_text(text, f"text {i}")


def cosine(embeddings: np.ndarray) -> np.ndarray:
    """The cosine similarity of every pair of rows, ``(n, n)`` float64."""
    e = np.asarray(embeddings, np.float64)
    u = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-300)
    return u @ u.T


def _texts(given: Optional[List[str]]) -> list[str]:
    """The texts: ``--text``'s, else (or with ``--text -``, as ``run --prompt -``) stdin's
    lines, one text a line; blank lines are skipped, and how many said on stderr.

    Raises:
        FlagError: a ``--text`` that is empty or white space only (as ``run --prompt ''``),
            ``--text -`` beside other texts, no ``--text`` and stdin is a terminal (nothing
            piped), or no text at all.
    """
    if given and "-" in given:
        if len(given) > 1:
            raise FlagError("--text - reads the texts from stdin, one a line; give it alone, "
                            "not beside other --text")
    elif given:
        for i, text in enumerate(given, 1):
            if not text.strip():
                raise FlagError(f"--text {text!r} (text {i}) is empty"
                                + (" but for white space" if text else "") + "; give some text")
        return list(given)
    elif sys.stdin is None or sys.stdin.isatty():
        raise FlagError("give the texts with --text TEXT (repeat it for several), or one a "
                        "line on stdin")
    raw = getattr(sys.stdin, "buffer", None)
    data = raw.read().decode("utf-8", "surrogateescape") if raw is not None else sys.stdin.read()
    lines = data.splitlines()
    texts = [line for line in lines if line.strip()]
    if not texts:
        raise FlagError("stdin holds no text; give the texts with --text TEXT, or one a line "
                        "on stdin")
    if len(texts) < len(lines):
        blank = len(lines) - len(texts)
        typer.echo(f"[{blank} blank line{'s' * (blank != 1)} on stdin skipped: {len(texts)} "
                   f"text{'s' * (len(texts) != 1)}]", err=True)
    return texts


#: The texts of ``embed``, ``fill-mask`` and ``classify``: an option, never positional (SPEC
#: is their one argument), so no text is taken for a spec.
TEXT = typer.Option(None, "--text", "-t", metavar="TEXT",
                    help="a text; repeat it for several; - reads them from stdin, one a line (the default)")


def command(
    spec: Optional[str] = typer.Argument(None, metavar="[SPEC]", help=SPEC_HELP),
    checkpoint: Optional[str] = typer.Option(None, metavar=CHECKPOINT_METAVAR, help=CHECKPOINT_HELP),
    text: Optional[List[str]] = TEXT,
    similarity: bool = typer.Option(False, "--similarity",
                                    help="print the cosine matrix of the texts' embeddings"),
    max_tokens: Optional[int] = typer.Option(None, min=2, help="ids a text keeps, the rest truncated; "
                                             "at least 2, the [CLS] and [SEP] a text is put "
                                             "between (default: the spec's, capped by "
                                             "sentence-transformers' max_seq_length)"),
    decimals: int = typer.Option(4, min=0, max=12, help="decimals printed"),
    lang: Optional[int] = typer.Option(None, min=0, metavar="ID",
                                       help="the texts' language id, for a model with language "
                                            "embeddings (config.json's lang2id; default: the "
                                            "spec's, lang_id)"),
    allow_unread_config: bool = typer.Option(False, ALLOW_UNREAD, help=ALLOW_UNREAD_HELP),
) -> None:
    """Embed texts with an encoder SPEC: one line per text, or with --similarity the cosine
    matrix (row i, column j: text i against text j)."""
    with log_to_stderr():
        _embed(spec, text, checkpoint, similarity, max_tokens, decimals, allow_unread_config,
               lang)


def _embed(spec, given, checkpoint, similarity, max_tokens, decimals, allow_unread_config,
           lang=None) -> None:
    try:
        if checkpoint is None:
            raise FlagError("give --checkpoint DIR (its tokenizer encodes the texts)")
        spec_path = pick_spec(spec, checkpoint, "--text")
        texts = _texts(given)
        _utf8(texts)  # before anything loads
        spec = load_spec(spec_path)
        if spec.get("model") != "encoder":
            raise ValueError(f"{spec_path} is model {spec.get('model')!r}: embed runs encoder "
                             "specs (model: encoder)")
        with stages() as shown:
            model = load(spec_path, checkpoint, max_tokens=max_tokens, progress=shown.reporter(),
                         allow_unread_config=allow_unread_config)
        loaded = model.loaded
        cap = loaded.model.config.max_tokens
        if max_tokens is not None and max_tokens > cap:
            held = "its position table's rows" if cap == loaded.model.config.positions else \
                "the spec's runtime/max_tokens"
            typer.echo(f"--max-tokens {max_tokens} is capped at {cap}, the most ids the model "
                       f"takes ({held})", err=True)
        e = model.embed(texts, lang=lang)
    except (SpecError, CheckpointError, FileNotFoundError, ValueError, OSError) as err:
        refuse(err)
    table = cosine(e) if similarity else e
    for row in table:
        sys.stdout.write(" ".join(f"{x:{decimals + 3}.{decimals}f}" for x in row) + "\n")
