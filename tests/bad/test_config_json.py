"""Bad config.json values refused at load, each naming config.json and the key (issue 13):
RoPE parameters NaN, zero, negative or of the wrong type, ids outside the vocabulary, a
window past any kernel's int, and files that are not what config.json must be."""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path

import jinja2
import pytest

from iron_spec.spec.build import load_model
from iron_spec.spec.errors import SpecError
from iron_spec.runtime.checkpoint import CheckpointError
from tests.bad.corpus import LLAMA, dump, toy_config
from tests.conftest import SPECS

EXPECTED = (SpecError, CheckpointError, FileNotFoundError, ValueError, jinja2.TemplateError)
NAN, INF = float("nan"), float("inf")


def rope(**over):
    """The toy's llama3 RoPE table with ``over`` (None deletes a key)."""
    def edit(c):
        table = dict(c["rope_scaling"])
        for k, v in over.items():
            if v is None:
                table.pop(k, None)
            else:
                table[k] = v
        c["rope_scaling"] = table
    return edit


def key(name, value):
    def edit(c):
        c[name] = value
    return edit


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}
LONGROPE = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
            "original_max_position_embeddings": 128}

# (case, edit of the toy config.json, what the refusal names beside config.json)
CASES = [
    ("factor_nan", rope(factor=NAN), "rope_parameters.factor is nan"),
    ("factor_zero", rope(factor=0), "rope_parameters.factor is 0"),
    ("factor_negative", rope(factor=-8.0), "rope_parameters.factor is -8.0"),
    ("factor_infinite", rope(factor=INF), "rope_parameters.factor is inf"),
    ("factor_text", rope(factor="8"), "rope_parameters.factor is '8' (text)"),
    ("factor_boolean", rope(factor=True), "rope_parameters.factor is True (a boolean)"),
    ("factor_list", rope(factor=[8]), "rope_parameters.factor is [8] (a list)"),
    ("factor_missing", rope(factor=None), "rope_parameters.factor is missing"),
    ("low_freq_zero", rope(low_freq_factor=0), "rope_parameters.low_freq_factor is 0"),
    ("low_freq_nan", rope(low_freq_factor=NAN), "rope_parameters.low_freq_factor is nan"),
    ("high_freq_text", rope(high_freq_factor="4"), "rope_parameters.high_freq_factor is '4'"),
    ("freq_band_reversed", rope(high_freq_factor=0.5), "high_freq_factor 0.5 is below"),
    ("original_negative", rope(original_max_position_embeddings=-64),
     "rope_parameters.original_max_position_embeddings is -64"),
    ("original_fraction", rope(original_max_position_embeddings=2.5),
     "rope_parameters.original_max_position_embeddings is 2.5"),
    ("original_huge", rope(original_max_position_embeddings=10**30),
     "rope_parameters.original_max_position_embeddings is 1000000000000000000000000000000"),
    ("original_text", rope(original_max_position_embeddings="64"),
     "rope_parameters.original_max_position_embeddings is '64'"),
    ("rope_type_unknown", rope(rope_type="bogus"), "rope_parameters.rope_type is 'bogus'"),
    ("rope_type_number", rope(rope_type=3), "rope_parameters.rope_type is 3"),
    ("rope_scaling_list", key("rope_scaling", [1, 2]), "rope"),
    ("rope_scaling_text", key("rope_scaling", "llama3"), "rope"),
    ("yarn_theta_one", lambda c: c.update(rope_theta=1.0, rope_scaling=dict(YARN)),
     "rope_theta 1 with"),
    ("yarn_beta_fast_nan", key("rope_scaling", {**YARN, "beta_fast": NAN}),
     "rope_parameters.beta_fast is nan"),
    ("yarn_beta_slow_negative", key("rope_scaling", {**YARN, "beta_slow": -1}),
     "rope_parameters.beta_slow is -1"),
    ("yarn_attention_factor_zero", key("rope_scaling", {**YARN, "attention_factor": 0.0}),
     "rope_parameters.attention_factor is 0.0"),
    ("yarn_truncate_text", key("rope_scaling", {**YARN, "truncate": "yes"}),
     "rope_parameters.truncate is 'yes'"),
    ("yarn_mscale_nan", key("rope_scaling", {**YARN, "mscale": NAN}),
     "rope_parameters.mscale is nan"),
    ("yarn_original_missing", key("rope_scaling", {"rope_type": "yarn", "factor": 4.0,
                                                   "original_max_position_embeddings": None}),
     "rope_parameters.original_max_position_embeddings"),
    ("longrope_factor_text", key("rope_scaling", {**LONGROPE, "short_factor": ["x"] * 8}),
     "rope_parameters.short_factor[0] is 'x'"),
    ("longrope_factor_nan", key("rope_scaling", {**LONGROPE, "long_factor": [NAN] * 8}),
     "rope_parameters.long_factor[0] is nan"),
    ("longrope_factor_empty", key("rope_scaling", {**LONGROPE, "long_factor": []}),
     "rope_parameters.long_factor is []"),
    ("longrope_original_one", key("rope_scaling", {**LONGROPE,
                                                   "original_max_position_embeddings": 1}),
     "rope_parameters.original_max_position_embeddings is 1: longrope"),
    ("dynamic_two_columns", lambda c: c.update(head_dim=2, num_attention_heads=32,
                                               num_key_value_heads=16, rope_scaling={
                                                   "rope_type": "dynamic", "factor": 2.0}),
     "rotates 2 columns with dynamic scaling"),
    ("dynamic_factor_zero", key("rope_scaling", {"rope_type": "dynamic", "factor": 0}),
     "rope_parameters.factor is 0"),
    ("linear_factor_nan", key("rope_scaling", {"rope_type": "linear", "factor": NAN}),
     "rope_parameters.factor is nan"),
    ("theta_nan", key("rope_theta", NAN), "rope_theta"),
    ("theta_zero", key("rope_theta", 0), "rope_theta"),
    ("theta_text", key("rope_theta", "1e4"), "rope_theta"),
    ("theta_below_float32", key("rope_theta", 1e-300), "float32 cannot hold"),
    ("factor_below_float32", rope(factor=1e-300), "float32 cannot hold"),
    ("eps_nan", key("rms_norm_eps", NAN), "rms_norm_eps"),
    ("eps_negative", key("rms_norm_eps", -1e-5), "rms_norm_eps"),
    ("eps_text", key("rms_norm_eps", "1e-5"), "rms_norm_eps"),
    ("vocab_zero", key("vocab_size", 0), "vocab_size"),
    ("vocab_fraction", key("vocab_size", 258.5), "vocab_size"),
    ("vocab_boolean", key("vocab_size", True), "vocab_size"),
    ("vocab_text", key("vocab_size", "258"), "vocab_size"),
    ("heads_not_grouping", key("num_key_value_heads", 3), "config.json"),
    ("layers_negative", key("num_hidden_layers", -2), "num_hidden_layers"),
    ("positions_zero", key("max_position_embeddings", 0), "max_position_embeddings"),
    ("tie_text", key("tie_word_embeddings", "false"), "tie_word_embeddings"),
    ("act_unknown", key("hidden_act", "swish2"), "hidden_act"),
    ("architectures_text", key("architectures", "LlamaForCausalLM"),
     "architectures is 'LlamaForCausalLM', not a list"),
    ("architectures_numbers", key("architectures", [1]), "architectures is [1]"),
    ("eos_outside_vocab", key("eos_token_id", 300), "eos_token_id is 300"),
    ("eos_negative", key("eos_token_id", -1), "eos_token_id is -1"),
    ("eos_fraction", key("eos_token_id", 2.7), "eos_token_id is 2.7"),
    ("eos_text", key("eos_token_id", "257"), "eos_token_id is '257'"),
    ("eos_boolean", key("eos_token_id", True), "eos_token_id is True"),
    ("eos_list_member", key("eos_token_id", [257, "x"]), "eos_token_id[1] is 'x'"),
    ("eos_list_outside", key("eos_token_id", [257, 999]), "eos_token_id[1] is 999"),
    ("bos_negative", key("bos_token_id", -3), "bos_token_id is -3"),
    ("pad_fraction", key("pad_token_id", 1.5), "pad_token_id is 1.5"),
]


