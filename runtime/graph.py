"""Recording a model's body as steps on handles, once per input shape.

A body is ordinary Python that calls ``Recorder.step``; nothing is computed while it runs.
Each step names its operator, its input handles, its output handle, its attributes (some
known only at the call, ``PerCall``) and the module it belongs to. ``Plan`` (compile) and
``Reference`` (eager, float64) both execute the same recording.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from iron_spec.operators import OPERATORS, Operator, PerCall


@dataclass(eq=False)
class Handle:
    """A value in a recording.

    ``kind`` is ``input`` (fed per call), ``param`` (a module's weight), ``state`` (a module's
    memory across calls, e.g. a KV cache), ``const`` (a table built at construction) or
    ``value`` (an intermediate, placed in the arena). ``bounded``: the leading axis is a
    compiled capacity of which a call runs the first ``rows``. ``base``: the handle this one
    is a reshaped view of.
    """

    shape: tuple[int, ...]
    kind: str
    name: str = ""
    bounded: bool = False
    dtype: Any = np.float32
    base: "Handle | None" = None
    array: np.ndarray | None = None  # the param, state or const it stands for
    # What holds a growing state's or table's memory (``runtime.module.State``,
    # ``runtime.causal.Table``): its ``array``, replaced as it grows; ``shape`` is the most
    # it holds. ``array`` is then None.
    owner: Any = None

    @property
    def memory(self) -> np.ndarray | None:
        """The array this param, state or const is now."""
        return self.array if self.owner is None else self.owner.array

    @property
    def root(self) -> "Handle":
        return self if self.base is None else self.base.root

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


@dataclass(eq=False)
class Step:
    """One operator applied: ``output = op(*inputs, **attrs)``, in module ``where``."""

    op: Operator
    inputs: tuple[Handle | None, ...]
    output: Handle
    attrs: dict[str, Any]
    where: str

    @property
    def per_call(self) -> dict[str, PerCall]:
        return {k: v for k, v in self.attrs.items() if isinstance(v, PerCall)}

    @property
    def static(self) -> dict[str, Any]:
        return {k: v for k, v in self.attrs.items() if not isinstance(v, PerCall)}


@dataclass
class CallSpec:
    """What a body knows of its call while recording.

    ``prompt``: a prompt chunk (``capacity`` ids, of which a call runs ``rows``) or the
    decode step (one token at ``position``). ``start``, ``rows`` and ``position`` are
    ``PerCall`` values (``rows`` a plain 1 for the decode step). ``soft`` and ``reach``: a
    prompt chunk's own inputs beside its ids (``runtime.towers.multimodal``). ``batch``: a
    decode step over ``capacity`` sequences, a call running ``rows`` of them, each row its
    own token at its own position in its own caches (``runtime.batch``: the steps at a
    position run once a row). ``every_row``: a prompt chunk giving every row's logits, not
    the last's alone. ``hidden``: its body names the hidden states to keep
    (``Recorder.kept``: the first layer's input, then each layer's output, the last after
    the final norm, as transformers' ``output_hidden_states``).
    """

    prompt: bool
    capacity: int
    start: PerCall = field(default_factory=lambda: PerCall("start"))
    position: PerCall = field(default_factory=lambda: PerCall("position"))
    # A prompt chunk whose placeholder rows take a tower's soft tokens (runtime.towers):
    # ``soft``; ``reach``: each row sees the keys up to a position of its own (an image's
    # rows see the whole image).
    soft: bool = False
    reach: bool = False
    batch: bool = False
    every_row: bool = False
    hidden: bool = False

    @property
    def last_row(self) -> PerCall | int:
        return PerCall("rows", -1) if self.prompt else 0


class Recorder:
    """Collects the steps of one body for one input shape."""

    def __init__(self, call: CallSpec):
        self.call = call
        self.steps: list[Step] = []
        self.inputs: dict[str, Handle] = {}
        self._held: dict[int, Handle] = {}
        self.kept: list[Handle] = []  # values a plan keeps past its steps (CallSpec.hidden)

    def input(self, name: str, shape: tuple[int, ...], dtype=np.int32, bounded=False) -> Handle:
        h = Handle(tuple(shape), "input", name, bounded, dtype)
        self.inputs[name] = h
        return h

    def hold(self, kind: str, name: str, array: np.ndarray) -> Handle:
        """The handle of a param, state or const ``array``, one per array."""
        h = self._held.get(id(array))
        if h is None:
            h = Handle(tuple(array.shape), kind, name, False, array.dtype, array=array)
            self._held[id(array)] = h
        return h

    def state(self, name: str, state, kind: str = "state") -> Handle:
        """The handle of ``state``, one per state: memory that grows with the sequence (a
        ``runtime.module.State``, or with ``kind`` ``const`` a table by position,
        ``runtime.causal.Table``). Its shape is the most the state holds, its memory
        whatever ``state.array`` is at the call."""
        h = self._held.get(id(state))
        if h is None:
            h = Handle(state.shape, kind, name, False, np.float32, owner=state)
            self._held[id(state)] = h
        return h

    def view(self, h: Handle, shape: tuple[int, ...]) -> Handle:
        """``h`` reshaped (same elements, same bound on the leading axis)."""
        if int(np.prod(shape)) != h.size:
            raise ValueError(f"cannot view {h.shape} as {shape}")
        return Handle(tuple(shape), h.kind, h.name, h.bounded, h.dtype, base=h)

    def step(self, op: str, *inputs: Handle | None, where: str = "", **attrs: Any) -> Handle:
        """Record ``op`` on ``inputs``; return its output handle."""
        operator = OPERATORS[op]
        shapes = [None if h is None else h.shape for h in inputs]
        static = {k: v for k, v in attrs.items() if not isinstance(v, PerCall)}
        try:
            shape = operator.shape(*shapes, **static)
        except ValueError as e:
            raise ValueError(f"{where or 'model'}: {e}") from None
        if operator.writes is not None:
            out = inputs[operator.writes]
        else:
            bounded = operator.keeps_bound and any(h is not None and h.bounded for h in inputs)
            out = Handle(tuple(shape), "value", f"{where}.{op}" if where else op, bounded)
        self.steps.append(Step(operator, tuple(inputs), out, dict(attrs), where))
        return out
