"""Layers and blocks: the params each option builds (named as transformers names them), and
every option's compiled plan against its float64 reference."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from runtime.blocks import AttentionOptions, LayerOptions, MLPOptions, NormOptions, RopeOptions
from runtime.causal import CausalLM, CausalOptions
from runtime.checkpoint import fill
from runtime.session import Session
from runtime.weights import draw_weights

E, V = 32, 64


def model(**layer) -> CausalLM:
    attention = AttentionOptions(heads=4, kv_heads=2, head_dim=8)
    base = LayerOptions(attention, MLPOptions(48), NormOptions(eps=1e-6))
    a = {k[5:]: layer.pop(k) for k in list(layer) if k.startswith("attn_")}
    m = {k[4:]: layer.pop(k) for k in list(layer) if k.startswith("mlp_")}
    lo = dataclasses.replace(base, attention=dataclasses.replace(attention, **a),
                             mlp=dataclasses.replace(base.mlp, **m), **layer)
    o = CausalOptions(V, E, (lo, lo), lo.norm, {"default": RopeOptions(10000.0, 8)},
                      max_seq_len=64, prefill_chunk=8, logit_softcap=3.0, logit_scale=0.5)
    lm = CausalLM(o)
    fill(lm, draw_weights(lm, 0))
    return lm


def names(lm: CausalLM) -> set[str]:
    return {n.split("layers.0.", 1)[1] for n, _ in lm.named_params() if "layers.0." in n}


NORMS = {"input_layernorm.weight", "post_attention_layernorm.weight"}


@pytest.mark.parametrize("options,expect", [
    ({}, NORMS),
    ({"placement": "post"}, {"post_attention_layernorm.weight", "post_feedforward_layernorm.weight"}),
    ({"kind": "sandwich"}, NORMS | {"pre_feedforward_layernorm.weight",
                                    "post_feedforward_layernorm.weight"}),
])
def test_norm_placement_names(options, expect):
    got = names(model(**options))
    assert {n for n in got if "layernorm" in n} == expect


def test_qk_norm_per_head_and_whole_projection_shapes():
    per_head = dict(model(attn_qk_norm="head").named_params())
    assert per_head["model.layers.0.self_attn.q_norm.weight"].shape == (8,)
    assert per_head["model.layers.0.self_attn.k_norm.weight"].shape == (8,)
    whole = dict(model(attn_qk_norm="all").named_params())
    assert whole["model.layers.0.self_attn.q_norm.weight"].shape == (32,)
    assert whole["model.layers.0.self_attn.k_norm.weight"].shape == (16,)


def test_fused_projections_are_single_params():
    got = names(model(attn_fused_qkv=True, mlp_fused=True))
    assert {"self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight"} <= got
    assert not {"self_attn.q_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight"} & got


def test_fused_equals_unfused_on_the_same_weights():
    plain, fused = model(), model(attn_fused_qkv=True, mlp_fused=True)
    p, f = dict(plain.named_params()), dict(fused.named_params())
    for i in range(2):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        f[a + "qkv_proj.weight"].array = np.concatenate(
            [p[a + n + ".weight"].array for n in ("q_proj", "k_proj", "v_proj")])
        f[m + "gate_up_proj.weight"].array = np.concatenate(
            [p[m + n + ".weight"].array for n in ("gate_proj", "up_proj")])
        for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight",
                     "input_layernorm.weight", "post_attention_layernorm.weight"):
            f[f"model.layers.{i}.{name}"].array = p[f"model.layers.{i}.{name}"].array
    for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        f[name].array = p[name].array
    ids = list(range(1, 12))
    np.testing.assert_allclose(Session(fused).logits(ids), Session(plain).logits(ids), atol=1e-5)


@pytest.mark.parametrize("options", [
    {"kind": "sandwich", "attn_qk_norm": "head", "attn_window": 3, "attn_softcap": 2.0},
    {"placement": "post", "attn_qk_norm": "all", "residual_scale": 0.5},
    {"attn_fused_qkv": True, "mlp_fused": True, "attn_bias": True, "attn_scale": 0.2},
    {"mlp_kind": "plain", "mlp_act": "gelu_pytorch_tanh", "mlp_bias": True},
])
def test_compiled_equals_reference_and_passes_per_step_check(options):
    lm = model(**options)
    prompt = list(range(3, 3 + 13))  # a chunk and a part
    a = list(Session(lm).generate(prompt, 12))
    b = list(Session(lm, reference=True).generate(prompt, 12))
    assert a == b
    logits = Session(lm).logits(prompt)
    assert np.all(np.abs(logits) < 3.0)  # the final softcap holds
    lm._versions.clear()
    for prompt_chunk in (True, False):
        lm._versions[(prompt_chunk, False)] = lm.version(prompt_chunk, check=True)
    Session(lm).logits(prompt + [1])  # CheckError at the first step past its tolerance
    assert lm.version(True, check=True).plan.checked


def test_unknown_options_refused():
    with pytest.raises(ValueError, match="placement"):
        model(placement="middle")
    with pytest.raises(ValueError, match="qk_norm"):
        model(attn_qk_norm="both")
    with pytest.raises(ValueError, match="mlp kind"):
        model(mlp_kind="moe")
