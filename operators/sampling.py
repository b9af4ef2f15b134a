"""Drawing the next token from a row of logits: greedy, or temperature, top-k, top-p.

The order is transformers' ``generate``: temperature, then top-k, then top-p, then a draw
from the softmax of what is kept. Draws come from ``numpy.random.default_rng(seed)``, one
uniform per token, so a seed replays the same tokens from the same logits.
"""

from __future__ import annotations

import numpy as np


class Sampler:
    """Draws token ids from logits.

    Args:
        temperature: 0 is greedy (argmax, the lowest id on ties); otherwise logits are
            divided by it.
        top_k: keep the ``top_k`` largest logits and any tied with the k-th (None or 0: all).
        top_p: keep the smallest set of most likely tokens whose probability reaches
            ``top_p`` (1.0: all), always at least one.
        seed: the generator's seed.

    Raises:
        ValueError: a negative temperature, a negative top_k, or top_p outside (0, 1].
    """

    def __init__(self, temperature: float = 0.0, top_k: int | None = None,
                 top_p: float = 1.0, seed: int = 0):
        if not np.isfinite(temperature) or temperature < 0:
            raise ValueError(f"temperature {temperature} is not a finite number >= 0 (0 is greedy)")
        if top_k is not None and top_k < 0:
            raise ValueError(f"top_k {top_k} is negative; 0 or None keeps every token")
        if not (np.isfinite(top_p) and 0.0 < top_p <= 1.0):
            raise ValueError(f"top_p {top_p} is outside (0, 1]")
        self.temperature, self.top_k, self.top_p = float(temperature), top_k or None, float(top_p)
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        """The distribution a token is drawn from, ``(vocab,)`` float64 summing to 1."""
        x = np.asarray(logits, np.float64).reshape(-1)
        probs = np.zeros_like(x)
        if self.greedy:
            probs[int(np.argmax(x))] = 1.0
            return probs
        # Shifted by the largest before dividing: a tiny temperature (1e-320) then gives 0
        # and -inf, not inf - inf = NaN, so every temperature accepted draws from a finite
        # distribution (at the limit, the argmax). The softmax is the same either way.
        with np.errstate(over="ignore"):  # a difference over a tiny temperature: -inf
            x = (x - x.max()) / self.temperature
        order = np.argsort(-x, kind="stable")
        if self.top_k is not None and self.top_k < order.size:
            # transformers' TopKLogitsWarper removes only what is below the k-th largest:
            # tokens tied with it stay.
            kth = x[order[self.top_k - 1]]
            order = order[x[order] >= kth]
        kept = x[order]
        p = np.exp(kept - kept[0])
        p /= p.sum()
        if self.top_p < 1.0:
            # transformers' TopPLogitsWarper drops the tokens whose cumulative probability,
            # least likely first, stays within 1 - top_p: the kept set reaches top_p.
            keep = int(np.searchsorted(np.cumsum(p), self.top_p, side="left")) + 1
            order, p = order[:keep], p[:keep] / p[:keep].sum()
        probs[order] = p
        return probs

    def __call__(self, logits: np.ndarray) -> int:
        """One token id drawn from ``logits`` ``(vocab,)``."""
        if self.greedy:
            return int(np.argmax(np.asarray(logits).reshape(-1)))
        probs = self.probabilities(logits)
        cdf = np.cumsum(probs)
        u = self.rng.random() * cdf[-1]
        return int(min(np.searchsorted(cdf, u, side="right"), probs.size - 1))
