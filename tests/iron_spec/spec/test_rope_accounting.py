"""Every key of config.json's rope_parameters is read, ignored on purpose or refused, as every
top-level key is: read where its table's rope_type reads it (transformers'
_validate_<type>_rope_parameters), where a config field names it, or where ignore: lists it.
A key nothing reads is a default silently kept (a trial ran Ministral 3's
llama_4_scaling_beta through a spec that never scaled its queries)."""

from __future__ import annotations

import copy

import pytest

from iron_spec.spec.accounting import account
from iron_spec.spec.errors import SpecError
from iron_spec.spec.loader import load_spec
from tests.conftest import SPECS


def toy(name: str) -> tuple:
    spec = load_spec(SPECS / f"{name}.yaml")
    return spec, copy.deepcopy(spec.get("toy", "config"))


def refused(spec, config) -> str:
    with pytest.raises(SpecError) as e:
        account(spec, config, "cfg/config.json")
    return e.value.message


def test_a_made_up_key_is_refused_by_name_and_file():
    spec, config = toy("ministral3")
    account(spec, config, "cfg/config.json")
    config["rope_parameters"]["made_up"] = 3
    message = refused(spec, config)
    assert "cfg/config.json: key 'rope_parameters.made_up' (= 3)" in message
    assert "llama_4_scaling_beta" not in message  # read by the spec's field


def test_a_family_key_is_refused_by_a_spec_that_does_not_read_it():
    # Ministral 3's query scale under Ministral's spec, which builds none.
    spec, config = toy("ministral")
    config["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                 "original_max_position_embeddings": 16,
                                 "llama_4_scaling_beta": 0.1}
    assert "'rope_parameters.llama_4_scaling_beta' (= 0.1)" in refused(spec, config)
    del config["rope_parameters"]["llama_4_scaling_beta"]
    account(spec, config, "cfg/config.json")  # yarn's own keys are read


def test_a_key_of_another_rope_type_is_refused():
    # beta_fast is yarn's: under a linear table transformers warns and reads it never.
    spec, config = toy("ministral")
    config["rope_parameters"] = {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0,
                                 "beta_fast": 32.0}
    assert "'rope_parameters.beta_fast' (= 32.0)" in refused(spec, config)


def test_partial_rotary_factor_needs_a_spec_that_rotates_part():
    spec, config = toy("llama3")
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e4,
                                 "partial_rotary_factor": 0.5}
    assert "'rope_parameters.partial_rotary_factor' (= 0.5)" in refused(spec, config)
    spec, config = toy("glm4")
    config.setdefault("rope_parameters", {})["partial_rotary_factor"] = 0.5
    account(spec, config, "cfg/config.json")  # glm4 reads it (rotary_dim)


def test_tables_by_layer_type_are_accounted_each():
    spec, config = toy("gemma3")
    account(spec, config, "cfg/config.json")
    config["rope_parameters"] = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}}
    for key in ("rope_theta", "rope_scaling", "rope_local_base_freq"):
        config.pop(key, None)
    account(spec, config, "cfg/config.json")
    config["rope_parameters"]["sliding_attention"]["made_up"] = 1
    assert "'rope_parameters.sliding_attention.made_up' (= 1)" in refused(spec, config)


def test_an_ignored_rope_key_is_accounted():
    spec, config = toy("ministral3")
    assert "rope_parameters.max_position_embeddings" in spec.get("ignore")
    account(spec, config, "cfg/config.json")  # the toy holds max_position_embeddings there
    spec.data["ignore"] = [k for k in spec.get("ignore") if not k.startswith("rope_parameters.")]
    assert "'rope_parameters.max_position_embeddings' (= 512)" in refused(spec, config)
