"""Reading a spec's ``recurrence:`` section: stacks, states and a schedule of runs, its
repeats (counts from config fields) unrolled into ``runtime.recurrence.RecurrenceOptions``.

Not for: running the schedule (``runtime.recurrence``).
"""

from __future__ import annotations

from typing import Any

from iron_spec.runtime.recurrence import DEFAULT_STACK, INITS, RecurrenceOptions, Run

from ..config import Resolved, evaluate_option, whole_option
from ..loader import Spec

MAX_RUNS = 4096  # steps an unrolled schedule may hold: each repeated layer is a module tree
SECTION = ("recurrence",)


def recurrence(spec: Spec, r: Resolved, layers: int) -> RecurrenceOptions | None:
    """The spec's schedule over ``layers`` layers a stack, None without a ``recurrence:``.

    Raises:
        SpecError: at the entry, a stack or state name that is no identifier, a state's init
            other than ``embeddings`` or ``learned``, a repeat count or layer bound that is no
            whole number (or out of the stack), a step reading a state no earlier step wrote,
            more than ``MAX_RUNS`` steps unrolled, an output no step writes.
    """
    if spec.get(*SECTION) is None:
        return None
    stacks_raw = spec.get(*SECTION, "stacks", default=None) or {DEFAULT_STACK: {}}
    stacks = []
    for name, entry in stacks_raw.items():
        at = SECTION + ("stacks", name)
        _name(spec, at, name)
        final = evaluate_option(spec, at + ("final_norm",), (entry or {}).get("final_norm", False),
                                r, "true or false")
        if not isinstance(final, bool) or (final and name == DEFAULT_STACK):
            raise spec.error(at, f"stack {name!r}'s final_norm is {final!r}: true or false "
                                 f"(model.layers holds none: head.norm is the model's)")
        stacks.append((name, final))
    states = []
    for name, init in (spec.get(*SECTION, "states", default=None) or {}).items():
        at = SECTION + ("states", name)
        _name(spec, at, name)
        if init not in INITS:
            raise spec.error(at, f"state {name!r} starts as {init!r}, not one of "
                                 f"{', '.join(INITS)}")
        states.append((name, init))
    if not states:
        raise spec.error(SECTION, "a recurrence needs states: each a name and its start "
                                  f"({', '.join(INITS)})")
    written = {name for name, _ in states}
    runs: list[Run] = []
    _steps(spec, r, SECTION + ("steps",), dict(stacks), layers, written, runs)
    output = spec.get(*SECTION, "output")
    if output not in written:
        raise spec.error(SECTION + ("output",), f"the output state {output!r} is written by no "
                                                f"step (states: {', '.join(sorted(written))})")
    return RecurrenceOptions(tuple(stacks), tuple(states), tuple(runs), output)


def _name(spec: Spec, at: tuple, name: Any) -> None:
    if not isinstance(name, str) or not name.isidentifier():
        raise spec.error(at, f"{name!r} is not a name (letters, digits and _)")


