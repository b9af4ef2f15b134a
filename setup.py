"""The one compiled part: ``iron_spec.operators._cpu``, the decode step's kernels (see its source).

Optional: without a C compiler the install goes on and the numpy kernels serve.
Everything else about the package is in pyproject.toml.
"""

import importlib.util
from pathlib import Path

from setuptools import Extension, setup

# The sources' digest, compiled in: operators/native.py compares it with the sources beside
# it at import, so an extension left from before a C change is never called (it falls back).
_spec = importlib.util.spec_from_file_location("_sources", Path("operators", "_sources.py"))
_sources = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_sources)

setup(ext_modules=[Extension(
    "iron_spec.operators._cpu", ["operators/_cpu.c"],
    depends=["operators/_cpu_vec.h", "operators/_cpu_gemv.h", "operators/_cpu_program.h",
             "operators/_cpu_chunk.h", "operators/_cpu_tiles.h", "operators/_cpu_held.h",
             "operators/_cpu_held_x8.h", "operators/_cpu_experts.h", "operators/_cpu_experts_q8.h",
             "operators/_cpu_recurrent.h", "operators/_cpu_held_gemm.h", "operators/_cpu_skinny.h",
             "operators/_cpu_held_k.h", "operators/_cpu_attend_rows.h"],
    optional=True,
    define_macros=[("IRON_SPEC_SOURCE_DIGEST", f'"{_sources.digest("operators")}"')],
    extra_compile_args=["-O3", "-pthread", "-fno-strict-aliasing"],
    extra_link_args=["-pthread"],
)])
