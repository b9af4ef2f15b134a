"""``compile``: a recording turned into a plan for one input shape, run with no allocation.

A plan orders the recording's steps, places every intermediate in one arena by lifetime,
packs each weight once into the form its kernel reads, and on each call runs the kernels
on views of the arena, bounded by the call's ``rows``. With ``check=True`` every step is
compared, on the same inputs, with its operator's float64 reference.

Steps are lowered at compile to a native program (``Operator.lower``, ``operators.native``)
where the extension is built, a prompt chunk's over their arrays at capacity with the row
count taken from the call: each run of consecutive lowered steps is then one native call,
and the rest run their numpy kernels between. Under ``check=True`` each lowered step runs alone, the
native code itself judged by its reference.
"""

from __future__ import annotations

from functools import partial
from typing import Mapping

import numpy as np

from iron_spec.operators import held, native
from iron_spec.operators.base import PerCall, resolve
from iron_spec.operators.formats import to_bfloat16, widen_bfloat16

from .arena import Span, aligned, place
from .graph import Handle, Recorder, Step


class CheckError(AssertionError):
    """A compiled step missed its operator's reference by more than its tolerance."""


class _Run:
    """One step, bound to its arrays: what the hot loop reads."""

    __slots__ = ("step", "kernel", "out", "ins", "bounded_in", "bounded_out", "bounded",
                 "static", "per_call", "scratch", "index", "fixed")

    def __init__(self, index, step, kernel, out, ins, bounded_in, bounded_out, scratch):
        self.index, self.step, self.kernel = index, step, kernel
        self.out, self.ins, self.scratch = out, ins, scratch
        self.bounded_in, self.bounded_out = bounded_in, bounded_out
        self.bounded = bounded_out or any(bounded_in)
        self.static, self.per_call = step.static, step.per_call
        # A step whose arrays do not change with the call is bound to them once: the hot
        # loop only calls it, with its per-call attributes if it has any (every step of
        # the decode step).
        self.fixed = None if self.bounded else partial(
            kernel, out, *ins, scratch=scratch, **self.static)

    def arguments(self, rows: int, call: Mapping[str, int]) -> tuple[list, np.ndarray, dict]:
        """This call's inputs and output (bounded to ``rows``) and attributes."""
        if self.bounded:
            ins = [x[:rows] if b else x for x, b in zip(self.ins, self.bounded_in)]
            out = self.out[:rows] if self.bounded_out else self.out
        else:
            ins, out = self.ins, self.out
        attrs = self.static if not self.per_call else {**self.static, **resolve(self.per_call, call)}
        return ins, out, attrs


