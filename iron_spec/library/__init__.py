"""The library a Python user drives: ``iron_spec.load`` -> ``Model`` / ``EncoderModel``
(``api``), texts' embeddings (``embedding``), and the goldens that judge a model: where they
are stored (``goldens``), recording them from transformers (``golden_record``), a spec's
config defaults against transformers' (``config_defaults``).

Not for: reading specs (``iron_spec.spec``), the commands (``iron_spec.cli``), the draw loop
and sampling settings (``iron_spec.runtime.generation``). Imports only ``spec``, ``runtime``
and ``operators`` below it.
"""
