"""What transformers reads of a config.json, by model type (iron_spec/keys.json, recorded
beside the goldens), and what a load makes of it: keys read under their aliases, a spec
picked by model type where no spec serves the architectures a checkpoint names."""

from __future__ import annotations

import json

import pytest

from iron_spec.spec import keys
from iron_spec.spec.build import load_model
from iron_spec.spec.config import aliased, resolve
from iron_spec.spec.errors import SpecError
from iron_spec.spec.loader import load_spec
from iron_spec.spec.registry import for_architectures, for_checkpoint
from tests.conftest import ROOT, SPECS

LLAMA = SPECS / "llama3.yaml"


def toy(name: str, **changes) -> dict:
    return {**load_spec(SPECS / f"{name}.yaml").get("toy", "config"), **changes}


def test_every_committed_golden_records_what_transformers_reads_and_keys_json_gathers_it():
    # keys.json is the goldens' meta gathered (python -m tests.goldens.keys --gather): a
    # golden re-recorded by a newer transformers shows in it, never at a user's load.
    from tests.goldens.keys import HERE, gather, meta_of

    paths = sorted(HERE.glob("*/*.npz"))
    lacking = [str(p.relative_to(HERE)) for p in paths if "config_keys" not in meta_of(p)]
    assert not lacking, (f"goldens recording no config_keys: {lacking}; record them where "
                         "transformers is installed: python -m tests.goldens.keys")
    assert gather(paths) == json.loads(keys.STORE.read_text()), \
        f"{keys.STORE} is not the goldens' config_keys gathered: python -m tests.goldens.keys --gather"


def test_a_record_says_why_transformers_reads_a_key():
    llama = keys.recorded("llama")
    assert llama.why("rms_norm_eps") == "a field of LlamaConfig"
    assert llama.why("rope_theta") == "read by LlamaConfig as it is built"  # into rope_parameters
    assert llama.why("sliding_window").startswith("read by cache_utils.py")
    for unread in ("_name_or_path", "auto_map", "cache_implementation", "transformers.js_config"):
        assert llama.why(unread) is None, unread
    assert keys.recorded("exaone").why("num_layers") == "ExaoneConfig's alias of num_hidden_layers"
    assert keys.recorded("no_such_type") is None and keys.recorded(None) is None


def test_a_key_is_read_under_its_alias_as_transformers_sets_it():
    # InternLM3Config: qkv_bias and bias are attention_bias and mlp_bias; the alias wins
    # where both are given (transformers sets it last).
    data = aliased({"model_type": "internlm3", "qkv_bias": True, "bias": True,
                    "attention_bias": False})
    assert (data["attention_bias"], data["mlp_bias"]) == (True, True)
    # specs/internlm3.yaml reads InternLM3's own spelling; a config.json transformers 5
    # saved (attention_bias, mlp_bias) is read all the same.
    spec = load_spec(SPECS / "internlm3.yaml")
    config = toy("internlm3", attention_bias=True, mlp_bias=True)
    del config["qkv_bias"], config["bias"]
    assert resolve(spec, config).values["attention_bias"] is True
    assert resolve(spec, config).values["mlp_bias"] is True


def test_a_spec_is_picked_by_model_type_where_no_spec_serves_the_name(tmp_path):
    # transformers' AutoModelForCausalLM builds a config.json by its model_type whatever its
    # architectures say (a fine-tune's own class name, or none at all).
    assert for_architectures(["MyLlamaForCausalLM"], "cfg", config={"model_type": "llama"}).stem == "llama3"
    assert for_architectures(None, "cfg", config={"model_type": "qwen3"}).stem == "qwen3"
    with pytest.raises(ValueError, match="no spec serves MyThing or model_type nope"):
        for_architectures(["MyThing"], "cfg", config={"model_type": "nope"})
    (tmp_path / "config.json").write_text(json.dumps(toy("llama3", architectures=["MyLlama"])))
    assert for_checkpoint(tmp_path).stem == "llama3"
    assert load_model(LLAMA, checkpoint=tmp_path, random_weights=0).lm.config.vocab_size == 256


def test_another_model_type_under_a_named_spec_is_still_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(toy("llama3", architectures=["MyQwen"],
                                                          model_type="qwen3")))
    with pytest.raises(SpecError, match="the architecture does not match"):
        load_model(LLAMA, checkpoint=tmp_path, random_weights=0)


def test_keys_json_covers_every_spec_with_a_golden():
    # Every spec whose goldens are committed is accounted by what transformers reads: a
    # golden recorded for it says which model types it serves.
    specs = {s for e in json.loads(keys.STORE.read_text())["model_types"].values()
             for s in e["specs"]}
    with_goldens = {p.parent.name for p in (ROOT / "tests" / "goldens").glob("*/*.npz")}
    assert with_goldens <= specs
