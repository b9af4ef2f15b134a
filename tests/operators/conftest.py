"""Running an operator's kernel as a compiled plan would, and checking it against the reference.

The kernel gets float32 inputs (weights at ``packed`` indexes through ``op.pack``), an
output buffer and scratch both filled with NaN (so an element the kernel leaves unwritten,
or scratch it reads before writing, shows), and the attributes. The reference gets the same
float32 values as loaded, so the comparison measures the kernel's arithmetic alone.
"""

from __future__ import annotations

import numpy as np
import pytest

from iron_spec.operators import native


def _shapes(inputs) -> tuple:
    # An absent optional input (None) has no shape, as in a plan (linear's bias).
    return tuple(None if x is None else np.shape(x) for x in inputs)


def _run_kernel(op, *inputs, packed=(), **attrs):
    shapes = _shapes(inputs)
    args = []
    for i, x in enumerate(inputs):
        if x is None:
            args.append(None)
            continue
        x = np.asarray(x)
        if i in packed:
            args.append(op.pack(i, x, **attrs))
        elif x.dtype.kind == "f":
            args.append(np.array(x, np.float32))  # a copy: a kernel may write an input
        else:
            args.append(x)
    out = np.full(op.shape(*shapes, **attrs), np.nan, np.float32)
    scratch = np.full(max(1, op.scratch(*shapes, **attrs)), np.nan, np.float32)
    op.kernel(out, *args, scratch=scratch, **attrs)
    return args[op.writes] if op.writes is not None else out


def _check_kernel(op, *inputs, packed=(), **attrs):
    """Assert ``|kernel - reference| <= tol.bound(scale)``; return both outputs."""
    shapes = _shapes(inputs)
    got = _run_kernel(op, *inputs, packed=packed, **attrs)
    # The reference may write a cache in place.
    ref_inputs = [None if x is None else np.array(x) for x in inputs]
    ref = op.reference(*ref_inputs, **attrs)
    assert got.dtype == np.float32
    assert got.shape == ref.shape == op.shape(*shapes, **attrs)
    bound = op.tolerance(*shapes, **attrs).bound(op.scale(ref, *inputs, **attrs))
    err = np.abs(got.astype(np.float64) - ref)
    bad = ~(err <= bound)  # NaN fails
    assert not bad.any(), (
        f"{op.name} {attrs}: {bad.sum()} of {bad.size} elements out of bound; "
        f"worst err {np.nanmax(err)} vs bound {np.min(np.broadcast_to(bound, err.shape)[bad])}")
    return got, ref


@pytest.fixture
def run_kernel():
    return _run_kernel


@pytest.fixture
def check_kernel():
    return _check_kernel


@pytest.fixture
def rng():
    return np.random.default_rng(20240607)


def f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


@pytest.fixture
def randn(rng):
    """``randn(*shape, scale=1.0)``: standard normal float32 values from the fixed ``rng``."""
    return lambda *shape, scale=1.0: f32(rng, *shape, scale=scale)


SIMD = ("portable", "avx2", "avx512")


@pytest.fixture(params=SIMD)
def simd(request):
    """Run a test on each instruction set's kernels in turn (skipped where this CPU lacks
    it), then go back to the one in use."""
    if native.LIB is None:
        pytest.skip("the decode pool is off here (IRON_SPEC_NATIVE) or operators._cpu is not built")
    if request.param not in native.LIB.available():
        pytest.skip(f"this CPU has no {request.param} (it runs {native.LIB.available()})")
    before = native.LIB.simd()
    native.LIB.use(request.param)
    yield request.param
    native.LIB.use(before)
