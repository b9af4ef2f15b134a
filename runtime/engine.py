"""Many generations over one model at once: continuous batching and prefix reuse.

An ``Engine`` owns one thread that makes every model call for the requests given to it
(``submit``, from any thread). Each turn of its loop:

1. admits waiting requests while fewer than ``max_batch`` run, each on a session from its
   pool (``SessionPool``): the held session that would run the fewest of the request's
   tokens again (``Session.reusable``: the session is asked where it can restart), else a
   fresh one;
2. runs prompt chunks of the admitted requests still reading their prompts, oldest first,
   up to ``prefill_tokens`` rows a turn (a long prompt delays the others' next tokens by a
   turn's budget, not by its whole length), drawing each one's first token as its prompt
   ends;
3. runs one decode step for every request whose prompt is read: one batched call over all
   of them where the model has one (``runtime.batch.BatchDecode``: each weight read once
   for the batch), else one decode call per session.

Every request draws from the logits a session alone would compute, bit for bit (the
batched step computes each row as the decode step does), with its own sampler, so its text
is the text it gets served alone. A finished request's session goes back to the pool,
its caches holding the prompt and the tokens drawn: a request beginning the same way runs
only the rest (llama-server's cache reuse, vLLM's prefix caching). The pool is bounded by
a count and by bytes, the least recently used session dropped first.

Not for: what a request's settings mean (``runtime.generation``, ``operators.sampling``),
HTTP (``iron_spec.cli.server``).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from iron_spec.operators import native
from iron_spec.operators.sampling import Sampler, log_softmax

from .batch import BatchDecode, Unbatchable
from .causal import CausalLM, token_ids
from .generation import Completion, StopText
from .session import Session
from .tokenizer import TextStream

log = logging.getLogger("iron_spec")


@dataclass
class TokenLogprob:
    """A drawn token's natural log-probability under the model's distribution (the softmax
    of the raw logits, as ``Completion.logprobs``) and the ``top`` most likely tokens' ids
    and log-probabilities, most likely first (as many as the request asked)."""

    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class Piece:
    """One drawn token as a request receives it: ``token`` its id, ``text`` what may be
    shown now (empty while a character or a possible stop string is held back; the text
    held back comes with a later piece or the last), ``logprob`` where asked."""

    token: int | None
    text: str
    logprob: TokenLogprob | None = None


@dataclass
class Request:
    """One generation to run.

    ``ids``: the prompt's token ids (checked by the caller against the model's vocabulary
    and context: ``Session.check``). ``max_new_tokens``: the most to draw. ``sampler``: its
    own (its seed, its penalties). ``eos``: ids that end the text (drawn, not shown).
    ``tokenizer``: turns ids into text (None: ids only, each shown as `` <id>``). ``stops``:
    stop strings. ``top_logprobs``: None for no log-probabilities, else how many of the most
    likely tokens to give beside each drawn one's. ``context_bound``: ``max_new_tokens``
    was cut to the context (a run to it ends as ``context``, not ``length``).
    ``on_piece(piece)`` and ``on_finish(completion)`` are called on the engine's thread,
    each piece as it is drawn, then the ``Completion`` once (``finish_reason`` as
    ``runtime.generation``'s, ``error`` where a model call failed: ``Ticket.error`` holds
    it).
    """

    ids: Sequence[int]
    max_new_tokens: int
    sampler: Sampler
    eos: frozenset = frozenset()
    tokenizer: object = None
    stops: tuple[str, ...] = ()
    top_logprobs: int | None = None
    context_bound: bool = False
    on_piece: Callable[[Piece], None] | None = None
    on_finish: Callable[[Completion], None] | None = None


class Ticket:
    """A submitted request: ``cancel()`` ends it at the engine's next turn (finish reason
    ``interrupted``); ``wait()`` blocks until it finished and gives its ``Completion``."""

    def __init__(self, request: Request):
        self.request = request
        self.result: Completion | None = None
        self.error: BaseException | None = None
        self.cancelled = False
        self._done = threading.Event()

    def cancel(self) -> None:
        self.cancelled = True

    def wait(self, timeout: float | None = None) -> Completion:
        """The ``Completion`` once the request ends.

        Raises:
            TimeoutError: not finished within ``timeout`` seconds.
            The exception a model call raised for this request, where one did.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"the request did not finish within {timeout} s")
        if self.error is not None:
            raise self.error
        return self.result

    @property
    def done(self) -> bool:
        return self._done.is_set()


