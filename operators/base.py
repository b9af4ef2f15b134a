"""The operator contract every family implements, and the per-call values attributes may name.

Not for: scheduling, memory placement or model structure (``runtime``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)


@dataclass(frozen=True)
class PerCall:
    """An attribute known only at the call: ``value = call[name] + offset``.

    ``name`` is one of a call's bounds: ``start`` (the first position a call runs), ``rows``
    (how many of a compiled capacity it runs) or ``position`` (the last position it runs).
    """

    name: str
    offset: int = 0

    def resolve(self, call: Mapping[str, int]) -> int:
        return int(call[self.name]) + self.offset


def resolve(attrs: Mapping[str, Any], call: Mapping[str, int]) -> dict[str, Any]:
    """``attrs`` with every ``PerCall`` value replaced by its value at ``call``."""
    return {k: v.resolve(call) if isinstance(v, PerCall) else v for k, v in attrs.items()}


@dataclass(frozen=True)
class Tolerance:
    """How far a float32 kernel's output may be from the float64 reference.

    ``|kernel - reference| <= atol + rtol * scale`` elementwise, where ``scale`` is the
    operator's magnitude for that element (by default ``|reference|``).
    """

    atol: float
    rtol: float

    def bound(self, scale: np.ndarray | float) -> np.ndarray | float:
        return self.atol + self.rtol * np.abs(scale)


class Operator:
    """One operator family.

    Subclasses set ``name`` and implement ``shape``, ``reference`` and ``kernel``; they may
    refine ``tolerance``, ``scale`` (the magnitude the relative tolerance applies to) and
    ``scratch`` (float32 elements of working memory the kernel needs).
    """

    name: str = ""
    #: Which input the kernel writes in place (a cache write), else None.
    writes: int | None = None
    #: Which input holds a recurrent state (a convolution's last rows, an SSM's or a delta
    #: rule's matrix) the kernel updates in place beside its output, else None. Such an
    #: operator reads its ``start`` attribute: at 0 the state before the call is zeros,
    #: whatever the array holds (a sequence begins), else the state after the position
    #: before ``start``. Its reference updates a float64 state the same way, in place.
    updates: int | None = None
    #: Whether an output keeps its first input's per-call row bound (``rows``).
    keeps_bound: bool = True
    #: The attribute a native program gives the step from the call (``lower``).
    call_attr: str = "start"
    #: Whether the numpy ``kernel`` computes each row of a call's rows from that row alone,
    #: the same bits whatever the call's other rows and their count (a copy, an elementwise
    #: sum or product). A step lowered to the native program always does (one body per
    #: row); a BLAS product, or a kernel with a path of its own for one row, need not
    #: (``runtime.plan.Plan.rows_alone``, which lets a session resume at any position).
    rows_alone: bool = False
    #: Whether its native step computes a row with other rows of the call it groups them by
    #: (the experts' one GEMM per expert hit: a row's bits follow how many share its expert),
    #: so a session resumes only where a fresh run's calls begin.
    groups_rows: bool = False

    def shape(self, *shapes: tuple[int, ...], **attrs: Any) -> tuple[int, ...]:
        """The output shape for inputs of ``shapes``. Raises ValueError on a mismatch."""
        raise NotImplementedError

    def reference(self, *inputs: np.ndarray, **attrs: Any) -> np.ndarray:
        """The output in float64, computed plainly from the definition."""
        raise NotImplementedError

    def kernel(self, out: np.ndarray, *inputs: np.ndarray, scratch: np.ndarray | None = None,
               **attrs: Any) -> None:
        """Compute the output into ``out`` (float32), allocating nothing of its size."""
        raise NotImplementedError

    def tolerance(self, *shapes: tuple[int, ...], **attrs: Any) -> Tolerance:
        """The bound a float32 kernel meets; a few ulps of the output by default."""
        return Tolerance(atol=1e-6, rtol=8 * EPS32)

    def scale(self, reference: np.ndarray, *inputs: np.ndarray, **attrs: Any) -> np.ndarray:
        """The magnitude each element's relative error is measured against."""
        return np.abs(reference)

    def pack(self, index: int, array: np.ndarray, **attrs: Any) -> np.ndarray:
        """The form the kernel reads input ``index`` (a weight) in, made once at compile.

        float32, C-contiguous by default; the reference always reads the weight as loaded.
        """
        return np.ascontiguousarray(array, dtype=np.float32)

    def pack_reduced(self, index: int, array: np.ndarray, dtype: str,
                     rows: int | None = None) -> np.ndarray | None:
        """Input ``index`` (a weight) in ``dtype`` (a decode step's ``bfloat16``,
        ``bfloat16-rounded``, ``int8``, a prompt chunk's ``bfloat16-tiles``:
        ``operators.formats``), the form a kernel reads in reduced precision, or None where
        this operator keeps float32 (the default). ``rows``: the leading axis of the step's
        first input, where it has one.

        Raises:
            ValueError: the weight does not hold exactly in ``dtype``.
        """
        return None

    def widen_reduced(self, index: int, packed: np.ndarray,
                      shape: tuple[int, ...] | None = None) -> np.ndarray:
        """The float32 values input ``index``'s reduced form (``pack_reduced``) stands for,
        of the weight's own ``shape``: what a reference multiplies by to judge the kernel
        reading it. The packed array itself by default (an operator that keeps float32)."""
        return packed

    def reference_inputs(self, inputs: list, kernel_inputs: list) -> list:
        """The inputs the reference judges the kernel on, given ``inputs`` (float64 copies,
        reduced weights widened: ``widen_reduced``) and what the kernel read
        (``kernel_inputs``): ``inputs`` as they are by default. An operator whose kernel
        rounds an input to meet a reduced weight (Linear's on Q8_0) gives the rounded values,
        so the reference computes the kernel's own product exactly."""
        return inputs

    def reconcile(self, expected: np.ndarray, got: np.ndarray, inputs: list,
                  attrs: dict) -> np.ndarray:
        """The reference's output as the kernel may rightly have computed it, given what it
        computed (``got``) from ``inputs``: ``expected`` itself by default. An operator
        whose output is a choice (a router's top-k) gives the reference's output for the
        kernel's choice where that choice ties within float32's error, so a tie is judged
        by what follows from it, not failed."""
        return expected

    def state_tolerance(self, *shapes: tuple[int, ...], **attrs: Any) -> Tolerance:
        """The bound a float32 kernel's updated state (``updates``) meets against the
        reference's, each element measured against its magnitude; the output's by default."""
        return self.tolerance(*shapes, **attrs)

    def state_scale(self, expected: np.ndarray) -> np.ndarray:
        """The magnitude each element of the updated state (``updates``) is measured
        against: its own, and the RMS of its last axis (a recurrent state's small entries
        carry the rounding of its large ones)."""
        a = np.abs(expected)
        return a + np.sqrt(np.mean(a * a, axis=-1, keepdims=True)) if a.ndim else a

    def scratch(self, *shapes: tuple[int, ...], **attrs: Any) -> int:
        """float32 elements of working memory the kernel needs; none by default."""
        return 0

    def lower(self, out: np.ndarray, *inputs: np.ndarray, scratch: np.ndarray | None = None,
              **attrs: Any):
        """This step as one step of a native program (``operators.native.Step``) over these
        very arrays, or None where it has none (the default: the plan calls ``kernel``).

        Called once, at compile, over the step's arrays at their full size; a per-call
        ``call_attr`` (``start``) is the program's to give (``attrs`` hold the static ones
        only). Where the step's leading axis is bounded by the call's ``rows`` (a prompt
        chunk's), the plan lowers it only if the step says which of its ints counts that
        axis (``Step.rows``). The native step computes what ``kernel`` does, judged by the
        same reference.
        """
        return None


def as64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)
