"""One conversation over a CausalLM's compiled versions, and generation that streams.

A session holds its own KV caches (``runtime.caches.Caches``) and knows which tokens they
hold. Asked for the logits after a history, it runs only what its caches do not hold: one
more token is a decode step; anything else runs in prompt chunks from the restart position,
the earliest position every state of the model allows at or before the first token the
caches do not hold (``CausalLM.resume_at``):

- a KV cache allows every position it holds, so a chat's next turn runs its own tokens only;
- a sliding window's ring allows a position whose window it still holds, else only 0;
- the prompt chunk's arithmetic allows any position where each row is computed alone (the
  native kernels: ``Plan.rows_alone``), else a multiple of ``prefill_chunk`` (numpy's BLAS,
  ``IRON_SPEC_GEMM=blas``, ``IRON_SPEC_NATIVE=0``, the float64 ``reference()``);
- a state carried from position to position (a recurrent one) allows the positions it keeps
  a copy of, and is restored there before the run.

So a model adds a kind of state by answering ``resume_at(start, written, kind)`` for it
(``kind``: ``compiled`` or ``reference``, which hold states of their own); a session needs
nothing else. The logits are bit for bit those of a fresh session making the same calls;
and where the history before the restart was written by prompt calls (not decode steps,
whose sums differ from a prompt row's by rounding), those of a fresh run of the whole.
``calls`` logs every call as ``(version, start, rows)``. Bad input (an id outside the
vocabulary, a history past ``max_seq_len``) is refused before any call, so the caches keep
what they held.

Whose tokens the caches hold: no ``holder``. When the model had one set of KV caches that
sessions took turns on, it kept a (weak) ``holder``, the session whose tokens they held,
and a session another had displaced ran again from its first token. Here each session owns
its caches, so the decision is that nothing needs to say whose they are: a set records its
own tokens (``Caches.tokens``), which only its session's calls write, and the model binds
one set at a time for a call, under its lock (``CausalLM.caches``: "which session's caches
are bound" is that object; a bench's fresh session may take it over, forgetting what it
held). Another session's call therefore never costs this one its positions, and exact
resume holds across threads. A set holds no one's tokens (``Caches.forget``) after what
writes it behind its session's back: a call of a version without ``caches=`` (``checks``),
a call stopped part-way, or a new cache form (``use_kv_cache``, by its epoch). Nothing the
model holds points back at a session or at the model (``Caches`` holds arrays and ids; a
``Version``'s ``lm`` is a weak proxy), so a model dropped with its sessions is freed by its
refcounts, not at the garbage collector's rare full pass.

Threads. What is locked, what is per session, what a caller may share:

- The model (``CausalLM``) is shared: one call of a session (``logits``, one step of
  ``generate``) runs whole under the model's lock (``CausalLM.lock``), its caches bound for
  it (``CausalLM.bind``: a few milliseconds where another session ran last) and its logits
  copied out before the lock is released. Calls of sessions on other threads wait their
  turn; they never interleave inside one another, and none sees another's positions.
- A session's caches and what they hold are its own: any number of sessions on one model,
  from any threads, each gives the logits it gives alone on one thread, bit for bit.
- A session may be used from several threads too (every call takes the history whole and
  runs what its caches do not hold), but it is one conversation: two histories taking turns
  on it run each other's positions again at every call. Give each thread its own session;
  ``claim``/``release`` say whether a session is in use (the library runs a generation on a
  session of its own where the model's is busy, and refuses a second turn of one chat).
- A batched decode step over many sessions (``runtime.batch``, the server's engine:
  ``runtime.engine``) runs each session's row on that session's own ``Caches``, read in
  place by one native program under the same lock, instead of binding one set at a time.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import numpy as np

from .caches import Caches
from .causal import CausalLM, greedy, in_per_layer_table, token_ids


class Busy(RuntimeError):
    """A session (a chat's) that another generation is running on, claimed by it
    (``Session.claim``): refused, nothing changed."""


@dataclass
class Stats:
    """A generation's timings: ``ttft`` seconds from the call to the first token drawn;
    ``decode_tokens_per_s`` over the tokens drawn after it (NaN with fewer than two);
    ``prompt_tokens`` run, ``tokens`` drawn."""

    prompt_tokens: int
    tokens: int
    ttft: float
    decode_tokens_per_s: float


class Session:
    """A conversation over ``lm``, on KV caches of its own (``caches``): several sessions
    share one model, from any threads, each resuming from its own caches (the module
    docstring says what is locked)."""

    def __init__(self, lm: CausalLM, reference: bool = False, caches: Caches | None = None):
        self.lm = lm
        self.reference = reference  # run the float64 reference instead of the compiled plans
        # Its KV caches, and the tokens they hold (with the positions bitwise a fresh run's
        # and the logits after them where a prompt run computed them). Given a set (the
        # model's bound one, lm.caches: a bench's runs reuse its grown arrays), what that
        # set held is forgotten: this session wrote none of it.
        self.caches = Caches() if caches is None else caches
        if caches is not None:
            with lm.lock:
                caches.forget()
        self.calls: list[tuple[str, int, int]] = []  # (version, start, rows) of each call
        # Positions of the last history its call did not run: held by the caches.
        self.reused = 0
        # Where a tower's soft tokens sit in the history (runtime.towers.multimodal's
        # Placement: its chunks' starts and inputs); None: a text's ids alone.
        self.placement = None
        self.stats: Stats | None = None
        self._claim = threading.Lock()

    def claim(self) -> bool:
        """Mark the session in use by one generation, where no other has it: whether it was
        free (and is now claimed). ``release`` gives it back. Nothing runs differently while
        claimed; it tells a caller sharing a session whether another generation is on it."""
        return self._claim.acquire(blocking=False)

    def release(self) -> None:
        """Give back a ``claim``."""
        self._claim.release()

    @property
    def claimed(self) -> bool:
        return self._claim.locked()


    def _validate(self, tokens: Iterable[int], more: int = 0) -> np.ndarray:
        t = token_ids(tokens, self.lm.config.vocab_size, "tokens")
        if t.ndim != 1 or t.size == 0:
            raise ValueError("a history is a non-empty sequence of token ids")
        V, L = self.lm.config.vocab_size, self.lm.config.max_seq_len
        bad = np.flatnonzero((t < 0) | (t >= V))
        if bad.size:
            raise IndexError(f"token id {int(t[bad[0]])} at position {int(bad[0])} is outside "
                             f"the vocabulary [0, {V})")
        in_per_layer_table(self.lm.config, t, "position {} of the history")
        pad, prefix = self.lm.config.padding_id, self.lm.config.prefix
        if pad is not None and np.any(t == pad):
            raise IndexError(f"token id {pad} at position {int(np.flatnonzero(t == pad)[0])} is "
                             "the padding id (embedding.padding_id), which the model reads as "
                             "left padding, not as a token: a history holds none")
        P = len(prefix)
        if t.size + more + P > L:
            raise ValueError(f"{t.size} token{'s' * (t.size != 1)}"
                             f"{f' and {more} more to draw' if more else ''}"
                             f"{f' after a prefix of {P} ids' if P else ''} do "
                             f"not fit max_seq_len {L}, the context the model was built "
                             "with")
        # The prefix runs first, in the first call, as a part of every history.
        return np.concatenate([np.asarray(prefix, np.int64), t]) if P else t

    def check(self, tokens: Iterable[int], more: int = 0) -> None:
        """Refuse ``tokens`` (a history) with ``more`` tokens to draw after it, as a call
        would, before anything runs.

        Raises:
            ValueError: ``tokens`` is empty, not ids, or with ``more`` does not fit
                ``max_seq_len``.
            IndexError: a token is outside ``[0, vocab_size)``, or past a per-layer-input
                table with no ``outside_row`` (``causal.in_per_layer_table``).
        """
        self._validate(tokens, more)

    @property
    def held(self) -> int:
        """How many tokens of this session its caches hold (a prefix's ids too): none where
        the model's cache form changed since they were written (``use_kv_cache``)."""
        return self.caches.tokens.size if self.caches.epoch == self.lm._epoch else 0

    def forget(self, position: int) -> None:
        """Hold nothing the caches have from ``position`` on: the next call runs again from
        the latest position at or before it that every state allows (``CausalLM.resume_at``;
        where placed, a chunk start: a tower's soft tokens changed there: the seeds'
        ``Session.forget``)."""
        # The caches still hold what was written past it (a sliding window's ring has
        # replaced older positions by it: resume_at reads how far), so the held tokens stay;
        # what they share with the next history is cut at the position instead.
        position, caches = max(0, int(position)), self.caches
        with self.lm.lock:
            caches.stale = position if caches.stale is None else min(caches.stale, position)
            caches.last = None

    def _common(self, tokens: np.ndarray) -> int:
        held, stale = self.caches.tokens[:self.held], self.caches.stale
        n = min(held.size, tokens.size, stale if stale is not None else held.size)
        differ = np.flatnonzero(held[:n] != tokens[:n])
        return int(differ[0]) if differ.size else n

    def logits(self, tokens: Iterable[int]) -> np.ndarray:
        """The logits ``(vocab,)`` float32 after the last of ``tokens``, the whole history.

        Raises:
            ValueError: ``tokens`` is empty or longer than ``max_seq_len``.
            IndexError: a token is outside ``[0, vocab_size)``.
        """
        tokens = self._validate(tokens)
        return self._run(tokens, greedy)[0]

    def forward(self, tokens: Iterable[int], hidden: bool = False
                ) -> tuple[np.ndarray, list[np.ndarray] | None]:
        """Every position's logits ``(n, vocab)`` float32 after the history ``tokens`` (row
        ``i`` predicts token ``i + 1``, as transformers' ``model(ids).logits[0]``), and with
        ``hidden`` the hidden states, a list of ``num_hidden_layers + 1`` arrays ``(n,
        hidden_size)``: the first layer's input, each layer's output, the last after the
        final norm (transformers' ``output_hidden_states``). Rows of the model's prefix ids
        (``CausalOptions.prefix``) are left out. Run from position 0 on this session's
        caches, which then hold nothing to resume from.

        Raises:
            ValueError, IndexError: as ``logits``; ValueError for a model whose layers run
                on several streams or a recurrent schedule, where hidden states are asked.
        """
        tokens = self._validate(tokens)
        lm, n, P = self.lm, tokens.size, len(self.lm.config.prefix)
        logits, states = [], []
        with lm.lock:
            version = lm.version(True, every_row=True)
            C = version.capacity
            lm.bind(self.caches)
            lm.fit_rope(n)
            self.caches.forget()
            self.caches.regime = lm.rope_regime(n)
            ids = np.zeros(C, np.int32)
            try:
                for s in range(0, n, C):
                    rows = min(C, n - s)
                    ids[:rows] = tokens[s: s + rows]
                    out, kept = version(ids, start=s, rows=rows, caches=self.caches)
                    self.calls.append(("forward", s, rows))
                    logits.append(np.array(out))
                    if hidden:
                        states.append([np.array(k) for k in kept])
            finally:
                self.caches.forget()
        out = np.concatenate(logits)[P:]
        if not hidden:
            return out, None
        return out, [np.concatenate([c[i] for c in states])[P:] for i in range(len(states[0]))]

    def prefill(self, tokens: Iterable[int], chunks: int | None = None) -> np.ndarray | None:
        """Run at most ``chunks`` prompt chunks (None: all) of what the caches lack of
        ``tokens`` (a history): the logits after its last token (as ``logits``) once every
        chunk has run, else None, the caches holding the tokens the chunks ran. A server
        interleaves a long prompt's chunks with other sessions' decode steps so; the calls
        are the ones ``logits`` makes, so the logits are bit for bit the same.

        Raises:
            ValueError, IndexError: as ``logits``.
        """
        tokens = self._validate(tokens)
        if chunks is not None and (isinstance(chunks, bool) or not isinstance(chunks, int)
                                   or chunks < 1):
            raise ValueError(f"chunks is {chunks!r}: a count >= 1, or None for all")
        return self._run(tokens, greedy, chunks)[0]

    def reusable(self, tokens: Iterable[int]) -> int:
        """How many leading tokens of ``tokens`` (a history) a call for it would not run again:
        where this session's caches let it restart (``restart``), 0 where they hold
        nothing of it. What a pool of held sessions (``runtime.engine``) ranks them by: the
        session is asked, not assumed to restart at any position its tokens match
        (``CausalLM.resume_at``: a prompt chunk whose rows are not computed alone restarts
        at a chunk boundary, a sliding window's ring may hold too little, a recurrent state
        only where it kept a copy).

        Raises:
            ValueError, IndexError: as ``logits``.
        """
        tokens = self._validate(tokens)
        with self.lm.lock:
            if self.held == 0 or self.caches.regime not in (None, self.lm.rope_regime(tokens.size)):
                return 0
            common = self._common(tokens)
            n = tokens.size
            if self.held == n == common and self.caches.last is not None:
                return n
            if common == self.held and self.held in (n - 1, n):
                return n - 1  # a decode step
            return self._restart(tokens, common)

    def _restart(self, tokens: np.ndarray, common: int) -> int:
        """The position a prompt run for ``tokens`` restarts at, ``common`` of them held: the
        earliest every state of the model allows (``CausalLM.resume_at``)."""
        lm, caches = self.lm, self.caches
        kind = "reference" if self.reference else "compiled"
        # The last token runs whatever the caches hold: its logits are the answer.
        start = min(common, tokens.size - 1)
        placed = self.placement
        if placed is None:
            return lm.resume_at(start, self.held, kind)
        # A placement's chunks keep an image's rows together: resumed at a start the held
        # run and this one share (a fresh run's calls from there), and which every state
        # allows.
        starts = placed.starts(tokens, lm.config.prefill_chunk)
        held = set(caches.starts) if self.held else {0}
        while True:
            start = max(b for b in starts if b <= start and (b in held or b == 0))
            allowed = lm.resume_at(start, self.held, kind)
            if allowed == start:
                return start
            start = allowed

    def _run(self, tokens: np.ndarray, sampler, chunks: int | None = None
             ) -> tuple[np.ndarray | None, int | None]:
        """The logits after ``tokens`` (a copy, the caller's own) and the token ``sampler``
        draws from them, the whole call under the model's lock on this session's caches;
        with ``chunks``, (None, None) where more prompt chunks remain (``prefill``)."""
        with self.lm.lock:
            self.lm.bind(self.caches)
            try:
                logits, token = self._step(tokens, sampler, chunks)
            except BaseException:
                # Stopped part-way (an interrupt's KeyboardInterrupt, an error in a kernel):
                # the caches may hold positions past what the session records, and a sliding
                # window's ring may have replaced keys the recorded history still needs
                # (resume_at reads only what is recorded). They count as holding nothing:
                # the next call runs the whole history again, never over a half-written cache.
                self.caches.forget()
                raise
            # Copied while the lock is held: the plan's arena is the next caller's after it.
            return (None, None) if logits is None else (np.array(logits), token)

    def _step(self, tokens: np.ndarray, sampler, chunks: int | None = None
              ) -> tuple[np.ndarray | None, int | None]:
        lm, n, caches = self.lm, tokens.size, self.caches
        regime = lm.rope_regime(n)
        lm.fit_rope(n)
        if caches.regime != regime:
            # Every cached key was turned by the table of another sequence length (a
            # longrope table past its original context): the whole history runs again, as
            # transformers turns every position by the table of the current length.
            caches.forget()
            caches.regime = regime
        common = self._common(tokens)
        if self.held == n == common and caches.last is not None:
            self.reused = n
            return caches.last, sampler(caches.last)
        caches.last = None
        kind = "reference" if self.reference else "compiled"
        if common == self.held and (self.held == n - 1 or
                                    self.held == n and lm.restores(n - 1, kind)):
            # One token past what the caches hold, or (after a decode step, whose logits
            # are not kept) the last one again: a decode step, as generation runs it, which
            # writes the same keys and values again (recurrent states restored to before
            # it, where a snapshot of them is; else a prompt call from where one is).
            if self.held == n:
                lm.restore(n - 1, kind)
            version = lm.decode_step
            run = version.reference if self.reference else version
            placed = self.placement
            logits, carry = run(token=int(tokens[-1]), position=n - 1, sampler=sampler,
                                caches=caches, extra=None if placed is None
                                else placed.decode_inputs(n - 1))
            self.calls.append(("decode", n - 1, 1))
            self.reused = n - 1
        else:
            version = lm.prompt_chunk
            run = version.reference if self.reference else version
            C = version.capacity
            start = self._restart(tokens, common)
            lm.restore(start, kind)
            caches.tokens, self.reused = tokens[:start], start
            ids = np.zeros(C, np.int32)
            placed = self.placement
            starts = placed.starts(tokens, C) if placed is not None else None
            bounds = [b for b in starts if b >= start] + [n] if placed is not None else \
                list(range(start, n, C)) + [n]
            if chunks is not None:
                bounds = bounds[:chunks + 1]
            for s, end in zip(bounds, bounds[1:]):
                rows = end - s
                ids[:rows] = tokens[s: s + rows]
                # Only the last chunk's logits are read: the chunks before it fill the
                # caches alone (the head and the last layer past its cache write skipped).
                last = end >= n
                extra = placed.inputs(tokens, s, rows, C) if placed is not None else None
                if extra is None or "soft" not in extra:  # no placeholder (M-RoPE's rows)
                    logits, carry = run(ids, start=s, rows=rows, sampler=sampler, output=last,
                                        extra=extra, caches=caches)
                else:
                    version = placed.version(lm)
                    go = version.reference if self.reference else version
                    logits, carry = go(ids, start=s, rows=rows, sampler=sampler, output=last,
                                       extra=extra, caches=caches)
                self.calls.append(("placed" if extra and "soft" in extra else "prompt", s, rows))
            caches.starts = starts if starts is not None else list(range(0, n, C))
            if bounds[-1] < n:  # more chunks to run (prefill): the caches hold what these ran
                caches.tokens, caches.stale = tokens[:bounds[-1]], None
                return None, None
            caches.last = np.array(logits)
        caches.tokens, caches.stale = tokens, None
        return logits, carry["token"]

    def generate(self, tokens: Iterable[int], max_tokens: int,
                 sampler: Callable[[np.ndarray], int] = greedy,
                 eos: Iterable[int] = ()) -> Iterator[int]:
        """Draw up to ``max_tokens`` after ``tokens``, each yielded as it is drawn, stopping
        after the first of ``eos`` (or the model's padding id, which a history may not
        hold); ``stats`` is set once the last is drawn.

        Raises (before anything runs):
            ValueError: the history and the tokens to draw do not fit ``max_seq_len``.
            IndexError: a token is outside the vocabulary.
        """
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)):
            raise TypeError(f"max_tokens is {max_tokens!r}, not an integer")
        if max_tokens < 1:
            raise ValueError(f"max_tokens {max_tokens} draws nothing; give 1 or more")
        history = self._validate(tokens, more=max_tokens - 1)
        prompt_tokens, eos = history.size - len(self.lm.config.prefix), frozenset(eos)
        if self.lm.config.padding_id is not None:
            # A drawn padding id ends the text: the model would read it as padding next.
            eos |= {self.lm.config.padding_id}
        begin = time.perf_counter()
        _, token = self._run(history, sampler)
        ttft = time.perf_counter() - begin
        drawn, after = 1, time.perf_counter()
        try:
            yield token
            while drawn < max_tokens and token not in eos:
                history = np.append(history, token)
                _, token = self._run(history, sampler)
                drawn += 1
                yield token
        finally:  # also when a caller stops early
            elapsed = time.perf_counter() - after
            rate = (drawn - 1) / elapsed if drawn > 1 and elapsed > 0 else float("nan")
            self.stats = Stats(prompt_tokens, drawn, ttft, rate)
