"""The declarative layer over the runtime, in three parts: reading and expanding specs
(``spec``), the library a Python user drives (``library``), the commands (``cli``); beside
them ``runtime`` and ``operators`` (tests/test_layering.py holds imports to that order).

``iron_spec.load(spec, checkpoint)`` gives a model to drive from Python
(``iron_spec.library.api``); its names load on first use, so ``import iron_spec.operators``
pulls in nothing else.
"""

from . import operators  # noqa: F401  (first: sets OpenBLAS's idle spin before numpy loads; operators.blas_env)

_API = ("load", "Model", "EncoderModel", "Conversation", "ContextFull")
_GENERATION = ("Completion", "Stream")
__all__ = [*_API, *_GENERATION]


def __getattr__(name: str):
    if name in _API:
        from .library import api
        return getattr(api, name)
    if name in _GENERATION:
        from .runtime import generation
        return getattr(generation, name)
    raise AttributeError(f"module 'iron_spec' has no attribute {name!r}")
