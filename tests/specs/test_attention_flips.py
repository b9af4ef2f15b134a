"""Attention behaviours flipped one at a time against their specs' goldens: each must miss
transformers' logits on the same weights by far more than the gate (1e-6)."""

from __future__ import annotations

import pytest

from iron_spec.spec.build import load_model
from iron_spec.cli.check import golden_path
from iron_spec.runtime.golden import Golden, kl_stats, teacher_forced
from iron_spec.runtime.session import Session
from tests.conftest import SPECS
from tests.specs.test_position_flips import flipped_kl


@pytest.mark.parametrize("name,old,new", [
    # GraniteSWA's toy: layer 1 has layer_rope_theta 0 (no RoPE), layer 2 100.
    ("granite_swa", 'rope_on: "layer_rope_theta != 0"', "rope_on: true"),
    ("granite_swa", 'theta: "layer_rope_theta if layer_rope_theta != 0 else rope_theta"',
     "theta: rope_theta"),
    # The toy's window is 5, its prompts longer.
    ("granite_swa", "attention: {window: sliding_window}", "attention: {window: null}"),
    # DiffLlama's toy has four layers: lambda_init 0.2, 0.36, 0.47, 0.56 by depth; decay 0
    # makes every one 0.2, a base of 0.7 lowers each deeper one.
    ("diffllama", "lambda_decay: 0.3", "lambda_decay: 0.0"),
    ("diffllama", "lambda_base: 0.8", "lambda_base: 0.7"),
], ids=["granite-swa-rope-everywhere", "granite-swa-one-theta", "granite-swa-no-window",
        "diffllama-lambda-init-flat", "diffllama-lambda-base"])
def test_a_flipped_attention_option_misses_the_golden(tmp_path, name, old, new):
    assert flipped_kl(tmp_path, name, old, new) > 1e-4


def _judged_on_the_right_weights(name: str, flipped_path, param: str, count: int):
    """The KL means of spec ``name`` and of the flipped copy at ``flipped_path`` (lacking the
    params ending ``param``, ``count`` of them in the right one), the flipped model given the
    right one's weights by name and judged by the right one's golden."""
    right = load_model(SPECS / f"{name}.yaml", random_weights=0, toy=True)
    flipped = load_model(flipped_path, random_weights=0, toy=True)
    weights = dict(right.lm.named_params())
    assert sum(n.endswith(param) for n in weights) == count
    for n, p in flipped.lm.named_params():
        p.array[...] = weights[n].array
    golden = Golden.read(golden_path(right), right.fingerprint())
    return (kl_stats(teacher_forced(golden, Session(right.lm).logits))["mean"],
            kl_stats(teacher_forced(golden, Session(flipped.lm).logits))["mean"])


def test_attention_without_its_differential_misses_the_golden(tmp_path):
    # Plain attention over the same q/k/v/o (the lambdas left unread).
    text = (SPECS / "diffllama.yaml").read_text()
    old = ("    differential: {lambda_base: 0.8, lambda_amplitude: 0.6, lambda_decay: 0.3, "
           "eps: rms_norm_eps}\n")
    assert old in text
    path = tmp_path / "diffllama.yaml"
    path.write_text(text.replace(old, "", 1))
    right, flipped = _judged_on_the_right_weights("diffllama", path, ".lambda_q1", 4)
    assert right < 1e-6
    assert flipped > 1e-2


def test_attention_without_its_sinks_misses_the_golden(tmp_path):
    # The flip drops the sinks tensors, so the flipped model takes the right one's weights
    # by name (drawn weights follow the tree), and is judged by the right one's golden.
    right = load_model(SPECS / "granite_swa.yaml", random_weights=0, toy=True)
    text = (SPECS / "granite_swa.yaml").read_text()
    assert "sinks: true" in text
    path = tmp_path / "granite_swa.yaml"
    path.write_text(text.replace("sinks: true", "sinks: false", 1))
    flipped = load_model(path, random_weights=0, toy=True)
    weights = dict(right.lm.named_params())
    assert sum(name.endswith(".sinks") for name in weights) == 4
    for name, p in flipped.lm.named_params():
        p.array[...] = weights[name].array
    golden = Golden.read(golden_path(right), right.fingerprint())
    assert kl_stats(teacher_forced(golden, Session(right.lm).logits))["mean"] < 1e-6
    assert kl_stats(teacher_forced(golden, Session(flipped.lm).logits))["mean"] > 1e-4


