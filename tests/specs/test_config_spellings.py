"""config.json as transformers reads it: a null is None (the config class's own fallbacks
where it has them), and transformers 4's RoPE keys read in transformers 5's spelling."""

from __future__ import annotations

from pathlib import Path

import pytest

from iron_spec.spec.build import load_model
from iron_spec.spec.config import resolve, standard
from iron_spec.spec.errors import SpecError
from iron_spec.spec.interpreter import expand
from iron_spec.spec.loader import load_spec
from iron_spec.runtime.golden import Golden
from tests.conftest import SPECS
from tests.specs.test_goldens import judge

CONFIGS = Path(__file__).with_name("configs")


def toy(name: str, **changes) -> tuple:
    spec = load_spec(SPECS / f"{name}.yaml")
    return spec, {**spec.get("toy", "config"), **changes}


def test_llama3_on_a_transformers_5_config_matches_transformers():
    # config.json as transformers 5 saves a llama3-scaled Llama: rope_parameters, no
    # rope_theta; the golden is LlamaForCausalLM's logits on it (seed-0 weights).
    d = CONFIGS / "llama3-rope-parameters"
    loaded = load_model(SPECS / "llama3.yaml", checkpoint=d, random_weights=0, prefill_chunk=16)
    rope = loaded.lm.config.ropes["default"]
    assert rope.theta == 500000.0 and rope.scaling["rope_type"] == "llama3"
    judge(loaded, Golden.read(d / "seed0.npz", loaded.fingerprint()))


def test_transformers_4_keys_move_into_rope_parameters():
    spec, config = toy("llama3")
    data, moved = standard(spec, config)
    assert "rope_theta" not in data and "rope_scaling" not in data
    # As LlamaConfig(**config).rope_parameters in transformers 5.
    assert data["rope_parameters"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "rope_theta": 500000.0,
                                       "original_max_position_embeddings": 64}
    assert moved == {"rope_theta": "rope_parameters.rope_theta", "rope_scaling": "rope_parameters"}
    assert config["rope_theta"] == 500000.0  # the caller's dict untouched


def test_rope_parameters_own_values_win_over_a_stray_rope_theta():
    spec, config = toy("qwen3", rope_theta=5.0)
    assert standard(spec, config)[0]["rope_parameters"]["rope_theta"] == 1000000.0


def test_llama3_scaling_without_original_context_takes_max_position_embeddings():
    # standardize_rope_params: llama3, yarn and longrope tables default it to the context.
    spec, config = toy("llama3", rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                               "low_freq_factor": 1.0, "high_freq_factor": 4.0})
    assert standard(spec, config)[0]["rope_parameters"]["original_max_position_embeddings"] == 512


def test_gemma3_transformers_4_keys_go_to_their_layer_types():
    # Gemma3TextConfig.convert_rope_params_to_dict: rope_scaling and rope_theta to
    # full_attention, rope_local_base_freq to sliding_attention.
    spec, config = toy("gemma3")
    params = standard(spec, config)[0]["rope_parameters"]
    assert params == {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                      "sliding_attention": {"rope_theta": 10000.0}}


def test_olmo3_transformers_4_theta_is_the_full_layers_only():
    # Olmo3Config(rope_theta=1234.0).rope_parameters in transformers 5.24: {"sliding_attention":
    # {"rope_type": "default", "rope_theta": 500000.0}, "full_attention": {"rope_type":
    # "default", "rope_theta": 1234.0}} (its convert_rope_params_to_dict pops rope_theta for
    # the full table; the sliding one keeps default_theta).
    spec, config = toy("olmo3")
    del config["rope_parameters"]
    o = expand(spec, {**config, "rope_theta": 1234.0}).options
    assert (o.ropes["full"].theta, o.ropes["sliding"].theta) == (1234.0, 500000.0)


def test_a_field_reading_a_moved_key_is_a_lint_error(tmp_path):
    from iron_spec.spec.lint import lint_paths
    text = (SPECS / "llama3.yaml").read_text().replace(
        "  rope_theta: {json: rope_parameters.rope_theta, default: 10000.0}",
        "  rope_theta: {json: rope_theta, default: 10000.0}")
    path = tmp_path / "llama3.yaml"
    path.write_text(text)
    problems, _ = lint_paths([path])
    assert any("reads 'rope_theta', which every config.json is read with in transformers 5's "
               "spelling, as 'rope_parameters.rope_theta'" in p.message for p in problems)


def test_null_is_none_not_absent():
    # rms_norm_eps has a non-null default; config.json's null is still None, as LlamaConfig
    # takes it (and the spec then refuses None as an eps).
    spec, config = toy("llama3", rms_norm_eps=None)
    assert resolve(spec, config).values["rms_norm_eps"] is None
    with pytest.raises(SpecError, match="is None, not a number above 0"):
        expand(spec, config)


def test_if_null_takes_the_config_class_fallback_where_it_has_one():
    # LlamaConfig.__post_init__: num_key_value_heads and head_dim None are
    # num_attention_heads and hidden_size // num_attention_heads.
    spec, config = toy("llama3", num_key_value_heads=None, head_dim=None)
    a = expand(spec, config).options.layers[0].attention
    assert (a.kv_heads, a.head_dim) == (4, 16)
    # Qwen2Config: absent is its default 32; None is num_attention_heads.
    spec, config = toy("qwen2")
    assert resolve(spec, {**config, "num_key_value_heads": None}).values["num_key_value_heads"] == 4
    del config["num_key_value_heads"]
    assert resolve(spec, config).values["num_key_value_heads"] == 32


def test_mistral_null_sliding_window_is_full_attention():
    spec, config = toy("mistral", sliding_window=None)
    assert expand(spec, config).options.layers[0].attention.window is None
