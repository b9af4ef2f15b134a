"""Which options belong to one kind only: data, one row per kind-chosen section.

A section's kind is chosen by a discriminator (``layer.kind``, ``layer.norm.kind``,
``model``; absent, the schema's default). A row lists, per kind, the options of the section
only that kind takes; lint refuses such an option under any other kind. Options no row
lists are every kind's (the schema alone says which keys exist). A kind-only option is a
word here beside its entry in spec.schema.json; tests/iron_spec/spec/test_lint.py checks every
kind and option named here exists there.
"""

from __future__ import annotations

from typing import NamedTuple


class Row(NamedTuple):
    section: tuple[str, ...]  # the mapping whose keys are checked
    chosen_by: tuple[str, ...]  # the discriminator's path from the top level
    only: dict[str, tuple[str, ...]]  # kind -> the section's options only that kind takes


CAUSAL_LAYERS = ("decoder", "sandwich", "ple")  # the layer kinds of model causal

KINDS: tuple[Row, ...] = (
    Row((), ("model",), {"causal": ("head", "recurrence"), "encoder": ("pooling",)}),
    Row(("embedding",), ("model",), {"causal": ("prefix", "segments", "padding_id"),
                                     "encoder": ("position_padding", "token_types", "task_types",
                                                  "token_dropout", "size",
                                                  "project", "languages", "word_transform")}),
    Row(("runtime",), ("model",), {"causal": ("prefill_chunk",), "encoder": ("max_tokens",)}),
    Row(("layer",), ("layer", "kind"), {
        **{k: ("kv_sharing", "laurel", "altup", "residual_gates")
           + (("per_layer_input",) if k in ("sandwich", "ple") else ())
           + (("parallel", "shared_norm", "first_attention_norm", "residual_weights")
              if k == "decoder" else ())
           for k in CAUSAL_LAYERS},
        "encoder": ("first_attention_norm", "final_norm_bias", "sharing", "mixing",
                    "bottleneck", "feedforwards", "pointwise")}),
    Row(("layer", "attention"), ("layer", "kind"), {
        **{k: ("softcap", "qk_norm_on",
               "v_norm", "values_from_keys", "clip_qkv", "qk_norm_after_rope",
               "alibi", "alibi_scaled", "alibi_bfloat16", "sinks", "rope_on",
               "qkv_shards", "qkv_order", "latent", "differential", "sub_norm",
               "dynamic_mask", "output_gate", "sees", "reach")
           for k in CAUSAL_LAYERS},
        "encoder": ("disentangled", "span_conv", "landmarks",
                    "value_conv", "lsh_expectation", "global_tokens")}),
    Row(("layer", "norm"), ("layer", "norm", "kind"), {"layer": ("bias",), "no_norm": ("bias",)}),
    Row(("layer", "mlp"), ("layer", "kind"), {**{k: ("sub_norm",) for k in CAUSAL_LAYERS},
                                              "encoder": ("down_bias",)}),
)
