"""Modules, recording, compile, reference, sessions, generation and checkpoints: the runtime.

Imports only ``iron_spec.operators``; nothing of the declarative layer (specs, library,
commands) above it (tests/test_layering.py)."""

from iron_spec import operators  # noqa: F401  (first: sets OpenBLAS's idle spin before numpy loads; operators.blas_env)
