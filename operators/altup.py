"""Alternating updates (AltUp): several residual streams of one hidden width, of which one
runs the layer and the others are predicted and corrected from it.

Streams travel as one array ``(n, K, E)``: ``n`` rows (tokens), ``K`` streams, ``E``
hidden. As transformers' Gemma3nTextAltUp ``predict`` and ``correct`` and
Gemma3nTextModel's stream setup (``altup_projections``, each stream rescaled to the first
one's root mean square), here as plain array arithmetic on that layout.

Not for: the router and coefficient projections (``linear``, ``rms_norm``, ``tanh``) or which
layer reads which stream (``runtime.layers``). None of these has a native step: numpy runs
them between the native program's runs.
"""

from __future__ import annotations

import math

import numpy as np

from .base import EPS32, Operator, Tolerance, as64


def _streams(s, what: str) -> tuple[int, int, int]:
    if len(s) != 3:
        raise ValueError(f"{what}: streams are (n, streams, hidden), not {s}")
    return s


class StackStreams(Operator):
    """``K`` arrays ``(n, E)`` as the streams ``(n, K, E)``, stream ``k`` the ``k``-th
    input (torch.stack on a new axis). Exact: a copy."""

    name = "stack_streams"
    rows_alone = True

    def shape(self, *xs):
        if not xs or any(len(x) != 2 or x != xs[0] for x in xs):
            raise ValueError(f"stack_streams takes arrays (n, hidden) of one shape, not {xs}")
        return (xs[0][0], len(xs), xs[0][1])

    def reference(self, *xs):
        return np.stack([as64(x) for x in xs], axis=1)

    def kernel(self, out, *xs, scratch=None):
        for k, x in enumerate(xs):
            np.copyto(out[:, k], x)

    def tolerance(self, *xs):
        return Tolerance(atol=0.0, rtol=0.0)


class MatchRMS(Operator):
    """``x`` ``(n, E)`` rescaled to ``target``'s root mean square, row by row:
    ``x * rms(target) / sqrt(max(mean(x ** 2), floor))``, as Gemma3nTextModel's
    ``current_hidden_state * target_magnitude / new_magnitude`` (``new_magnitude`` clamped
    at ``floor`` 1e-5 before its root) for each stream past the first, at the model's start
    and end. Attribute ``floor`` (the mean square's least value, above 0)."""

    name = "match_rms"

    def shape(self, x, target, floor=1e-5):
        if len(x) != 2 or x != target:
            raise ValueError(f"match_rms takes x and target of one shape (n, hidden), not {x} "
                             f"and {target}")
        if not floor > 0:
            raise ValueError(f"match_rms: floor {floor} is not above 0")
        return x

    def reference(self, x, target, floor=1e-5):
        x, t = as64(x), as64(target)
        want = np.sqrt((t * t).mean(-1, keepdims=True))
        have = np.sqrt(np.maximum((x * x).mean(-1, keepdims=True), floor))
        return x * want / have

    def kernel(self, out, x, target, scratch=None, floor=1e-5):
        np.multiply(target, target, out=out)
        want = np.sqrt(out.mean(-1, keepdims=True))
        np.multiply(x, x, out=out)
        have = np.sqrt(np.maximum(out.mean(-1, keepdims=True), np.float32(floor)))
        np.multiply(x, want, out=out)
        out /= have

    def tolerance(self, x, target, floor=1e-5):
        # Two row means (numpy's pairwise sums: log2(E) roundings) and their roots.
        return Tolerance(atol=1e-7, rtol=(8 + 2 * math.log2(max(x[-1], 2))) * EPS32)


