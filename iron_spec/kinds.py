"""Which options each kind of a kind-chosen section takes: data, one row per kind.

A section (``layer``, ``layer.norm``, ``layer.mlp``) chooses its kind with its ``kind`` key
(else the schema's default); lint refuses an option the chosen kind does not take. A new
kind is a row here beside its entry in spec.schema.json's ``kind`` enum of that section;
tests/iron_spec/test_lint.py checks the two agree, so neither is added without the other.
"""

from __future__ import annotations

KINDS: dict[tuple[str, ...], dict[str, tuple[str, ...]]] = {
    ("layer",): {"decoder": ("norm", "residual_scale", "attention", "mlp"),
                 "encoder": ("norm", "placement", "attention", "mlp")},
    ("layer", "norm"): {"rms": ("eps", "plus_one"), "layer": ("eps",)},
    ("layer", "mlp"): {"gated": ("act", "bias"), "plain": ("act", "bias")},
}