class _Running:
    """A request the engine runs: its session, history and what it drew so far."""

    def __init__(self, ticket: Ticket, session: Session, submitted: float):
        r = ticket.request
        self.ticket, self.request, self.session = ticket, r, session
        self.history = list(r.ids)
        # The history again as int64 ids, the model calls' argument: a list would be
        # converted and checked id by id at every step (Session._validate: ~0.5 ms a row at
        # 2000 ids), an array in one pass. Grown by doubling. (What is not an id is refused
        # here as the model's call would refuse it.)
        self._ids = token_ids(self.history, session.lm.config.vocab_size)
        self.drawn: list[int] = []
        self.logprobs: list[float] = []
        self.text = TextStream(r.tokenizer) if r.tokenizer is not None else None
        self.stops = StopText(r.stops)
        self.shown: list[str] = []
        self.submitted, self.first, self.last = submitted, None, None
        self.reading = True  # its prompt not yet all run
        self.reused = session.reusable(self.history) if session.held else 0

    @property
    def ids(self) -> np.ndarray:
        """The history as int64 ids (a view: the model's calls copy what they keep)."""
        return self._ids[:len(self.history)]

    def append(self, token: int) -> None:
        n = len(self.history)
        if n == self._ids.size:
            self._ids = np.concatenate([self._ids, np.empty(max(n, 16), np.int64)])
        self._ids[n] = token
        self.history.append(token)


class SessionPool:
    """Sessions over one model whose caches hold what their last request ran, for requests
    that begin the same way. ``take(ids)`` gives the held session a call for ``ids`` would
    run the fewest tokens of again (``Session.reusable``), else a fresh one; ``give(s)``
    keeps ``s`` as the most recently used, dropping the least recently used past
    ``max_sessions`` held or ``max_bytes`` of caches."""

    def __init__(self, lm: CausalLM, max_sessions: int = 8, max_bytes: int | None = None):
        self.lm, self.max_sessions, self.max_bytes = lm, max_sessions, max_bytes
        self._held: list[Session] = []  # least recently used first
        self.hits = self.reused = 0

    def take(self, ids: Sequence[int]) -> Session:
        best, most = None, 0
        for s in self._held:
            n = s.reusable(ids)
            if n > most:
                best, most = s, n
        if best is None:
            return Session(self.lm)
        self._held.remove(best)
        self.hits += 1
        self.reused += most
        return best

    def give(self, session: Session) -> None:
        if self.max_sessions < 1 or not session.held:
            return
        self._held.append(session)
        while len(self._held) > self.max_sessions or (
                self.max_bytes is not None and len(self._held) > 1
                and self.bytes() > self.max_bytes):
            self._held.pop(0)

    def bytes(self) -> int:
        """Bytes the held sessions' caches take."""
        return sum(cache_bytes(self.lm, s) for s in self._held)

    def __len__(self) -> int:
        return len(self._held)


def cache_bytes(lm: CausalLM, session: Session) -> int:
    """Bytes ``session``'s KV caches take (in the model's states where they are bound)."""
    if session.caches is lm.caches:
        return lm.cache_bytes()[0]
    return session.caches.nbytes


