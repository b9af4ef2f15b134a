"""Two layer behaviours of Gemma 3n's decoder, each general in its own terms: a low-rank
residual branch (Laurel) and alternating updates over several residual streams (AltUp).

Streams are one handle ``(n, K, E)`` (``operators.altup``); a layer running on AltUp takes
and returns them, and the model spreads its embeddings into them before the first layer and
merges them after the last (``spread``, ``merge``).

Not for: where a layer places its norms and residual adds (``runtime.layers``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .blocks.norms import Norm, NormOptions
from .blocks.projections import Linear
from .graph import Handle, Recorder
from .module import Module, Param


@dataclass(frozen=True)
class AltUpOptions:
    """Alternating updates: ``inputs`` residual streams, the layer running on stream
    ``active`` and the others predicted before it and corrected after it by per-token
    coefficients from a router (``AltUp``), as transformers' Gemma3nTextAltUp
    (``altup_num_inputs``, ``altup_active_idx``); ``correct_scale``: the corrected active
    stream times ``correct_output_scale`` before it feeds the per-layer input
    (``altup_correct_scale``)."""

    inputs: int
    active: int = 0
    correct_scale: bool = True


# Gemma3nTextModel clamps each stream's mean square at 1e-5 before rescaling it to the
# first stream's root mean square (``new_magnitude.clamp(min=1e-5)``).
MAGNITUDE_FLOOR = 1e-5


class Laurel(Module):
    """A learned augmented residual: ``h + post_laurel_norm(linear_right(linear_left(h)))``
    for ``h`` ``(n, E)``, ``linear_left`` ``(rank, E)`` and ``linear_right`` ``(E, rank)``
    without biases, the norm of the layer's kind, as transformers' Gemma3nTextLaurelBlock."""

    def __init__(self, hidden_size: int, rank: int, norm: NormOptions):
        self.linear_left = Linear(hidden_size, rank)
        self.linear_right = Linear(rank, hidden_size)
        self.post_laurel_norm = Norm(hidden_size, norm)

    def __call__(self, rec: Recorder, h: Handle) -> Handle:
        branch = self.linear_right(rec, self.linear_left(rec, h))
        return rec.step("add", h, self.post_laurel_norm(rec, branch), where=self.path)


def stream(rec: Recorder, streams: Handle, k: int, where: str) -> Handle:
    """Stream ``k`` of ``streams`` ``(n, K, E)`` as ``(n, E)`` (a copy of its columns)."""
    n, K, E = streams.shape
    flat = rec.view(streams, (n, K * E))
    return rec.step("columns", flat, where=where, begin=k * E, end=(k + 1) * E)


class AltUp(Module):
    """One layer's AltUp: ``modality_router`` ``(K, E)`` over ``router_norm(x) / E`` and a
    tanh gives each row's modalities ``(n, K)``; ``prediction_coefs`` ``(K * K, K)`` makes
    them the prediction matrix, ``correction_coefs`` ``(K, K)`` the correction weights;
    ``correct_output_scale`` ``(E,)`` scales the corrected active stream
    (``scale_corrected``), as transformers' Gemma3nTextAltUp (``router_input_scale``
    ``hidden_size ** -1``; no coefficient clipping, which is training's).
    """

    def __init__(self, hidden_size: int, o: AltUpOptions, norm: NormOptions):
        K, E = o.inputs, hidden_size
        self.correct_output_scale = Param(E, gain=True)
        self.correction_coefs = Linear(K, K)
        self.prediction_coefs = Linear(K, K * K)
        self.modality_router = Linear(E, K)
        self.router_norm = Norm(E, norm)
        self.options = o
        self.hidden_size = E

    def modalities(self, rec: Recorder, x: Handle) -> Handle:
        """``tanh(modality_router(router_norm(x) * hidden_size ** -1))`` ``(n, K)``."""
        r = rec.step("mul", self.router_norm(rec, x), where=self.path,
                     scale=self.hidden_size ** -1.0)
        return rec.step("tanh", self.modality_router(rec, r), where=self.path)

    def predict(self, rec: Recorder, streams: Handle) -> Handle:
        """The predicted streams ``(n, K, E)`` from the active one's modalities."""
        m = self.modalities(rec, stream(rec, streams, self.options.active, self.path))
        return rec.step("altup_predict", streams, self.prediction_coefs(rec, m),
                        where=self.path)

    def correct(self, rec: Recorder, predictions: Handle, activated: Handle) -> Handle:
        """``predictions`` corrected by ``activated`` ``(n, E)``, the layer's output."""
        c = self.correction_coefs(rec, self.modalities(rec, activated))
        return rec.step("altup_correct", predictions, activated, c, where=self.path,
                        active=self.options.active)

    def scale_corrected(self, rec: Recorder, x: Handle) -> Handle:
        """``x`` times ``correct_output_scale`` where ``correct_scale``, else ``x``."""
        if not self.options.correct_scale:
            return x
        w = rec.hold("param", self.where("correct_output_scale"), self.correct_output_scale.array)
        return rec.step("mul", x, w, where=self.path)


def spread(rec: Recorder, owner: Module, x: Handle) -> Handle:
    """The streams ``(n, K, E)`` from the embeddings ``x`` ``(n, E)``: ``x`` first, then
    each ``altup_projections[k - 1](x)`` rescaled to ``x``'s root mean square, as the
    start of Gemma3nTextModel.forward. ``owner`` (the model) holds ``altup_projections``
    and ``altup_unembed_projections``, ``K - 1`` bias-free ``(E, E)`` Linears each."""
    out = [x]
    for proj in owner.altup_projections:
        out.append(rec.step("match_rms", proj(rec, x), x, where=proj.path,
                            floor=MAGNITUDE_FLOOR))
    return rec.step("stack_streams", *out, where=owner.path)


def merge(rec: Recorder, owner: Module, streams: Handle) -> Handle:
    """The mean ``(n, E)`` of stream 0 and each later stream through its
    ``altup_unembed_projections`` entry, rescaled to stream 0's root mean square, as the end
    of Gemma3nTextModel.forward (before its final norm)."""
    first = stream(rec, streams, 0, owner.path)
    total = first
    for k, proj in enumerate(owner.altup_unembed_projections, start=1):
        y = rec.step("match_rms", proj(rec, stream(rec, streams, k, owner.path)), first,
                     where=proj.path, floor=MAGNITUDE_FLOOR)
        total = rec.step("add", total, y, where=owner.path)
    K = len(owner.altup_unembed_projections) + 1
    return rec.step("mul", total, where=owner.path, scale=1.0 / K)
