"""The checks a model must pass, each a figure and a verdict (the seeds' ``testing``).

Every check runs the compiled model against something independent of its kernels: the
operators' float64 references (per step, and the whole graph through ``reference()``), a
golden recorded from transformers, or itself run another way (chunked against one token at
a time, a resumed chat against a fresh run).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from iron_spec.operators.attention import rows_of
from iron_spec.operators.base import EPS32
from iron_spec.operators.formats import widen_bfloat16
from iron_spec.operators.router import Router, tied_choice

from .causal import CausalLM
from .golden import Golden, kl_stats, log_softmax, teacher_forced
from .plan import CheckError
from .session import Session


@dataclass
class Result:
    """One check: its ``name``, whether it ``passed``, its headline ``figure`` (text) and
    the numbers behind it; ``verified`` False where nothing it could judge by was there
    (it failed nothing, and it verified nothing either: the figure says what was missing)."""

    name: str
    passed: bool
    figure: str
    numbers: dict = field(default_factory=dict)
    seconds: float = 0.0
    verified: bool = True


def divergence(reference: np.ndarray, logits: np.ndarray) -> tuple[float, bool]:
    """KL(reference || ours) of two rows of logits, and whether both rank one token first."""
    r, o = log_softmax(reference), log_softmax(logits)
    return max(float(np.sum(np.exp(r) * (r - o))), 0.0), int(np.argmax(r)) == int(np.argmax(o))


def tie_gap(reference: np.ndarray, ours: int) -> float:
    """How far (nats) the reference's log-probability of token ``ours`` lies below its own
    first choice: 0.0 where ``ours`` is that choice. Under reduced precision two tokens this
    close may swap (the rounding moves log-probabilities by more), which is no error of the
    kernels or the spec; the gap says so whatever rank the reference gives ``ours``."""
    lp = log_softmax(reference)
    return float(lp.max() - lp[ours])


def _top1_said(reference: np.ndarray, logits: np.ndarray, top1: bool, tie: float
               ) -> tuple[bool, str, float]:
    """Whether ``logits``' first choice passes against ``reference``'s (the same, or within
    ``tie`` nats of it: ``tie_gap``), the words for it, and the gap (0.0 where the same)."""
    if top1:
        return True, "same", 0.0
    gap = tie_gap(reference, int(np.argmax(logits)))
    if tie > 0 and gap <= tie:
        return True, f"a tie ({gap:.3g} nats apart, at most {tie:g})", gap
    return False, f"DIFFERS ({gap:.3g} nats below the reference's first)", gap


def _timed(fn: Callable[[], Result]) -> Result:
    start = time.perf_counter()
    result = fn()
    result.seconds = time.perf_counter() - start
    return result


def per_step(lm: CausalLM, prompt: list[int], decode_steps: int = 3) -> Result:
    """``check=True`` on both versions: every step of a prompt (more than one chunk, so a
    chunk with a per-call ``rows`` bound runs) and a few decode steps, each against its
    operator's reference on the same inputs."""
    def run() -> Result:
        prompt_v, decode_v = lm.version(True, check=True), lm.version(False, check=True)
        C = prompt_v.capacity
        ids = np.zeros(C, np.int32)
        try:
            for s in range(0, len(prompt), C):
                rows = min(C, len(prompt) - s)
                ids[:rows] = prompt[s: s + rows]
                _, carry = prompt_v(ids, start=s, rows=rows)
            for _ in range(decode_steps):
                _, carry = decode_v(**carry)
        except CheckError as e:
            return Result("per-step check", False, str(e))
        n = len(prompt_v.plan.checked) + len(decode_v.plan.checked)
        return Result("per-step check", True, f"{n} steps within tolerance", {"steps": n})
    result = _timed(run)
    lm.caches.forget()  # the checked calls wrote the bound caches behind their session's back
    return result


