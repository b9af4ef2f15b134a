"""``reference``: a recording run eagerly through each operator's float64 reference.

The truth a compiled plan is judged by. It holds its own copy of every state (float64 KV
caches), so a reference run and a compiled run of the same calls never share memory.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from iron_spec.operators.base import resolve

from .graph import Handle, Recorder


class Reference:
    """Runs ``recorder``'s steps eagerly; ``run`` mirrors ``Plan.run``."""

    def __init__(self, recorder: Recorder, output: Handle,
                 states: dict[int, np.ndarray] | Callable[[], dict[int, np.ndarray]]):
        self.recorder, self.output = recorder, output
        # One float64 copy of each state, shared by every version over the same model; or
        # where a callable, the dict it gives at each call (the bound set of a model's
        # caches: runtime.caches).
        self._states = states
        # Where given, each step of an operator named here is appended as it runs: (its
        # module, its inputs, its output, its attributes) (a mixture's routers, for
        # ``runtime.checks.routing_against``).
        self.capture: tuple[set[str], list] | None = None

    @property
    def states(self) -> dict[int, np.ndarray]:
        return self._states() if callable(self._states) else self._states

    def _state(self, h: Handle, states: dict[int, np.ndarray]) -> np.ndarray:
        # By the state itself (its array is replaced as it grows), at the most it holds:
        # np.zeros maps pages lazily, so only the positions written cost memory.
        root = h.root
        key = id(root.owner if root.owner is not None else root.array)
        if key not in states:
            states[key] = np.zeros(root.shape, np.float64)
        return states[key]

    def run(self, inputs: Mapping[str, np.ndarray], call: Mapping[str, int],
            output: bool = True) -> np.ndarray:
        # Every step runs, whatever ``output``: the truth's caches are the same either way.
        rows = call.get("rows", 1)
        values: dict[int, np.ndarray] = {}
        states = self.states

        def read(h: Handle | None):
            if h is None:
                return None
            root = h.root
            if root.kind == "input":
                x = np.asarray(inputs[root.name])
                x = x[:rows] if root.bounded else x
            elif root.kind in ("param", "const"):
                # As stored: each operator's reference computes in float64 from it. A float64
                # copy of every weight held here was twice the weights again (1.1 GB on
                # SmolLM2, per compiled version), more than the model itself.
                x = root.memory
            elif root.kind == "state":
                x = self._state(root, states)
            else:
                x = values[id(root)]
            if h.base is None:
                return x
            shape = (x.shape[0],) + h.shape[1:] if h.bounded else h.shape
            return x.reshape(shape)

        for step in self.recorder.steps:
            attrs = {**step.static, **resolve(step.per_call, call)}
            ins = [read(h) for h in step.inputs]
            out = step.op.reference(*ins, **attrs)
            if self.capture is not None and step.op.name in self.capture[0]:
                self.capture[1].append((step.where, ins, out, attrs))
            # A writing step (a cache write) has changed its float64 state where it is.
            if step.op.writes is None:
                values[id(step.output)] = out
        return read(self.output)
