"""Every causal spec on its toy: compiled equals the float64 reference (greedy tokens), every
compiled step within its operator's tolerance, and what each family's YAML says expanded as
transformers reads the same config.json."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from iron_spec.spec.build import load_model
from iron_spec.spec.errors import SpecError
from iron_spec.spec.interpreter import expand
from iron_spec.spec.loader import load_spec, parse_spec
from iron_spec.runtime.blocks.norms import NormOptions
from iron_spec.runtime.session import Session
from tests.conftest import SPECS

CAUSAL = sorted(p for p in SPECS.glob("*.yaml") if load_spec(p).get("model") == "causal")


@pytest.mark.parametrize("spec", CAUSAL, ids=lambda p: p.stem)
def test_toy_compiled_equals_reference_and_checks(spec: Path):
    lm = load_model(spec, random_weights=0, toy=True).lm
    C = lm.config.prefill_chunk
    prompt = np.random.default_rng(1).integers(0, lm.config.vocab_size, C + 5).tolist()
    steps = min(16, lm.config.max_seq_len - len(prompt))
    compiled = list(Session(lm).generate(prompt, steps))
    assert compiled == list(Session(lm, reference=True).generate(prompt, steps))
    # Resumed where the model allows (any position where the prompt chunk's rows are
    # computed alone, else a chunk boundary), a history's logits are a fresh run's, bit for bit.
    fresh = Session(lm).logits(prompt).copy()
    P = len(lm.config.prefix)
    for held in (2, C - 1, C + 1):  # (a one-token history from nothing is a decode step)
        session = Session(lm)
        session.logits(prompt[:held])
        session.calls.clear()
        assert session.logits(prompt).tobytes() == fresh.tobytes(), held
        at = held + P if lm.prompt_chunk.plan.rows_alone else (held + P) // C * C
        assert session.calls[0][:2] == ("prompt", at), held
    for prompt_chunk in (True, False):
        lm._versions[(prompt_chunk, False)] = lm.version(prompt_chunk, check=True)
    # The checked versions now serve every call: CheckError at a step past its tolerance.
    list(Session(lm).generate(prompt, 3))
    assert lm.version(True, check=True).plan.checked and lm.version(False, check=True).plan.checked


def options(name: str, config: dict):
    spec = load_spec(SPECS / f"{name}.yaml")
    return expand(spec, {**spec.get("toy", "config"), **config}).options


def test_layer_types_pick_window_and_rope_table_per_layer():
    o = options("gemma3", {})
    assert [lo.attention.window for lo in o.layers] == [8, None, 8, None]
    assert [lo.attention.rope for lo in o.layers] == ["local", "global", "local", "global"]
    # Gemma3TextConfig's rope_parameters["full_attention"] on the toy's transformers-4 keys.
    assert o.ropes["global"].scaling == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
    assert o.ropes["local"].theta == 10000.0 and o.ropes["global"].theta == 1e6


def test_every_nth_rule_without_layer_types():
    six = options("gemma3", {"layer_types": None, "num_hidden_layers": 7})
    assert [lo.attention.window for lo in six.layers] == [8] * 5 + [None, 8]
    two = options("gemma2", {})  # its toy has no layer_types: every second layer is full
    assert [lo.attention.window for lo in two.layers] == [8, None, 8, None]


def test_transformers_5_rope_parameters_read_as_transformers_4_spelling():
    v4 = options("gemma3", {})
    toy = load_spec(SPECS / "gemma3.yaml").get("toy", "config")
    v5 = {k: v for k, v in toy.items()
          if k not in ("rope_theta", "rope_local_base_freq", "rope_scaling")}
    v5["rope_parameters"] = {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    spec = load_spec(SPECS / "gemma3.yaml")
    o = expand(spec, v5).options
    for name in ("local", "global"):
        assert o.ropes[name].theta == v4.ropes[name].theta
        kind = (o.ropes[name].scaling or {}).get("rope_type", "default")
        assert kind == (v4.ropes[name].scaling or {}).get("rope_type", "default")


def test_multipliers_and_softcaps_reach_the_options():
    g = options("granite", {})
    assert (g.embedding_scale, g.logit_scale) == (6.0, 0.25)
    assert g.layers[0].residual_scale == 0.5 and g.layers[0].attention.scale == 0.125
    two = options("gemma2", {})
    assert two.logit_softcap == 2.0 and two.layers[0].attention.softcap == 1.0
    assert two.embedding_scale == 64 ** 0.5


def test_partial_rotary_and_longrope_original_context():
    o = options("phi3", {})
    assert o.ropes["default"].rotary_dim == 8  # head_dim 16 * 0.5
    assert o.ropes["default"].scaling["original_max_position_embeddings"] == 64


def test_kv_sharing_reads_the_last_earlier_layer_of_its_type():
    # Toy: sliding, full, sliding | sliding, full; the last two share (as kv_sharing_modes).
    o = options("gemma4", {})
    assert [lo.attention.kv_from for lo in o.layers] == [None, None, None, 2, 1]
    assert [lo.mlp.intermediate_size for lo in o.layers] == [96, 96, 96, 192, 192]
    single = options("gemma4", {"use_double_wide_mlp": False, "num_kv_shared_layers": 1})
    assert [lo.attention.kv_from for lo in single.layers] == [None] * 4 + [1]
    assert {lo.mlp.intermediate_size for lo in single.layers} == {96}


def test_kv_sharing_without_a_source_of_the_type_is_refused():
    with pytest.raises(SpecError, match=r"layer 1 \(type full_attention\) .* none of layers 0..0"):
        options("gemma4", {"num_kv_shared_layers": 4})
    with pytest.raises(SpecError, match="not within 0..4"):
        options("gemma4", {"num_kv_shared_layers": 5})


def test_per_layer_type_head_width_kv_heads_and_per_layer_inputs():
    o = options("gemma4", {})
    full, sliding = o.layers[1].attention, o.layers[0].attention
    assert (full.head_dim, full.kv_heads, full.values_from_keys, full.window) == (32, 1, True, None)
    assert (sliding.head_dim, sliding.kv_heads, sliding.values_from_keys) == (16, 2, False)
    assert full.scale == sliding.scale == 1.0 and full.v_norm and full.qk_norm == "head"
    assert o.ropes["global"].rotary_dim == 32 and o.ropes["local"].rotary_dim == 16
    p = o.per_layer_input
    assert (p.size, p.vocab_size, p.act) == (8, 256, "gelu_pytorch_tanh")
    assert (p.embedding_scale, p.projection_scale, p.mix_scale) == (8 ** 0.5, 64 ** -0.5, 2 ** -0.5)
    assert o.logit_softcap == 3.0 and not o.layers[0].norm.plus_one
    assert options("gemma4", {"attention_k_eq_v": False}).layers[1].attention.values_from_keys is False
    assert options("gemma4", {"hidden_size_per_layer_input": 0}).per_layer_input is None


def test_a_flag_list_selects_rope_and_window_per_layer():
    # SmolLM3Attention: use_rope = no_rope_layers[i]; its toy's layer_types, as
    # SmolLM3Config.__post_init__ derives them: sliding exactly where there is no RoPE.
    o = options("smollm3", {})
    assert [lo.attention.rope for lo in o.layers] == ["default", None, "default", None]
    assert [lo.attention.window for lo in o.layers] == [None, 8, None, 8]
    assert all(lo.attention.o_bias and lo.attention.bias for lo in o.layers)


def test_without_the_flag_list_every_interval_th_layer_has_no_rope():
    # SmolLM3Config: no_rope_layers = [int((i + 1) % no_rope_layer_interval != 0) ...].
    o = options("smollm3", {"no_rope_layers": None, "num_hidden_layers": 8,
                            "use_sliding_window": False})
    assert [lo.attention.rope is None for lo in o.layers] == [False, False, False, True] * 2
    assert all(lo.attention.window is None for lo in o.layers)
    o = options("smollm3", {"no_rope_layers": None, "num_hidden_layers": 6,
                            "no_rope_layer_interval": 3})
    assert [lo.attention.rope is None for lo in o.layers] == [False, False, True] * 2


def _smollm3(tmp_path, old: str, new: str) -> Path:
    text = (SPECS / "smollm3.yaml").read_text()
    assert old in text
    path = tmp_path / "smollm3.yaml"
    path.write_text(text.replace(old, new))
    return path


def test_boolean_types_are_keyed_true_and_false(tmp_path):
    path = _smollm3(tmp_path, "      1: {}\n      0:\n", "      true: {}\n      false:\n")
    spec = load_spec(path)
    toy = {**spec.get("toy", "config"), "no_rope_layers": [True, False, False, True]}
    o = expand(spec, toy).options
    assert [lo.attention.rope for lo in o.layers] == ["default", None, None, "default"]


def test_a_type_with_no_options_entry_is_named_at_the_types_line(tmp_path):
    spec = load_spec(SPECS / "smollm3.yaml")
    toy = {**spec.get("toy", "config"), "no_rope_layers": [1, 2, 1, 0]}
    with pytest.raises(SpecError, match=r"smollm3.yaml:\d+:5: error: layer types 2 have no "
                                        r"entry under layer/pattern/options \(entries: 1, 0\)"):
        expand(spec, toy)
    toy["no_rope_layers"] = [1, 0.5, 1, 0]
    with pytest.raises(SpecError, match="are not 4 names, integers or booleans, one per layer"):
        expand(spec, toy)
    toy["no_rope_layers"] = [1, 0]
    with pytest.raises(SpecError, match="are not 4 names"):
        expand(spec, toy)


def test_number_keys_are_taken_only_under_pattern_options(tmp_path):
    path = _smollm3(tmp_path, "  kind: decoder\n", "  kind: decoder\n  0: {}\n")
    with pytest.raises(SpecError, match="key '0' reads as 0, not text; quote it"):
        load_spec(path)
    path = _smollm3(tmp_path, "      1: {}\n", "      1: {}\n      true: {}\n")
    with pytest.raises(SpecError, match="duplicate key True"):
        load_spec(path)


def test_layer_norm_options_reach_every_norm():
    text = (SPECS / "llama3.yaml").read_text().replace(
        "norm: {kind: rms,", "norm: {kind: layer, weight: false, bias: false, plus_one: true,")
    spec = parse_spec(text, "x.yaml")
    o = expand(spec, spec.get("toy", "config")).options
    want = NormOptions("layer", o.norm.eps, plus_one=True, weight=False, bias=False)
    assert o.norm == want and all(lo.norm == want for lo in o.layers)


def test_a_norm_flag_not_a_boolean_is_refused_at_its_line():
    text = (SPECS / "llama3.yaml").read_text().replace("norm: {kind: rms,",
                                                       "norm: {kind: layer, bias: 2,")
    spec = parse_spec(text, "x.yaml")
    line = next(i for i, l in enumerate(text.splitlines(), 1) if "bias: 2" in l)
    col = text.splitlines()[line - 1].index("bias: 2") + 1
    with pytest.raises(SpecError, match=rf"x.yaml:{line}:{col}: .*layer.norm.bias is 2, not true"):
        expand(spec, spec.get("toy", "config"))


def _llama_with(layer_lines: str, **config):
    text = (SPECS / "llama3.yaml").read_text().replace("  kind: decoder\n",
                                                       "  kind: decoder\n" + layer_lines, 1)
    spec = parse_spec(text, "x.yaml")
    return text, spec, {**spec.get("toy", "config"), **config}


@pytest.mark.parametrize("tied,shared", [(True, False), (False, True)])
def test_parallel_is_an_expression_and_shared_norm_a_flag(tied, shared):
    text, spec, config = _llama_with(f"  parallel: tie_word_embeddings\n  shared_norm: {str(shared).lower()}\n",
                                     tie_word_embeddings=tied)
    lo = expand(spec, config).options.layers[0]
    assert (lo.parallel, lo.shared_norm) == (tied, shared)


def test_parallel_with_post_placement_is_refused_at_its_line():
    text, spec, config = _llama_with("  placement: post\n  parallel: true\n")
    line = text.splitlines().index("  parallel: true") + 1
    with pytest.raises(SpecError, match=rf"x.yaml:{line}:3: .*a parallel layer is kind decoder, "
                                        r"placement pre \(not decoder, post\)"):
        expand(spec, config)
