"""The ``iron-spec`` command line (typer): run a spec, lint specs, print the schema."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Optional

import jinja2
import numpy as np
import typer

from iron_spec.operators import Sampler
from iron_spec.runtime.checkpoint import CheckpointError
from iron_spec.runtime.files import read_object
from iron_spec.runtime.values import generation_config
from iron_spec.runtime.session import Session
from iron_spec.runtime.tokenizer import TextStream, utf8_text

from .build import Loaded
from .command import HELP_OPTIONS, Command, Group, load_compiled, number, refuse, stages, version
from .config import ALLOW_UNREAD, ALLOW_UNREAD_HELP
from .errors import FlagError, SpecError, message
from .schema import SCHEMA_PATH

app = typer.Typer(cls=Group, add_completion=False, no_args_is_help=True,
                  rich_markup_mode="rich", context_settings={"help_option_names": HELP_OPTIONS},
                  help="Declarative YAML specs for language models: lint, show, check, run, "
                       "embed and bench them.")
log = logging.getLogger("iron_spec")
DEFAULT_TOKENS = 64
EXPECTED = (SpecError, CheckpointError, FileNotFoundError, ValueError, IndexError,
            jinja2.TemplateError)


@app.callback()
def _app(show_version: bool = typer.Option(False, "--version", is_eager=True, callback=version,
                                           help="print the version and exit")) -> None:
    pass


class _Stderr(logging.Handler):
    """Log lines to whatever ``sys.stderr`` is when they are emitted, so a progress display
    that redirects it prints them above itself instead of through its bar."""

    def emit(self, record: logging.LogRecord) -> None:
        print(self.format(record), file=sys.stderr)


def _log_to_stderr() -> None:
    if not any(isinstance(h, _Stderr) for h in log.handlers):
        log.addHandler(_Stderr())
        log.setLevel(logging.INFO)


def _fail(e: Exception) -> None:
    refuse(e)  # a SpecError says FILE:LINE:COL: error: itself; a FlagError exits 2


DECODE_WEIGHTS_OPTION = typer.Option("float32", "--decode-weights", help="the decode step's projection weights: float32, or bfloat16 (half the bytes; only where every value holds exactly, as a bfloat16 checkpoint's)")


def _load(spec: Path, checkpoint, random_weights, toy, max_seq_len, prefill_chunk,
          decode_weights: str = "float32", allow_unread_config: bool = False) -> Loaded:
    with stages() as s:
        return load_compiled(s, spec, checkpoint=checkpoint, random_weights=random_weights,
                             toy=toy, max_seq_len=max_seq_len, prefill_chunk=prefill_chunk,
                             decode_weights=decode_weights,
                             allow_unread_config=allow_unread_config)


def _sampling(loaded: Loaded, temperature, top_k, top_p, seed) -> Sampler:
    """Flags given, else the checkpoint's generation_config.json, as transformers' generate:
    greedy unless it says do_sample. A null value is unset, as transformers reads it: that
    warper is left off (temperature 1, every token, top_p 1).

    Raises:
        ValueError: generation_config.json is not valid JSON, or holds a value that is not a
            number or that the sampler refuses (the file named).
    """
    path = None if loaded.directory is None else loaded.directory / "generation_config.json"
    gen = {}
    if path is not None and (path.exists() or path.is_symlink()):
        gen = read_object(path, what="generation_config.json")
        model = getattr(loaded, "model", None)
        generation_config(gen, str(path), None if model is None else model.config.vocab_size)

    def setting(key: str, kind, absent, null):
        """The file's ``key`` as ``kind``; ``absent`` where it has none, ``null`` where null."""
        if gen.get(key) is None:
            return null if key in gen else absent
        try:
            return kind(gen[key])
        except (TypeError, ValueError):
            raise ValueError(f"{path}: {key} is {gen[key]!r}, not a number") from None

    sample = bool(gen.get("do_sample"))
    if temperature is None:
        temperature = setting("temperature", float, 1.0, 1.0) if sample else 0.0
    if top_k is None:
        top_k = setting("top_k", int, 50, None) if sample else None
    if top_p is None:
        top_p = setting("top_p", float, 1.0, 1.0) if sample else 1.0
    try:
        return Sampler(temperature, top_k, top_p, seed)
    except ValueError as e:
        if not gen:
            raise
        # The flags were checked before loading: the value the sampler refuses is the file's.
        raise ValueError(f"{path}: {e}") from None