class Plan:
    """A compiled version of one recording.

    Args:
        recorder: the recorded body; ``output`` its result handle.
        check: compare every step with its operator's reference at each call
            (``CheckError`` at the first miss).

    ``run(inputs, call)`` feeds ``inputs`` (by input name, int32) and runs with ``call``'s
    per-call values (``start``, ``rows``, ``position``); it returns a view of the output in
    the arena, valid until the next call.

    A plan is one arena and one set of input buffers: it runs one call at a time, and whoever
    shares it across threads serializes its calls (``runtime.causal.CausalLM.lock``).
    """

    def __init__(self, recorder: Recorder, output: Handle, *, check: bool = False,
                 packed: dict | None = None, weights: str = "float32"):
        self.recorder, self.output, self.check = recorder, output, check
        # Weights in reduced precision (``bfloat16``) where an operator reads them so
        # (``Operator.pack_reduced``); the rest, and every table, float32.
        self.weights = weights
        # Views of a fused step's output along its second axis (a fused projection's
        # columns, a fused RoPE's heads), by the handle each stands for.
        self._columns: dict[int, tuple[Handle, int, int]] = {}
        self.steps = self._fuse_ropes(self._fuse(recorder.steps))
        self.inputs = {name: np.zeros(h.shape, h.dtype) for name, h in recorder.inputs.items()}
        spans = self._lifetimes()
        self.arena_elements = place(list(spans.values()))
        self.arena = np.empty(self.arena_elements, np.float32)
        self._views: dict[int, np.ndarray] = {}
        self._spans = spans
        # Weights and tables in their kernels' form; plans of one model may share it.
        self._packed: dict[tuple, np.ndarray] = {} if packed is None else packed
        self.runs = [self._bind(i, s) for i, s in enumerate(self.steps)]
        # Steps over memory that grows (a KV cache, a RoPE table): bound again when it does,
        # by the ids of what owns it (runtime.module.State, runtime.causal.Table).
        self._owners = {i: {id(self._root(h).owner) for h in s.inputs + (s.output,)
                            if h is not None and self._root(h).owner is not None}
                        for i, s in enumerate(self.steps)}
        self._stateful = [i for i, owners in self._owners.items() if owners]
        self._lowered: dict[int, tuple | None] = {}
        self._out = self._array(output)
        self.checked: list[str] = []
        self._for_state = self._state_steps()
        self._lower()

    # -- compile ---------------------------------------------------------------------------
    def _fuse(self, steps: list[Step]) -> list[Step]:
        """Consecutive projections of one input whose weights are consecutive rows of one
        array (a block's q/k/v or gate/up, packed at load: ``runtime.module.pack``) become
        one GEMM over that array; each projection's output is a column view of its output.
        One call and one pass over the input instead of several; the weights are not copied.
        """
        out: list[Step] = []
        i = 0
        while i < len(steps):
            group = [steps[i]]
            while i + len(group) < len(steps) and _continues(group, steps[i + len(group)]):
                group.append(steps[i + len(group)])
            i += len(group)
            if len(group) == 1:
                out.append(group[0])
                continue
            first = group[0]
            rows = sum(g.output.shape[1] for g in group)
            # The group's rows of the packed array: the whole of it unless some of its
            # projections stand apart from the rest (a step recorded between them).
            base = first.inputs[1].root.array.base
            at = (first.inputs[1].root.array.__array_interface__["data"][0]
                  - base.__array_interface__["data"][0]) // base.strides[0]
            weight = base if (at, rows) == (0, base.shape[0]) else base[at: at + rows]
            w = Handle(tuple(weight.shape), "param", "+".join(g.where for g in group),
                       array=weight)
            bias = None
            if first.inputs[2] is not None:
                b = np.concatenate([g.inputs[2].root.array for g in group])
                bias = Handle(tuple(b.shape), "param", w.name, array=b)
            x = first.inputs[0]
            fused = Handle((x.shape[0], rows), "value", w.name, first.output.bounded)
            out.append(Step(first.op, (x, w, bias), fused, dict(first.attrs), w.name))
            at = 0
            for g in group:
                width = g.output.shape[1]
                self._columns[id(g.output)] = (fused, at, at + width)
                at += width
        return out

    def _fuse_ropes(self, steps: list[Step]) -> list[Step]:
        """Two consecutive RoPE steps over adjacent column ranges of one fused projection
        (a block's k then q, both straight from the fused q/k/v GEMM), with the same table
        and start, become one RoPE over the union; each output is a view of its heads.
        One call instead of two on a decode step's handful of heads."""
        out: list[Step] = []
        i = 0
        while i < len(steps):
            pair = self._rope_pair(steps[i], steps[i + 1]) if i + 1 < len(steps) else None
            out.append(steps[i] if pair is None else pair)
            i += 1 if pair is None else 2
        return out

    def _rope_pair(self, a: Step, b: Step) -> Step | None:
        if a.op.name != "rope" or b.op.name != "rope" or a.attrs != b.attrs:
            return None
        if a.inputs[1] is not b.inputs[1] or a.inputs[2] is not b.inputs[2]:
            return None
        ranges = [self._columns.get(id(s.inputs[0].base)) for s in (a, b)]
        if None in ranges or ranges[0][0] is not ranges[1][0]:
            return None
        (first, (fused, lo, mid)), (second, (_, mid2, hi)) = sorted(
            zip((a, b), ranges), key=lambda p: p[1][1])
        x1, x2 = first.inputs[0], second.inputs[0]
        if mid != mid2 or x1.shape[0] != x2.shape[0] or x1.shape[2] != x2.shape[2]:
            return None
        n, h1, D = x1.shape
        where = f"{first.where}+{second.where}"
        cols = Handle((n, hi - lo), "value", where, fused.bounded)
        self._columns[id(cols)] = (fused, lo, hi)
        x = Handle((n, (hi - lo) // D, D), "value", where, fused.bounded, base=cols)
        y = Handle(x.shape, "value", f"{where}.rope", fused.bounded)
        self._columns[id(first.output)] = (y, 0, h1)
        self._columns[id(second.output)] = (y, h1, x.shape[1])
        return Step(first.op, (x,) + first.inputs[1:], y, dict(first.attrs), where)

    def _pack(self, step: Step, k: int, weight: Handle) -> np.ndarray:
        """Input ``k`` of ``step`` (a weight or table) in the form its kernel reads."""
        if self.weights != "float32":
            try:
                x = step.inputs[0]
                reduced = step.op.pack_reduced(k, weight.memory, self.weights,
                                               rows=None if x is None else x.shape[0])
            except ValueError as e:
                raise ValueError(f"{weight.name}: {e}") from None
            if reduced is not None:
                return reduced
        return step.op.pack(k, weight.memory, **step.static)

    def _root(self, h: Handle) -> Handle:
        while True:
            if id(h) in self._columns:
                h = self._columns[id(h)][0]
            elif h.base is not None:
                h = h.base
            else:
                return h

    def _lifetimes(self) -> dict[object, Span]:
        spans: dict[object, Span] = {}

        def touch(h: Handle | None, i: int):
            if h is None or self._root(h).kind != "value":
                return
            r = self._root(h)
            s = spans.get(id(r))
            if s is None:
                spans[id(r)] = Span(id(r), aligned(r.size), i, i)
            else:
                s.last = max(s.last, i)

        for i, step in enumerate(self.steps):
            for h in step.inputs:
                touch(h, i)
            touch(step.output, i)
            need = step.op.scratch(*[None if h is None else h.shape for h in step.inputs],
                                   **step.static)
            if need:
                spans[("scratch", i)] = Span(("scratch", i), aligned(need), i, i)
        touch(self.output, len(self.steps))
        for h in self.recorder.kept:  # read after the run: none of their memory reused
            touch(h, len(self.steps))
        return spans

    def _array(self, h: Handle) -> np.ndarray:
        if id(h) in self._columns:
            fused, a, b = self._columns[id(h)]
            return self._array(fused)[:, a:b].reshape(h.shape)
        if h.base is not None:
            # A view of a column slice is a strided view: numpy splits its last axis in place.
            return self._array(h.base).reshape(h.shape)
        if h.kind == "input":
            return self.inputs[h.name]
        if h.kind in ("param", "state", "const"):
            return h.memory  # as it is now: a growing state's memory is replaced
        s = self._spans[id(h)]
        return self.arena[s.offset: s.offset + h.size].reshape(h.shape)

    def _bind(self, i: int, step: Step, owners: set[int] | None = None) -> _Run:
        """Step ``i`` bound to its arrays; ``owners``: only its arrays over memory these own
        (ids, as ``rebind``) taken again, the rest as the step's run holds them now."""
        before = None if owners is None else self.runs[i]
        fresh = [before is None or (h is not None and id(self._root(h).owner) in owners)
                 for h in step.inputs + (step.output,)]
        ins = []
        for k, h in enumerate(step.inputs):
            if h is None:
                ins.append(None)
            elif not fresh[k]:
                ins.append(before.ins[k])
            elif self._root(h).kind in ("param", "const"):
                array = self._root(h).memory
                key = (id(array), step.op.name, k, repr(sorted(step.static.items())),
                       self.weights)
                if key not in self._packed:
                    self._packed[key] = self._pack(step, k, self._root(h))
                ins.append(self._packed[key])
            else:
                ins.append(self._array(h))
        s = self._spans.get(("scratch", i))
        scratch = None if s is None else self.arena[s.offset: s.offset + s.size]
        return _Run(i, step, step.op.kernel,
                    self._array(step.output) if fresh[-1] else before.out, ins,
                    [h is not None and h.bounded for h in step.inputs], step.output.bounded,
                    scratch)

    def rebind(self, owners: set[int] | None = None) -> None:
        """Bind every step over growing memory to that memory as it is now: after a KV cache
        or a RoPE table grew (``runtime.causal.CausalLM.reserve``), which replaced its array
        (a table is packed again: the plans' shared ``packed`` must have dropped its old
        form), or another set of caches was bound (``CausalLM.bind``). ``owners``: only the
        steps over memory these own (ids of states or tables; None: all of them); the other
        steps keep what they were lowered to."""
        steps = [i for i in self._stateful if owners is None or self._owners[i] & owners]
        for i in steps:
            self.runs[i] = self._bind(i, self.steps[i], self._owners[i])
        self._lower(steps)

    def _lower(self, changed: list[int] | None = None) -> None:
        """The native program of the steps that have one (``Operator.lower``), and the order
        the plan runs: runs of consecutive native steps as ``(first, last)`` of the program,
        each other step its ``_Run``. A step bounded by the call's ``rows`` (a prompt
        chunk's) is lowered over its arrays at their capacity, the program taking the rows
        from the call. Without the extension (or IRON_SPEC_PROGRAM=0), every step is a
        ``_Run``. ``changed``: the runs bound again since the last lowering (None: every
        run); the others' lowered steps are reused, as encoded (``native.encode``)."""
        for i in range(len(self.runs)) if changed is None else changed:
            low = self._lower_run(self.runs[i]) if native.PROGRAM else None
            self._lowered[i] = None if low is None else native.encode(*low, index=i)
        lowered: list[tuple] = []
        before = getattr(self, "_native", None)
        self._native: dict[int, int] = {}  # run index -> program step
        for r in self.runs:
            low = self._lowered[r.index]
            if low is not None:
                self._native[r.index] = len(lowered)
                lowered.append(low)
        self._program = native.encoded_program(lowered) if lowered else None
        # The orders hold the _Run of each step run alone: made again where one of those
        # was bound again, or which steps run natively changed.
        if before != self._native or changed is None or \
                any(i not in self._native for i in changed):
            self._order = self._ordered(self.runs)
            self._state_order = self._ordered([r for r in self.runs
                                               if r.index in self._for_state])

    @staticmethod
    def _lower_run(r: _Run) -> tuple | None:
        """``r``'s native step, its start and its capacity (``native.program``), or None
        where it has none."""
        key = r.step.op.call_attr
        start = r.per_call.get(key, r.static.get(key))
        if set(r.per_call) - {key} or not (start is None or isinstance(start, (int, PerCall))):
            return None
        attrs = {k: v for k, v in r.static.items() if k != key}
        step = r.step.op.lower(r.out, *r.ins, scratch=r.scratch, **attrs)
        if step is None or (r.bounded and step.rows is None):
            return None
        capacity = None
        if r.bounded:
            bounded = [x for x, b in zip(r.ins, r.bounded_in) if b]
            capacity = (r.out if r.bounded_out else bounded[0]).shape[0]
        return step, start, capacity

    def _ordered(self, runs: list[_Run]) -> list:
        """``runs`` in the order the plan runs them: consecutive native steps as one
        ``(first, last)`` range of the program, each other step its ``_Run``."""
        order: list = []
        for r in runs:
            j = self._native.get(r.index)
            if j is None:
                order.append(r)
            elif order and isinstance(order[-1], tuple) and order[-1][1] == j:
                order[-1] = (order[-1][0], j + 1)
            else:
                order.append((j, j + 1))
        return order

    def _state_steps(self) -> set[int]:
        """The steps a state written in place (a KV cache) depends on: each writing step
        and every step whose value they read, transitively. The rest only lead to the
        output (a prompt chunk's last layer past its cache write, the final norm, the
        head), so a call that wants no output (a prompt's chunk before its last) skips
        them and leaves every state as a whole run does."""
        producer: dict[int, int] = {}
        reads: list[list[int]] = []
        for i, step in enumerate(self.steps):
            reads.append([producer[id(self._root(h))] for h in step.inputs
                          if h is not None and id(self._root(h)) in producer])
            producer[id(self._root(step.output))] = i
        keep = {i for i, step in enumerate(self.steps)
                if step.op.writes is not None or step.op.updates is not None}
        todo = list(keep)
        while todo:
            for j in reads[todo.pop()]:
                if j not in keep:
                    keep.add(j)
                    todo.append(j)
        return keep

    @property
    def native_steps(self) -> int:
        """How many of the plan's steps run in its native program."""
        return len(self._native)

    @property
    def rows_alone(self) -> bool:
        """Whether each row of a call bounded by ``rows`` (a prompt chunk's) comes out the
        same bits whatever the call's other rows, their count and where the call starts:
        every bounded step runs in the native program (whose kernels compute a row alone:
        the GEMM's sums run along k per row, the chunk's attention per query lane) or is an
        operator whose numpy kernel does (``Operator.rows_alone``). A session may then
        resume at any position the caches hold; else only where a fresh run's calls begin
        (numpy's BLAS sums a row by how many rows its call holds; a native step that groups
        a call's rows, ``Operator.groups_rows``, the experts' GEMM per expert hit)."""
        return all((r.index in self._native and not r.step.op.groups_rows)
                   or r.step.op.rows_alone for r in self.runs if r.bounded)

    # -- call ------------------------------------------------------------------------------
    def run(self, inputs: Mapping[str, np.ndarray], call: Mapping[str, int],
            output: bool = True) -> np.ndarray | None:
        """Run the plan on ``inputs`` with ``call``'s per-call values; the output (a view
        of the arena, valid until the next call), or with ``output=False`` None, having run
        only the steps the states depend on (``_state_steps``): the same states, bit for
        bit."""
        for name, value in inputs.items():
            buf = self.inputs[name]
            buf[: len(value)] = value
        rows = call.get("rows", 1)
        if self.check:
            for r in self.runs:
                if not output and r.index not in self._for_state:
                    continue
                ins, out, attrs = r.arguments(rows, call)
                j = self._native.get(r.index)
                self._check(r, out, ins, attrs, None if j is None else partial(
                    native.run, self._program, call, j, j + 1))
        else:
            for r in self._order if output else self._state_order:
                if r.__class__ is tuple:
                    native.run(self._program, call, r[0], r[1])
                elif r.fixed is None:
                    ins, out, attrs = r.arguments(rows, call)
                    r.kernel(out, *ins, scratch=r.scratch, **attrs)
                elif r.per_call:
                    r.fixed(**{k: v.resolve(call) for k, v in r.per_call.items()})
                else:
                    r.fixed()
        if not output:
            return None
        return self._out[:rows] if self.output.bounded else self._out

    def kept(self, rows: int) -> list[np.ndarray]:
        """The values the recording keeps (``Recorder.kept``), views of the arena after the
        last call (its first ``rows`` where bounded), valid until the next call."""
        return [self._array(h)[:rows] if h.bounded else self._array(h)
                for h in self.recorder.kept]

    def _is_bfloat16_state(self, h: Handle | None) -> bool:
        """Whether ``h`` is (a view of) a state holding bfloat16 (``State.use``)."""
        if h is None:
            return False
        owner = self._root(h).owner
        return owner is not None and owner.array.dtype == np.uint16

    def _check(self, r: _Run, out, ins, attrs, lowered=None) -> None:
        """Run step ``r`` (its kernel, or ``lowered``: its native step) and compare what it
        wrote with its operator's reference on the same inputs."""
        step = r.step
        writes = step.op.writes
        originals = [None if h is None or self._root(h).kind not in ("param", "const")
                     else self._root(h).memory for h in step.inputs]
        # A weight in reduced precision is judged as the values the kernel reads (bfloat16
        # rounded, Q8_0's d * q); what the rounding costs is the KL checks' to judge.
        # A weight held in its stored form (operators.held) is read by the kernel as it is,
        # and by the reference too (which widens it a block of rows at a time).
        originals = [o if o is None or x is o or held.is_held(x) or x.dtype == np.float32 else
                     step.op.widen_reduced(k, x, o.shape) for k, (o, x) in enumerate(zip(originals, ins))]
        # Copies taken before the kernel runs: a writing step changes its state in place.
        # A weight is read as stored, never copied (the reference widens what it needs).
        # A bfloat16 state (a KV cache's uint16 bits) is read as the values it holds.
        before = [None if x is None or o is not None else
                  _held(x) if self._is_bfloat16_state(step.inputs[k]) else
                  np.array(x, np.float64 if x.dtype.kind == "f" else x.dtype)
                  for k, (x, o) in enumerate(zip(ins, originals))]
        if lowered is None:
            r.kernel(out, *ins, scratch=r.scratch, **attrs)
        else:
            lowered()
        ref_ins = step.op.reference_inputs(
            [o if o is not None else b for o, b in zip(originals, before)], ins)
        updates = step.op.updates
        if updates is not None:
            # The reference updates its own copy of the state; the scale reads the state as
            # it was before the call.
            state = ref_ins[updates].copy()
            expected = step.op.reference(*ref_ins[:updates], state, *ref_ins[updates + 1:],
                                         **attrs)
            self._check_state(r, step, ins, attrs, state)
        else:
            expected = step.op.reference(*ref_ins, **attrs)
        if writes is None:
            expected = step.op.reconcile(expected, np.asarray(out), ref_ins, attrs)
        if writes is not None and self._is_bfloat16_state(step.inputs[writes]):
            # What the state can hold of what the reference wrote: each value as the kernel
            # rounds it (formats.to_bfloat16 of its float32); judged exactly, as float32's.
            expected = _held(to_bfloat16(expected.astype(np.float32)))
            got = _held(ins[writes])
        else:
            got = np.asarray(ins[writes] if writes is not None else out, np.float64)
        tol = step.op.tolerance(*[None if x is None else x.shape for x in ins], **attrs)
        bound = tol.bound(step.op.scale(expected, *ref_ins, **attrs))
        err = np.abs(got - expected)
        excess = err - bound
        worst = float(np.max(excess)) if excess.size else 0.0
        if not np.isfinite(got).all() or worst > 0:
            at = int(np.argmax(excess)) if excess.size else 0
            raise CheckError(
                f"step {r.index} ({step.op.name} in {step.where or 'model'}): max error "
                f"{float(err.flat[at]):.3g} past its bound {float(np.broadcast_to(bound, err.shape).flat[at]):.3g} "
                f"(atol {tol.atol:.3g}, rtol {tol.rtol:.3g}) at "
                f"{tuple(int(i) for i in np.unravel_index(at, err.shape))}")
        self.checked.append(step.where)

    def _check_state(self, r: _Run, step: Step, ins, attrs, expected: np.ndarray) -> None:
        """The state a recurrent step updated (``Operator.updates``) against the one its
        reference updated from the same state and inputs."""
        k = step.op.updates
        got = np.asarray(ins[k], np.float64)
        tol = step.op.state_tolerance(*[None if x is None else x.shape for x in ins], **attrs)
        err = np.abs(got - expected)
        excess = err - tol.bound(step.op.state_scale(expected))
        if not np.isfinite(got).all() or (excess.size and float(np.max(excess)) > 0):
            at = int(np.argmax(excess))
            raise CheckError(
                f"step {r.index} ({step.op.name} in {step.where or 'model'}): its state's max "
                f"error {float(err.flat[at]):.3g} past its bound (atol {tol.atol:.3g}, rtol "
                f"{tol.rtol:.3g}) at {tuple(int(i) for i in np.unravel_index(at, err.shape))}")


def _held(bits: np.ndarray) -> np.ndarray:
    """A bfloat16 state's bits (uint16) as the float64 values they hold."""
    return widen_bfloat16(bits).astype(np.float64)


def _continues(group: list[Step], step: Step) -> bool:
    """Whether ``step`` projects the group's input through the rows right after the group's
    last weight, in the same array."""
    first, last = group[0], group[-1]
    if step.op.name != "linear" or first.op.name != "linear" or step.inputs[0] is not first.inputs[0]:
        return False
    if (step.inputs[2] is None) != (first.inputs[2] is None) or step.attrs != first.attrs:
        return False
    w, prev = step.inputs[1], last.inputs[1]
    if w.base is not None or prev.base is not None or w.kind != "param" or prev.kind != "param":
        return False
    a, b = prev.array, w.array
    # A float32 stack alone (runtime.module.pack): a held weight's view of a mapped file is
    # no stack, though the file holds one tensor after another.
    if held.is_held(a) or held.is_held(b) or held.is_held(first.inputs[1].array):
        return False
    base = first.inputs[1].array.base
    if not isinstance(base, np.ndarray) or base.ndim != 2 or base.dtype != np.float32:
        return False
    return (base is not None and a.base is base and b.base is base and base.flags.c_contiguous
            and a.shape[1] == b.shape[1]
            and b.__array_interface__["data"][0] == a.__array_interface__["data"][0] + a.nbytes)
