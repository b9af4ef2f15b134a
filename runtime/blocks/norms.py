"""Norms over the last axis: the options (``NormOptions``) and the blocks, one norm (``Norm``:
RMSNorm, LayerNorm or MobileBERT's NoNorm) or one per head with weights of its own
(``HeadNorms``).

Not for: where a layer places its norms (``runtime.layers``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph import Handle, Recorder
from ..module import Module, Param


@dataclass(frozen=True)
class NormOptions:
    """A norm over the last axis (``Norm``). ``kind``: ``rms`` (RMSNorm, as transformers'
    LlamaRMSNorm) or ``layer`` (LayerNorm, as torch.nn.LayerNorm); ``eps`` added to the
    mean square (the variance); ``plus_one`` scales by ``1 + weight`` (Gemma3RMSNorm,
    NemotronLayerNorm1P); ``weight``: false holds no weight (OlmoLayerNorm's non-affine
    ``F.layer_norm``); ``bias`` (LayerNorm and no_norm) adds a ``bias``. ``no_norm``
    normalizes nothing: ``x * weight + bias`` (MobileBERT's NoNorm; ``eps`` unread)."""

    kind: str = "rms"
    eps: float = 1e-6
    plus_one: bool = False
    weight: bool = True
    bias: bool = True


class Norm(Module):
    """The norm ``options`` names over the last axis of ``size`` (``x`` ``(n, size)``, or
    ``(n, heads, size)`` for a q/k norm per head): ``rms`` runs operators.RMSNorm (as
    transformers' LlamaRMSNorm; Gemma3RMSNorm with ``plus_one``), ``layer`` runs
    operators.LayerNorm (as torch.nn.LayerNorm; NemotronLayerNorm1P with ``plus_one``),
    ``no_norm`` runs operators' ``affine``, ``x * weight + bias`` (MobileBERT's NoNorm).

    Params: ``weight`` ``(size,)``, and for ``layer`` or ``no_norm`` with ``bias`` also
    ``bias`` ``(size,)``.
    With ``options.weight`` false none is held and the normed values are the output, as
    transformers' OlmoLayerNorm (``F.layer_norm(x, shape, None, None)``) and Gemma4RMSNorm
    ``with_scale=False`` (a constant of ones stands for the weight: times one is exact).

    Raises:
        ValueError: a kind other than ``rms``, ``layer`` or ``no_norm``, or ``no_norm``
            without its weight or with ``plus_one``.
    """

    def __init__(self, size: int | tuple[int, int], options: NormOptions):
        if options.kind not in NORM_KINDS:
            raise ValueError(f"norm kind {options.kind!r} is not one of {', '.join(NORM_KINDS)}")
        if options.kind == "no_norm" and (not options.weight or options.plus_one):
            raise ValueError("a no_norm norm is x * weight + bias: it holds its weight, "
                             "multiplied as it is (no weight: false, no plus_one)")
        # (heads, size): each head's own weights in one tensor, as CohereLayerNorm((H, D)).
        shape = tuple(size) if isinstance(size, tuple) else (size,)
        # A weight that multiplies as it is (not 1 + weight) is drawn around 1.
        self.weight = Param(*shape, gain=not options.plus_one) if options.weight else None
        if not options.weight:
            self.ones = np.ones(shape, np.float32)
        self.bias = Param(*shape) if options.kind in ("layer", "no_norm") and options.bias \
            else None
        self.options = options

    def __call__(self, rec: Recorder, x: Handle) -> Handle:
        o = self.options
        if self.weight is not None:
            w = rec.hold("param", self.where("weight"), self.weight.array)
            plus_one = o.plus_one
        else:
            w, plus_one = rec.hold("const", self.where("ones"), self.ones), False
        if o.kind == "rms":
            return rec.step("rms_norm", x, w, where=self.path, eps=o.eps, plus_one=plus_one)
        b = None if self.bias is None else rec.hold("param", self.where("bias"), self.bias.array)
        if o.kind == "no_norm":
            return rec.step("affine", x, w, b, where=self.path)
        return rec.step("layer_norm", x, w, b, where=self.path, eps=o.eps, plus_one=plus_one)


class HeadNorms(Module):
    """One norm per head over its ``size`` columns, each with weights of its own: ``norms``
    a list of ``heads`` ``Norm``s (``norms.{h}.weight`` ``(size,)``, and ``.bias`` where the
    options hold one), as transformers' StableLmLayerNormPerHead. Their weights are rows of
    one ``(heads, size)`` array, so one step norms ``x`` ``(n, heads, size)``: row ``h`` of
    every token by head ``h``'s weights.

    Raises:
        ValueError: options holding no weight (heads would not differ: use one ``Norm``), or
            of kind ``no_norm``.
    """

    def __init__(self, heads: int, size: int, options: NormOptions):
        if not options.weight:
            raise ValueError("norms per head with no weight are one norm: use qk_norm head")
        if options.kind == "no_norm":
            raise ValueError("norms per head are rms or layer norms, not no_norm")
        self.norms = [Norm(size, options) for _ in range(heads)]
        self.weights = self._stack([n.weight for n in self.norms])
        first = self.norms[0].bias
        self.biases = None if first is None else self._stack([n.bias for n in self.norms])
        self.options = options

    @staticmethod
    def _stack(params: list[Param]) -> np.ndarray:
        # Filled in place at load (Param.fill), each param a row of the stacked array.
        stacked = np.empty((len(params),) + params[0].shape, np.float32)
        for i, p in enumerate(params):
            p.array = stacked[i]
        return stacked

    def __call__(self, rec: Recorder, x: Handle) -> Handle:
        o = self.options
        w = rec.hold("param", self.where("norms.weight"), self.weights)
        if o.kind == "rms":
            return rec.step("rms_norm", x, w, where=self.path, eps=o.eps, plus_one=o.plus_one)
        b = None if self.biases is None else rec.hold("param", self.where("norms.bias"),
                                                      self.biases)
        return rec.step("layer_norm", x, w, b, where=self.path, eps=o.eps, plus_one=o.plus_one)


NORM_KINDS = ("rms", "layer", "no_norm")