@app.command(cls=Command)
def run(
    spec: Optional[Path] = typer.Argument(None, help="the spec YAML, one of specs/ (iron-spec list) or your own (default: the spec serving --checkpoint's config.json architectures)"),
    checkpoint: Optional[str] = typer.Option(None, metavar="DIR|ID", help="checkpoint directory or hub id"),
    prompt: Optional[str] = typer.Option(None, help="the text to continue (or, with --chat, the first message)"),
    chat: bool = typer.Option(False, "--chat", help="render messages with the checkpoint's chat template; without --prompt, read turns from stdin"),
    num_tokens: Optional[int] = typer.Option(None, min=1, help="most tokens to draw per turn (default: 64, or as many as the context leaves room for; in a chat, up to the end of the turn)"),
    temperature: Optional[float] = typer.Option(None, callback=number(0), help="0 is greedy (default: generation_config.json's, else greedy)"),
    top_k: Optional[int] = typer.Option(None, min=0, help="keep the K most likely tokens"),
    top_p: Optional[float] = typer.Option(None, callback=number(0, 1, low_open=True), help="keep the most likely tokens up to probability P"),
    seed: int = typer.Option(0, min=0, help="the sampler's seed"),
    max_seq_len: Optional[int] = typer.Option(None, min=1, help="context length (default: the checkpoint's own, fitted to this host's memory)"),
    prefill_chunk: Optional[int] = typer.Option(None, min=1, help="ids a prompt call holds (default: the spec's)"),
    random_weights: Optional[int] = typer.Option(None, min=0, help="draw weights at this seed instead of reading them"),
    toy: bool = typer.Option(False, "--toy", help="the spec's tiny shape (with --random-weights: no files at all)"),
    prompt_len: int = typer.Option(24, min=1, help="with no tokenizer (--toy), this many random prompt ids"),
    decode_weights: str = DECODE_WEIGHTS_OPTION,
    allow_unread_config: bool = typer.Option(False, ALLOW_UNREAD, help=ALLOW_UNREAD_HELP),
) -> None:
    """Generate from SPEC: stream the text as drawn, then time to first token and tokens/s."""
    _log_to_stderr()
    try:
        if spec is None:
            if checkpoint is None:
                raise FlagError("name a SPEC, or give --checkpoint DIR to pick one from its "
                                 "config.json architectures")
            from .registry import for_checkpoint
            spec = for_checkpoint(checkpoint)
            log.info("spec %s, serving the checkpoint's architectures", spec)
        # The flags are checked before anything loads (a refusal in a second, not a minute).
        Sampler(temperature or 0.0, top_k, 1.0 if top_p is None else top_p, seed)
        if prompt is not None:
            utf8_text(prompt, "--prompt")
        if not chat and prompt is None and checkpoint is not None and random_weights is None:
            raise FlagError("give --prompt TEXT, or --chat")
        loaded = _load(spec, checkpoint, random_weights, toy, max_seq_len, prefill_chunk,
                       decode_weights, allow_unread_config)
        sampler = _sampling(loaded, temperature, top_k, top_p, seed)
        session, tok = Session(loaded.lm), loaded.tokenizer
        eos = tok.eos_ids if tok is not None else frozenset()
        if tok is None:
            if (prompt is not None or chat) and loaded.directory is not None:
                raise ValueError(f"--prompt and --chat need the checkpoint's tokenizer, and "
                                 f"{loaded.directory / 'tokenizer.json'} is missing")
            if prompt is not None or chat:
                raise ValueError("--prompt and --chat need a checkpoint's tokenizer.json; "
                                 "a --toy run prompts with random ids")
            rng = np.random.default_rng(random_weights)
            ids = rng.integers(0, loaded.lm.config.vocab_size, prompt_len).tolist()
            drawn = _generate(session, ids, _to_draw(num_tokens, ids, session), sampler, eos,
                              None, shown=f"prompt ids: {' '.join(map(str, ids))}")
        elif not chat:
            if prompt is None:
                raise FlagError("give --prompt TEXT, or --chat")
            ids = tok.encode(prompt)
            if not ids:
                raise ValueError("--prompt encodes to no tokens; give some text")
            drawn = _generate(session, ids, _to_draw(num_tokens, ids, session), sampler, eos,
                              tok)
        else:
            _chat(session, tok, prompt, num_tokens, sampler)
            return
        L = loaded.lm.config.max_seq_len
        if num_tokens is None and len(drawn) == L - len(ids) + 1 and drawn[-1] not in eos:
            typer.echo(f"[the text stopped where the context (max_seq_len {L}) is full]",
                       err=True)
    except EXPECTED as e:
        _fail(e)