class Metrics:
    """What the engine counts (read from any thread; Prometheus' names in
    ``iron_spec.cli.server``): requests, prompt tokens run and reused, tokens drawn, time
    to first token (sum and count, and a histogram's buckets), decode steps and their rows."""

    TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, float("inf"))

    def __init__(self):
        self.requests = self.finished = self.failed = 0
        self.prompt_tokens = self.prompt_tokens_run = self.generated_tokens = 0
        self.ttft_sum, self.ttft_count = 0.0, 0
        self.ttft_buckets = [0] * len(self.TTFT_BUCKETS)
        self.decode_steps = self.decode_rows = 0
        self.decode_seconds = 0.0
        self.started = time.time()

    def first_token(self, seconds: float) -> None:
        self.ttft_sum += seconds
        self.ttft_count += 1
        for i, b in enumerate(self.TTFT_BUCKETS):
            if seconds <= b:
                self.ttft_buckets[i] += 1


def _wake(cond: threading.Condition) -> None:
    with cond:
        cond.notify_all()


def _serve(ref: weakref.ref) -> None:
    """The engine's thread: turns of ``ref()``'s loop while it has work (the engine held
    meanwhile: what runs and waits ends); idle, it waits holding only the weak reference, so
    an engine (and its model) its owner dropped is collected, its finalizer waking this
    thread to end."""
    engine = ref()
    while engine is not None:
        cond = engine._cond
        with cond:
            if engine._idle():
                del engine  # may run the finalizer here (the lock is re-entrant): ref() is None
                if ref() is not None:
                    cond.wait()
                engine = ref()
                continue
        if not engine._loop():
            return


#: The least each of the engine's count options may be (held_sessions 0: no prefix reuse).
_LEAST = {"max_batch": 1, "held_sessions": 0, "held_bytes": 0, "prefill_tokens": 1}


def check_options(**options: Any) -> None:
    """Refuse engine options (``Engine``'s keyword arguments) that are not what they must be,
    before any model is built for them (``iron-spec serve`` checks its file with this before
    loading weights).

    Raises:
        ValueError: an option is unknown, a count that is not an int at least its least
            (``max_batch`` >= 1, ``held_sessions`` and ``held_bytes`` >= 0,
            ``prefill_tokens`` >= 1; None for the three last: the default), ``max_batch``
            past the batched decode's rows (``native.CALL_ROWS``) unless ``batched`` is False,
            or ``batched`` is not a bool; the message names the option and what is valid.
    """
    for name, value in options.items():
        if name == "batched":
            if not isinstance(value, bool):
                raise ValueError(f"batched is {value!r}: true or false")
            continue
        if name not in _LEAST:
            raise ValueError(f"unknown engine option {name!r} (the options: "
                             f"{', '.join([*_LEAST, 'batched'])})")
        if value is None and name != "max_batch":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < _LEAST[name]:
            raise ValueError(f"{name} is {value!r}: a count >= {_LEAST[name]}")
    most = native.CALL_ROWS
    if options.get("batched", True) and options.get("max_batch", 1) > most:
        raise ValueError(f"max_batch is {options['max_batch']}: at most {most} requests decode "
                         "together in one step (batched: false runs more, one at a time)")