@pytest.mark.parametrize("old,new", [
    # MiniCPM3 turns its RoPE part half against half (apply_rotary_pos_emb), not in pairs.
    ("rotary_dim: qk_rope_head_dim}", "rotary_dim: qk_rope_head_dim, interleaved: true}"),
    # The softmax scale is qk_head_dim's (16 in the toy), not v_head_dim's (12).
    ('scale: "(qk_nope_head_dim + qk_rope_head_dim) ** -0.5"', 'scale: "v_head_dim ** -0.5"'),
], ids=["minicpm3-interleaved-rope", "minicpm3-scale-of-values"])
def test_a_flipped_latent_option_misses_the_golden(tmp_path, old, new):
    assert flipped_kl(tmp_path, "minicpm3", old, new) > 1e-4


def test_youtus_rope_half_against_half_misses_the_golden(tmp_path):
    # YoutuAttention turns its RoPE part in interleaved pairs (rope_interleave, the toy's
    # true): apply_rotary_pos_emb_interleave, not apply_rotary_pos_emb.
    assert flipped_kl(tmp_path, "youtu", "interleaved: rope_interleave}",
                      "interleaved: false}") > 1e-4


@pytest.mark.parametrize("projection", ["q_b_proj", "kv_b_proj"])
def test_latent_rows_read_as_stored_miss_the_golden(projection):
    # Each head's RoPE part is its last query columns and kv_b_proj's rows are [k_nope | v]
    # per head: read the rows as they are stored (no regrouping) and RoPE turns the wrong
    # columns, or keys and values take each other's rows.
    loaded = load_model(SPECS / "minicpm3.yaml", random_weights=0, toy=True)
    golden = Golden.read(golden_path(loaded), loaded.fingerprint())
    assert kl_stats(teacher_forced(golden, Session(loaded.lm).logits))["mean"] < 1e-6
    flipped = load_model(SPECS / "minicpm3.yaml", random_weights=0, toy=True)
    for layer in flipped.lm.model.layers:
        p = getattr(layer.self_attn, projection).weight
        p.array[...] = p.to_stored(p.array.copy())
    assert kl_stats(teacher_forced(golden, Session(flipped.lm).logits))["mean"] > 1e-4



@pytest.mark.parametrize("name,old,new,param", [
    # BitNet's toy, one of its two sub-norms dropped.
    ("bitnet", "rope: default, sub_norm: true}", "rope: default}", ".attn_sub_norm.weight"),
    ("bitnet", "act: hidden_act, sub_norm: true}", "act: hidden_act}", ".ffn_sub_norm.weight"),
    # Doge's toy without its dynamic mask (A, dt_proj) or its residual weights.
    ("doge", "qk_norm: head,\n              dynamic_mask: true}", "qk_norm: head}", ".A"),
    ("doge", "  residual_weights: true\n", "", ".input_residual"),
], ids=["bitnet-attn-sub-norm", "bitnet-ffn-sub-norm", "doge-no-dynamic-mask",
        "doge-no-residual-weights"])
def test_a_behaviour_dropped_misses_the_golden(tmp_path, name, old, new, param):
    # The dropped behaviour's weights (one per layer of the two-layer toys) left unread.
    text = (SPECS / f"{name}.yaml").read_text()
    assert old in text
    path = tmp_path / f"{name}.yaml"
    path.write_text(text.replace(old, new, 1))
    right, flipped = _judged_on_the_right_weights(name, path, param, 2)
    assert right < 1e-6
    assert flipped > 1e-3, flipped
