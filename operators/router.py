"""A mixture of experts' router: each row's experts and their weights, as transformers' routers
choose them.

One operator for every router the families write, its behaviour by attributes (never by a
family's name):

- ``score``: what each expert's logit ``l = x W^T (+ bias)`` becomes: ``softmax`` over all
  experts (Qwen2MoeTopKRouter, MixtralTopKRouter, OlmoeTopKRouter, DeepseekV2TopkRouter),
  ``sigmoid`` (DeepseekV3TopkRouter, Glm4MoeTopkRouter, Llama4Router), ``logits`` as they are.
- ``select``: which value the top-k is taken over, ``scores`` or ``logits``, plus the
  ``selection_bias`` input where given (DeepSeek V3's ``e_score_correction_bias``, added for
  the choice alone; Kolibri1TopKRouter adds it to the logits).
- ``groups``: ``(n_group, topk_group)``: the experts in ``n_group`` equal groups, only the
  ``topk_group`` groups of the highest group score eligible (``group_score`` ``top2``: the sum
  of the group's two highest selection values, DeepseekV3TopkRouter; ``max``: its highest,
  DeepseekV2TopkRouter's ``group_limited_greedy``).
- ``weights``: ``scores`` (each chosen expert's score) or ``softmax`` (a softmax over the
  chosen experts' logits alone: GptOssTopKRouter, GraniteMoeTopKRouter, JetMoeTopKGating).
- ``normalize``: None, ``sum`` (the chosen weights divided by their sum plus ``norm_eps``,
  the sum held at least ``norm_min``: DeepSeek V3's ``+ 1e-20``, ERNIE 4.5's ``moe_norm_min``
  clamp) or ``p`` (divided by their ``norm_p``-norm: DbrxFFN's ``moe_normalize_expert_weights``).
- ``scale``: the weights times it after (``routed_scaling_factor``); the ``expert_scale``
  input, where given, times each chosen expert's own (Gemma4TextRouter's ``per_expert_scale``).
- ``sparsemixer``: PhimoeTopKRouter's ``sparsemixer`` at inference, its jitter epsilon:
  two experts, each the argmax of the logits left (the first's removed for the second), its
  weight a softmax over the experts within ``2 eps`` (relative) of that max.

Output ``(n, 2, k)`` float32: row ``[r, 0]`` the chosen experts' indices (exact integers,
ascending: the order transformers' experts loop adds them in), ``[r, 1]`` their weights.

Ties: which of two experts of equal value a top-k takes is the implementation's (torch's);
the reference and a float32 kernel may part where two values lie within float32's error of
each other. ``reconcile`` accepts such a choice (``noise``), nothing else.

Not for: what the experts compute (``experts``).
"""

from __future__ import annotations

import numpy as np

from . import native
from .base import EPS32, Operator, Tolerance, as64

SCORES = ("softmax", "sigmoid", "logits")
SELECTS = ("scores", "logits")
WEIGHTS = ("scores", "softmax")
NORMALIZE = (None, "sum", "p")
GROUP_SCORES = ("top2", "max")


def _softmax(l: np.ndarray) -> np.ndarray:
    e = np.exp(l - l.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _sigmoid(l: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-l))


def _score(l: np.ndarray, score: str) -> np.ndarray:
    return _softmax(l) if score == "softmax" else _sigmoid(l) if score == "sigmoid" else l


def _group_values(m: np.ndarray, groups: int, group_score: str) -> np.ndarray:
    """Each row's group scores ``(n, groups)`` of selection values ``m`` ``(n, E)``."""
    g = m.reshape(m.shape[0], groups, -1)
    if group_score == "max":
        return g.max(axis=-1)
    top = np.sort(g, axis=-1)[..., -2:]
    return top.sum(axis=-1)


def _top(values: np.ndarray, k: int) -> np.ndarray:
    """The indices of each row's ``k`` largest values (ties: the lower index first, a stable
    choice; transformers' own is torch.topk's), unordered."""
    order = np.argsort(-values, axis=-1, kind="stable")
    return order[..., :k]