class Trajectory:
    """The float64 ``reference()``'s own greedy run from ``prompt``, ``steps`` draws, run once
    where first read and shared by the checks that judge by it: ``logits`` ``(steps,
    vocab)`` float64, row ``i`` after ``tokens[:len(prompt) + i]``; ``tokens`` the prompt and
    every token drawn."""

    def __init__(self, lm: CausalLM, prompt: list[int], steps: int):
        self.lm, self.prompt, self.steps = lm, list(prompt), steps

    @functools.cached_property
    def logits(self) -> np.ndarray:
        session, history, rows = Session(self.lm, reference=True), list(self.prompt), []
        for _ in range(self.steps):
            rows.append(session.logits(history))
            history.append(int(np.argmax(rows[-1])))
        self.tokens = history
        return np.stack(rows)

    def drawn(self, steps: int) -> list[int]:
        """The first ``steps`` tokens drawn (``steps`` at most ``self.steps``)."""
        self.logits
        return self.tokens[len(self.prompt): len(self.prompt) + steps]


def greedy_match(lm: CausalLM, prompt: list[int], steps: int,
                 reference: Trajectory | None = None, tie: float = 0.0) -> Result:
    """Compiled against ``reference()``: the greedy tokens over ``steps`` draws are
    identical (``reference``: its run, if one is shared with other checks); with ``tie``
    (nats, reduced precision's), the first that differs may be any token within ``tie`` of
    the reference's first (``tie_gap``): a tie the rounding broke."""
    def run() -> Result:
        ours = list(Session(lm).generate(prompt, steps))
        shared = reference or Trajectory(lm, prompt, steps)
        ref = shared.drawn(steps)
        same = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), None)
        if same is None:
            return Result("compiled = reference (greedy)", True,
                          f"{steps} tokens identical", {"steps": steps})
        gap = tie_gap(shared.logits[same], ours[same])
        numbers = {"steps": steps, "first_difference": same, "gap": gap}
        tied = tie > 0 and gap <= tie
        figure = (f"first differs at step {same}: {ours[same]} vs {ref[same]}, {gap:.3g} nats "
                  "below it in the reference")
        if tied:
            figure += f" (a tie under reduced precision, at most {tie:g})"
        elif tie > 0:
            figure += f" (more than the {tie:g} a tie under reduced precision may be)"
        return Result("compiled = reference (greedy)", tied, figure, numbers)
    return _timed(run)


def kl_against(lm: CausalLM, bounds: dict[str, float], golden: Golden | None,
               prompt: list[int], steps: int, reference: Trajectory | None = None,
               tie: float = 0.0) -> Result:
    """KL(reference || ours), teacher-forced on the reference's greedy tokens: the golden's
    where there is one, else ``reference()``'s (``reference``: its run, if one is shared,
    of at least ``steps`` draws). Within ``bounds`` (mean, p90, max) and no top-1
    mismatch (or at most ``bounds["top1_mismatches"]``, where given); with ``tie`` (nats,
    reduced precision's), a step whose first choice lies within ``tie`` of the reference's
    is a tie, counted in ``top1_ties`` and not as a mismatch (``tie_gap``; with a golden,
    ``Golden.gap``, and where our first is not among its top ids, a mismatch)."""
    def run() -> Result:
        ours, gaps = Session(lm), []
        if golden is not None:
            def logits(history):
                row = ours.logits(history)
                gaps.append(golden.gap(len(history) - golden.prompt_len, row))
                return row
            results, source = teacher_forced(golden, logits), "golden"
        else:
            # The reference's whole run first, then ours: alternating the two on one model
            # re-ran both from the first token at every step (each session's caches held
            # the other's tokens), 9 minutes on SmolLM2.
            ref = reference or Trajectory(lm, prompt, steps)
            rows, n = ref.logits, len(prompt)
            results = []
            for i in range(steps):
                row = ours.logits(ref.tokens[: n + i])
                results.append(divergence(rows[i], row))
                gaps.append(tie_gap(rows[i], int(np.argmax(row))))
            source = "reference()"
        stats = kl_stats(results)
        ties = [g for (_, top1), g in zip(results, gaps)
                if not top1 and tie > 0 and g is not None and g <= tie]
        stats["top1_mismatches"] -= len(ties)
        stats["top1_ties"] = len(ties)
        over = [f"{k} {stats[k]:.3g} > {b:.3g}" for k, b in bounds.items()
                if not stats[k] <= b]  # NaN fails too
        if stats["top1_mismatches"] and "top1_mismatches" not in bounds:  # else bounded above
            over.append(f"{stats['top1_mismatches']} top-1 mismatches")
        figure = (f"vs {source}, {len(results)} steps: mean {stats['mean']:.3g}, p90 "
                  f"{stats['p90']:.3g}, max {stats['max']:.3g}, top-1 mismatches "
                  f"{stats['top1_mismatches']}")
        if ties:
            figure += (f" (and {len(ties)} tie{'s' if len(ties) > 1 else ''}: our first within "
                       f"{max(ties):.3g} nats of the reference's, at most {tie:g} under "
                       "reduced precision)")
        if over:
            figure += " — " + "; ".join(over)
        return Result(f"KL vs {source}", not over, figure, {**stats, "source": source})
    return _timed(run)


