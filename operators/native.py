"""The decode step's kernels on a thread pool of our own (``operators._cpu``), where built.

``operators/_cpu.c`` is compiled at install (an optional extension: without a C compiler the
install still succeeds and every operator runs its numpy kernel). It serves one-row GEMVs
(``Linear``) and one query's attention (``Attention``) on ``threads()`` threads, so a decode
step never mixes OpenBLAS's worker threads with another pool's. Set ``IRON_SPEC_NATIVE=0``
to run the numpy kernels only.

Every build holds the GEMV for each instruction set (portable C vectors, AVX2+FMA,
AVX-512), and the best this CPU has runs, chosen by cpuid at import, never by the flags of
the machine that built it. ``IRON_SPEC_SIMD=portable|avx2|avx512`` picks one instead (a
ValueError at the first call where this CPU lacks it); ``describe()`` says which runs.
A prompt chunk's GEMMs run on the pool too (``GEMM``), unless IRON_SPEC_GEMM=blas.

A compiled plan runs its steps as one native call (``Step``, ``PROGRAM``), a decode step's
and a prompt chunk's (over the call's rows): ``operators/_cpu_program.h`` holds each step's
arrays and runs them with the GIL released. IRON_SPEC_PROGRAM=0 runs them one Python call a
step instead.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator, NamedTuple

import numpy as np

import logging
from pathlib import Path

from ._sources import digest

try:
    from . import _cpu
except ImportError:  # not built: the numpy kernels serve
    _cpu = None

#: Why the extension built is not used, where it is stale: built from other sources than
#: the ``_cpu*.c``/``.h`` beside this file (a C change since the last build), so its step
#: codes and arguments may not be this tree's ("program: step N is no step", or worse).
#: The numpy kernels serve then, with a warning: every result stays right, only slower,
#: and a run or a test is not blocked by a rebuild it can be told about.
STALE: str | None = None
if _cpu is not None:
    _here = digest(Path(__file__).parent)
    if _here is not None and getattr(_cpu, "SOURCE_DIGEST", None) != _here:
        STALE = (f"{_cpu.__file__} was built from other sources than "
                 f"{Path(__file__).parent}/_cpu*.c, _cpu*.h (changed since): rebuild it with "
                 "pip install -e . (the numpy kernels serve until then, slower)")
        logging.getLogger("iron_spec").warning("operators._cpu is stale: %s", STALE)
        _cpu = None

BUILT = _cpu is not None
#: The extension, unless IRON_SPEC_NATIVE turns it off (0, false, off, no).
LIB = _cpu if os.environ.get("IRON_SPEC_NATIVE", "1").strip().lower() not in (
    "0", "false", "off", "no") else None


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads() -> int:
    """The threads a model runs on: ``OPENBLAS_NUM_THREADS`` or ``OMP_NUM_THREADS`` where
    set, else every core this process may run on (OpenBLAS's own default), and never more
    than those cores: a pool thread without a core of its own stalls every call. The same
    count serves BLAS in a prompt chunk and the pool in a decode step, never both at once."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(var, "").strip()
        if value.isdigit() and int(value) > 0:
            return min(int(value), cores())
    return cores()


def describe(tiles: bool = True, held_rows: bool = False) -> str:
    """Which kernels a decode step runs on, for logs and bench reports; ``tiles``: and the
    kernel bfloat16 prefill weights' GEMMs run on where they read bfloat16 tiles (float32
    weights rounded at load); ``held_rows``: where they read weights held as bfloat16 rows in
    place, x rounded to bfloat16 (``_cpu_held_gemm.h``: VDPBF16PS, or the widening GEMM where
    the tiles run portable). Say each only where it ran."""
    if LIB is None:
        return "numpy (" + ("IRON_SPEC_NATIVE off" if BUILT else "operators._cpu stale: rebuild "
                            "with pip install -e ." if STALE else "operators._cpu not built") + ")"
    return (f"operators._cpu, {lib().threads()} threads, {LIB.simd()} (this CPU: "
            f"{', '.join(LIB.available())})"
            + (", block forms' GEMV on VNNI" if LIB.simd() == "avx512" and LIB.vnni() else "")
            + "; prompt GEMMs: "
            + ("operators._cpu" if GEMM == "native" else "numpy's BLAS (IRON_SPEC_GEMM=blas)")
            + (f", on bfloat16 tiles {LIB.tiles()}" if tiles else "")
            + (", on the held bfloat16 rows in place ("
               + ("portable" if LIB.tiles() == "portable" else "avx512bf16")
               + ", x rounded to bfloat16)" if held_rows else "")
            + "; compiled steps: " + ("one native call" if PROGRAM else
                                     "a Python call each (IRON_SPEC_PROGRAM=0)"))


SIMD_VARIABLE = "IRON_SPEC_SIMD"
#: Whether a compiled plan runs its steps as one native call (``Step``), unless
#: IRON_SPEC_PROGRAM turns it off (0, false, off, no).
PROGRAM = hasattr(LIB, "program") and os.environ.get("IRON_SPEC_PROGRAM", "1").strip().lower() \
    not in ("0", "false", "off", "no")

#: The per-call values a step's ``start`` may come from, in the order ``_cpu.run`` takes them.
CALL = ("start", "rows", "position")
# The step codes of operators/_cpu_program.h, in its order.
(OP_GEMV, OP_ATTEND, OP_RMS_NORM, OP_ADD, OP_MUL, OP_GATED, OP_ROPE, OP_KV_WRITE,
 OP_EMBEDDING, OP_LAYER_NORM, OP_COLUMNS, OP_ACTIVATION, OP_CLAMP, OP_SOFTCAP,
 OP_ADD_ROWS, OP_GEMM, OP_TAKE_ROW, OP_ROUTER, OP_EXPERTS, OP_CAUSAL_CONV, OP_SCAN, OP_SSD,
 OP_DELTA, OP_GATED_NORM) = range(24)
ACT_SILU, ACT_GELU_TANH, ACT_GELU_ERF, ACT_RELU, ACT_QUICK_GELU, ACT_RELU2, ACT_SIGMOID = range(7)


class Step(NamedTuple):
    """One step of a native program (``Operator.lower``): its code (``OP_*``), its arrays
    (output first; None for an absent input), and the ints and floats its code takes
    (``operators/_cpu_program.h``). Every array is C-contiguous (or, where its code reads
    it so, float32 rows apart: ``rows_apart``) and stays where it is while the program
    lives (the program holds it).

    ``rows``: which int counts the leading axis of the step's arrays (their rows, or rows
    times a width), where the step may run fewer rows than its arrays hold (a prompt chunk's
    ``rows``: ``program``); None where it may not."""

    op: int
    arrays: tuple
    ints: tuple = ()
    floats: tuple = ()
    rows: int | None = None


def contiguous(*arrays) -> bool:
    """Whether every array given (None aside) is C-contiguous: what a native step reads."""
    return all(a is None or a.flags.c_contiguous for a in arrays)


def rows_apart(*arrays) -> bool:
    """Whether every array given (None aside) is float32 rows a stride apart, each row (and
    in three dimensions, each row's heads) contiguous: what a prompt chunk's native
    elementwise kernels (``gated``, ``rms_norm``) read, a fused projection's column views
    among them."""
    for a in arrays:
        if a is None:
            continue
        if a.dtype != np.float32 or a.ndim not in (2, 3) or a.strides[-1] != 4 \
                or (a.ndim == 3 and a.strides[1] != 4 * a.shape[2]) \
                or a.strides[0] < 4 * (a.size // max(1, a.shape[0])):
            return False
    return True


def program(steps: list[tuple]):
    """The native program of ``steps``, for ``run``: each a ``Step``, its ``start`` (a
    ``base.PerCall``, an int, or None for none) and optionally its capacity: where given,
    the step's arrays hold that many rows (a bounded step's, ``Step.rows`` its count) and
    each run takes the call's ``rows`` of them.

    Raises:
        ValueError: a step's arrays do not fit its code (naming the step), or a capacity is
            given to a step without ``rows``.
    """
    return encoded_program([encode(step, start, *bound, index=j)
                            for j, (step, start, *bound) in enumerate(steps)])


def encode(step: Step, start, capacity: int | None = None, index: int = 0) -> tuple:
    """One step of ``program`` as the extension takes it (``encoded_program``): a plan
    keeps each step's, so binding a few of its steps to new arrays encodes only those.

    Raises:
        ValueError: a capacity given to a step without ``rows`` (naming it as step ``index``).
    """
    if start is None or isinstance(start, int):
        at, offset = -1, start or 0
    else:
        at, offset = CALL.index(start.name), start.offset
    if capacity is not None and step.rows is None:
        raise ValueError(f"program: step {index} (op {step.op}) takes no rows")
    rows_at = -1 if capacity is None else step.rows
    return (step.op, at, offset, step.arrays, tuple(int(i) for i in step.ints),
            tuple(float(f) for f in step.floats), rows_at, int(capacity or 0))


def encoded_program(encoded: list[tuple]):
    """The native program of steps already ``encode``d.

    Raises:
        ValueError: a step's arrays do not fit its code (naming the step).
    """
    return lib().program(tuple(encoded))


def run(prog, call, first: int, last: int, positions: tuple | None = None) -> None:
    """Steps ``first .. last`` of ``prog`` at ``call``'s per-call values; ``positions``: each
    row's position, which a step encoded with start ``ROW + r`` reads (a batched decode
    step's rows, each its own sequence: ``runtime.batch``)."""
    if positions is None:
        LIB.run(prog, call.get("start", 0), call.get("rows", 1), call.get("position", 0),
                first, last)
    else:
        LIB.run(prog, call.get("start", 0), call.get("rows", 1), call.get("position", 0),
                first, last, positions)


#: A step's ``start_from`` for row 0's position of a run's ``positions`` (row r: ROW + r),
#: and how many rows a run may give (``operators/_cpu_program.h``'s CALL_ROWS).
ROW, CALL_ROWS = len(CALL), 256

class Profile(dict):
    """Each compiled step's calls and wall seconds by its code (``gemm``, ``attend``, ...),
    summed over every native run inside ``profile()``: {code: (calls, seconds)}."""


@contextmanager
def profile() -> Iterator[Profile]:
    """Count the native programs' steps by code while the block runs; the ``Profile`` is
    filled when it ends. Steps run outside a program (IRON_SPEC_PROGRAM=0, check's per-step
    runs) are not counted.

    Raises:
        RuntimeError: the extension is not in use (nothing would be counted).
    """
    if LIB is None:
        raise RuntimeError("native.profile needs operators._cpu (built, IRON_SPEC_NATIVE on)")
    LIB.profile(True)
    out = Profile()
    try:
        yield out
    finally:
        out.update({k: (calls, ns * 1e-9) for k, (calls, ns) in LIB.profile(False).items()})


#: Who runs a prompt chunk's projections (GEMMs): ``native``, the extension's blocked GEMM
#: on the same pool as the decode step (the default where it is built), or ``blas``,
#: numpy's BLAS (OpenBLAS), through IRON_SPEC_GEMM=blas.
GEMM = "blas" if os.environ.get("IRON_SPEC_GEMM", "").strip().lower() == "blas" else "native"


def _pick_simd() -> None:
    """The instruction set IRON_SPEC_SIMD names, where it names one (once, before the first
    call). Raises ValueError where it names none of them or one this CPU lacks."""
    want = os.environ.get(SIMD_VARIABLE, "").strip().lower()
    if not want:
        return
    try:
        LIB.use(want)
    except ValueError as e:
        raise ValueError(f"{SIMD_VARIABLE}={want}: {e} (this CPU runs "
                         f"{', '.join(LIB.available())})") from None


def gemm_lib():
    """The extension where it runs a prompt chunk's GEMMs (``GEMM``), else None."""
    return lib() if GEMM == "native" else None


def lib():
    """The extension with its pool started (once), or None where it is not in use.

    Raises:
        ValueError: IRON_SPEC_SIMD names an instruction set this CPU lacks.
    """
    # Asked of the pool at every call (a C call, ~0.1 us), not remembered here: a forked
    # child's pool is empty again (operators/_cpu.c) and must start its own workers.
    if LIB is not None and LIB.threads() == 0:
        _pick_simd()
        LIB.start(threads())
    return LIB


def attend_scratch(heads: int, kv_heads: int, head_dim: int, positions: int) -> int:
    """float32 elements ``_cpu.attend`` needs for one query over up to ``positions`` keys."""
    T = max(1, threads())
    span = (positions + T - 1) // T + 1
    return heads * head_dim + T * (heads // kv_heads) * span + T * heads * (head_dim + 2)


def attend_chunk_scratch(head_dim: int, positions: int) -> int:
    """float32 elements ``_cpu.attend_chunk`` needs for a prompt chunk's queries over up to
    ``positions`` keys: per thread, a block of up to 32 queries (2 vectors of AVX-512's 16
    lanes) and their scores."""
    return max(1, threads()) * 32 * (head_dim + positions + 32)
