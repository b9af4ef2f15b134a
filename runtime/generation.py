"""Generation as a user of transformers expects it: settings from generation_config.json
where the caller gives none, the draw loop over a session, text pieces as drawn with stop
strings held back, and what a generation returns.

Not for: the sampling rules themselves (``operators.sampling``), the cache (``session``), the
library's calls that drive it (``iron_spec.library.api``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from iron_spec.operators.sampling import Sampler, log_softmax
from iron_spec.runtime.files import FileError, read_object
from iron_spec.runtime.session import Busy, Session
from iron_spec.runtime.values import CHECKS, GENERATION, TOKEN_KEYS, token_ids
from iron_spec.runtime.tokenizer import TextStream

#: The sampling settings a caller may give; None leaves each to generation_config.json.
SETTINGS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
            "frequency_penalty")
FINISH_REASONS = ("eos", "stop", "length", "context", "interrupted")
log = logging.getLogger("iron_spec")


def read_generation_config(directory: Path | None, vocab: int | None = None, *,
                           warn: bool = False) -> tuple[dict, Path | None]:
    """``directory``'s generation_config.json as a dict ({} where there is none) and its path,
    its token ids checked (``runtime.values.token_ids``; below ``vocab`` where given). Its
    sampling settings are checked where they are read (``sampler_for``, ``setting``): a
    broken ``top_p`` refuses a sampled run, not a greedy one.

    A file that cannot be read (not a regular file, not UTF-8 JSON, not an object) is {}:
    as transformers, whose ``from_pretrained`` logs a GenerationConfig it cannot load and
    goes on with the model config's; with ``warn``, a warning on the ``iron_spec`` logger
    names the file, what is wrong and what goes unused.

    Raises:
        ValueError: an id that is no token (file and key named).
    """
    path = None if directory is None else Path(directory) / "generation_config.json"
    if path is None or not (path.exists() or path.is_symlink()):
        return {}, path
    try:
        gen = read_object(path, what="generation_config.json")
    except FileError as e:
        if warn:
            log.warning("%s; it is not used: no sampling defaults or end-of-text ids come "
                        "from it (config.json's and the tokenizer's end generation)", e)
        return {}, path
    for key in TOKEN_KEYS:
        token_ids(gen.get(key), f"{path}: {key}", vocab)
    return gen, path


def setting(gen: dict, path: Path | None, key: str, absent: Any = None, null: Any = None):
    """generation_config.json's ``key`` (``gen``, read from ``path``), checked as
    ``runtime.values.GENERATION`` says: ``absent`` where the file has no such key, ``null``
    where it is null.

    Raises:
        ValueError: a value of the wrong type or out of range, naming the file and the key.
    """
    if gen.get(key) is None:
        return null if key in gen else absent
    return CHECKS[GENERATION.get(key, "whole")](gen[key], f"{path}: {key}")


def sampler_for(gen: dict, path: Path | None, *, seed: int | None = None,
                **given: Any) -> Sampler:
    """The sampler of the settings ``given`` (``SETTINGS``; None: unset), the rest from
    generation_config.json's ``gen``, as transformers' ``generate`` merges them: greedy
    unless it says ``do_sample`` (a temperature given > 0 samples); sampling, an absent
    ``top_k`` is GenerationConfig's default 50 and a null one is off, as is a null
    temperature (1) or top_p (1); ``repetition_penalty`` applies greedy or not.

    Raises:
        ValueError: a file value that is not a number, or a value the sampler refuses (a
            file's named with its path).
    """
    unknown = set(given) - set(SETTINGS)
    if unknown:
        raise TypeError(f"unknown sampling settings {', '.join(sorted(unknown))}; "
                        f"the settings: {', '.join(SETTINGS)}")

    t = given.get("temperature")
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float, np.integer, np.floating))):
        raise TypeError(f"temperature {t!r} is not a number")
    # Only what this run reads is checked: a greedy run reads no temperature, top_k, top_p
    # or min_p from the file (a broken one refuses sampling only).
    sample = bool(setting(gen, path, "do_sample", False, False)) if t is None else t > 0
    from_file = {}
    if t is None:
        from_file["temperature"] = setting(gen, path, "temperature", 1.0, 1.0) if sample else 0.0
    if given.get("top_k") is None:
        from_file["top_k"] = setting(gen, path, "top_k", 50, None) if sample else None
    if given.get("top_p") is None:
        from_file["top_p"] = setting(gen, path, "top_p", 1.0, 1.0) if sample else 1.0
    if given.get("min_p") is None:
        from_file["min_p"] = setting(gen, path, "min_p", None, None) if sample else None
    if given.get("repetition_penalty") is None:
        from_file["repetition_penalty"] = setting(gen, path, "repetition_penalty", 1.0, 1.0)
    settings = {**from_file, **{k: v for k, v in given.items() if v is not None}}
    settings.setdefault("presence_penalty", 0.0)
    settings.setdefault("frequency_penalty", 0.0)
    # The caller's own values first, refused as they are; what fails after is the file's.
    Sampler(**{k: v for k, v in settings.items() if k not in from_file},
            seed=0 if seed is None else seed)
    try:
        return Sampler(**settings, seed=seed)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


@dataclass
class Completion:
    """What one generation gave.

    ``text``: the text drawn, up to the end-of-text token, a stop string (left out) or the
    last token. ``token_ids``: the ids drawn, the end-of-text token included where drawn.
    ``finish_reason``: ``eos`` (an end-of-text token), ``stop`` (the stop string ``stop``),
    ``length`` (``max_new_tokens`` drawn), ``context`` (the context is full) or
    ``interrupted`` (the stream was closed, or an exception such as an interrupt's
    KeyboardInterrupt ended it, before it ended by itself: the text so far).
    ``logprobs``: each drawn token's natural log-probability under the model's distribution
    (the softmax of the raw logits, before any penalty or warper, as vLLM's default
    ``raw_logprobs``); empty unless asked for. ``seed``: the sampler's (None when greedy).
    ``prompt_tokens``: ids the prompt held; ``cached_tokens``: how many of them the KV cache
    already held, not run again (a chat's turns before; the OpenAI API's
    ``prompt_tokens_details.cached_tokens``); ``ttft`` seconds to the first token;
    ``decode_tokens_per_s`` over the tokens after it (NaN with fewer than two).
    """

    text: str
    token_ids: list[int]
    finish_reason: str
    logprobs: list[float] = field(default_factory=list)
    seed: int | None = None
    stop: str | None = None
    prompt_tokens: int = 0
    ttft: float = float("nan")
    decode_tokens_per_s: float = float("nan")
    cached_tokens: int = 0


class StopText:
    """Text pieces with stop strings cut out: ``push(piece)`` returns what may be shown now,
    holding back an end that could begin a stop string until the next piece decides it;
    ``stopped`` names the stop string once one appears (the text ends before it, as
    vLLM's and the OpenAI API's ``stop``); ``flush()`` gives back what is held at the end."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(stops)
        self.held = ""
        self.stopped: str | None = None

    def push(self, piece: str) -> str:
        if self.stopped is not None:
            return ""
        text = self.held + piece
        found = [(text.find(s), -len(s), s) for s in self.stops if s in text]
        if found:
            at, _, self.stopped = min(found)
            self.held = ""
            return text[:at]
        keep = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), keep, -1):
                if text.endswith(s[:n]):
                    keep = n
                    break
        self.held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


