"""Modules, recording, compile, reference, sessions and checkpoints: the runtime."""

from iron_spec import operators  # noqa: F401  (first: sets OpenBLAS's idle spin before numpy loads; operators.blas_env)
