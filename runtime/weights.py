"""Weights drawn at a seed, for runs and checks with no checkpoint."""

from __future__ import annotations

import numpy as np

from .module import Module


def draw_weights(module: Module, seed: int) -> dict[str, np.ndarray]:
    """One float32 tensor per distinct param of ``module``, by its first dotted name.

    Matrices (and stacks of them: a mixture's experts) are normal with standard deviation
    ``1 / sqrt(in_features)`` (activations stay
    of order one through every layer, so the logits are not flat and a wrong model shows),
    embedding rows with ``1 / scale`` (of order one once the model scales them);
    vectors (norm weights, biases) are ``N(0, 0.1)``, around 1 for a gain (``Param.gain``: a
    norm that multiplies by its weight, a layer's scalar), around 0 for biases and
    ``1 + weight`` norms. Drawn in name order from
    ``numpy.random.default_rng(seed)``, so a name's tensor depends only on the seed and the
    tree. A param with a rule of its own (``Param.draw``) is drawn by it (``_drawn``): a
    recurrent mixer's ``A_log``, so the state it decays is remembered over tens of tokens.
    """
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    # A tied param is named as loading names it: by the first of its names in tree order.
    first: dict[int, tuple[str, object]] = {}
    for name, p in module.named_params():
        first.setdefault(id(p), (name, p))
    for name, p in sorted(first.values(), key=lambda item: item[0]):
        if p.draw is not None:
            t = _drawn(rng, p)
        elif len(p.shape) in (2, 3) and not p.gain:  # a (heads, size) norm weight is a gain
            # A stack of matrices (a mixture's experts, (E, out, in)) as each of its matrices.
            t = rng.standard_normal(p.shape, dtype=np.float32) / np.float32(np.sqrt(p.shape[-1]))
            if name.endswith(("embed_tokens.weight", "embed_tokens_per_layer.weight",
                              "embed_positions.weight")):
                # Rows of order one once the model scales them (Gemma's sqrt(hidden_size)):
                # larger, the residual stream is the token's own row and every layer a ripple.
                scale = abs(getattr(_module(module, name), "scale", 1.0)) or 1.0
                t *= np.float32(np.sqrt(p.shape[1]) / scale)
        else:
            t = np.float32(0.1) * rng.standard_normal(p.shape, dtype=np.float32)
            if p.gain:
                t += np.float32(1.0)
        out[name] = t
    return out


def _module(module: Module, name: str):
    node = module
    for part in name.split(".")[:-1]:
        node = node[int(part)] if isinstance(node, list) else getattr(node, part)
    return node



def _drawn(rng: np.random.Generator, p) -> np.ndarray:
    """``p`` drawn by its rule: ``("uniform", lo, hi)``, or ``("log_decay", lo, hi)``, the
    log of ``-log(u)``, ``u`` uniform in ``[lo, hi]`` (``A_log`` whose decay ``exp(-exp(A_log)
    dt)`` is ``u`` at ``dt`` 1: within [0.5, 0.99], the state is remembered over tens of
    tokens, so a state carried wrong shows).

    Raises:
        ValueError: an unknown rule.
    """
    kind, lo, hi = p.draw
    u = rng.uniform(lo, hi, p.shape)
    if kind == "uniform":
        return u.astype(np.float32)
    if kind == "log_decay":
        return np.log(-np.log(u)).astype(np.float32)
    raise ValueError(f"no draw rule {kind!r} (uniform, log_decay)")
