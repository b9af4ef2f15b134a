"""One conversation over a CausalLM's compiled versions, and generation that streams.

A session knows which tokens the KV caches hold. Asked for the logits after a history, it
runs only what the caches do not hold: one more token is a decode step; anything else runs
in prompt chunks from the restart position, the earliest position every state of the model
allows at or before the first token the caches do not hold (``CausalLM.resume_at``):

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
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import numpy as np

from .causal import CausalLM, greedy, in_per_layer_table, token_ids


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
    """A conversation over ``lm``. Several sessions may share one model; the caches hold one
    session's tokens at a time, so a session whose tokens another replaced runs again from
    the first token."""

    def __init__(self, lm: CausalLM, reference: bool = False):
        self.lm = lm
        self.reference = reference  # run the float64 reference instead of the compiled plans
        self._held = np.zeros(0, np.int64)
        self.calls: list[tuple[str, int, int]] = []  # (version, start, rows) of each call
        # Where a tower's soft tokens sit in the history (runtime.towers.multimodal's
        # Placement: its chunks' starts and inputs); None: a text's ids alone.
        self.placement = None
        self._starts: list[int] = []  # the held run's chunk starts, where placed
        self._stale: int | None = None  # the first position forgotten (forget)
        # Positions of the last history its call did not run: held by the caches.
        self.reused = 0
        # The logits after the held tokens when a prompt run computed them (bitwise a fresh
        # run's): asked again for the same history, nothing runs.
        self._last: np.ndarray | None = None
        self.stats: Stats | None = None

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
        """How many tokens of this session the caches hold (a prefix's ids too)."""
        return self._held.size if self.lm.holder is self else 0

    def forget(self, position: int) -> None:
        """Hold nothing the caches have from ``position`` on: the next call runs again from
        the latest position at or before it that every state allows (``CausalLM.resume_at``;
        where placed, a chunk start: a tower's soft tokens changed there: the seeds'
        ``Session.forget``)."""
        # The caches still hold what was written past it (a sliding window's ring has
        # replaced older positions by it: resume_at reads how far), so the held tokens stay;
        # what they share with the next history is cut at the position instead.
        position = max(0, int(position))
        self._stale = position if self._stale is None else min(self._stale, position)
        self._last = None

    def _common(self, tokens: np.ndarray) -> int:
        held = self._held if self.lm.holder is self else self._held[:0]
        n = min(held.size, tokens.size, self._stale if self._stale is not None else held.size)
        differ = np.flatnonzero(held[:n] != tokens[:n])
        return int(differ[0]) if differ.size else n

    def logits(self, tokens: Iterable[int]) -> np.ndarray:
        """The logits ``(vocab,)`` float32 after the last of ``tokens``, the whole history.

        Raises:
            ValueError: ``tokens`` is empty or longer than ``max_seq_len``.
            IndexError: a token is outside ``[0, vocab_size)``.
        """
        tokens = self._validate(tokens)
        return np.array(self._run(tokens, greedy)[0])

    def _run(self, tokens: np.ndarray, sampler) -> tuple[np.ndarray, int]:
        try:
            return self._step(tokens, sampler)
        except BaseException:
            # Stopped part-way (an interrupt's KeyboardInterrupt, an error in a kernel): the caches
            # may hold positions past what the session records, and a sliding window's ring
            # may have replaced keys the recorded history still needs (resume_at reads only
            # what is recorded). They count as holding nothing: the next call runs the whole
            # history again, never over a half-written cache.
            self.lm.holder, self._last = None, None
            raise

    def _step(self, tokens: np.ndarray, sampler) -> tuple[np.ndarray, int]:
        lm, n = self.lm, tokens.size
        if lm.fit_rope(n):
            # Every cached key was turned by the table of another sequence length (a
            # longrope table past its original context): the whole history runs again, as
            # transformers turns every position by the table of the current length.
            lm.holder = None
        common = self._common(tokens)
        if self.held == n == common and self._last is not None:
            self.reused = n
            return self._last, sampler(self._last)
        self._last = None
        if common == self.held and self.held in (n - 1, n):
            # One token past what the caches hold, or (after a decode step, whose logits
            # are not kept) the last one again: a decode step, as generation runs it, which
            # writes the same keys and values again.
            version = lm.decode_step
            run = version.reference if self.reference else version
            logits, carry = run(token=int(tokens[-1]), position=n - 1, sampler=sampler)
            self.calls.append(("decode", n - 1, 1))
            self.reused = n - 1
        else:
            version = lm.prompt_chunk
            run = version.reference if self.reference else version
            C = version.capacity
            kind = "reference" if self.reference else "compiled"
            # The last token runs whatever the caches hold: its logits are the answer.
            start = min(common, n - 1)
            placed = self.placement
            starts = placed.starts(tokens, C) if placed is not None else None
            if placed is None:
                start = lm.resume_at(start, self.held, kind)
            else:
                # A placement's chunks keep an image's rows together: resumed at a start the
                # held run and this one share (a fresh run's calls from there), and which
                # every state allows.
                held = set(self._starts) if lm.holder is self else {0}
                while True:
                    start = max(b for b in starts if b <= start and (b in held or b == 0))
                    allowed = lm.resume_at(start, self.held, kind)
                    if allowed == start:
                        break
                    start = allowed
            lm.holder, self._held, self.reused = self, tokens[:start], start
            ids = np.zeros(C, np.int32)
            bounds = [b for b in starts if b >= start] + [n] if placed is not None else \
                list(range(start, n, C)) + [n]
            for s, end in zip(bounds, bounds[1:]):
                rows = end - s
                ids[:rows] = tokens[s: s + rows]
                # Only the last chunk's logits are read: the chunks before it fill the
                # caches alone (the head and the last layer past its cache write skipped).
                last = end >= n
                extra = placed.inputs(tokens, s, rows, C) if placed is not None else None
                if extra is None:
                    logits, carry = run(ids, start=s, rows=rows, sampler=sampler, output=last)
                else:
                    version = placed.version(lm)
                    go = version.reference if self.reference else version
                    logits, carry = go(ids, start=s, rows=rows, sampler=sampler, output=last,
                                       extra=extra)
                self.calls.append(("placed" if extra is not None else "prompt", s, rows))
            self._starts = starts if starts is not None else list(range(0, n, C))
            self._last = np.array(logits)
        lm.holder, self._held, self._stale = self, tokens, None
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
