"""``iron-spec check``: run every check on a spec and a checkpoint (or drawn weights), and
record goldens from transformers.

The reference for KL is the golden recorded for these exact inputs (config.json and
checkpoint tensors) where one exists, else the model's own float64 ``reference()``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Optional

import numpy as np
import typer

from runtime import checks
from runtime.golden import Golden, GoldenError

from .build import Loaded, load_model
from .config import ALLOW_UNREAD, ALLOW_UNREAD_HELP
from .errors import message
from .interpreter import DEFAULT_PREFILL_CHUNK

PROMPT_TEXT = Path(__file__).with_name("prompt.txt")
STEPS = 40


def golden_path(loaded: Loaded) -> Path:
    """Where a golden for ``loaded``'s inputs lives: ``tests/goldens/<spec>/<inputs>.npz``
    beside the spec's folder, named ``toy-seed<S>`` or after the checkpoint directory."""
    spec = Path(loaded.expanded.spec.file).resolve()
    name = loaded.expanded.spec.get("name")
    if loaded.random_weights is not None:
        inputs = f"{'toy' if loaded.directory is None else loaded.directory.name}-seed{loaded.random_weights}"
    else:
        inputs = loaded.directory.name
    return spec.parent.parent / "tests" / "goldens" / name / f"{inputs}.npz"


def check_prompt(loaded: Loaded, length: int | None = None) -> list[int]:
    """The prompt checks run from: ``prefill_chunk + 8`` tokens (more than one chunk), from
    the packaged text where there is a tokenizer, else drawn at seed 0."""
    n = length or loaded.lm.config.prefill_chunk + 8
    if loaded.tokenizer is None:
        return np.random.default_rng(0).integers(0, loaded.lm.config.vocab_size, n).tolist()
    text = PROMPT_TEXT.read_text()
    ids = loaded.tokenizer.encode(text)
    while len(ids) < n:
        text += "\n" + text
        ids = loaded.tokenizer.encode(text)
    return ids[:n]


def find_golden(loaded: Loaded, path: Path | None) -> tuple[Golden | None, str]:
    """The golden for these inputs and a note of what was found.

    A named ``path`` must be a golden of these inputs (GoldenError otherwise); else the
    spec's goldens folder is searched for one recorded from the same config and tensors,
    whatever the checkpoint directory is called.
    """
    fp = loaded.fingerprint()
    if path is not None:
        return Golden.read(path, fp), f"golden {path}"
    folder = golden_path(loaded).parent
    for candidate in sorted(folder.glob("*.npz")):
        try:
            return Golden.read(candidate, fp), f"golden {candidate}"
        except GoldenError:
            continue
    return None, f"no golden in {folder} for these inputs ({fp})"


def needed_length(prompt: int, steps: int, kl_steps: int | None = None) -> int:
    """The shortest max_seq_len the checks run in from a prompt of ``prompt`` tokens: the
    longest history one runs is the prompt and what is drawn after it, ``kl_steps``
    (default ``steps``) teacher-forced for KL, up to 32 greedy, 4 for determinism; the chat
    turn's fits in what the context leaves (at least a token of turn and one drawn)."""
    drawn = max(steps if kl_steps is None else kl_steps, min(steps, 32), 4)
    return prompt + drawn - 1


def require_length(L: int, prompt: int, steps: int, why: str, kl_steps: int | None = None
                   ) -> None:
    """Raises ValueError where a context of ``L`` is too short for the checks
    (``needed_length``), saying how long one must be and why."""
    needed = needed_length(prompt, steps, kl_steps)
    if L < needed:
        raise ValueError(f"check needs a --max-seq-len of at least {needed}, not {L}: it runs a "
                         f"prompt of {prompt} tokens ({why}) and up to {needed - prompt} more "
                         "tokens after it")