@pytest.mark.parametrize("case, edit, names", CASES, ids=[c[0] for c in CASES])
def test_a_bad_config_value_is_refused_naming_the_file_and_key(toy_dir, case, edit, names):
    config = toy_config()
    edit(config)
    text = json.dumps(config)  # NaN and Infinity as Python's json writes (and reads) them
    dump(toy_dir / "config.json", text)
    with pytest.raises(EXPECTED) as e:
        load_model(LLAMA, checkpoint=toy_dir, allow_unread_config=True)
    said = str(e.value)
    assert str(toy_dir / "config.json") in said and names in said, said


MISTRAL = str(SPECS / "mistral.yaml")


@pytest.mark.parametrize("window", [10**30, 2**31, 0, -4, 2.5, "64"])
def test_a_sliding_window_past_any_int_or_not_whole_is_refused(tmp_path, window):
    from iron_spec.spec.loader import load_spec
    config = dict(load_spec(MISTRAL).get("toy", "config"), sliding_window=window)
    dump(tmp_path / "config.json", config)
    with pytest.raises(SpecError) as e:
        load_model(MISTRAL, checkpoint=tmp_path, random_weights=0)
    assert "window" in e.value.message and "sliding_window" in e.value.message, e.value


FILES = [
    ("directory", lambda p: p.mkdir(), "is a directory, not a regular config.json"),
    ("fifo", lambda p: os.mkfifo(p), "is a FIFO (named pipe), not a regular config.json"),
    ("not_utf8", lambda p: p.write_bytes(b'{"a": "\xff"}'), "not UTF-8 text (byte 0xff at"),
    ("not_json", lambda p: p.write_text("{vocab_size: 4}"), "not valid JSON"),
    ("truncated", lambda p: p.write_text('{"vocab_size": 4'), "not valid JSON"),
    ("a_list", lambda p: p.write_text("[1, 2]"), "holds a list, not a JSON object"),
    ("empty", lambda p: p.write_text(""), "not valid JSON: Expecting value at line 1 column 1"),
    # json's message ends "starting at": said "at at line" (a new user's trial).
    ("unterminated", lambda p: p.write_text('{"model_type": "llama'),
     "not valid JSON: Unterminated string starting at line 1 column 16"),
    ("deeply_nested", lambda p: p.write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"),
     "nested too deeply"),
    # json keeps the last of a key given twice: a config.json edited by hand says 64 and 96.
    ("duplicate_key", lambda p: p.write_text('{"hidden_size": 64, "hidden_size": 96}'),
     "the key 'hidden_size' is given twice in one object (64, then 96)"),
    ("duplicate_nested_key", lambda p: p.write_text(
        '{"rope_parameters": {"rope_type": "default", "rope_type": "linear"}}'),
     "the key 'rope_type' is given twice in one object ('default', then 'linear')"),
]