def _steps(spec: Spec, r: Resolved, at: tuple, stacks: dict, layers: int, written: set,
           runs: list[Run]) -> None:
    """Unroll the steps at ``at`` onto ``runs``."""
    steps = spec.get(*at)
    if not isinstance(steps, list) or not steps:
        raise spec.error(at, "steps is a list of runs and repeats, not empty")
    for k, step in enumerate(steps):
        here = at + (k,)
        if "repeat" in step:
            times = whole_option(spec, r, here + ("repeat",), step["repeat"], 0, MAX_RUNS)
            for _ in range(times):
                _steps(spec, r, here + ("steps",), stacks, layers, written, runs)
            continue
        inputs = []
        for j, entry in enumerate(step.get("inputs") or []):
            name, normed = (entry, False) if isinstance(entry, str) else \
                (entry.get("state"), bool(entry.get("norm", False)))
            if name not in written:
                raise spec.error(here + ("inputs", j), f"state {name!r} is read before any step "
                                 f"writes it (states so far: {', '.join(sorted(written))})")
            inputs.append((name, normed))
        if not inputs:
            raise spec.error(here, "a run sums at least one state: inputs is empty")
        stack = step.get("stack")
        begin, end = 0, None
        if stack is not None:
            if stack not in stacks:
                raise spec.error(here + ("stack",), f"stack {stack!r} is not under "
                                 f"recurrence/stacks ({', '.join(stacks)})")
            begin = whole_option(spec, r, here + ("begin",), step.get("begin", 0), 0, layers)
            end = whole_option(spec, r, here + ("end",), step.get("end", layers), begin, layers)
        elif "begin" in step or "end" in step:
            raise spec.error(here, "begin and end bound a run's layers: only with stack")
        _name(spec, here + ("into",), step.get("into"))
        runs.append(Run(tuple(inputs), step["into"], stack, begin, end))
        written.add(step["into"])
        if len(runs) > MAX_RUNS:
            raise spec.error(at, f"the schedule unrolls to more than {MAX_RUNS} runs")


def outline(spec: Spec, r: Resolved, options: RecurrenceOptions, layers: int) -> list[str]:
    """The schedule of ``options`` (what ``recurrence`` read from ``spec`` over ``r``) as
    ``iron-spec show`` prints it, one line each: the stacks (their layers, a final norm),
    the states and how each starts, the steps as the spec nests them (a repeat with its
    count and the expression it came from; a run as ``INTO <- STACK[begin:end](A + B)``,
    ``norm(A)`` for an input through the model's norm), the output, and how often each
    stack's layers run a token.

    Raises:
        SpecError: as ``recurrence`` (it read the same section first, so none in practice).
    """
    stacks = ", ".join(f"{name} ({layers} layers{', final norm' if final else ''})"
                       for name, final in options.stacks)
    states = ", ".join(f"{name} from {init}" for name, init in options.states)
    lines = [f"stacks    {stacks}", f"states    {states}", "steps"]
    _outline(spec, r, SECTION + ("steps",), layers, 1, lines)
    runs = ", ".join(_calls(name, options.calls(name, layers)) for name, _ in options.stacks)
    lines += [f"output    {options.output}",
              f"unrolled  {len(options.runs)} runs a token: {runs}"]
    return lines


def _calls(stack: str, counts: list[int]) -> str:
    """How often ``stack``'s layers run a token: ``each L_module layer 4 times``, or layer
    by layer where they differ (a run of part of a stack)."""
    if len(set(counts)) == 1:
        return f"each {stack} layer {counts[0]} time{'s' * (counts[0] != 1)}"
    return f"{stack} layers {'/'.join(map(str, counts))} times"


def _outline(spec: Spec, r: Resolved, at: tuple, layers: int, depth: int,
             lines: list[str]) -> None:
    pad = "  " * depth
    for k, step in enumerate(spec.get(*at)):
        here = at + (k,)
        if "repeat" in step:
            raw = step["repeat"]
            times = whole_option(spec, r, here + ("repeat",), raw, 0, MAX_RUNS)
            lines.append(f"{pad}repeat {times}" + (f" ({raw})" if isinstance(raw, str) else "")
                         + ":")
            _outline(spec, r, here + ("steps",), layers, depth + 1, lines)
            continue
        summed = " + ".join(f"norm({e['state']})" if isinstance(e, dict) and e.get("norm")
                            else e["state"] if isinstance(e, dict) else e
                            for e in step.get("inputs") or [])
        stack = step.get("stack")
        if stack is None:
            lines.append(f"{pad}{step['into']} <- {summed}")
            continue
        begin = whole_option(spec, r, here + ("begin",), step.get("begin", 0), 0, layers)
        end = whole_option(spec, r, here + ("end",), step.get("end", layers), begin, layers)
        span = "" if (begin, end) == (0, layers) else f"[{begin}:{end}]"
        lines.append(f"{pad}{step['into']} <- {stack}{span}({summed})")
