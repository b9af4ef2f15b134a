"""How many threads the kernels run on, chosen at run time (``iron-spec run --threads``).

A prompt chunk's GEMMs run on OpenBLAS's threads, a decode step on the decode pool
(``native``); both take the same count, never more than the cores (``native.threads``).
OpenBLAS reads ``OPENBLAS_NUM_THREADS`` once, when numpy loads it, so a count chosen later
is set through its own ``*set_num_threads`` call, found among the libraries this process
has loaded (numpy's wheel bundles ``libscipy_openblas64_``, whose symbols carry a prefix).
"""

from __future__ import annotations

import ctypes
import logging
import os

from . import native

log = logging.getLogger("iron_spec")
_SETTERS = ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_",
            "scipy_openblas_set_num_threads")


def _openblas_libraries() -> list[str]:
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
    except OSError:  # not Linux: OPENBLAS_NUM_THREADS before the process starts decides
        return []
    return sorted(p for p in paths
                  if "openblas" in os.path.basename(p).lower() and ".so" in os.path.basename(p))


def set_threads(n: int) -> int:
    """Run the kernels on ``n`` threads (at most the cores); returns the count in use.

    ``n`` past the cores is cut to them, a warning on the ``iron_spec`` logger saying so
    (what ``run --threads`` prints on stderr). The decode pool starts once per process: a
    pool already started with another count keeps it (a warning says so).

    Raises:
        ValueError: ``n`` is not a whole number >= 1.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"threads {n!r} is not a whole number >= 1")
    cores = native.cores()
    if n > cores:
        log.warning("threads %d asked for, %d used: this process may run on %d core%s, and a "
                    "thread without a core of its own stalls the others", n, cores, cores,
                    "s" * (cores != 1))
        n = cores
    os.environ["OPENBLAS_NUM_THREADS"] = str(n)  # the decode pool reads it as it starts
    for path in _openblas_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _SETTERS:
            if hasattr(lib, name):
                getattr(lib, name)(ctypes.c_int(n))
                break
    started = native.LIB.threads() if native.LIB is not None else 0
    if started and started != n:
        log.warning("the decode pool already runs %d threads in this process; it keeps them "
                    "(BLAS now runs %d)", started, n)
    return n
