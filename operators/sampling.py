"""Drawing the next token from a row of logits, as transformers' ``generate`` does.

The scores pass through the rules in transformers' order (``GenerationMixin.
_get_logits_processor``): the repetition penalty (a logits processor, applied greedy or not),
then the frequency and presence penalties (not in transformers: the OpenAI/vLLM rules,
applied where vLLM applies them, after the repetition penalty), then, when sampling, the warpers temperature,
top-k, top-p and min-p, and a draw from the softmax of what is kept. Greedy (temperature 0,
transformers' ``do_sample=False``) is the argmax of the penalized scores: warpers do not
apply. Draws come from ``numpy.random.default_rng(seed)``, one uniform per token, so a seed
replays the same tokens from the same logits; no seed draws a fresh one (``seed`` says which).
"""

from __future__ import annotations

import secrets
from typing import Iterable

import numpy as np


def repetition_penalty(scores: np.ndarray, seen: Iterable[int], penalty: float) -> np.ndarray:
    """``scores`` ``(vocab,)`` with every token of ``seen`` penalized once however often it
    occurs: a negative score multiplied by ``penalty``, any other divided by it, as
    transformers' RepetitionPenaltyLogitsProcessor (CTRL's rule, arXiv:1909.05858). A copy.
    Ids past the scores (read by the embedding, not drawn by a narrow head) have no score."""
    out = np.array(scores, np.float64)
    ids = np.unique(np.asarray(list(seen), np.int64))
    ids = ids[ids < out.shape[-1]]
    if ids.size and penalty != 1.0:
        s = out[ids]
        out[ids] = np.where(s < 0, s * penalty, s / penalty)
    return out


def presence_penalty(scores: np.ndarray, generated: Iterable[int], penalty: float) -> np.ndarray:
    """``scores`` ``(vocab,)`` less ``penalty`` for every distinct token of ``generated`` (the
    tokens drawn so far, not the prompt's), as the OpenAI API defines it and vLLM computes it
    (``vllm/model_executor/layers/utils.py`` ``apply_penalties``: ``logits -=
    presence_penalties * output_mask``). A copy."""
    out = np.array(scores, np.float64)
    ids = np.unique(np.asarray(list(generated), np.int64))
    if ids.size and penalty != 0.0:
        out[ids] -= penalty
    return out


def frequency_penalty(scores: np.ndarray, generated: Iterable[int], penalty: float) -> np.ndarray:
    """``scores`` ``(vocab,)`` less ``penalty`` times how often each token occurs in
    ``generated`` (the tokens drawn so far), as the OpenAI API defines it and vLLM computes
    it (``apply_penalties``: ``logits -= frequency_penalties * output_bin_counts``, before
    the presence penalty). A copy."""
    out = np.array(scores, np.float64)
    ids, counts = np.unique(np.asarray(list(generated), np.int64), return_counts=True)
    keep = ids < out.shape[-1]
    if ids.size and penalty != 0.0:
        out[ids[keep]] -= penalty * counts[keep]
    return out


def top_k_filter(scores: np.ndarray, k: int) -> np.ndarray:
    """``scores`` with every one below the ``k``-th largest set to -inf (ties with it stay), as
    transformers' TopKLogitsWarper (``min_tokens_to_keep`` 1). A copy."""
    out = np.array(scores, np.float64)
    if k < out.size:
        kth = np.partition(out, out.size - k)[out.size - k]
        out[out < kth] = -np.inf
    return out


def top_p_filter(scores: np.ndarray, p: float) -> np.ndarray:
    """``scores`` with the least likely tokens set to -inf while their cumulative probability,
    least likely first, stays within ``1 - p``; the most likely always stays. As transformers'
    TopPLogitsWarper. Among tokens tied at the boundary the lower ids go first (the warper's
    torch.sort is unstable: which of equal tokens it drops is arbitrary). A copy."""
    out = np.array(scores, np.float64)
    order = np.argsort(out, kind="stable")  # ascending, as the warper sorts
    probs = _softmax(out[order])
    remove = np.cumsum(probs) <= 1.0 - p
    remove[-1] = False
    out[order[remove]] = -np.inf
    return out


