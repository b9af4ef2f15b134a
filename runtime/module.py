"""Modules: a tree of params (checkpoint tensors by dotted name), state and children.

Attribute names are the checkpoint's own (``q_proj``, ``input_layernorm``), so a module's
params are named exactly as a Hugging Face checkpoint names its tensors. A param shared by
two names (a tied ``lm_head``) is one ``Param`` object reached twice.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np


class Param:
    """A weight of ``shape``, float32 once loaded (``array`` is None until then), or where
    ``holdable``, in the form loading holds it (``runtime.holding``). ``gain``:
    the weight multiplies a value as it is (a norm's weight, a layer's scalar), so drawn
    weights centre it on 1 (``runtime.weights``).

    How a checkpoint stores it, where that differs from the model's layout: ``transposed``,
    a matrix stored ``[in, out]`` (transformers' ``Conv1D``), or a stack of matrices each
    stored so (``(E, in, out)``: GptOssExperts' ``gate_up_proj``): the last two axes
    swapped; ``rows``, the stored row each model row is (``model = stored[rows]``: a fused
    q/k/v projection stored per head); ``reshaped``, the stored shape of the same elements in
    the same order (a ``Conv1d``'s ``(out, in, 1)`` weight, a bias stored ``(out, 1)``, a
    stack of experts' matrices stored as their rows one after another, ``(E * rows, cols)``:
    DbrxExpertGLU's), of the transposed layout's elements where also ``transposed``.
    ``from_stored`` and ``to_stored`` turn one layout into the other, exactly.
    """

    def __init__(self, *shape: int, gain: bool = False, draw: tuple | None = None):
        self.shape = tuple(int(s) for s in shape)
        self.gain = gain
        # How drawn weights draw it where a normal draw would not serve (a decay's log
        # that must keep the state remembered): ``runtime.weights.draw_weights``.
        self.draw = draw
        self.array: np.ndarray | None = None
        # Read only by operators that read every held form (a projection's or embedding's
        # matrix: operators.held): loading may keep it as the checkpoint stores it
        # (runtime.holding), not float32.
        self.holdable = False
        self.transposed = False
        self.rows: np.ndarray | None = None
        self.reshaped: tuple[int, ...] | None = None
        # A stack of matrices stored as their rows one after another, (E * rows, cols) of
        # the stored matrices (turned first where transposed): DbrxExpertGLU's w1, v1, w2.
        self.flat = False
        # May hold +-inf as stored (a clip's bound that clips nothing, as transformers
        # initializes Gemma4ClippableLinear's): loading refuses NaN in it alone.
        self.infinite = False

    @property
    def _turned(self) -> tuple[int, ...]:
        """``shape`` with its last two axes swapped (a transposed matrix's stored shape)."""
        return self.shape[:-2] + self.shape[-2:][::-1]

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """The shape a checkpoint stores: ``reshaped``, else ``shape`` with its last two
        axes swapped where ``transposed``, its first two axes as one where ``flat``."""
        if self.reshaped is not None:
            return self.reshaped
        turned = self._turned if self.transposed else self.shape
        return (turned[0] * turned[1],) + turned[2:] if self.flat else turned

    def from_stored(self, values: np.ndarray) -> np.ndarray:
        """A stored tensor ``stored_shape`` in the model's layout (a view where only
        transposed or reshaped, else a copy)."""
        if self.reshaped is not None or self.flat:
            values = values.reshape(self._turned if self.transposed else self.shape)
        if self.transposed:
            values = np.swapaxes(values, -1, -2)
        return values if self.rows is None else values[self.rows]

    def to_stored(self, values: np.ndarray) -> np.ndarray:
        """The model's ``values`` in the checkpoint's layout (``from_stored`` undone)."""
        if self.rows is not None:
            stored = np.empty_like(values)
            stored[self.rows] = values
            values = stored
        if self.transposed:
            values = np.ascontiguousarray(np.swapaxes(values, -1, -2))
        return values.reshape(self.stored_shape) if self.reshaped is not None or self.flat \
            else values

    def fill(self, values: np.ndarray) -> None:
        """Set the weight to ``values`` (of ``shape``, any float dtype) cast to float32: in
        place where the param has its memory already (rows of a stacked array, ``pack``),
        else into a new array."""
        if self.array is None:
            self.array = np.empty(self.shape, np.float32)
        np.copyto(self.array, values, casting="unsafe")

    def __repr__(self) -> str:
        return f"Param{self.shape}"


#: What a State may hold, by name: a bfloat16 cache as its values' upper 16 bits.
STATE_DTYPES = {"float32": np.float32, "bfloat16": np.uint16}


class State:
    """Memory a module keeps from call to call, zeros of ``shape`` (a KV cache): float32,
    or where ``kv`` (an attention layer's keys or values, which any kernel reading them
    reads in either form) ``use``'s bfloat16, as bits (uint16: ``operators.formats``).

    ``shape`` is the most it holds. With ``axis`` (a cache's positions), ``array`` holds
    only ``capacity`` of them along that axis, starting at ``initial``, and ``grow`` makes
    it longer: a new array holding the old one's values, so whoever holds ``array`` must
    take it again (``runtime.plan.Plan.rebind``). ``ring``: the positions are slots of a
    ring of that many (a sliding window's cache, ``operators.attention``); ``shape`` along
    ``axis`` is then the ring's.

    ``recurrent``: a state of fixed size carried from position to position (a convolution's
    last rows, an SSM's or a delta rule's matrix: ``operators.causal_conv``, ``ssd``, ...),
    which holds the sequence up to one position only: a session restarts it from a snapshot
    (``runtime.snapshots``), not at any position it held.
    """

    def __init__(self, *shape: int, axis: int | None = None, initial: int | None = None,
                 ring: int | None = None, kv: bool = False, recurrent: bool = False):
        self.shape = tuple(int(s) for s in shape)
        self.axis, self.ring, self.kv, self.recurrent = axis, ring, kv, recurrent
        held = list(self.shape)
        if axis is not None:
            held[axis] = self.shape[axis] if initial is None else min(initial, self.shape[axis])
        # np.zeros maps pages lazily: only what is written costs memory.
        self.array = np.zeros(tuple(held), np.float32)

    def emptied(self) -> np.ndarray:
        """A new array of this state's dtype holding no positions along ``axis`` (all of
        ``shape`` without one), zeros: another sequence's caches (``runtime.caches``),
        grown as ``array`` is."""
        held = list(self.shape)
        if self.axis is not None:
            held[self.axis] = 0
        return np.zeros(tuple(held), self.array.dtype)

    def use(self, dtype: str) -> None:
        """Hold ``dtype`` (``float32`` or, where ``kv``, ``bfloat16``) from now on, the held
        values zeros again (a model's KV caches are chosen before any token is run).

        Raises:
            ValueError: ``dtype`` is neither, or bfloat16 on a state not ``kv``.
        """
        if dtype not in STATE_DTYPES or (dtype != "float32" and not self.kv):
            raise ValueError(f"a state holds float32{', or bfloat16 (a KV cache)' if self.kv else ''}, "
                             f"not {dtype!r}")
        self.array = np.zeros(self.array.shape, STATE_DTYPES[dtype])

    @property
    def capacity(self) -> int:
        """Positions ``array`` holds along ``axis`` (all of ``shape`` without one)."""
        return self.array.shape[self.axis if self.axis is not None else 0]

    def grow(self, capacity: int) -> bool:
        """Hold ``capacity`` positions (at most ``shape``'s): a new array, the old values
        copied to its first positions. Returns whether ``array`` changed."""
        array = self.grown(self.array, capacity)
        changed = array is not self.array
        self.array = array
        return changed

    def grown(self, array: np.ndarray, capacity: int) -> np.ndarray:
        """``array`` (this state's, or another sequence's set of it: ``runtime.caches``)
        holding ``capacity`` positions (at most ``shape``'s): ``array`` itself where it
        holds as many, else a new array, the old values copied to its first positions."""
        if self.axis is None:
            return array
        capacity = min(int(capacity), self.shape[self.axis])
        held = array.shape[self.axis]
        if capacity <= held:
            return array
        shape = list(array.shape)
        shape[self.axis] = capacity
        new = np.zeros(tuple(shape), array.dtype)
        new[(slice(None),) * self.axis + (slice(0, held),)] = array
        return new

    @property
    def nbytes(self) -> int:
        """Bytes ``array`` holds now."""
        return self.array.nbytes

    @property
    def most_bytes(self) -> int:
        """Bytes it holds at its full ``shape``."""
        return int(np.prod(self.shape)) * self.array.itemsize


class Module:
    """A node of the tree. Subclasses set Params, States, Modules and lists of Modules as
    attributes; ``path`` is the module's dotted name, set by ``name_tree``."""

    path: str = ""

    def children(self) -> Iterator[tuple[str, "Module"]]:
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value
            elif isinstance(value, list) and value and isinstance(value[0], Module):
                for i, child in enumerate(value):
                    yield f"{name}.{i}", child

    def name_tree(self, prefix: str = "") -> "Module":
        self.path = prefix
        for name, child in self.children():
            child.name_tree(f"{prefix}.{name}" if prefix else name)
        return self

    def named_params(self) -> Iterator[tuple[str, Param]]:
        """Every (dotted name, Param), a tied param once under each of its names."""
        for name, value in vars(self).items():
            if isinstance(value, Param):
                yield (f"{self.path}.{name}" if self.path else name), value
        for _, child in self.children():
            yield from child.named_params()

    def named_states(self) -> Iterator[tuple[str, State]]:
        for name, value in vars(self).items():
            if isinstance(value, State):
                yield (f"{self.path}.{name}" if self.path else name), value
        for _, child in self.children():
            yield from child.named_states()

    def where(self, name: str = "") -> str:
        return f"{self.path}.{name}" if name and self.path else (name or self.path)


def pack_tree(root: Module) -> None:
    """``pack`` every group of projections a module of ``root`` declares (its ``packs()``);
    best before the weights are loaded, which then fill the stacked arrays in place."""
    modules = [root]
    while modules:
        m = modules.pop()
        for group in getattr(m, "packs", lambda: [])():
            pack(*group)
        modules += [child for _, child in m.children()]


def pack(*params: Param) -> None:
    """Give ``params`` (matrices of one width: the projections a block applies to one input,
    q/k/v or gate/up) one C-contiguous array, each param becoming a view of its rows; a
    param already loaded is copied in. A compiled plan runs the projections as one GEMM over
    the stacked array (``Plan._fuse``), and the reference reads the same views. Packed
    before loading, the weights are read straight into their rows: never held twice.
    """
    if any(len(p.shape) != 2 or p.shape[1] != params[0].shape[1] for p in params):
        raise ValueError(f"pack takes matrices of one width, not {[p.shape for p in params]}")
    stacked = np.empty((sum(p.shape[0] for p in params), params[0].shape[1]), np.float32)
    at = 0
    for p in params:
        rows = stacked[at: at + p.shape[0]]
        if p.array is not None:
            rows[...] = p.array
        p.array = rows
        at += p.shape[0]