#: What a stream does where its session is claimed by another generation when it starts
#: (``Session.claim``): run on it all the same (a caller's own session: every call takes
#: the whole history, so it stays right), run on a session of its own (the model's shared
#: one), or refuse (a chat's: its turns come one at a time).
BUSY = ("share", "own", "refuse")


class Stream:
    """A generation run lazily: iterate it for the text pieces as they are drawn; once it is
    exhausted (or closed, or interrupted: ``finish_reason`` ``interrupted``), ``result`` is the
    ``Completion``. ``on_finish(result)`` is called then, once.

    From its first piece to its end a stream claims its session (``Session.claim``);
    ``busy`` (``BUSY``) says what it does where another generation has it then: ``refuse``
    raises ``runtime.session.Busy`` at the first piece, nothing run or changed. ``ready``,
    where given, is called once the session is claimed, before anything runs: it may refuse
    (raise) too (a chat's turn made before another turn of that chat ended)."""

    def __init__(self, session: Session, ids: list[int], max_new_tokens: int, sampler: Sampler,
                 eos: frozenset[int], tokenizer, stop: Sequence[str], logprobs: bool,
                 context_bound: bool, on_finish: Callable[[Completion], None] | None = None,
                 busy: str = "share", what: str = "the session"):
        if busy not in BUSY:
            raise ValueError(f"busy={busy!r} is not one of {', '.join(BUSY)}")
        self.session, self.ids, self.n = session, list(ids), max_new_tokens
        self.sampler, self.eos, self.tokenizer = sampler, eos, tokenizer
        self.stop, self.want_logprobs = tuple(stop), logprobs
        self.context_bound, self.on_finish = context_bound, on_finish
        self.busy, self.what = busy, what
        self.ready: Callable[[], None] | None = None
        # What readies the session the stream runs on, once claimed (a tower's soft tokens
        # placed in it: Multimodal.adopt); None: nothing.
        self.prepare: Callable[[Session], None] | None = None
        self.result: Completion | None = None
        self._pieces = self._run()

    def __iter__(self) -> Iterator[str]:
        return self._pieces

    def __next__(self) -> str:
        return next(self._pieces)

    def close(self) -> None:
        self._pieces.close()

    def text(self) -> str:
        """Run to the end; the whole text."""
        for _ in self._pieces:
            pass
        return self.result.text

    def _run(self) -> Iterator[str]:
        session, sampler = self.session, self.sampler
        claimed = session.claim()
        if not claimed and self.busy == "refuse":
            raise Busy(busy_message(self.what))
        if not claimed and self.busy == "own":
            # The model's session is another generation's now (another thread's, or a
            # stream not yet finished): this one runs on caches of its own.
            session = Session(session.lm, session.reference)
        try:
            if self.ready is not None:
                self.ready()
            if self.prepare is not None:
                self.prepare(session)
            yield from self._draw(session)
        finally:
            if claimed:
                session.release()

    def _draw(self, session: Session) -> Iterator[str]:
        sampler = self.sampler
        history, drawn, logprobs = list(self.ids), [], []
        text = TextStream(self.tokenizer) if self.tokenizer is not None else None
        stops = StopText(self.stop)
        shown, reason, ended = [], "length", False
        begin = time.perf_counter()
        ttft, after, cached = float("nan"), begin, 0
        try:
            while len(drawn) < self.n:
                logits = session.logits(history)
                token = sampler(logits, seen=history, generated=drawn)
                if not drawn:
                    ttft, after = time.perf_counter() - begin, time.perf_counter()
                    # The session's positions count the model's prefix ids before the prompt.
                    cached = max(0, session.reused - len(session.lm.config.prefix))
                drawn.append(token)
                history.append(token)
                if self.want_logprobs:
                    logprobs.append(float(log_softmax(logits)[token]))
                if token in self.eos:
                    reason = "eos"  # the end of the text: drawn, not shown
                    break
                piece = text.push(token) if text is not None else f" {token}"
                piece = stops.push(piece)
                if piece:
                    shown.append(piece)
                    yield piece
                if stops.stopped is not None:
                    reason = "stop"
                    break
            else:
                reason = "context" if self.context_bound else "length"
            if reason != "stop":
                rest = stops.flush()
                if rest:
                    shown.append(rest)
                    yield rest
            ended = True
        finally:
            # Closed at a yield or stopped by an exception (an interrupt): not a length reached.
            reason = reason if ended else "interrupted"
            elapsed = time.perf_counter() - after
            rate = (len(drawn) - 1) / elapsed if len(drawn) > 1 and elapsed > 0 else float("nan")
            self.result = Completion("".join(shown), drawn, reason, logprobs,
                                     None if sampler.greedy else sampler.seed, stops.stopped,
                                     len(self.ids), ttft, rate, cached)
            if self.on_finish is not None:
                self.on_finish(self.result)


def busy_message(what: str) -> str:
    """Why a generation on ``what`` (a chat) is refused while another runs on it."""
    return (f"{what} is running a turn already (a stream of it not yet finished or closed, "
            "on this thread or another): a conversation takes one turn at a time, so this "
            "one is refused and nothing changed. Finish or close that stream first "
            "(stream.close()), or give each thread a chat of its own (model.chat())")
