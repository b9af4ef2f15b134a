"""Recurrent depth: stacks of layers run several times per token, in a schedule over named
hidden states (a looped transformer's prelude, recurrent block and coda; hierarchical H/L
cycles), each run of a layer with a KV cache of its own.

Not for: the layers themselves (``layers``) or the model around them (``causal``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .blocks.norms import Norm
from .graph import Handle, Recorder
from .layers import DecoderLayer
from .module import Module, Param

DEFAULT_STACK = "layers"  # the model's own ``model.layers``
INITS = ("embeddings", "learned")


@dataclass(frozen=True)
class Run:
    """One step of a schedule: the sum of ``inputs`` (state names, each through the
    model's final ``norm`` where its flag says) run through layers ``begin..end - 1`` of
    ``stack`` (None: no layers, the sum itself) into the state ``into``."""

    inputs: tuple[tuple[str, bool], ...]
    into: str
    stack: str | None = None
    begin: int = 0
    end: int | None = None


@dataclass(frozen=True)
class RecurrenceOptions:
    """The schedule the model's layers run in. ``stacks``: (name, final_norm) each, a
    stack of the model's ``num_hidden_layers`` layer options: ``layers`` is
    ``model.layers`` itself, another name ``model.<name>.layers`` with a weightless or
    weighted ``model.<name>.final_norm`` after its last layer where ``final_norm``
    (HrmTextStack). ``states``: (name, init) each, ``embeddings`` the token embeddings
    (scaled) or ``learned`` a param ``model.<name>`` ``(hidden,)`` added to every row
    (HrmTextModel's ``z_L_init``). ``runs``: the schedule, repeats unrolled. ``output``:
    the state the head reads."""

    stacks: tuple[tuple[str, bool], ...]
    states: tuple[tuple[str, str], ...]
    runs: tuple[Run, ...]
    output: str

    def calls(self, stack: str, layers: int) -> list[int]:
        """How many times each of ``stack``'s ``layers`` layers runs in the schedule."""
        count = [0] * layers
        for r in self.runs:
            if r.stack == stack:
                for i in range(r.begin, layers if r.end is None else r.end):
                    count[i] += 1
        return count


class Stack(Module):
    """``layers`` and, where the stack has one, its ``final_norm`` (HrmTextStack)."""

    def __init__(self, layers: list[DecoderLayer], final_norm: Norm | None):
        self.layers = layers
        self.final_norm = final_norm


def tie(copy: Module, owner: Module) -> None:
    """Make ``copy`` (a module built from the same options as ``owner``) hold ``owner``'s
    very params, so each is one param reached under two names (loaded once, a tied alias)
    while ``copy`` keeps states (KV caches) of its own."""
    for name, value in vars(owner).items():
        if isinstance(value, Param):
            setattr(copy, name, value)
        elif isinstance(value, Module):
            tie(getattr(copy, name), value)
        elif isinstance(value, list) and value and isinstance(value[0], Module):
            for c, o in zip(getattr(copy, name), value):
                tie(c, o)


class Schedule(Module):
    """Every run of a layer past its first: ``runs`` (``model.loops.K``), each a layer
    holding the params of the one it repeats and KV caches of its own, as transformers
    gives every run its own cache slot (DoryModel's ``per_loop`` copies, HrmTextModel's
    ``cycle_offset``). ``order`` pairs each step of the schedule with the layers it runs
    and the stack's final norm where the run reaches its last layer.

    Raises:
        ValueError: a run names a stack the model does not hold or layers outside it, a
            state no earlier step wrote, or a normed input without a final norm.
    """

    def __init__(self, o: RecurrenceOptions, stacks: dict[str, list[DecoderLayer]],
                 model_stacks: dict[str, Stack], build, normed: bool):
        states = {name for name, _ in o.states}
        self.loops: list[DecoderLayer] = []
        self.order: list[tuple[Run, list[DecoderLayer]]] = []
        seen: set[tuple[str, int]] = set()
        for r in o.runs:
            for s, normed_input in r.inputs:
                if s not in states:
                    raise ValueError(f"a run reads state {s!r} before any step writes it "
                                     f"(states: {', '.join(sorted(states))})")
                if normed_input and not normed:
                    raise ValueError(f"state {s!r} is read through the final norm, which the "
                                     "model does not hold (head.norm false)")
            layers, final = [], None
            if r.stack is not None:
                if r.stack not in stacks:
                    raise ValueError(f"a run names stack {r.stack!r}, not one of "
                                     f"{', '.join(stacks)}")
                held = stacks[r.stack]
                end = len(held) if r.end is None else r.end
                if not 0 <= r.begin <= end <= len(held):
                    raise ValueError(f"a run of layers {r.begin}..{end - 1} of stack "
                                     f"{r.stack!r} is outside its {len(held)} layers")
                for i in range(r.begin, end):
                    if (r.stack, i) in seen:
                        layer = build(i)
                        tie(layer, held[i])
                        self.loops.append(layer)
                    else:
                        seen.add((r.stack, i))
                        layer = held[i]
                    layers.append(layer)
                if end == len(held) and r.stack != DEFAULT_STACK:
                    final = model_stacks[r.stack].final_norm
            states.add(r.into)
            self.order.append((r, layers, final))
        if o.output not in states:
            raise ValueError(f"the output state {o.output!r} is written by no step")
        self.options = o


def run_schedule(rec: Recorder, model: Module, schedule: Schedule, x: Handle, ropes) -> Handle:
    """The schedule over the embeddings ``x`` ``(n, hidden)``: the output state."""
    o = schedule.options
    held: dict[str, Handle] = {}
    learned: dict[str, Handle] = {}
    for name, init in o.states:
        if init == "embeddings":
            held[name] = x
        else:
            p = getattr(model, name)
            learned[name] = rec.hold("param", model.where(name), p.array)
    for r, layers, final in schedule.order:
        parts = [model.norm(rec, held[s]) if normed else held.get(s, learned.get(s))
                 for s, normed in r.inputs]
        # A learned state is one row: the sum starts from a whole one (HrmTextModel's
        # z_L_init expanded to the embeddings' shape).
        whole = [p for p, (s, _) in zip(parts, r.inputs) if s in held or s not in learned]
        if not whole:
            raise ValueError(f"run into {r.into!r} sums learned states only: no rows to add to")
        h = whole[0]
        for p in parts:
            if p is not whole[0]:
                h = rec.step("add", h, p, where=model.path)
        for layer in layers:
            h = layer(rec, h, ropes, None)
        if final is not None:
            h = final(rec, h)
        held[r.into] = h
    return held[o.output]