def _to_draw(asked: Optional[int], ids: list[int], session: Session) -> int:
    """``--num-tokens`` as asked (the session refuses what does not fit), else the default
    cut to the room the context leaves after ``ids``, as a chat's reply is; at least 1, so a
    prompt that alone fills the context is refused by the session, naming the sizes."""
    if asked is not None:
        return asked
    return max(1, min(DEFAULT_TOKENS, session.lm.config.max_seq_len - len(ids) + 1))


def _generate(session: Session, ids: list[int], n: int, sampler, eos, tok,
              shown: Optional[str] = None) -> list[int]:
    """Draw and stream up to ``n`` tokens after ``ids``; ``shown`` goes to stderr once the
    session has taken the prompt (a prompt it refuses prints nothing, however long)."""
    stream = TextStream(tok) if tok is not None else None
    drawn = []
    for token in session.generate(ids, n, sampler, eos):
        if shown is not None:
            typer.echo(shown, err=True)
            shown = None
        drawn.append(token)
        if token in eos:
            continue  # the end of the turn: drawn, not shown
        piece = stream.push(token) if stream is not None else f" {token}"
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    s = session.stats
    typer.echo(f"\n[prefill] {s.prompt_tokens} token{'s' * (s.prompt_tokens != 1)}, time to "
               f"first token {s.ttft:.3f} s", err=True)
    if s.tokens > 1:
        typer.echo(f"[decode]  {s.tokens - 1} token{'s' * (s.tokens != 2)}, "
                   f"{s.decode_tokens_per_s:.1f} tokens/s", err=True)
    return drawn


def _chat(session: Session, tok, first: Optional[str], n: Optional[int], sampler) -> None:
    """Turns from ``first`` or stdin; each reply ends at the end of the assistant's turn, at
    ``n`` tokens, or where the context is full, whichever comes first."""
    messages: list[dict] = []
    interactive = first is None
    L = session.lm.config.max_seq_len
    lines = 0
    while True:
        if first is not None:
            text, first = first, None
        elif interactive:
            typer.echo("> ", nl=False, err=True)
            line = _read_line()
            if not line:  # end of input ends the chat; an empty line is no turn
                return
            lines += 1
            text = line.rstrip("\r\n")
            if not text.strip():
                continue
            try:
                utf8_text(text, f"line {lines}")
            except ValueError as e:  # that turn is refused, not the chat
                typer.echo(f"{message(e)}; skipped", err=True)
                continue
        else:
            return
        messages.append({"role": "user", "content": text})
        ids = tok.chat(messages)
        room = L - len(ids) + 1
        if room < 1:
            raise ValueError(f"the conversation ({len(ids)} tokens) fills max_seq_len {L}; "
                             "start a new one, or raise --max-seq-len")
        want = n if n is not None else min(512, room)
        drawn = _generate(session, ids, min(want, room), sampler, tok.eos_ids, tok)
        if len(drawn) == room and drawn[-1] not in tok.eos_ids:
            typer.echo(f"[the reply stopped where the context (max_seq_len {L}) is full]", err=True)
        messages.append({"role": "assistant", "content": tok.decode(drawn)})
        if not interactive:
            return


def _read_line() -> str:
    """A line of stdin ("" at its end), its bytes decoded as Python decodes a command line
    (surrogateescape), so bytes that are not text reach the UTF-8 check: a stdin decoding
    strictly (a UTF-8 locale's) would raise in the middle of the chat."""
    raw = getattr(sys.stdin, "buffer", None)
    if raw is None:
        return sys.stdin.readline()
    return raw.readline().decode(sys.stdin.encoding or "utf-8", "surrogateescape")


@app.command(cls=Command)
def schema() -> None:
    """Print the spec JSON Schema."""
    typer.echo(SCHEMA_PATH.read_text())


# Commands that live in their own modules, registered here (one line each).
from . import lint as _lint  # noqa: E402  (after app: the modules import nothing from here)

app.command("lint", cls=Command)(_lint.command)
from . import show as _show  # noqa: E402
app.command("show", cls=Command)(_show.command)
from . import check as _check  # noqa: E402

app.command("check", cls=Command, epilog=_check.EXIT_STATUS)(_check.command)
from . import bench as _bench  # noqa: E402

app.command("bench", cls=Command)(_bench.command)
from . import embed as _embed  # noqa: E402

app.command("embed", cls=Command)(_embed.command)
from . import registry as _registry  # noqa: E402

app.command("list", cls=Command)(_registry.command)