def run_checks(loaded: Loaded, golden: Golden | None, steps: int = STEPS) -> list[checks.Result]:
    """Every check of the validation issue, in order.

    Raises:
        ValueError: the model's max_seq_len is too short for them (``require_length``).
    """
    lm = loaded.lm
    bounds = dict(loaded.expanded.spec.get("validation", "kl", default={}) or {})
    bounds = bounds or {"mean": 1e-4, "p90": 2e-4, "max": 1e-3}
    prompt = [int(t) for t in golden.tokens[:golden.prompt_len]] if golden else check_prompt(loaded)
    C, L = lm.config.prefill_chunk, lm.config.max_seq_len
    if golden is not None:
        require_length(L, len(prompt), steps, "the golden's", golden.steps)
    else:
        require_length(L, len(prompt), steps, f"a prefill chunk of {C} and 8 more")
    other = check_prompt(loaded, len(prompt) + 7)[7:] if loaded.tokenizer is None else \
        check_prompt(loaded, 2 * len(prompt))[len(prompt):]
    # A turn of up to a chunk and 3 (past the next chunk boundary) in what the context leaves.
    turn = other[: min(C + 3, L - len(prompt) - 1)]
    return [
        checks.per_step(lm, prompt[: C + 4]),
        checks.greedy_match(lm, prompt, min(steps, 32)),
        checks.kl_against(lm, bounds, golden, prompt, steps),
        checks.determinism(lm, [prompt, other]),
        checks.chat_turn(lm, prompt, turn),
        checks.chunked_vs_decode(lm, prompt[: min(len(prompt), 2 * C + 3, 64)], bounds["max"]),
        checks.deep_decode(lm, prompt[:C], L - 2, bounds["max"]),
    ]


