"""Laurel and AltUp in a layer: the params they add (transformers' names), a Laurel layer
against the branch computed by hand and by transformers' Gemma3nTextLaurelBlock, and the
compiled plan of AltUp layers against its float64 reference."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from iron_spec.runtime.altup import AltUpOptions
from iron_spec.runtime.blocks.attention import AttentionOptions
from iron_spec.runtime.blocks.mlp import MLPOptions
from iron_spec.runtime.blocks.norms import NormOptions
from iron_spec.runtime.blocks.rope import RopeOptions
from iron_spec.runtime.layers import LayerOptions, PerLayerInputOptions
from iron_spec.runtime.causal import CausalLM, CausalOptions
from iron_spec.runtime.checkpoint import fill
from iron_spec.runtime.session import Session
from iron_spec.runtime.weights import draw_weights

E, V = 32, 64
ATTENTION = AttentionOptions(heads=4, kv_heads=2, head_dim=8, rope=None)


def _one_layer(**layer) -> CausalLM:
    lo = LayerOptions(ATTENTION, MLPOptions(48), NormOptions(eps=1e-6), **layer)
    lm = CausalLM(CausalOptions(V, E, (lo,), lo.norm, {}, max_seq_len=8, prefill_chunk=4))
    fill(lm, draw_weights(lm, 3))
    return lm


def _rms(x, w):
    return x / np.sqrt(np.mean(x * x) + 1e-6) * w


def _one_token_by_hand(w: dict, token: int, laurel) -> np.ndarray:
    """A pre-norm layer with Laurel on one token, in float64: attention over one position
    is its values, attn = o(v(h)) per kv group; then (x + attn + laurel(h)) / sqrt(2), the
    gated silu MLP, the final norm and the head."""
    L = "model.layers.0."
    x = w["model.embed_tokens.weight"][token]
    h = _rms(x, w[L + "input_layernorm.weight"])
    v = (w[L + "self_attn.v_proj.weight"] @ h).reshape(2, 8)
    x = x + w[L + "self_attn.o_proj.weight"] @ np.repeat(v, 2, axis=0).reshape(-1)
    x = (x + laurel(h)) / np.sqrt(2.0)
    n = _rms(x, w[L + "post_attention_layernorm.weight"])
    g = w[L + "mlp.gate_proj.weight"] @ n
    x = x + w[L + "mlp.down_proj.weight"] @ (g / (1 + np.exp(-g)) * (w[L + "mlp.up_proj.weight"] @ n))
    return w["lm_head.weight"] @ _rms(x, w["model.norm.weight"])


def test_laurel_layer_matches_the_branch_by_hand_and_is_seen():
    lm = _one_layer(laurel_rank=3)
    w = {n: p.array.astype(np.float64) for n, p in lm.named_params()}
    P = "model.layers.0.laurel."
    assert w[P + "linear_left.weight"].shape == (3, E)
    assert w[P + "linear_right.weight"].shape == (E, 3)

    def laurel(h):
        b = w[P + "linear_right.weight"] @ (w[P + "linear_left.weight"] @ h)
        return h + _rms(b, w[P + "post_laurel_norm.weight"])

    want = _one_token_by_hand(w, 9, laurel)
    np.testing.assert_allclose(Session(lm).logits([9]), want, atol=2e-5, rtol=0)
    np.testing.assert_allclose(Session(lm, reference=True).logits([9]), want, atol=1e-12, rtol=0)
    # Without the branch (the same weights otherwise) the logits move by far more.
    plain = CausalLM(dataclasses.replace(lm.config, layers=(
        dataclasses.replace(lm.config.layers[0], laurel_rank=0),)))
    fill(plain, {n: p.array for n, p in lm.named_params() if ".laurel." not in n})
    assert np.abs(Session(plain).logits([9]) - want).max() > 1e-2


def test_laurel_branch_is_transformers_laurel_block():
    torch = pytest.importorskip("torch")
    modeling = pytest.importorskip("transformers.models.gemma3n.modeling_gemma3n")
    from transformers import Gemma3nTextConfig
    lm = _one_layer(laurel_rank=3)
    w = {n: p.array.astype(np.float64) for n, p in lm.named_params()}
    config = Gemma3nTextConfig(hidden_size=E, laurel_rank=3, rms_norm_eps=1e-6,
                               num_hidden_layers=1, intermediate_size=48, vocab_size=V,
                               vocab_size_per_layer_input=V, hidden_size_per_layer_input=2,
                               num_kv_shared_layers=0, activation_sparsity_pattern=[0.0])
    block = modeling.Gemma3nTextLaurelBlock(config).double()
    P = "model.layers.0.laurel."
    block.load_state_dict({n: torch.tensor(w[P + n]) for n, _ in block.named_parameters()})

    def laurel(h):
        with torch.no_grad():
            return block(torch.tensor(h)).numpy()

    # Gemma3nRMSNorm computes in float32 even in a float64 block (its .float()).
    want = _one_token_by_hand(w, 9, laurel)
    np.testing.assert_allclose(Session(lm, reference=True).logits([9]), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("layer", [{"placement": "post"}, {"parallel": True}])
def test_laurel_needs_the_attention_norm_of_a_sequential_layer(layer):
    with pytest.raises(ValueError, match="laurel branches off the attention norm's output"):
        _one_layer(laurel_rank=3, **layer)


PLE = PerLayerInputOptions(size=4, vocab_size=V, act="gelu_pytorch_tanh", embedding_scale=2.0,
                           projection_scale=0.5, mix_scale=0.7)


def _altup_model(active: int = 1, **layer) -> CausalLM:
    attention = AttentionOptions(heads=4, kv_heads=2, head_dim=8, qk_norm="head", v_norm=True,
                                 scale=1.0, window=3)
    lo = LayerOptions(attention, MLPOptions(48), NormOptions(eps=1e-6), kind="sandwich",
                      laurel_rank=4, altup=AltUpOptions(3, active), per_layer_input=PLE,
                      **layer)
    shared = dataclasses.replace(lo, attention=dataclasses.replace(attention, kv_from=0))
    o = CausalOptions(V, E, (lo, lo, shared), lo.norm, {"default": RopeOptions(10000.0, 8)},
                      max_seq_len=64, prefill_chunk=8, logit_softcap=3.0,
                      per_layer_input=PLE, altup=lo.altup)
    lm = CausalLM(o)
    fill(lm, draw_weights(lm, 0))
    return lm


def test_altup_params_are_transformers_names():
    params = {n: p.shape for n, p in _altup_model().named_params()}
    A = "model.layers.0.altup."
    assert params[A + "correct_output_scale"] == (E,)
    assert params[A + "correction_coefs.weight"] == (3, 3)
    assert params[A + "prediction_coefs.weight"] == (9, 3)
    assert params[A + "modality_router.weight"] == (3, E)
    assert params[A + "router_norm.weight"] == (E,)
    for k in (0, 1):
        assert params[f"model.altup_projections.{k}.weight"] == (E, E)
        assert params[f"model.altup_unembed_projections.{k}.weight"] == (E, E)
    assert "model.altup_projections.2.weight" not in params
    assert "model.layers.0.layer_scalar" not in params  # kind sandwich, not ple


@pytest.mark.parametrize("active", [0, 2])
def test_altup_compiled_equals_reference_and_passes_per_step_check(active):
    lm = _altup_model(active)
    prompt = list(range(3, 3 + 13))  # a chunk and a part
    a = list(Session(lm).generate(prompt, 12))
    b = list(Session(lm, reference=True).generate(prompt, 12))
    assert a == b
    lm._versions.clear()
    for prompt_chunk in (True, False):
        lm._versions[(prompt_chunk, False)] = lm.version(prompt_chunk, check=True)
    Session(lm).logits(prompt + [1])  # CheckError at the first step past its tolerance
    assert lm.version(True, check=True).plan.checked