def min_p_filter(scores: np.ndarray, min_p: float) -> np.ndarray:
    """``scores`` with every token less likely than ``min_p`` times the most likely one set to
    -inf (the most likely always stays), as transformers' MinPLogitsWarper (arXiv:2407.01082,
    ``min_tokens_to_keep`` 1). A copy."""
    out = np.array(scores, np.float64)
    probs = _softmax(out)
    remove = probs < min_p * probs.max()
    remove[int(np.argmax(out))] = False
    out[remove] = -np.inf
    return out


def _softmax(x: np.ndarray) -> np.ndarray:
    finite = np.isfinite(x)
    e = np.zeros_like(x)
    e[finite] = np.exp(x[finite] - x[finite].max())
    return e / e.sum()


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """The log-probabilities ``(vocab,)`` float64 of the softmax of ``logits``."""
    x = np.asarray(logits, np.float64).reshape(-1)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def fresh_seed() -> int:
    """A seed from the operating system's entropy, in ``[0, 2**32)``."""
    return secrets.randbelow(2**32)


class Sampler:
    """Draws token ids from logits.

    Args:
        temperature: 0 is greedy (argmax of the penalized scores, the lowest id on ties);
            otherwise scores are divided by it.
        top_k: keep the ``top_k`` largest scores and any tied with the k-th (None or 0: all).
        top_p: keep the smallest set of most likely tokens whose probability reaches
            ``top_p`` (1.0: all), always at least one.
        seed: the generator's seed; None draws a fresh one (``fresh_seed``), kept in ``seed``.
        min_p: keep the tokens at least ``min_p`` times as likely as the most likely one
            (None: all; applied after temperature, top-k and top-p, as transformers).
        repetition_penalty: > 0; 1.0 is none. Over ``seen``, the whole sequence (prompt and
            drawn tokens), as transformers penalizes ``input_ids``.
        presence_penalty: subtracted once from every token drawn so far (``generated``);
            0.0 is none, a negative value favours them.
        frequency_penalty: subtracted from every token drawn so far as many times as it was
            drawn (``generated``), before the presence penalty; 0.0 is none.

    Raises:
        TypeError: a setting that is not a real number (a bool, text), a top_k or seed that
            is not a whole number.
        ValueError: a negative or non-finite temperature, a negative top_k, top_p outside
            (0, 1], min_p outside [0, 1], a repetition penalty that is not a finite number
            > 0, a presence or frequency penalty that is not finite, a seed outside
            [0, 2**64).
    """

    def __init__(self, temperature: float = 0.0, top_k: int | None = None,
                 top_p: float = 1.0, seed: int | None = 0, *, min_p: float | None = None,
                 repetition_penalty: float = 1.0, presence_penalty: float = 0.0,
                 frequency_penalty: float = 0.0):
        # Types first: a bool is an int to Python and a str compares with nothing, so
        # either would otherwise pass as a number or fail deep in numpy.
        for name, value in (("temperature", temperature), ("top_p", top_p), ("min_p", min_p),
                            ("repetition_penalty", repetition_penalty),
                            ("presence_penalty", presence_penalty),
                            ("frequency_penalty", frequency_penalty)):
            if value is not None and (isinstance(value, (bool, np.bool_)) or
                                      not isinstance(value, (int, float, np.integer, np.floating))):
                raise TypeError(f"{name} {value!r} is not a number")
        for name, value in (("top_k", top_k), ("seed", seed)):
            if value is not None and (isinstance(value, (bool, np.bool_)) or
                                      not isinstance(value, (int, np.integer))):
                raise TypeError(f"{name} {value!r} is not a whole number")
        if not np.isfinite(temperature) or temperature < 0:
            raise ValueError(f"temperature {temperature} is not a finite number >= 0 (0 is greedy)")
        if top_k is not None and top_k < 0:
            raise ValueError(f"top_k {top_k} is negative; 0 or None keeps every token")
        if not (np.isfinite(top_p) and 0.0 < top_p <= 1.0):
            raise ValueError(f"top_p {top_p} is outside (0, 1]")
        if min_p is not None and not (np.isfinite(min_p) and 0.0 <= min_p <= 1.0):
            raise ValueError(f"min_p {min_p} is outside [0, 1]")
        if not (np.isfinite(repetition_penalty) and repetition_penalty > 0):
            raise ValueError(f"repetition_penalty {repetition_penalty} is not a finite number "
                             "> 0 (1.0 is none)")
        for name, value in (("presence_penalty", presence_penalty),
                            ("frequency_penalty", frequency_penalty)):
            if not np.isfinite(value):
                raise ValueError(f"{name} {value} is not a finite number (0.0 is none)")
        if seed is None:
            seed = fresh_seed()
        if not 0 <= seed < 2**64:
            raise ValueError(f"seed {seed} is outside [0, 2**64)")
        self.temperature, self.top_k, self.top_p = float(temperature), top_k or None, float(top_p)
        self.min_p = None if min_p is None else float(min_p)
        self.repetition_penalty = float(repetition_penalty)
        self.presence_penalty = float(presence_penalty)
        self.frequency_penalty = float(frequency_penalty)
        self.seed = int(seed)
        self.rng = np.random.default_rng(self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Whether the scores depend on the tokens seen, not on the logits alone."""
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    def scores(self, logits: np.ndarray, seen: Iterable[int] = (),
               generated: Iterable[int] = ()) -> np.ndarray:
        """The processed scores ``(vocab,)`` float64 a token is drawn from (the softmax) or
        greedy takes the argmax of: -inf where a warper removed a token. What transformers'
        ``generate`` holds after its logits processors, as ``output_scores`` returns them.

        Args:
            logits: ``(vocab,)`` the model's logits.
            seen: every token of the sequence so far (for the repetition penalty).
            generated: the tokens drawn so far (for the frequency and presence penalties).
        """
        x = np.asarray(logits, np.float64).reshape(-1)
        if self.repetition_penalty != 1.0:
            x = repetition_penalty(x, seen, self.repetition_penalty)
        if self.frequency_penalty != 0.0:
            x = frequency_penalty(x, generated, self.frequency_penalty)
        if self.presence_penalty != 0.0:
            x = presence_penalty(x, generated, self.presence_penalty)
        if self.greedy:
            return x
        if self.temperature != 1.0:
            with np.errstate(over="ignore", invalid="ignore"):
                divided = x / self.temperature
            if not np.isfinite(divided[np.isfinite(x)]).all():
                # A tiny temperature (1e-320) overflows; shifted by the largest first it
                # gives 0 and -inf, not inf - inf = NaN, so every temperature accepted draws
                # from a finite distribution (at the limit, the argmax). The softmax is
                # the same either way; unshifted, the scores are transformers' own.
                with np.errstate(over="ignore"):
                    divided = (x - x[np.isfinite(x)].max()) / self.temperature
            x = divided
        if self.top_k is not None:
            x = top_k_filter(x, self.top_k)
        if self.top_p < 1.0:
            x = top_p_filter(x, self.top_p)
        if self.min_p is not None:
            x = min_p_filter(x, self.min_p)
        return x

    def probabilities(self, logits: np.ndarray, seen: Iterable[int] = (),
                      generated: Iterable[int] = ()) -> np.ndarray:
        """The distribution a token is drawn from, ``(vocab,)`` float64 summing to 1 (one-hot
        at the argmax when greedy)."""
        x = self.scores(logits, seen, generated)
        if self.greedy:
            probs = np.zeros_like(x)
            probs[int(np.argmax(x))] = 1.0
            return probs
        return _softmax(x)

    def __call__(self, logits: np.ndarray, seen: Iterable[int] = (),
                 generated: Iterable[int] = ()) -> int:
        """One token id drawn from ``logits`` ``(vocab,)``; ``seen`` and ``generated`` as
        ``scores`` takes them (unused without penalties)."""
        if self.greedy and not self.penalized:
            return int(np.argmax(np.asarray(logits).reshape(-1)))
        probs = self.probabilities(logits, seen, generated)
        if self.greedy:
            return int(np.argmax(probs))
        cdf = np.cumsum(probs)
        u = self.rng.random() * cdf[-1]
        return int(min(np.searchsorted(cdf, u, side="right"), probs.size - 1))