def float64_against(lm: CausalLM, golden: Golden, bounds: dict[str, float],
                    steps: int | None = None) -> Result:
    """Our float64 ``reference()`` against transformers' model run in float64 (the
    golden's float64 rows), teacher-forced on the golden's tokens: KL(transformers || ours)
    over its first ``steps`` (default all) mean and max within ``bounds`` (``mean``,
    ``max``: a float64 gate, far below float32's spread, so a semantic
    error too small for the float32 KL, an epsilon 100x off, fails here), and the largest
    |log-probability difference| over the golden's top tokens.

    Raises:
        GoldenError: the golden holds no float64 rows.
    """
    def run() -> Result:
        ours = Session(lm, reference=True)
        kls, diffs, n = [], [], golden.steps if steps is None else min(steps, golden.steps)
        for i in range(n):
            kl, diff = golden.divergence64(i, ours.logits(golden.history(i)))
            kls.append(kl)
            diffs.append(diff)
        mean, worst = float(np.mean(kls)), float(np.max(kls))
        stats = {"mean": mean, "max": worst}
        over = [f"{k} {stats[k]:.3g} > {b:.3g}" for k, b in bounds.items()
                if not stats[k] <= b]  # NaN fails too
        figure = (f"float64 reference vs transformers float64, {n} steps: KL mean "
                  f"{mean:.3g}, max {worst:.3g} (gate mean {bounds['mean']:.3g}, max "
                  f"{bounds['max']:.3g}), max |log-prob diff| {max(diffs):.3g}")
        if over:
            figure += " — " + "; ".join(over)
        return Result("float64 KL vs golden", not over, figure,
                      {**stats, "gate": dict(bounds), "max_logprob_diff": max(diffs),
                       "steps": n})
    return _timed(run)


def determinism(lm: CausalLM, prompts: list[list[int]], steps: int = 4, rounds: int = 3) -> Result:
    """Two prompts alternated over ``rounds``: every run's logits bitwise equal to the first
    run of its prompt."""
    def greedy_logits(prompt):
        s, history, rows = Session(lm), list(prompt), []
        for _ in range(steps):
            rows.append(s.logits(history).copy())
            history.append(int(np.argmax(rows[-1])))
        return np.stack(rows)

    def run() -> Result:
        first, differ = [None] * len(prompts), 0
        for r in range(rounds * len(prompts)):
            p = r % len(prompts)
            logits = greedy_logits(prompts[p])
            if first[p] is None:
                first[p] = logits
            elif logits.tobytes() != first[p].tobytes():
                differ += 1
        total = (rounds - 1) * len(prompts)
        return Result("determinism", differ == 0, f"{differ}/{total} runs differ bitwise",
                      {"differing_runs": differ, "runs": total})
    return _timed(run)


def chat_turn(lm: CausalLM, history: list[int], turn: list[int], steps: int = 2) -> Result:
    """A history extended by a turn runs from the turn's first token (or the earlier
    position the model allows: ``CausalLM.resume_at``) and its logits equal, bit for bit, a
    fresh run of the whole."""
    def run() -> Result:
        def greedy(session, tokens):
            rows = []
            for _ in range(steps):
                rows.append(session.logits(tokens).copy())
                tokens = tokens + [int(np.argmax(rows[-1]))]
            return np.stack(rows)

        fresh = greedy(Session(lm), history + turn)
        chat = Session(lm)
        chat.logits(history)
        chat.calls.clear()
        # Positions count the model's prefix too (a session runs it before every history).
        # Asked before the turn runs: recurrent states keep copies of the positions held now.
        held = len(lm.config.prefix) + len(history)
        reused = lm.resume_at(held, held)
        resumed = greedy(chat, history + turn)
        ran = sum(rows for kind, _, rows in chat.calls if kind == "prompt")
        same = resumed.tobytes() == fresh.tobytes()
        figure = (f"resumed at {chat.calls[0][1]} of {held} held, ran {ran} tokens"
                  + ("" if reused == held else
                     f" (the prompt chunk's rows are not computed alone here: from the chunk "
                     f"boundary)") + f"; logits {'bitwise equal' if same else 'DIFFER'}")
        return Result("chat turn", same and chat.calls[0][1] == reused, figure,
                      {"resumed_at": chat.calls[0][1], "ran": ran, "bitwise": same})
    return _timed(run)


