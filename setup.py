"""The one compiled part: ``iron_spec.operators._cpu``, the decode step's kernels (see its source).

Optional: without a C compiler the install goes on and the numpy kernels serve.
Everything else about the package is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "iron_spec.operators._cpu", ["operators/_cpu.c"],
    depends=["operators/_cpu_vec.h", "operators/_cpu_gemv.h", "operators/_cpu_program.h",
             "operators/_cpu_chunk.h"],
    optional=True,
    extra_compile_args=["-O3", "-pthread", "-fno-strict-aliasing"],
    extra_link_args=["-pthread"],
)])
