"""What a golden recording says where the weights do not fit transformers' class: each side
named (found by a new user's trial: ESM's contact_head, held by transformers' EsmModel and
unread by the spec, was reported as "transformers' model lacks" it, the wrong side)."""

from __future__ import annotations

from iron_spec.library.golden_record import misfit


def test_a_tensor_transformers_holds_and_the_spec_lacks_names_each_side():
    said = misfit("EsmModel", "specs/esm.yaml", ["contact_head.regression.weight"], [], [])
    assert said == ("the weights do not fit transformers' EsmModel: transformers' EsmModel "
                    "holds contact_head.regression.weight, which the spec's model neither has "
                    "nor declares unread (a tensor EsmModel holds and the model never reads "
                    "goes in specs/esm.yaml's checkpoint.unused)")


def test_a_tensor_the_spec_writes_and_transformers_does_not_take_is_the_specs():
    said = misfit("BertModel", "s.yaml", [], ["encoder.extra.weight"], [])
    assert "the spec's model has encoder.extra.weight, which transformers' BertModel does " \
           "not take" in said and "holds" not in said


def test_a_mis_shaped_tensor_gives_both_shapes_in_transformers_order():
    # transformers' mismatched_keys: (name, the checkpoint's shape, the model's shape).
    said = misfit("BertModel", "s.yaml", [], [], [("pooler.dense.weight", (64, 32), (64, 64))])
    assert said.endswith("pooler.dense.weight is [64, 32] in the spec's model, [64, 64] in "
                         "BertModel")