def chunked_vs_decode(lm: CausalLM, tokens: list[int], bound: float, tie: float = 0.0
                      ) -> Result:
    """The prompt chunk against one token at a time (decode steps) on the same tokens: the
    last logits within KL ``bound``, the same token first (with ``tie``, as
    ``greedy_match``'s: or one within ``tie`` nats of the chunk's first: the two run at
    other precisions where the prefill and decode weights differ). Not run
    where a layer's rows see their whole call
    (``attention.sees`` call): one token at a time is then another computation, in
    transformers too, and the golden judges the calls a session makes."""
    if any(lo.attention.sees == "call" for lo in lm.config.layers):
        return Result("chunked = decode", True, "not applicable: rows see their whole call "
                      "(attention.sees call), so one token at a time computes another thing, "
                      "as in transformers; the golden judges the session's calls")

    def run() -> Result:
        chunked = Session(lm).logits(tokens).copy()
        one = Session(lm)
        for n in range(1, len(tokens) + 1):
            logits = one.logits(tokens[:n])
        kl, top1 = divergence(chunked, logits)
        ok, said, gap = _top1_said(chunked, logits, top1, tie)
        return Result("chunked = decode", bool(kl <= bound) and ok,
                      f"KL {kl:.3g} (bound {bound:.3g}), top-1 {said}",
                      {"kl": kl, "top1": top1, "gap": gap})
    return _timed(run)