class AltUpPredict(Operator):
    """The streams' predictions: stream ``j`` plus ``sum_i coefs[t, j * K + i] * stream_i``
    for each row ``t``, ``coefs`` ``(n, K * K)`` (a row's ``prediction_coefs`` output), as
    Gemma3nTextAltUp.predict (its reshape to ``(K, K)`` and permute: row ``j`` of the matrix
    weighs the streams into prediction ``j``)."""

    name = "altup_predict"

    def shape(self, streams, coefs):
        n, K, _ = _streams(streams, "altup_predict")
        if tuple(coefs) != (n, K * K):
            raise ValueError(f"altup_predict: coefficients {coefs} for streams {streams}, not "
                             f"{(n, K * K)}")
        return streams

    def reference(self, streams, coefs):
        s, c = as64(streams), as64(coefs)
        n, K, _ = s.shape
        return s + np.einsum("tji,tie->tje", c.reshape(n, K, K), s)

    def kernel(self, out, streams, coefs, scratch=None):
        n, K, _ = streams.shape
        np.matmul(coefs.reshape(n, K, K), streams, out=out)
        out += streams

    def tolerance(self, streams, coefs):
        return Tolerance(atol=1e-6, rtol=(8 + 2 * streams[1]) * EPS32)

    def scale(self, reference, streams, coefs):
        s, c = np.abs(as64(streams)), np.abs(as64(coefs))
        n, K, _ = s.shape
        return s + np.einsum("tji,tie->tje", c.reshape(n, K, K), s)


class AltUpCorrect(Operator):
    """The predictions corrected by what the layer made of stream ``active``: stream ``j``
    plus ``(activated - predictions[:, active]) * (coefs[:, j] + 1)``, ``activated`` ``(n,
    E)`` the layer's output, ``coefs`` ``(n, K)`` (a row's ``correction_coefs`` output), as
    Gemma3nTextAltUp.correct. Attribute ``active``: the stream the layer ran on
    (``altup_active_idx``)."""

    name = "altup_correct"
    rows_alone = True

    def shape(self, predictions, activated, coefs, active=0):
        n, K, E = _streams(predictions, "altup_correct")
        if tuple(activated) != (n, E) or tuple(coefs) != (n, K) or not 0 <= active < K:
            raise ValueError(f"altup_correct: activated {activated}, coefficients {coefs} and "
                             f"active stream {active} do not fit streams {predictions}")
        return predictions

    def reference(self, predictions, activated, coefs, active=0):
        p, a, c = as64(predictions), as64(activated), as64(coefs)
        innovation = a - p[:, active]
        return p + innovation[:, None, :] * (c + 1.0)[:, :, None]

    def kernel(self, out, predictions, activated, coefs, scratch=None, active=0):
        n, K, E = predictions.shape
        innovation = scratch[: n * E].reshape(n, E)
        weights = scratch[n * E: n * E + n * K].reshape(n, K, 1)
        np.subtract(activated, predictions[:, active], out=innovation)
        np.add(coefs.reshape(n, K, 1), np.float32(1.0), out=weights)
        np.multiply(innovation[:, None, :], weights, out=out)
        out += predictions

    def scratch(self, predictions, activated, coefs, active=0):
        n, K, E = predictions
        return n * E + n * K

    def tolerance(self, predictions, activated, coefs, active=0):
        return Tolerance(atol=1e-6, rtol=8 * EPS32)

    def scale(self, reference, predictions, activated, coefs, active=0):
        p, a, c = np.abs(as64(predictions)), np.abs(as64(activated)), np.abs(as64(coefs))
        return p + (a + p[:, active])[:, None, :] * (c + 1.0)[:, :, None]


class AddToStreams(Operator):
    """``y`` ``(n, E)`` added to streams ``begin`` onward of ``streams`` ``(n, K, E)``, the
    streams before ``begin`` as they are: Gemma3nTextDecoderLayer's
    ``corrected_predictions[1:] += first_prediction`` (``begin`` 1)."""

    name = "add_to_streams"
    rows_alone = True

    def shape(self, streams, y, begin=1):
        n, K, E = _streams(streams, "add_to_streams")
        if tuple(y) != (n, E) or not 0 <= begin < K:
            raise ValueError(f"add_to_streams: {y} from stream {begin} does not fit streams "
                             f"{streams}")
        return streams

    def reference(self, streams, y, begin=1):
        out = as64(streams).copy()
        out[:, begin:] += as64(y)[:, None, :]
        return out

    def kernel(self, out, streams, y, scratch=None, begin=1):
        np.copyto(out[:, :begin], streams[:, :begin])
        np.add(streams[:, begin:], y[:, None, :], out=out[:, begin:])

    def tolerance(self, streams, y, begin=1):
        return Tolerance(atol=0.0, rtol=2 * EPS32)

    def scale(self, reference, streams, y, begin=1):
        out = np.abs(as64(streams)).copy()
        out[:, begin:] += np.abs(as64(y))[:, None, :]
        return out
