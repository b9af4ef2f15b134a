"""A grouped projection: the columns split into groups, each group's outputs a linear map of
its own inputs alone (a block-diagonal weight held as its blocks).

As torch's ``nn.Conv1d(cin, cout, kernel_size=1, groups=g)`` over a sequence (SqueezeBERT's
projections): output channel ``o`` reads the inputs of its group ``o // (cout / g)``.

Not for: a dense projection (``linear``), convolutions wider than one row (``span_conv``).
"""

from __future__ import annotations

import numpy as np

from .base import EPS32, Operator, Tolerance, as64


class GroupedLinear(Operator):
    """``x`` ``(n, cin)`` by ``weight`` ``(cout, cin / groups)`` plus ``bias`` ``(cout,)``
    (None: none): ``out[:, o] = x[:, g * ci: (g + 1) * ci] @ weight[o] + bias[o]``, ``g = o
    // (cout / groups)``, ``ci = cin / groups``; output ``(n, cout)``.

    Raises:
        ValueError: widths that do not split into ``groups``, or shapes that do not meet.
    """

    name = "grouped_linear"

    def shape(self, x, weight, bias=None, groups=1):
        cout, ci = weight
        if len(x) != 2 or groups < 1 or cout % groups or x[1] != ci * groups or \
                (bias is not None and tuple(bias) != (cout,)):
            raise ValueError(f"grouped_linear: x {x}, weight {weight} and bias {bias} are not "
                             f"(n, {groups} * in), (out, in) and (out,) with out split into "
                             f"{groups} groups")
        return (x[0], cout)

    @staticmethod
    def _blocks(x, weight, groups):
        n, cin = x.shape
        cout, ci = weight.shape
        xs = x.reshape(n, groups, ci).transpose(1, 0, 2)  # (g, n, ci)
        ws = weight.reshape(groups, cout // groups, ci).transpose(0, 2, 1)  # (g, ci, co)
        return np.matmul(xs, ws).transpose(1, 0, 2).reshape(n, cout)

    def reference(self, x, weight, bias=None, groups=1):
        y = self._blocks(as64(x), as64(weight), groups)
        return y if bias is None else y + as64(bias)

    def kernel(self, out, x, weight, bias=None, scratch=None, groups=1):
        np.copyto(out, self._blocks(x, weight, groups))
        if bias is not None:
            out += bias

    def tolerance(self, x, weight, bias=None, groups=1):
        return Tolerance(atol=1e-6, rtol=max(8.0, weight[1] / 4) * EPS32)

    def scale(self, reference, x, weight, bias=None, groups=1):
        s = self._blocks(np.abs(as64(x)), np.abs(as64(weight)), groups)
        return s if bias is None else s + np.abs(as64(bias))
