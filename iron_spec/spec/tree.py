"""The module tree a spec expands to on a config.json, at a small size and without weights:
what lint builds to check a spec and ``show`` prints. A causal spec's tree is a
``runtime.causal.CausalLM``, an encoder's a ``runtime.encoder.Encoder``.

Not for: a model to run, with its context fitted and its weights filled (``build``,
``encoder.load_encoder``).
"""

from __future__ import annotations

from iron_spec.runtime.causal import CausalLM
from iron_spec.runtime.checkpoint import mark_transposed
from iron_spec.runtime.encoder import Encoder
from iron_spec.runtime.host import host_budget

from .build import _footprint, too_large
from .encoder import expand_encoder
from .interpreter import expand


def build_tree(spec, config_json: dict, source: str, part=None, renames: dict | None = None):
    """The module tree ``spec`` expands to on ``config_json``, at a small size (what lint
    builds to check a spec): a CausalLM, or an Encoder for ``model: encoder`` (with the
    pooler and task head ``part`` says the checkpoint holds, a ``parts.Part``). Where
    ``renames`` is given, it is filled with the checkpoint's renames as this config resolves
    them (a ``{when, then, else}`` target chosen), as a load reads them.

    Raises:
        SpecError: the spec does not expand on the config.
        ValueError: the expanded options do not build.
    """
    if spec.get("model") == "encoder":
        expanded = expand_encoder(spec, config_json, source=source, part=part)
        tree = Encoder(expanded.options)
    else:
        expanded = expand(spec, config_json, max_seq_len=16, prefill_chunk=16, source=source)
        parts: dict = {}
        fixed, _ = _footprint(expanded.options, parts=parts)
        if fixed > host_budget():
            raise spec.error(("config",), too_large(expanded, source, parts["weights"], fixed,
                                                    host_budget(), "its module tree and a "
                                                    "16-token prompt chunk's activations"))
        tree = CausalLM(expanded.options)
    mark_transposed(tree, expanded.transposed)
    if renames is not None:
        renames.update(expanded.renames)
    return tree
