"""Reading and expanding specs: a YAML file and a checkpoint's config.json in, a model out.

The loader (safe YAML, every node's place kept), the schema (``spec.schema.json``) and lint's
rules, the expression language, the config.json mapping, the registry of shipped specs, the
interpreter and its option readers (``options``), the encoder's expansion, and ``build``:
from a spec and a checkpoint (or drawn weights) to a loaded model.

Not for: driving a loaded model (``iron_spec.library``), the commands (``iron_spec.cli``),
running a graph (``iron_spec.runtime``). Imports only ``runtime`` and ``operators`` below it.
"""