def deep_decode(lm: CausalLM, prompt: list[int], position: int, bound: float,
                tie: float = 0.0) -> Result:
    """A decode step at ``position`` (near ``max_seq_len``) against ``reference()``, every
    earlier cache row filled by repeating the compiled prompt's keys and values in both;
    within KL ``bound``, the same first token (or, with ``tie``, one within ``tie`` nats
    of the reference's, as ``greedy_match``'s)."""
    def run() -> Result:
        session = Session(lm)
        token = int(np.argmax(session.logits(prompt)))
        n = len(prompt)
        lm.reserve(position + 1)  # the caches grown to the position, as a sequence grows them
        for state in lm.recurrent_states:
            # A recurrent state holds no positions: the prompt's, as both runs read it.
            lm.reference_states.setdefault(id(state), np.zeros(state.shape))[...] = state.array
        for kind in ("compiled", "reference"):
            lm.snapshots.place(kind, position)
        for _, state in lm.named_states():
            if state.recurrent:
                continue
            held = state.array[:, :min(n, state.capacity)].copy()
            # Positions 0 .. position - 1, or a ring's last ``ring`` of them in their rows.
            lo = 0 if state.ring is None else max(0, position - state.ring)
            rows = rows_of(lo, position - lo, state.ring)
            reps = -(-position // held.shape[1])
            filled = np.tile(held, (1, reps, 1))[:, lo:position]
            state.array[:, rows] = filled
            # The reference's cache holds the very same rows: no float64 prompt run to fill
            # it first (every row of it would be overwritten here).
            mirror = lm.reference_states.setdefault(id(state), np.zeros(state.shape, np.float64))
            mirror[:, rows] = widen_bfloat16(filled) if filled.dtype == np.uint16 else filled
        lm.caches.forget()
        got, _ = lm.decode_step(token=token, position=position)
        got = np.array(got)
        want, _ = lm.decode_step.reference(token=token, position=position)
        kl, top1 = divergence(want, got)
        ok, said, gap = _top1_said(want, got, top1, tie)
        return Result(f"deep decode at {position}", bool(kl <= bound) and ok,
                      f"KL {kl:.3g} (bound {bound:.3g}), top-1 {said}",
                      {"kl": kl, "top1": top1, "gap": gap, "position": position})
    return _timed(run)


def call_keywords(masks: list | None, k: int) -> dict:
    """Probe ``k``'s call keywords: its global attention mask where ``masks`` holds one."""
    return {} if masks is None else {"global_attention_mask": masks[k]}


def embedding_checks(version, probes: list[tuple[np.ndarray, np.ndarray]],
                     golden: list[np.ndarray] | None, atol: float,
                     checked, masks: list | None = None) -> list[Result]:
    """An encoder's checks on ``probes`` (ids, token types; ``masks``: each probe's global
    attention mask, None: none): every step against its operator (``checked``, the version
    compiled with ``check=True``), compiled against ``reference()``, against transformers'
    embeddings (``golden``, one per probe) within ``atol``, and two runs bitwise equal."""
    def per_step() -> Result:
        try:
            for k, (ids, types) in enumerate(probes):
                checked(ids, types, **call_keywords(masks, k))
        except CheckError as e:
            return Result("per-step check", False, str(e))
        return Result("per-step check", True, f"{len(checked.plan.checked)} steps within tolerance")

    def against(name: str, wants: list[np.ndarray], bound: float) -> Result:
        got = [np.array(version(i, t, **call_keywords(masks, k))).reshape(-1)
               for k, (i, t) in enumerate(probes)]
        wants = [np.asarray(w).reshape(-1) for w in wants]
        errors = [float(np.abs(g - w).max()) for g, w in zip(got, wants)]
        cosines = [float(np.dot(g, w) / (np.linalg.norm(g) * np.linalg.norm(w)))
                   for g, w in zip(got, wants)]
        worst = max(errors)
        return Result(name, worst <= bound,
                      f"{len(probes)} texts: max |error| {worst:.3g} (bound {bound:.3g}), "
                      f"min cosine {min(cosines):.8f}", {"max_error": worst, "min_cosine": min(cosines)})

    def determinism() -> Result:
        runs = list(enumerate(probes))
        first = [np.array(version(i, t, **call_keywords(masks, k))) for k, (i, t) in runs]
        again = [np.array(version(i, t, **call_keywords(masks, k))) for k, (i, t) in runs[::-1]][::-1]
        differ = sum(a.tobytes() != b.tobytes() for a, b in zip(first, again))
        return Result("determinism", differ == 0, f"{differ}/{len(probes)} runs differ bitwise")

    results = [_timed(per_step),
               _timed(lambda: against("compiled = reference()",
                                      [version.reference(i, t, **call_keywords(masks, k))
                                       for k, (i, t) in enumerate(probes)], atol))]
    if golden is not None:
        results.append(_timed(lambda: against("embeddings vs golden", golden, atol)))
    results.append(_timed(determinism))
    return results


def hidden_states_against(version, probes: list[tuple[np.ndarray, np.ndarray]],
                          wants: list[np.ndarray], atol: float,
                          masks: list | None = None) -> Result:
    """An encoder's last hidden states (``version`` compiled with pooling ``none``) on
    ``probes`` against transformers' (``wants``, ``(rows, hidden)`` each): the largest
    absolute error within ``atol``, and every row's cosine."""
    def run() -> Result:
        errors, cosines = [], []
        for k, ((ids, types), want) in enumerate(zip(probes, wants)):
            got = np.asarray(version(ids, types, **call_keywords(masks, k)), np.float64)
            want = np.asarray(want, np.float64)
            if got.shape != want.shape:
                return Result("hidden states vs golden", False, f"shape {got.shape}, the "
                              f"golden's {want.shape}")
            errors.append(float(np.abs(got - want).max()))
            cosines.append(float((np.sum(got * want, 1) / (np.linalg.norm(got, axis=1)
                                                           * np.linalg.norm(want, axis=1))).min()))
        worst = max(errors)
        return Result("hidden states vs golden", worst <= atol,
                      f"{len(probes)} texts, every row: max |error| {worst:.3g} (bound "
                      f"{atol:.3g}), min cosine {min(cosines):.8f}",
                      {"max_error": worst, "min_cosine": min(cosines)})
    return _timed(run)


def float64_encoder_against(states, pooled, probes: list[tuple[np.ndarray, np.ndarray]],
                            hidden64: list[np.ndarray], pooled64: list[np.ndarray] | None,
                            bound: float, masks: list | None = None) -> Result:
    """An encoder's float64 ``reference()`` against transformers' encoder run in float64
    (the golden's ``hidden64`` ``(rows, hidden)`` and ``pooled64`` ``(hidden,)`` per
    probe): the largest absolute error of the last hidden states (``states``, a version of
    pooling ``none``) and of the pooled embeddings (``pooled``, the golden's pooling) within
    ``bound``, a float64 gate far below float32's spread."""
    def run() -> Result:
        hidden_err, pooled_err = 0.0, 0.0
        for i, (ids, types) in enumerate(probes):
            got = np.asarray(states.reference(ids, types, **call_keywords(masks, i)), np.float64)
            want = np.asarray(hidden64[i], np.float64)
            if got.shape != want.shape:
                return Result("float64 vs golden", False, f"hidden states {got.shape}, the "
                              f"golden's {want.shape}")
            hidden_err = max(hidden_err, float(np.abs(got - want).max()))
            if pooled64 is not None:
                p = np.asarray(pooled.reference(ids, types, **call_keywords(masks, i)),
                               np.float64).reshape(-1)
                pooled_err = max(pooled_err, float(np.abs(p - pooled64[i].reshape(-1)).max()))
        worst = max(hidden_err, pooled_err)
        figure = (f"float64 reference vs transformers float64, {len(probes)} texts: max |hidden "
                  f"error| {hidden_err:.3g}, max |pooled error| {pooled_err:.3g} (gate "
                  f"{bound:.3g})")
        return Result("float64 vs golden", worst <= bound, figure,
                      {"hidden_max_error": hidden_err, "pooled_max_error": pooled_err,
                       "gate": bound})
    return _timed(run)


def _softmax_kl(want: np.ndarray, got: np.ndarray) -> float:
    """The largest KL(want || got) of the rows' softmax (float64), a row ``(size,)`` alone
    counting as one."""
    want, got = np.atleast_2d(want), np.atleast_2d(got)
    p = want - want.max(axis=1, keepdims=True)
    p = p - np.log(np.exp(p).sum(axis=1, keepdims=True))
    q = got - got.max(axis=1, keepdims=True)
    q = q - np.log(np.exp(q).sum(axis=1, keepdims=True))
    return float((np.exp(p) * (p - q)).sum(axis=1).max())


def head_logits_against(version, probes: list[tuple[np.ndarray, np.ndarray]],
                        wants: list[np.ndarray], atol: float,
                        wants64: list[np.ndarray] | None = None, bound64: float | None = None,
                        masks: list | None = None) -> Result:
    """An encoder's task-head scores (``version`` compiled with ``head``) on ``probes``
    against transformers' ``logits`` of its ``*For<Task>`` class (``wants``: ``(rows,
    size)`` or ``(size,)`` each): the largest absolute error within ``atol``, the largest KL
    of their softmax over a row (fill-mask's vocabulary, the classes), the rows whose top
    score differs; and, with ``wants64``, the float64 ``reference()`` against transformers'
    float64 logits within ``bound64``."""
    def run() -> Result:
        error, kl, flips, error64, rows = 0.0, 0.0, 0, 0.0, 0
        for k, ((ids, types), want) in enumerate(zip(probes, wants)):
            got = np.asarray(version(ids, types, **call_keywords(masks, k)), np.float64)
            want = np.asarray(want, np.float64)
            if got.shape != want.shape:
                return Result("head logits vs golden", False, f"shape {got.shape}, the "
                              f"golden's {want.shape}")
            error = max(error, float(np.abs(got - want).max()))
            kl = max(kl, _softmax_kl(want, got))
            flips += int((np.atleast_2d(got).argmax(1) != np.atleast_2d(want).argmax(1)).sum())
            rows += np.atleast_2d(want).shape[0]
            if wants64 is not None:
                ref = np.asarray(version.reference(ids, types, **call_keywords(masks, k)),
                                 np.float64)
                error64 = max(error64, float(np.abs(ref - wants64[k]).max()))
        passed = error <= atol and flips == 0 and (wants64 is None or error64 <= bound64)
        figure = (f"{len(probes)} texts, {rows} rows: max |error| {error:.3g} (bound "
                  f"{atol:.3g}), max KL {kl:.3g}, {flips} top-1 mismatches")
        numbers = {"max_error": error, "max_kl": kl, "top1_mismatches": flips}
        if wants64 is not None:
            figure += f"; float64 max |error| {error64:.3g} (gate {bound64:.3g})"
            numbers["float64_max_error"] = error64
        return Result("head logits vs golden", passed, figure, numbers)
    return _timed(run)


NOISE_ULPS = 64  # float32 ulps (of the largest selection value) two routers may differ by


def routing_against(lm: CausalLM, golden: Golden) -> Result:
    """Our float64 ``reference()``'s routers against transformers' (the golden's
    ``routing``), on the golden's last history as one prompt: at every position and router,
    the same experts chosen. A different choice counts as a tie, not a mismatch, where our
    choice is a top-k of transformers' own selection values once each may move by the
    noise between the two (the largest difference of the two sides' selection values at
    that position: float32's error against float64's, carried through the layers before;
    at most ``NOISE_ULPS`` float32 ulps of the largest value, past which the two disagree
    for another reason than rounding), ``operators.router.tied_choice``; the rest are
    mismatches, and fail."""
    def run() -> Result:
        history = [int(t) for t in golden.tokens]
        captured: list = []
        refs = [v._reference for v in (lm.prompt_chunk, lm.decode_step)]
        for r in refs:
            r.capture = ({"router"}, captured)
        try:
            Session(lm, reference=True).logits(history)
        finally:
            for r in refs:
                r.capture = None
        order: dict[str, list] = {}
        for where, ins, out, attrs in captured:
            order.setdefault(where, []).append((ins, out, attrs))
        theirs = golden.routing or []
        if len(order) != len(theirs):
            return Result("routing vs golden", False, f"the model has {len(order)} routers, the "
                          f"golden recorded {len(theirs)}", {"routers": len(order)})
        op = Router()
        same = ties = wrong = 0
        worst: tuple[float, str] = (0.0, "")
        for (where, calls), (their_chosen, their_logits) in zip(order.items(), theirs):
            attrs = calls[0][2]
            x = np.concatenate([c[0][0] for c in calls])
            ours = np.concatenate([c[1] for c in calls])
            n = min(len(x), len(their_chosen))
            weight, bias, selection = (calls[0][0] + [None] * 5)[1:4]
            m_ours = op.selection(x[:n], weight, bias, selection, **attrs)
            logits = np.asarray(their_logits[:n], np.float64)
            if np.all(logits >= 0) and np.allclose(logits.sum(-1), 1.0, atol=1e-5):
                logits = np.log(np.maximum(logits, 1e-300))  # probabilities recorded
            m_theirs = op.selection(logits, np.eye(logits.shape[1]), None, selection, **attrs)
            for p in range(n):
                mine = np.rint(ours[p, 0]).astype(np.int64)
                if set(mine.tolist()) == set(int(e) for e in their_chosen[p]):
                    same += 1
                    continue
                # The two sides' disagreement, up to float32's: a model whose scores stand
                # further apart than float32's error is wrong, not tied (measured on the
                # first toys: at most 2.2e-7 of values below 1; a wrong clamp order: 3e-2).
                cap = NOISE_ULPS * EPS32 * (1.0 + float(np.max(np.abs(m_theirs[p]))))
                noise = min(float(np.max(np.abs(m_ours[p] - m_theirs[p]))), cap)
                if attrs.get("sparsemixer") is None and tied_choice(
                        m_theirs[p], np.full(m_theirs.shape[1], noise), mine, len(mine),
                        attrs.get("groups"), attrs.get("group_score", "top2")):
                    ties += 1
                else:
                    wrong += 1
                    worst = max(worst, (noise, f"{where} at position {p}: ours "
                                        f"{sorted(mine.tolist())}, transformers' "
                                        f"{sorted(int(e) for e in their_chosen[p])}"))
        total = same + ties + wrong
        figure = (f"{len(order)} routers x {total // max(1, len(order))} positions: "
                  f"{same} choices the same, {ties} ties within float32's noise, {wrong} "
                  "mismatches")
        if wrong:
            figure += f" (first: {worst[1]})"
        return Result("routing vs golden", not wrong, figure,
                      {"routers": len(order), "same": same, "ties": ties, "mismatches": wrong})
    return _timed(run)