class Engine:
    """Runs ``Request``s over ``lm`` on a thread of its own (module docstring).

    Args:
        lm: the model (shared: other threads' sessions may run on it too, each call under
            its lock).
        max_batch: requests running at once (the others wait, first come first served).
        held_sessions, held_bytes: the pool's bounds (``SessionPool``).
        prefill_tokens: prompt rows a turn runs before the decode step (at least one chunk;
            default four prompt chunks).
        batched: run the decode steps of several requests as one call where the model has
            a batched decode (``runtime.batch``); False: one call per session.
    """

    def __init__(self, lm: CausalLM, *, max_batch: int = 8, held_sessions: int | None = None,
                 held_bytes: int | None = None, prefill_tokens: int | None = None,
                 batched: bool = True):
        check_options(max_batch=max_batch, held_sessions=held_sessions, held_bytes=held_bytes,
                      prefill_tokens=prefill_tokens, batched=batched)
        self.lm, self.max_batch = lm, max_batch
        self.pool = SessionPool(lm, max_batch if held_sessions is None else held_sessions,
                                held_bytes)
        # Prompt rows a turn runs before its decode step: new requests' first tokens come
        # before the running ones' next (time to first token first), within a bound.
        self.prefill_tokens = prefill_tokens or 4 * lm.config.prefill_chunk
        self.batch = None
        self.unbatched: str | None = "batched=False" if not batched else \
            "max_batch is 1" if max_batch == 1 else None
        if self.unbatched is None:
            try:
                self.batch = BatchDecode(lm, max_batch)
            except Unbatchable as e:
                self.unbatched = str(e)
                log.info("decode steps run one session at a time: %s", e)
        self.metrics = Metrics()
        self._cond = threading.Condition()
        self._waiting: deque[tuple[Ticket, float]] = deque()
        self._running: list[_Running] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        # The loop's thread holds the engine only while it works (``_serve``): an engine
        # its owner dropped is collected, and this wakes the idle thread to end.
        weakref.finalize(self, _wake, self._cond)

    # -- callers' side -----------------------------------------------------------------
    def submit(self, request: Request) -> Ticket:
        """Queue ``request``; its ``Ticket``. Thread-safe.

        Raises:
            RuntimeError: the engine is closed.
        """
        ticket = Ticket(request)
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine is closed")
            self._waiting.append((ticket, time.perf_counter()))
            self.metrics.requests += 1
            if self._thread is None:
                self._thread = threading.Thread(target=_serve, args=(weakref.ref(self),),
                                                name="iron-spec-engine", daemon=True)
                self._thread.start()
            self._cond.notify()
        return ticket

    def close(self) -> None:
        """Stop the loop once what runs and waits has ended (each waiting request is
        cancelled); no new request is taken."""
        with self._cond:
            self._closed = True
            for t, _ in self._waiting:
                t.cancel()
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def kv_bytes(self) -> int:
        """Bytes the KV caches of the running and held sessions take."""
        return sum(cache_bytes(self.lm, r.session) for r in list(self._running)) + \
            self.pool.bytes()

    # -- the loop ----------------------------------------------------------------------
    def _idle(self) -> bool:
        return not self._waiting and not self._running and not self._closed

    def _loop(self) -> bool:
        """One turn of the loop (module docstring); False once the engine is closed and
        nothing runs or waits. Called with work to do (``_serve``)."""
        with self._cond:
            if self._closed and not self._waiting and not self._running:
                return False
            admitted = []
            while self._waiting and len(self._running) + len(admitted) < self.max_batch:
                admitted.append(self._waiting.popleft())
        for ticket, submitted in admitted:
            if ticket.cancelled:
                self._end_unstarted(ticket, submitted)
                continue
            try:
                session = self.pool.take(ticket.request.ids)
                self._running.append(_Running(ticket, session, submitted))
            except BaseException as e:  # a refused request ends alone
                self._fail_ticket(ticket, e)
        try:
            self._turn()
        except BaseException as e:  # never expected: every request ends, not the thread
            log.exception("engine: a turn failed")
            for r in list(self._running):
                self._fail(r, e)
        return True

    def _turn(self) -> None:
        for r in [r for r in self._running if r.ticket.cancelled]:
            self._finish(r, "interrupted")
        budget = self.prefill_tokens
        for r in [r for r in self._running if r.reading]:
            while budget > 0 and r.reading:
                budget -= self._chunk_rows(r)
                try:
                    logits = r.session.prefill(r.ids, chunks=1)
                except Exception as e:
                    self._fail(r, e)
                    break
                if logits is not None:
                    r.reading = False
                    self.metrics.prompt_tokens += len(r.request.ids)
                    self.metrics.prompt_tokens_run += len(r.request.ids) - r.reused
                    self._draw(r, logits)
            if budget <= 0:
                break
        ready = [r for r in self._running if not r.reading and r.drawn]
        if not ready:
            return
        begin = time.perf_counter()
        if self.batch is not None and len(ready) > 1:
            try:
                rows = self.batch.step([r.session for r in ready], [r.ids for r in ready])
            except Exception as e:
                for r in ready:
                    self._fail(r, e)
                return
            for r, logits in zip(ready, rows):
                self._draw(r, logits)
        else:
            for r in ready:
                try:
                    logits = r.session.logits(r.ids)
                except Exception as e:
                    self._fail(r, e)
                    continue
                self._draw(r, logits)
        self.metrics.decode_steps += 1
        self.metrics.decode_rows += len(ready)
        self.metrics.decode_seconds += time.perf_counter() - begin

    def _chunk_rows(self, r: _Running) -> int:
        """Rows ``r``'s next prompt chunk runs (at most a chunk of what is left)."""
        C = self.lm.config.prefill_chunk
        return max(1, min(C, len(r.history) - max(r.session.held, r.reused)))

    def _draw(self, r: _Running, logits: np.ndarray) -> None:
        """Draw ``r``'s next token from ``logits`` and hand it over; end ``r`` where it
        ends."""
        q = r.request
        token = q.sampler(logits, seen=r.history, generated=r.drawn)
        now = time.perf_counter()
        if r.first is None:
            r.first = now
            self.metrics.first_token(now - r.submitted)
        r.last = now
        r.drawn.append(token)
        r.append(token)
        self.metrics.generated_tokens += 1
        lp = None
        if q.top_logprobs is not None:
            logs = log_softmax(logits)
            lp = TokenLogprob(token, float(logs[token]))
            k = min(q.top_logprobs, logs.size)
            if k:
                top = np.argpartition(-logs, k - 1)[:k]
                top = top[np.lexsort((top, -logs[top]))]
                lp.top = [(int(i), float(logs[i])) for i in top]
            r.logprobs.append(lp.logprob)
        if token in q.eos:
            self._emit(r, Piece(token, "", lp))
            self._finish(r, "eos")
            return
        piece = r.text.push(token) if r.text is not None else f" {token}"
        shown = r.stops.push(piece)
        if shown:
            r.shown.append(shown)
        self._emit(r, Piece(token, shown, lp))
        if r.stops.stopped is not None:
            self._finish(r, "stop")
        elif len(r.drawn) >= q.max_new_tokens:
            self._finish(r, "context" if q.context_bound else "length")

    def _emit(self, r: _Running, piece: Piece) -> None:
        if r.request.on_piece is not None:
            try:
                r.request.on_piece(piece)
            except Exception:  # a caller's callback does not stop the engine
                log.exception("engine: on_piece raised; the request is cancelled")
                r.ticket.cancel()

    def _finish(self, r: _Running, reason: str) -> None:
        if reason not in ("stop",):
            rest = r.stops.flush()
            if rest:
                r.shown.append(rest)
                self._emit(r, Piece(None, rest))
        q = r.request
        n = len(r.drawn)
        rate = (n - 1) / (r.last - r.first) if n > 1 and r.last > r.first else float("nan")
        result = Completion("".join(r.shown), list(r.drawn), reason, list(r.logprobs),
                            None if q.sampler.greedy else q.sampler.seed, r.stops.stopped,
                            len(q.ids), float("nan") if r.first is None else r.first - r.submitted,
                            rate)
        self._running.remove(r)
        self.pool.give(r.session)
        self.metrics.finished += 1
        self._end(r.ticket, result)

    def _end(self, ticket: Ticket, result: Completion) -> None:
        ticket.result = result
        try:
            if ticket.request.on_finish is not None:
                ticket.request.on_finish(result)
        except Exception:
            log.exception("engine: on_finish raised")
        finally:
            ticket._done.set()

    def _end_unstarted(self, ticket: Ticket, submitted: float) -> None:
        q = ticket.request
        self._end(ticket, Completion("", [], "interrupted", [], None, None, len(q.ids)))

    def _fail(self, r: _Running, e: BaseException) -> None:
        if r in self._running:
            self._running.remove(r)
        # Its session's caches were forgotten by the failed call; it is not kept.
        self._fail_ticket(r.ticket, e)

    def _fail_ticket(self, ticket: Ticket, e: BaseException) -> None:
        self.metrics.failed += 1
        ticket.error = e
        q = ticket.request
        self._end(ticket, Completion("", [], "error", [], None, None, len(q.ids)))