def _eligible(m: np.ndarray, groups: tuple[int, int] | None, group_score: str) -> np.ndarray:
    """``m`` with the experts outside each row's chosen groups at -inf."""
    if groups is None:
        return m
    n_group, topk_group = groups
    chosen = _top(_group_values(m, n_group, group_score), topk_group)
    keep = np.zeros((m.shape[0], n_group), bool)
    np.put_along_axis(keep, chosen, True, axis=-1)
    keep = np.repeat(keep, m.shape[1] // n_group, axis=-1)
    return np.where(keep, m, -np.inf)


def _weights(l: np.ndarray, s: np.ndarray, chosen: np.ndarray, weights: str) -> np.ndarray:
    if weights == "softmax":
        return _softmax(np.take_along_axis(l, chosen, axis=-1))
    return np.take_along_axis(s, chosen, axis=-1)


def _finish(w: np.ndarray, chosen: np.ndarray, expert_scale, normalize, norm_eps, norm_min,
            norm_p, scale) -> np.ndarray:
    if normalize == "sum":
        w = w / np.maximum(w.sum(axis=-1, keepdims=True) + norm_eps, norm_min)
    elif normalize == "p":
        w = w / np.maximum((np.abs(w) ** norm_p).sum(axis=-1, keepdims=True) ** (1.0 / norm_p),
                           norm_min)
    if scale != 1.0:
        w = w * scale
    if expert_scale is not None:
        w = w * np.asarray(expert_scale, w.dtype)[chosen]
    return w


def _sparsemixer(l: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """PhiMoE's sparsemixer at inference: chosen ``(n, 2)`` and weights ``(n, 2)``."""
    n = l.shape[0]
    rows = np.arange(n)
    first = np.argmax(l, axis=-1)
    top = l[rows, first][:, None]
    factor = np.maximum(np.abs(l), top)
    masked = np.where((top - l) / factor > 2 * eps, -np.inf, l)
    w1 = _softmax(masked)[rows, first]
    rest = l.copy()
    rest[rows, first] = -np.inf
    second = np.argmax(rest, axis=-1)
    top2 = rest[rows, second][:, None]
    factor = np.maximum(np.abs(l), top2)
    masked = np.where((top2 - l) / factor > 2 * eps, -np.inf, rest)
    w2 = _softmax(masked)[rows, second]
    return np.stack([first, second], -1), np.stack([w1, w2], -1)


class Router(Operator):
    """``x`` ``(n, H)`` and ``weight`` ``(E, H)`` (the router's linear, as stored), optional
    ``bias`` ``(E,)`` on the logits, ``selection_bias`` ``(E,)`` added for the choice alone,
    ``expert_scale`` ``(E,)`` times each chosen weight; output ``(n, 2, top_k)`` (module
    docstring: each row's experts ascending, then their weights).

    Raises:
        ValueError: an unknown score, select, weights, normalize or group score; ``top_k``
            outside 1..E; groups that do not split the experts or leave fewer than
            ``top_k`` eligible; sparsemixer with a ``top_k`` other than 2.
    """

    name = "router"
    keeps_bound = True

    def shape(self, x, weight, bias=None, selection_bias=None, expert_scale=None, top_k=1,
              score="softmax", select="scores", weights="scores", groups=None,
              group_score="top2", normalize=None, norm_eps=0.0, norm_min=0.0, norm_p=1.0,
              scale=1.0, sparsemixer=None):
        if len(x) != 2 or len(weight) != 2 or x[1] != weight[1]:
            raise ValueError(f"router: x {x} does not meet weight {weight} (experts, hidden)")
        E = weight[0]
        for name, v in (("bias", bias), ("selection_bias", selection_bias),
                        ("expert_scale", expert_scale)):
            if v is not None and tuple(v) != (E,):
                raise ValueError(f"router: {name} {v} is not ({E},)")
        for what, v, allowed in (("score", score, SCORES), ("select", select, SELECTS),
                                 ("weights", weights, WEIGHTS),
                                 ("normalize", normalize, NORMALIZE),
                                 ("group_score", group_score, GROUP_SCORES)):
            if v not in allowed:
                raise ValueError(f"router: {what} {v!r} is not one of "
                                 f"{', '.join(map(str, allowed))}")
        if not 1 <= top_k <= E:
            raise ValueError(f"router: top_k {top_k} is not within 1..{E} (the experts)")
        if groups is not None:
            n_group, topk_group = groups
            if n_group < 1 or E % n_group or not 1 <= topk_group <= n_group:
                raise ValueError(f"router: {n_group} groups of which {topk_group} are kept do "
                                 f"not split {E} experts")
            if topk_group * (E // n_group) < top_k:
                raise ValueError(f"router: {topk_group} groups of {E // n_group} experts hold "
                                 f"fewer than top_k {top_k}")
        if sparsemixer is not None and top_k != 2:
            raise ValueError(f"router: sparsemixer chooses 2 experts, not top_k {top_k}")
        return (x[0], 2, top_k)

    def _route(self, x, weight, bias, selection_bias, expert_scale, xp, attrs,
               chosen=None):
        """Logits, selection values, chosen experts (ascending) and weights in ``xp``
        (float64 or float32); ``chosen`` given: those experts' weights instead of a choice."""
        l = x @ weight.T
        if bias is not None:
            l = l + bias
        a = attrs
        if a["sparsemixer"] is not None:
            c, w = _sparsemixer(l, a["sparsemixer"])
            if chosen is not None:
                c = chosen  # a tie reconciled: the kernel's picks, the reference's weights
            order = np.argsort(c, axis=-1)
            return l, l, np.take_along_axis(c, order, -1), np.take_along_axis(w, order, -1)
        s = _score(l, a["score"])
        m = s if a["select"] == "scores" else l
        if selection_bias is not None:
            m = m + selection_bias
        if chosen is None:
            chosen = _top(_eligible(m, a["groups"], a["group_score"]), a["top_k"])
        chosen = np.sort(chosen, axis=-1)
        w = _weights(l, s, chosen, a["weights"])
        w = _finish(w, chosen, expert_scale, a["normalize"], xp(a["norm_eps"]),
                    xp(a["norm_min"]), xp(a["norm_p"]), xp(a["scale"]))
        return l, m, chosen, w

    @staticmethod
    def _attrs(top_k=1, score="softmax", select="scores", weights="scores", groups=None,
               group_score="top2", normalize=None, norm_eps=0.0, norm_min=0.0, norm_p=1.0,
               scale=1.0, sparsemixer=None):
        return dict(top_k=top_k, score=score, select=select, weights=weights, groups=groups,
                    group_score=group_score, normalize=normalize, norm_eps=norm_eps,
                    norm_min=norm_min, norm_p=norm_p, scale=scale, sparsemixer=sparsemixer)

    def reference(self, x, weight, bias=None, selection_bias=None, expert_scale=None, **attrs):
        _, _, chosen, w = self._route(as64(x), as64(weight), _opt64(bias), _opt64(selection_bias),
                                      _opt64(expert_scale), np.float64, self._attrs(**attrs))
        return np.stack([chosen.astype(np.float64), w], axis=1)

    def kernel(self, out, x, weight, bias=None, selection_bias=None, expert_scale=None,
               scratch=None, **attrs):
        with np.errstate(over="ignore"):  # exp of a large negative logit: 0, as torch's
            _, _, chosen, w = self._route(x, weight, bias, selection_bias, expert_scale,
                                          np.float32, self._attrs(**attrs))
        out[:, 0] = chosen
        out[:, 1] = w

    def scratch(self, x, weight, *rest, **attrs):
        return 3 * weight[0]

    def lower(self, out, x, weight, bias=None, selection_bias=None, expert_scale=None,
              scratch=None, **attrs):
        """Rows' routing as a native step (``_cpu_experts.h``'s ``router_run`` a row at a
        time, the same choices and float32 operations as ``kernel``; a prompt chunk's rows
        bounded by the call's); sparsemixer stays numpy's."""
        a = self._attrs(**attrs)
        if native.LIB is None or x.ndim != 2 or a["sparsemixer"] is not None \
                or not native.contiguous(out, x, weight, bias, selection_bias, expert_scale):
            return None
        groups = a["groups"] or (0, 0)
        ints = (weight.shape[0], x.shape[1], a["top_k"], SCORES.index(a["score"]),
                int(a["select"] == "logits"), int(a["weights"] == "softmax"), groups[0],
                groups[1], int(a["group_score"] == "max"), NORMALIZE.index(a["normalize"]),
                x.shape[0])
        floats = (a["norm_eps"], a["norm_min"], a["norm_p"], a["scale"])
        return native.Step(native.OP_ROUTER, (out, x, weight, scratch, bias, selection_bias,
                                              expert_scale), ints, floats, rows=10)

    def selection(self, x, weight, bias=None, selection_bias=None, **attrs):
        """The values each row's experts are chosen by ``(n, E)`` (float64): the scores or
        logits plus the selection bias; the logits under sparsemixer."""
        l, m, _, _ = self._route(as64(x), as64(weight), _opt64(bias), _opt64(selection_bias),
                                 None, np.float64, self._attrs(**attrs))
        return m

    def noise(self, x, weight, bias=None, **attrs):
        """How far each selection value ``(n, E)`` may stand from its float64 value in a
        float32 computation of it: the float32 product's error bound on each logit (linear's
        tolerance), through the score's largest slope (sigmoid 1/4; softmax ``2 s``, its
        own score times the logits' worst), plus a few float32 ulps of the value."""
        a = self._attrs(**attrs)
        x, weight = as64(x), as64(weight)
        mag = np.abs(x) @ np.abs(weight).T
        if bias is not None:
            mag = mag + np.abs(as64(bias))
        tol = 1e-6 + max(4.0, x.shape[1] / 8) * EPS32 * mag
        l, m, _, _ = self._route(x, weight, _opt64(bias), None, None, np.float64, a)
        if a["sparsemixer"] is None and a["select"] == "scores":
            if a["score"] == "sigmoid":
                tol = 0.25 * tol
            elif a["score"] == "softmax":
                tol = 2 * _softmax(l) * tol.max(axis=-1, keepdims=True)
        return tol + 8 * EPS32 * np.abs(m)

    def reconcile(self, expected, got, inputs, attrs):
        """``expected`` where the kernel chose as the reference, else (a row whose choice
        differs only among experts within ``noise`` of each other: a tie) the reference's
        weights for the kernel's choice; any other difference is left to fail."""
        x, weight, bias, selection_bias, expert_scale = (list(inputs) + [None] * 5)[:5]
        a = self._attrs(**attrs)
        picked = np.rint(got[:, 0]).astype(np.int64)
        differ = np.any(picked != np.rint(expected[:, 0]).astype(np.int64), axis=-1)
        if not differ.any() or a["sparsemixer"] is not None:
            return expected
        m = self.selection(x, weight, bias, selection_bias, **attrs)
        noise = self.noise(x, weight, bias, **attrs)
        out = expected.copy()
        for r in np.flatnonzero(differ):
            if tied_choice(m[r], noise[r], picked[r], a["top_k"], a["groups"], a["group_score"]):
                _, _, c, w = self._route(as64(x)[r:r + 1], as64(weight), _opt64(bias),
                                         _opt64(selection_bias), _opt64(expert_scale),
                                         np.float64, a, chosen=picked[r][None])
                out[r, 0], out[r, 1] = c[0], w[0]
        return out

    def tolerance(self, x, weight, *rest, **attrs):
        # Indices are exact integers (a half is far off); weights pass through a product of
        # H terms, a softmax and a normalization.
        return Tolerance(atol=1e-6, rtol=(max(4.0, x[1] / 8) + 32) * EPS32)

    def scale(self, reference, x, weight, bias=None, selection_bias=None, expert_scale=None,
              **attrs):
        a = self._attrs(**attrs)
        mag = np.abs(as64(x)) @ np.abs(as64(weight)).T
        if bias is not None:
            mag = mag + np.abs(as64(bias))
        # A weight's error follows its logit's: softmax and sigmoid slopes are at most 1 a
        # logit (times the weight itself, and the chosen logits' spread under a softmax).
        spread = mag.max(axis=-1, keepdims=True)[:, None, :]
        out = np.abs(reference) + np.abs(reference) * spread
        out[:, 0] = 0.0  # an index is exact
        if a["scale"] != 1.0 or expert_scale is not None:
            out[:, 1] *= max(1.0, abs(a["scale"])) * (
                1.0 if expert_scale is None else max(1.0, float(np.abs(as64(expert_scale)).max())))
        return out


def tied_choice(m: np.ndarray, noise: np.ndarray, chosen: np.ndarray, k: int,
                groups: tuple[int, int] | None = None, group_score: str = "top2") -> bool:
    """Whether ``chosen`` (k experts) is a top-``k`` choice of selection values ``m`` ``(E,)``
    once each is allowed to move by its ``noise``: every chosen value at least every
    unchosen eligible one less both noises, and under ``groups`` the chosen experts' groups
    a top choice of group scores the same way. What a float32 computation may pick where
    values tie within its error."""
    chosen = np.asarray(chosen, np.int64)
    if len(set(chosen.tolist())) != k:
        return False
    E = m.shape[0]
    eligible = np.ones(E, bool)
    if groups is not None:
        n_group, topk_group = groups
        size = E // n_group
        g = _group_values(m[None], n_group, group_score)[0]
        gn = np.array([np.sort(noise[i * size:(i + 1) * size])[-2:].sum() for i in range(n_group)])
        picked = sorted(set((chosen // size).tolist()))
        if len(picked) > topk_group:
            return False
        # The groups the choice used, topped up by the best others: a top choice?
        rest = [i for i in np.argsort(-g, kind="stable") if i not in picked]
        kept = picked + rest[: topk_group - len(picked)]
        out = [i for i in range(n_group) if i not in kept]
        if out and min(g[i] + gn[i] for i in kept) < max(g[i] - gn[i] for i in out):
            return False
        eligible = np.repeat(np.isin(np.arange(n_group), kept), size)
    mask = np.zeros(E, bool)
    mask[chosen] = True
    if not eligible[chosen].all():
        return False
    others = eligible & ~mask
    if not others.any():
        return True
    return bool((m[mask] + noise[mask]).min() >= (m[others] - noise[others]).max())


def _opt64(v):
    return None if v is None else as64(v)