@pytest.mark.parametrize("case, make, says", FILES, ids=[f[0] for f in FILES])
def test_a_config_json_that_is_no_json_object_is_refused_naming_it(toy_dir, case, make, says):
    path = toy_dir / "config.json"
    path.unlink()
    make(path)
    with pytest.raises(EXPECTED) as e:
        load_model(LLAMA, checkpoint=toy_dir)
    assert str(e.value).startswith(f"{path}: ") and says in str(e.value), e.value


BERT = str(SPECS / "bert.yaml")
ENCODER = [
    ("eps_nan", "layer_norm_eps", NAN, "layer.norm.eps is nan"),
    ("vocab_null", "vocab_size", None, "vocab_size is None"),
    ("positions_huge", "max_position_embeddings", 10**30, "embedding.positions is 1000000"),
    ("layers_billion", "num_hidden_layers", 10**9, "num_hidden_layers is 1000000000"),
    ("mlp_past_memory", "intermediate_size", 10**8, "GiB of weights, past this host's"),
    ("pad_outside_vocab", "pad_token_id", 10**6, "pad_token_id is 1000000"),
    ("token_types_negative", "type_vocab_size", -1, "embedding.token_types is -1"),
]


@pytest.mark.parametrize("case, name, value, says", ENCODER, ids=[e[0] for e in ENCODER])
def test_a_bad_encoder_config_is_refused_before_anything_is_allocated(tmp_path, case, name,
                                                                      value, says):
    from iron_spec.spec.encoder import load_encoder
    from iron_spec.spec.loader import load_spec
    config = dict(load_spec(BERT).get("toy", "config"), **{name: value})
    dump(tmp_path / "config.json", json.dumps(config))
    with pytest.raises(EXPECTED) as e:
        load_encoder(BERT, checkpoint=tmp_path, random_weights=0)
    assert str(tmp_path / "config.json") in str(e.value) and says in str(e.value), e.value


@pytest.mark.parametrize("max_seq_len", [None, 16])
def test_a_model_past_the_host_memory_is_refused_before_it_is_allocated(toy_dir, max_seq_len):
    # 2**31 - 1 rows of 64: 512 GiB of embedding. numpy would map it lazily and the weights'
    # draw (or read) would then meet the OOM killer; found by the config fuzzer at 10x.
    config = dict(toy_config(), vocab_size=2**31 - 1)
    dump(toy_dir / "config.json", config)
    with pytest.raises(ValueError, match="budget") as e:
        load_model(LLAMA, checkpoint=toy_dir, random_weights=0, max_seq_len=max_seq_len)
    if max_seq_len is not None:
        assert str(toy_dir / "config.json") in str(e.value), e.value
