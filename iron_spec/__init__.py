"""The declarative layer: specs, their schema and lint, the interpreter and the CLI."""

from . import operators  # noqa: F401  (first: sets OpenBLAS's idle spin before numpy loads; operators.blas_env)