def command(
    spec: Path = typer.Argument(..., help="the spec YAML"),
    checkpoint: Optional[str] = typer.Option(None, help="checkpoint directory or hub id"),
    random_weights: Optional[int] = typer.Option(None, min=0, help="draw weights at this seed"),
    toy: bool = typer.Option(False, "--toy", help="the spec's tiny shape"),
    max_seq_len: Optional[int] = typer.Option(None, min=1, help="context length (default: the model's own, fitted; at most 4096 here)"),
    golden: Optional[Path] = typer.Option(None, help="the golden to judge by (default: tests/goldens/<spec>/<inputs>.npz)"),
    steps: int = typer.Option(STEPS, min=1, help="teacher-forced KL steps"),
    record_golden: bool = typer.Option(False, "--record-golden", help="record the golden from transformers first (needs the golden extra)"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object for machines"),
    decode_weights: str = typer.Option("float32", "--decode-weights", help="the decode step's projection weights: float32, or bfloat16 (half the bytes; only where every value holds exactly, as a bfloat16 checkpoint's)"),
    allow_unread_config: bool = typer.Option(False, ALLOW_UNREAD, help=ALLOW_UNREAD_HELP),
) -> None:
    """Check SPEC: per-step, compiled = reference, KL vs golden, determinism, chat turn,
    chunked = decode, deep decode. Exit status 1 if any fails."""
    from .cli import EXPECTED
    from .loader import load_spec
    try:
        parsed = load_spec(spec)
        if parsed.get("model") == "encoder":
            if decode_weights != "float32":
                raise ValueError(f"--decode-weights {decode_weights}: an encoder has no decode step")
            _check_encoder(spec, checkpoint, random_weights, toy, golden, as_json, record_golden,
                           allow_unread_config)
        if max_seq_len is not None:  # refused before the weights load
            C = (toy and parsed.get("toy", "prefill_chunk")) or \
                parsed.get("runtime", "prefill_chunk", default=DEFAULT_PREFILL_CHUNK)
            require_length(max_seq_len, C + 8, steps, f"a prefill chunk of {C} and 8 more")
        loaded = load_model(spec, checkpoint=checkpoint, random_weights=random_weights, toy=toy,
                            max_seq_len=max_seq_len or (None if toy else 4096),
                            decode_weights=decode_weights,
                            allow_unread_config=allow_unread_config)
        if record_golden:
            missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
            if missing:
                raise ValueError(f"--record-golden needs {' and '.join(missing)}, the golden "
                                 "extra: pip install -e '.[golden]'")
            from .golden_record import record
            path = golden or golden_path(loaded)
            record(loaded, check_prompt(loaded), steps).write(path)
            typer.echo(f"recorded {path}", err=True)
        found, note = find_golden(loaded, golden)
        results = run_checks(loaded, found, steps)
    except (*EXPECTED, GoldenError) as e:
        typer.echo(message(e), err=True)
        raise typer.Exit(2)
    _report(spec, note, results, as_json)


def _report(spec: Path, note: str, results: list[checks.Result], as_json: bool) -> None:
    """Print ``results`` and exit: 0 all passed, 1 any failed."""
    failed = [r for r in results if not r.passed]
    if as_json:
        typer.echo(json.dumps({"spec": str(spec), "reference": note, "passed": not failed,
                               "checks": [{"name": r.name, "passed": r.passed, "figure": r.figure,
                                           "numbers": r.numbers, "seconds": round(r.seconds, 3)}
                                          for r in results]}, indent=2, default=float))
    else:
        typer.echo(f"{spec}: reference: {note}")
        for r in results:
            typer.echo(f"  {'PASS' if r.passed else 'FAIL'}  {r.name:<32} {r.figure}  "
                       f"({r.seconds:.1f} s)")
        typer.echo(f"{len(results) - len(failed)}/{len(results)} checks passed")
    raise typer.Exit(1 if failed else 0)


ENCODER_ATOL = 1e-5  # float32 against transformers' float32: a few ulps of order-one values


def _check_encoder(spec: Path, checkpoint, random_weights, toy, golden: Path | None,
                   as_json: bool, record_golden: bool = False,
                   allow_unread_config: bool = False) -> None:
    """``check`` for an encoder spec: its last hidden states and its pooled embeddings
    against transformers' (each within ``ENCODER_ATOL``, max absolute error) where a golden
    exists for these inputs, else only against itself. ``record_golden`` records one first
    through transformers' own ``AutoModel`` (``golden_record.record_encoder``)."""
    from runtime.encoder_golden import EncoderGolden, find_encoder_golden
    from .encoder import load_encoder
    loaded = load_encoder(spec, checkpoint=checkpoint, random_weights=random_weights, toy=toy,
                          allow_unread_config=allow_unread_config)
    model, fp = loaded.model, loaded.fingerprint()
    if record_golden:
        missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
        if missing:
            raise ValueError(f"--record-golden needs {' and '.join(missing)}, the golden "
                             "extra: pip install -e '.[golden]'")
        from .golden_record import record_encoder
        path = golden or golden_path(loaded)
        try:
            recorded = record_encoder(loaded)
        except Exception as e:  # whatever transformers raises on a config or weights it refuses
            said = " ".join(str(e).split()) or "(no message)"
            source = (loaded.directory / "config.json" if loaded.directory is not None else
                      f"{loaded.expanded.spec.file} toy.config")
            raise ValueError(f"--record-golden: transformers refuses {source}: "
                             f"{type(e).__name__}: {said}") from None
        recorded.write(path)
        typer.echo(f"recorded {path}", err=True)
    folder = golden_path(loaded).parent
    if golden is not None:
        found, where = EncoderGolden.read(golden, fp), golden
    else:
        found, where = find_encoder_golden(folder, fp)
    note = f"golden {where}" if found else f"no golden in {folder} for these inputs ({fp})"
    pooling = model.config.pooling
    if found is not None and found.pooling == "mean":
        # bert's older goldens hold transformers' mean pooling, unnormalized: judged so.
        pooling = dataclasses.replace(pooling, kind="mean", normalize=False)
    if found is not None:
        probes, wants = found.probes, found.pooled
    else:
        rng = np.random.default_rng(0)
        probes, wants = [(rng.integers(0, model.config.vocab_size, n), None) for n in (5, 17)], None
    version = model.version(pooling)
    results = checks.embedding_checks(version, probes, wants, ENCODER_ATOL,
                                      model.version(pooling, check=True))
    if found is not None and found.hidden is not None:
        states = model.version(dataclasses.replace(pooling, kind="none", normalize=False))
        results.insert(-1, checks.hidden_states_against(states, probes, found.hidden,
                                                        ENCODER_ATOL))
    _report(spec, note, results, as_json)
