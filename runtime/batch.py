"""A decode step over several sessions at once: each weight read once for all of them.

A decode step streams every weight to compute one token's row; ``B`` sessions' steps one
after another stream them ``B`` times. ``BatchDecode`` records the model once more for a
call of up to ``capacity`` rows (``CallSpec.batch``), each row its own session's last token
at its own position, and runs it as one native program:

- a step that treats every row alike (a projection, a norm, an activation, the embedding,
  the head) runs once over the rows; a projection is the decode step's GEMV run over every
  row with the weights read a block at a time for all of them (``OP_GEMV`` with ``m``
  rows: ``operators/_cpu.c``'s ``gemv_batch_part``), each row's sums the one-row GEMV's;
- a step at a position or over a KV cache (RoPE, the cache writes, attention, learned
  positions), and a mixture of experts' router and experts (``ROW_ONLY``), runs once a
  row, lowered exactly as the decode step lowers it, on that row's
  slice, that session's caches and that row's position (``native.ROW + r``).

So every row's logits are bit for bit those of the session's own decode step: a request
served in a batch draws the tokens it draws alone. The program is assembled from each
step's encoded form and re-assembled only where the rows' sessions or their caches' arrays
changed. A model whose steps do not all lower so (a kernel without a native form, a RoPE
table switching with the sequence's length, ``IRON_SPEC_PROGRAM=0``) has no batched step
(``unbatchable`` says why): its sessions decode one at a time.

Threads: a call runs under the model's lock, as every version's.

Not for: which sessions run (``runtime.engine``), one session's calls (``runtime.session``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from iron_spec.operators import native
from iron_spec.operators.base import PerCall

from .blocks.rope import rope_switch
from .causal import CausalLM
from .graph import CallSpec, Recorder
from .plan import Plan
from .session import Session


#: Steps whose native form takes one row (a mixture of experts' router and experts: the
#: routed experts differ from row to row): lowered once a row on the row's slice, as the
#: decode step lowers them, so each row's choices and sums are its own decode step's.
ROW_ONLY = frozenset({"router", "experts"})


class Unbatchable(ValueError):
    """A model whose decode step cannot run over several sessions at once (why named)."""


def unbatchable(lm: CausalLM) -> str | None:
    """Why ``lm`` has no batched decode step (None: it has one), without compiling it."""
    if native.LIB is None or not native.PROGRAM:
        return ("the batched decode step runs as a native program: operators._cpu is not "
                "in use or IRON_SPEC_PROGRAM=0")
    for name, r in lm.tables.items():
        if rope_switch(r) is not None:
            return (f"the RoPE table {name!r} switches with the sequence's length (a longrope "
                    "table): rows at different lengths would need different tables")
    if lm.sections:
        return ("M-RoPE (RoPE sections): each row turns by positions of its own (an image's "
                "grid, the text after it), which the batched step does not take")
    return None


class BatchDecode:
    """The batched decode step of ``lm`` for up to ``capacity`` sessions at once.

    ``step(sessions, histories)`` gives each session's logits after its history, as
    ``Session.logits`` would: one batched call for the sessions whose caches hold all of
    their history but its last token (a decode step's case), the others one call each.

    Raises (at construction):
        Unbatchable: the model has no batched step (``unbatchable``, or a step of its
            decode step with no native form).
    """

    def __init__(self, lm: CausalLM, capacity: int):
        why = unbatchable(lm)
        if why is not None:
            raise Unbatchable(why)
        if not 1 <= capacity <= native.CALL_ROWS:
            raise ValueError(f"capacity {capacity} is not within 1..{native.CALL_ROWS}")
        self.lm, self.capacity = lm, capacity
        self._index = {id(s): i for i, s in enumerate(lm._states)}
        self.plan: Plan | None = None
        self._compile()

    # -- compile ---------------------------------------------------------------------------
    def _compile(self) -> None:
        lm, B = self.lm, self.capacity
        with lm.lock:
            rec = Recorder(CallSpec(False, B, start=PerCall("position"), batch=True))
            out = lm.body(rec)
            plan = Plan(rec, out, packed=lm.packed, weights=lm.decode_weights)
            self.plan, self._epoch, self._weights = plan, lm._epoch, lm.decode_weights
            # Registered with the model's versions: a cache or RoPE table that grows binds
            # this plan's steps again too (CausalLM.reserve, reserve_caches).
            lm._versions[("batch", B, lm.decode_weights)] = self
            self._rowwise: dict[int, tuple] = {}  # step -> (its _Run, its encoded step)
            self._rows: dict[tuple, list] = {}    # (row, step) -> (key, encoded)
            self._scratches: dict[int, np.ndarray] = {}
            self._program, self._key = None, None
            self._slots: list[int] = []  # the last call's sessions (ids) by row
            self._per_row = [self._at_position(r) for r in plan.runs]
            own = [st.array for st in lm._states]
            for r in plan.runs:  # every step must lower: refused now, not at a call
                if not self._per_row[r.index]:
                    try:
                        self._encode_rowwise(r)
                    except Unbatchable:
                        # No native form over the batch's rows (a per-row gate broadcast
                        # over its row: qwen2_moe's shared-expert gate): once a row, on the
                        # row's slice, as the decode step lowers it, where every value it
                        # reads and writes has the batch's rows.
                        if not self._row_by_row(r):
                            raise
                        self._per_row[r.index] = True
                        self._encode_row(r, 0, own)
                else:  # lowered at row 0 now, on the model's own caches
                    self._encode_row(r, 0, own)
            self._out = plan._out

    def _at_position(self, r) -> bool:
        """Whether step ``r`` runs once a row: at a position, over a KV cache, a step whose
        native form takes one row only (``ROW_ONLY``), or a product by a value a row."""
        plan = self.plan
        if r.step.op.name in ROW_ONLY:
            if not r.bounded_out and r.step.op.writes is None:
                raise Unbatchable(f"{r.step.where}: {r.step.op.name} writes no row of its own")
            return True
        if r.step.op.name == "mul" and r.bounded_out and plan._lower_run(r) is None:
            # A (rows, 1) column times the rows (a shared expert's sigmoid gate, Qwen3-Next's
            # and Qwen2-MoE's): OP_MUL repeats b along a row, not down the rows, so each
            # row runs its own, a (1, 1) value, as its decode step does.
            return True
        states = [h for h in r.step.inputs + (r.step.output,)
                  if h is not None and plan._root(h).kind == "state"]
        if r.per_call or states:
            for h in states:
                if plan._root(h) is not h:
                    raise Unbatchable(f"{r.step.where}: a view of a KV cache")
            if not r.bounded_out and r.step.op.writes is None:
                raise Unbatchable(f"{r.step.where}: {r.step.op.name} writes no row of its own")
            return True
        return False

    def _row_by_row(self, r) -> bool:
        """Whether step ``r`` (one that treats every row alike) can run once a row: an
        operator computing each row alone whose inputs and output all have the batch's rows
        (no weight or table shared by the rows, which a row's slice would cut)."""
        return (getattr(r.step.op, "rows_alone", False) and r.bounded_out
                and all(b for h, b in zip(r.step.inputs, r.bounded_in) if h is not None))

    def _encode_rowwise(self, r) -> tuple:
        """Step ``r`` (the same for every row) encoded over the capacity's rows."""
        held = self._rowwise.get(r.index)
        if held is not None and held[0] is r:
            return held[1]
        op = r.step.op
        where = f"{r.step.where or 'model'} ({op.name})"
        if op.name == "linear":
            x, out = r.ins[0], r.out
            one = op.lower(out[:1], x[:1], *r.ins[1:], scratch=r.scratch, **r.static)
            if one is None or one.op != native.OP_GEMV or not native.contiguous(out, x):
                raise Unbatchable(f"{where}: no batched GEMV for this projection")
            # (n, k, held, m): the held form one row's GEMV names (-1: none), m the rows
            held = one.ints[2] if len(one.ints) > 2 else -1
            step = native.Step(native.OP_GEMV, (out, x) + tuple(one.arrays[2:]),
                               tuple(one.ints[:2]) + (held, self.capacity), one.floats, rows=3)
            low = (step, None, self.capacity)
        else:
            low = self.plan._lower_run(r)
            if low is None:
                raise Unbatchable(f"{where}: no native form over a batch's rows")
        encoded = native.encode(*low, index=r.index)
        self._rowwise[r.index] = (r, encoded)
        return encoded

    def _encode_row(self, r, row: int, arrays: list[np.ndarray]) -> tuple:
        """Step ``r`` for row ``row`` of the call: its value rows sliced, its caches the
        row's session's (``arrays``, in the model's state order), at the row's position."""
        plan, step = self.plan, r.step

        def take(h, x, bounded):
            root = None if h is None else plan._root(h)
            if root is not None and root.kind == "state":
                return arrays[self._index[id(root.owner)]]
            return x[row: row + 1] if bounded else x

        ins = [take(h, x, b) for h, x, b in zip(step.inputs, r.ins, r.bounded_in)]
        # Each row on a scratch of its own: the rows' attention steps of a layer then run
        # as one dispatch of the pool (operators/_cpu_program.h's attend_rows).
        scratch = None if r.scratch is None else self._scratch(row, r.scratch.size)
        out = ins[step.op.writes] if step.op.writes is not None else \
            take(step.output, r.out, r.bounded_out)
        key = step.op.call_attr
        start = r.per_call.get(key, r.static.get(key))
        attrs = {k: v for k, v in r.static.items() if k != key}
        where = f"{step.where or 'model'} ({step.op.name})"
        if set(r.per_call) - {key} or not (start is None or isinstance(start, (int, PerCall))):
            raise Unbatchable(f"{where}: a per-call attribute the program cannot give a row")
        low = step.op.lower(out, *ins, scratch=scratch, **attrs)
        if low is None:
            raise Unbatchable(f"{where}: no native form at one row")
        encoded = list(native.encode(low, start if isinstance(start, int) else None,
                                     index=r.index))
        if isinstance(start, PerCall):
            if start.name != "position":
                raise Unbatchable(f"{where}: a row's {start.name} is no position")
            encoded[1], encoded[2] = native.ROW + row, start.offset
        return tuple(encoded)

    def _scratch(self, row: int, size: int) -> np.ndarray:
        """Row ``row``'s scratch, at least ``size`` float32 (one array a row, shared by
        the row's steps, which run one after another)."""
        held = self._scratches.get(row)
        if held is None or held.size < size:
            held = self._scratches[row] = np.empty(max(size, 0 if held is None else held.size),
                                                   np.float32)
        return held[:size]

    def _arrays(self, session: Session) -> list[np.ndarray]:
        lm = self.lm
        if session.caches is lm.caches:
            return [s.array for s in lm._states]
        return session.caches.arrays

    def _assemble(self, sessions: Sequence[Session]):
        """The program for ``sessions`` as the rows, made again only where a row's session
        or its caches' arrays (or a step's binding) changed."""
        plan, b = self.plan, len(sessions)
        sets = [self._arrays(s) for s in sessions]
        owners = tuple((id(s), tuple(map(id, a))) for s, a in zip(sessions, sets))
        key = (b, tuple(id(r) for r in plan.runs), owners)
        if key == self._key:
            return self._program
        encoded = []
        for r in plan.runs:
            if not self._per_row[r.index]:
                encoded.append(self._encode_rowwise(r))
                continue
            for row, arrays in enumerate(sets):
                k = (id(r), owners[row])
                held = self._rows.get((row, r.index))
                if held is None or held[0] != k:
                    held = (k, self._encode_row(r, row, arrays), arrays)
                    self._rows[(row, r.index)] = held
                encoded.append(held[1])
        for (row, i) in [k for k in self._rows if k[0] >= b]:
            del self._rows[(row, i)]  # rows no call holds: their arrays let go
        self._program, self._key = native.encoded_program(encoded), key
        self._count = len(encoded)
        return self._program

    # -- call ------------------------------------------------------------------------------
    def step(self, sessions: Sequence[Session], histories: Sequence[Sequence[int]]
             ) -> list[np.ndarray]:
        """Each session's logits ``(vocab,)`` float32 after its history (a copy), as
        ``sessions[i].logits(histories[i])`` gives them, bit for bit.

        Raises:
            ValueError, IndexError: as ``Session.logits`` for a history (checked for every
                row before anything runs); a session given twice.
        """
        if len(sessions) != len(histories):
            raise ValueError(f"{len(sessions)} sessions for {len(histories)} histories")
        if len({id(s) for s in sessions}) != len(sessions):
            raise ValueError("a session is given twice: each row is a sequence of its own")
        tokens = [s._validate(h) for s, h in zip(sessions, histories)]
        out: list[np.ndarray | None] = [None] * len(sessions)
        lm = self.lm
        with lm.lock:
            if self._epoch != lm._epoch or self._weights != lm.decode_weights:
                self._compile()  # the cache form or decode weights changed since
            rows = [i for i, (s, t) in enumerate(zip(sessions, tokens)) if self._decodes(s, t)]
            for first in range(0, len(rows), self.capacity):
                part = rows[first: first + self.capacity]
                if len(part) < 2:  # one row: the decode step itself
                    continue
                for i, logits in zip(part, self._run([sessions[i] for i in part],
                                                     [tokens[i] for i in part])):
                    out[i] = logits
        for i, (s, t) in enumerate(zip(sessions, tokens)):
            if out[i] is None:  # a prompt to run, or a row alone: its own call
                out[i] = s._run(t, _greedy)[0]
        return out

    def _decodes(self, session: Session, tokens: np.ndarray) -> bool:
        """Whether ``session``'s next call for ``tokens`` is a decode step (as
        ``Session._step`` decides) on caches a batched step can read."""
        lm, caches = self.lm, session.caches
        n = tokens.size
        if session.reference or caches.epoch != lm._epoch or session.held != n - 1:
            return False
        if caches.regime is not None and caches.regime != lm.rope_regime(n):
            return False
        if caches is not lm.caches and caches.arrays is None:
            return False
        return session._common(tokens) == n - 1

    def _order(self, sessions: list[Session]) -> list[int]:
        """Which of ``sessions`` runs at each row: a session at the row it ran at in the last
        call where that row is still in this call, the others in the rows left. Why: a
        row's steps are encoded for its session (``_assemble``); a session leaving the batch
        or joining it would otherwise move every session after it to another row, each of
        their steps encoded again (~10 ms for 8 rows of SmolLM2, a decode step's time)."""
        b = len(sessions)
        index = {id(s): i for i, s in enumerate(sessions)}
        rows: list[int | None] = [index.pop(sid, None) for sid in self._slots[:b]]
        rows += [None] * (b - len(rows))
        rest = iter(sorted(index.values()))
        return [next(rest) if i is None else i for i in rows]

    def _run(self, sessions: list[Session], tokens: list[np.ndarray]) -> list[np.ndarray]:
        lm, b = self.lm, len(sessions)
        try:
            for s, t in zip(sessions, tokens):
                lm.reserve_caches(s.caches, t.size)
            order = self._order(sessions)  # row -> index in sessions
            program = self._assemble([sessions[i] for i in order])
            self._slots = [id(sessions[i]) for i in order]
            ids = self.plan.inputs["ids"]
            for row, i in enumerate(order):
                ids[row] = tokens[i][-1]
            positions = tuple(int(tokens[i].size - 1) for i in order)
            native.run(program, {"start": 0, "rows": b, "position": 0}, 0, self._count,
                       positions)
            logits: list = [None] * b
            for row, i in enumerate(order):
                logits[i] = np.array(self._out[row])
        except BaseException:
            for s in sessions:  # as Session._run: a half-run step leaves nothing to resume
                s.caches.forget()
            raise
        for s, t in zip(sessions, tokens):
            c = s.caches
            c.last, c.tokens, c.stale = None, t, None
            s.reused = t.size - 1  # as the session's own decode step
            s.calls.append(("decode", t.size - 1, 1))
        return logits


def _greedy(logits: np.ndarray) -> int:
    return int(np.argmax(logits))
