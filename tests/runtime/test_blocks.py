"""Layers and blocks: the params each option builds (named as transformers names them), and
every option's compiled plan against its float64 reference."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from iron_spec.operators import native
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


PLE = PerLayerInputOptions(size=4, vocab_size=V, embedding_scale=2.0, projection_scale=0.5,
                           mix_scale=0.7)


def model(shared: bool = False, **layer) -> CausalLM:
    """Two layers of the options given (three, the last reading the first's cache, where
    ``shared``)."""
    attention = AttentionOptions(heads=4, kv_heads=2, head_dim=8)
    base = LayerOptions(attention, MLPOptions(48), NormOptions(eps=1e-6))
    a = {k[5:]: layer.pop(k) for k in list(layer) if k.startswith("attn_")}
    m = {k[4:]: layer.pop(k) for k in list(layer) if k.startswith("mlp_")}
    lo = dataclasses.replace(base, attention=dataclasses.replace(attention, **a),
                             mlp=dataclasses.replace(base.mlp, **m), **layer)
    layers = (lo, lo)
    if shared:
        layers += (dataclasses.replace(lo, attention=dataclasses.replace(lo.attention, kv_from=0)),)
    o = CausalOptions(V, E, layers, lo.norm, {"default": RopeOptions(10000.0, 8)},
                      max_seq_len=64, prefill_chunk=8, logit_softcap=3.0, logit_scale=0.5,
                      per_layer_input=lo.per_layer_input)
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
    {"kind": "ple", "per_layer_input": PLE, "attn_qk_norm": "head", "attn_v_norm": True,
     "attn_window": 3, "shared": True},
    {"kind": "ple", "attn_values_from_keys": True, "attn_scale": 1.0, "shared": True},
    {"mlp_activation_sparsity": 0.9, "mlp_act": "gelu_pytorch_tanh"},
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


def test_ple_layer_and_model_names():
    params = dict(model(kind="ple", per_layer_input=PLE).named_params())
    layer = {n.split("layers.0.", 1)[1] for n in params if "layers.0." in n}
    assert {"per_layer_input_gate.weight", "per_layer_projection.weight",
            "post_per_layer_input_norm.weight", "layer_scalar", "pre_feedforward_layernorm.weight",
            "post_feedforward_layernorm.weight"} <= layer
    assert params["model.layers.0.layer_scalar"].shape == (1,)
    assert params["model.layers.0.per_layer_input_gate.weight"].shape == (4, E)
    assert params["model.embed_tokens_per_layer.weight"].shape == (V, 2 * 4)
    assert params["model.per_layer_model_projection.weight"].shape == (2 * 4, E)
    assert params["model.per_layer_projection_norm.weight"].shape == (4,)
    # A ple layer without per-layer inputs keeps its scalar and nothing else of them.
    bare = names(model(kind="ple"))
    assert "layer_scalar" in bare and not any("per_layer" in n for n in bare)


def test_kv_sharing_layer_holds_no_keys_or_values_and_reads_its_source_cache():
    lm = model(shared=True, attn_qk_norm="head", attn_v_norm=True)
    params = {n for n, _ in lm.named_params()}
    shared = {n.split("layers.2.", 1)[1] for n in params if "layers.2." in n}
    assert {"self_attn.q_proj.weight", "self_attn.q_norm.weight", "self_attn.o_proj.weight"} <= shared
    assert not {n for n in shared if n.split(".")[1] in ("k_proj", "v_proj", "k_norm", "v_norm")}
    assert "model.layers.0.self_attn.v_norm.weight" not in params  # v_norm has no weight
    states = [n for n, _ in lm.named_states()]
    assert not [n for n in states if "layers.2." in n] and len(states) == 4
    assert lm.model.layers[2].self_attn.shared[0] is lm.model.layers[0].self_attn.keys
    keys_only = names(model(attn_values_from_keys=True))
    assert "self_attn.k_proj.weight" in keys_only and "self_attn.v_proj.weight" not in keys_only


def test_v_norm_and_kv_sharing_change_the_logits():
    # Each option is seen: the same drawn weights give other logits without it.
    ids = list(range(1, 12))
    normed = Session(model(attn_v_norm=True)).logits(ids).copy()
    assert not np.allclose(normed, Session(model()).logits(ids), atol=1e-4)
    shared = model(shared=True)
    own = CausalLM(dataclasses.replace(shared.config, layers=shared.config.layers[:2] + (
        dataclasses.replace(shared.config.layers[2], attention=dataclasses.replace(
            shared.config.layers[2].attention, kv_from=1)),)))
    fill(own, {n: p.array for n, p in shared.named_params()})
    assert not np.allclose(Session(own).logits(ids), Session(shared).logits(ids), atol=1e-4)


def test_unknown_options_refused():
    with pytest.raises(ValueError, match="placement"):
        model(placement="middle")
    with pytest.raises(ValueError, match="qk_norm"):
        model(attn_qk_norm="both")
    with pytest.raises(ValueError, match="mlp kind"):
        model(mlp_kind="moe")
    with pytest.raises(ValueError, match="takes no per-layer input"):
        model(kind="decoder", per_layer_input=PLE)
    with pytest.raises(ValueError, match="not an earlier one"):
        model(attn_kv_from=1)
    with pytest.raises(ValueError, match="fused qkv_proj"):
        model(attn_fused_qkv=True, attn_values_from_keys=True)


LAYER = NormOptions("layer", 1e-5)


@pytest.mark.parametrize("norm,expect", [
    (LAYER, {"input_layernorm.weight", "input_layernorm.bias",
             "post_attention_layernorm.weight", "post_attention_layernorm.bias"}),
    (NormOptions("layer", 1e-5, bias=False), NORMS),
    (NormOptions("layer", 1e-5, weight=False, bias=False), set()),
    (NormOptions("layer", 1e-5, plus_one=True), {"input_layernorm.weight", "input_layernorm.bias",
                                                 "post_attention_layernorm.weight",
                                                 "post_attention_layernorm.bias"}),
])
def test_layer_norm_kinds_hold_transformers_params(norm, expect):
    lm = model(norm=norm, attn_qk_norm="head")
    got = names(lm)
    qk = {n.replace("input_layernorm", f"self_attn.{q}_norm") for n in expect
          if n.startswith("input_") for q in "qk"}
    assert {n for n in got if "norm" in n} == expect | qk
    final = {n for n, _ in lm.named_params() if n.startswith("model.norm.")}
    assert final == {"model." + n.replace("input_layernorm", "norm") for n in expect
                     if n.startswith("input_")}


def _final_norm_only(norm: NormOptions, weights: dict) -> np.ndarray:
    """Logits of a model of no layers: lm_head(norm(embedding)) of ids 3 and 5."""
    lm = CausalLM(CausalOptions(V, E, (), norm, {}, max_seq_len=8, prefill_chunk=4))
    fill(lm, weights)
    return Session(lm).logits([3, 5])


@pytest.mark.parametrize("norm", [
    LAYER, NormOptions("layer", 1e-5, bias=False), NormOptions("layer", 1e-5, weight=False),
    NormOptions("layer", 1e-5, plus_one=True), NormOptions("rms", 1e-6, weight=False)])
def test_final_norm_kinds_match_a_hand_computation(norm):
    # torch.nn.LayerNorm by hand: the biased variance, eps inside the root; with plus_one
    # the weight is 1 + w (NemotronLayerNorm1P); weight false: no affine part (OlmoLayerNorm).
    r = np.random.default_rng(7)
    emb, head = r.standard_normal((V, E)), r.standard_normal((V, E)) / np.sqrt(E)
    w, b = 1 + 0.1 * r.standard_normal(E), 0.1 * r.standard_normal(E)
    weights = {"model.embed_tokens.weight": emb, "lm_head.weight": head}
    if norm.weight:
        weights["model.norm.weight"] = w
    if norm.kind == "layer" and norm.bias:
        weights["model.norm.bias"] = b
    x = emb[5]
    if norm.kind == "layer":
        x = x - x.mean()
    y = x / np.sqrt(np.mean(x * x) + norm.eps)
    if norm.weight:
        y = y * (1 + w if norm.plus_one else w)
    if norm.kind == "layer" and norm.bias:
        y = y + b
    got = _final_norm_only(norm, {k: v.astype(np.float32) for k, v in weights.items()})
    np.testing.assert_allclose(got, head @ y, atol=2e-5, rtol=0)


@pytest.mark.parametrize("options", [
    {"norm": LAYER, "attn_qk_norm": "head", "attn_bias": True},
    {"norm": NormOptions("layer", 1e-5, weight=False, bias=False), "attn_qk_norm": "all"},
    {"norm": NormOptions("layer", 1e-5, plus_one=True), "placement": "post"},
])
def test_layer_norm_compiled_equals_reference_and_passes_per_step_check(options):
    test_compiled_equals_reference_and_passes_per_step_check(options)


def test_an_unknown_norm_kind_is_refused():
    with pytest.raises(ValueError, match="norm kind 'batch' is not one of rms, layer"):
        model(norm=NormOptions("batch"))


def _one_token_parallel_by_hand(w: dict, token: int, shared: bool, eps: float) -> np.ndarray:
    """One layer on one token by hand: attention over a single position is its values, so
    attn = o(v(n1(x))) per kv group; x + attn + mlp(n2(x)), then the final norm and head."""
    def ln(x, name):
        c = x - x.mean()
        return c / np.sqrt(np.mean(c * c) + eps) * w[name + ".weight"] + w[name + ".bias"]

    L = "model.layers.0."
    x = w["model.embed_tokens.weight"][token]
    h = ln(x, L + "input_layernorm")
    v = (w[L + "self_attn.v_proj.weight"] @ h).reshape(2, 8)  # 2 kv heads of 8
    a = w[L + "self_attn.o_proj.weight"] @ np.repeat(v, 2, axis=0).reshape(-1)  # 4 heads
    h2 = h if shared else ln(x, L + "post_attention_layernorm")
    g = w[L + "mlp.gate_proj.weight"] @ h2
    m = w[L + "mlp.down_proj.weight"] @ (g / (1 + np.exp(-g)) * (w[L + "mlp.up_proj.weight"] @ h2))
    return w["lm_head.weight"] @ ln(x + a + m, "model.norm")


@pytest.mark.parametrize("shared", [True, False])
def test_parallel_layer_matches_a_hand_computation(shared):
    attention = AttentionOptions(heads=4, kv_heads=2, head_dim=8, rope=None)
    lo = LayerOptions(attention, MLPOptions(48), LAYER, parallel=True, shared_norm=shared)
    lm = CausalLM(CausalOptions(V, E, (lo,), LAYER, {}, max_seq_len=8, prefill_chunk=4))
    fill(lm, draw_weights(lm, 2))
    norms = {n for n, _ in lm.named_params() if "layernorm" in n}
    assert norms == {f"model.layers.0.{n}_layernorm.{p}" for p in ("weight", "bias")
                     for n in (("input",) if shared else ("input", "post_attention"))}
    w = {n: p.array.astype(np.float64) for n, p in lm.named_params()}
    want = _one_token_parallel_by_hand(w, 9, shared, LAYER.eps)
    np.testing.assert_allclose(Session(lm).logits([9]), want, atol=2e-5, rtol=0)
    sequential = CausalLM(dataclasses.replace(lm.config, layers=(
        dataclasses.replace(lo, parallel=False),)))
    fill(sequential, {n: p.array for n, p in lm.named_params() if n in
                      dict(sequential.named_params())} | ({} if not shared else {
                          "model.layers.0.post_attention_layernorm." + p:
                              w["model.layers.0.input_layernorm." + p].astype(np.float32)
                          for p in ("weight", "bias")}))
    assert not np.allclose(Session(sequential).logits([9]), want, atol=1e-3)


@pytest.mark.parametrize("options", [
    {"norm": LAYER, "parallel": True},
    {"norm": LAYER, "parallel": True, "shared_norm": False, "attn_bias": True, "mlp_bias": True},
])
def test_parallel_compiled_equals_reference_and_passes_per_step_check(options):
    test_compiled_equals_reference_and_passes_per_step_check(options)


@pytest.mark.parametrize("options", [{"placement": "post"}, {"kind": "sandwich"}])
def test_parallel_only_on_a_pre_decoder(options):
    with pytest.raises(ValueError, match="a parallel layer is a decoder placed pre"):
        model(parallel=True, **options)


def test_clip_qkv_clamps_each_projection():
    # With a limit below every projection's reach the logits change; with one far above
    # it they are the unclipped ones exactly (clamping nothing).
    ids = list(range(1, 12))
    plain = Session(model()).logits(ids).copy()
    np.testing.assert_array_equal(Session(model(attn_clip_qkv=1e6)).logits(ids), plain)
    assert not np.allclose(Session(model(attn_clip_qkv=0.05)).logits(ids), plain, atol=1e-3)
    test_compiled_equals_reference_and_passes_per_step_check(
        {"attn_clip_qkv": 0.05, "attn_qk_norm": "head"})
    lm = model(attn_clip_qkv=0.05, attn_fused_qkv=True)
    steps = [s for s in lm.version(True).plan.steps if s.op.name == "clamp"]
    assert len(steps) == 2 * 3 and all(s.static["limit"] == 0.05 for s in steps)


@pytest.mark.parametrize("norm", [LAYER, NormOptions("layer", 1e-5, bias=False),
                                  NormOptions("rms", 1e-6)])
def test_qk_norm_per_head_weights_norms_each_head_by_its_own(norm):
    # Head h of the queries normed by norms.{h} alone, as StableLmLayerNormPerHead: the
    # model equals one whose heads share a weight only where every head's weight is that one.
    lm = model(norm=norm, attn_qk_norm="per_head_weights")
    params = dict(lm.named_params())
    q = "model.layers.0.self_attn.q_norm.norms."
    assert {n[len(q):] for n in params if n.startswith(q)} == {
        f"{h}.{p}" for h in range(4) for p in ("weight", "bias")[: 1 + (norm.kind == "layer" and norm.bias)]}
    assert sum(n.startswith("model.layers.0.self_attn.k_norm.norms.") and n.endswith("weight")
               for n in params) == 2
    shared = model(norm=norm, attn_qk_norm="head")
    same = {n: p.array for n, p in shared.named_params()}
    for n, p in shared.named_params():
        for qk, heads in (("q", 4), ("k", 2)):
            if f"self_attn.{qk}_norm." in n:
                for h in range(heads):
                    same[n.replace(f"{qk}_norm.", f"{qk}_norm.norms.{h}.")] = p.array
                del same[n]
    fill(lm, same)
    ids = list(range(1, 12))
    np.testing.assert_allclose(Session(lm).logits(ids), Session(shared).logits(ids), atol=1e-5)
    params["model.layers.1.self_attn.q_norm.norms.3.weight"].array[:] *= 0.5
    assert not np.allclose(Session(lm).logits(ids), Session(shared).logits(ids), atol=1e-4)
    test_compiled_equals_reference_and_passes_per_step_check(
        {"norm": norm, "attn_qk_norm": "per_head_weights"})


@pytest.mark.parametrize("norm", [NormOptions("layer", 1e-5, bias=False), NormOptions("rms", 1e-6)])
def test_qk_norm_per_head_stacked_is_per_head_weights_in_one_tensor(norm):
    # CohereLayerNorm((heads, head_dim)): one q_norm.weight (heads, head_dim) whose row h
    # norms head h, the same model as per_head_weights with norms.{h}.weight = row h.
    lm = model(norm=norm, attn_qk_norm="per_head_stacked")
    params = dict(lm.named_params())
    assert params["model.layers.0.self_attn.q_norm.weight"].shape == (4, 8)
    assert params["model.layers.0.self_attn.k_norm.weight"].shape == (2, 8)
    assert not any(".norms." in n for n in params)
    rows = params["model.layers.0.self_attn.q_norm.weight"].array
    assert np.abs(rows.mean() - 1.0) < 0.1  # drawn as a gain, around 1
    per = model(norm=norm, attn_qk_norm="per_head_weights")
    weights = {}
    for n, p in lm.named_params():
        qk = next((qk for qk in "qk" if f"self_attn.{qk}_norm." in n), None)
        if qk is None:
            weights[n] = p.array
            continue
        for h in range(p.shape[0]):
            weights[n.replace(f"{qk}_norm.", f"{qk}_norm.norms.{h}.")] = p.array[h]
    fill(per, weights)
    ids = list(range(1, 12))
    np.testing.assert_allclose(Session(lm).logits(ids), Session(per).logits(ids), atol=1e-6)
    params["model.layers.1.self_attn.k_norm.weight"].array[1] *= 0.5
    assert not np.allclose(Session(lm).logits(ids), Session(per).logits(ids), atol=1e-4)
    test_compiled_equals_reference_and_passes_per_step_check(
        {"norm": norm, "attn_qk_norm": "per_head_stacked"})


@pytest.mark.skipif(not native.PROGRAM, reason="no native program here")
@pytest.mark.parametrize("options", [{}, {"kind": "sandwich", "attn_qk_norm": "head",
                                          "attn_window": 3, "attn_softcap": 2.0}])
def test_a_decode_step_runs_as_one_native_call(options):
    lm = model(**options)
    plan = lm.decode_step.plan
    assert plan.native_steps == len(plan.runs)
    assert plan._order == [(0, len(plan.runs))]


def _one_token_sparse_mlp_by_transformers(w: dict, token: int, sparsity: float) -> np.ndarray:
    """One pre-norm layer on one token, its MLP transformers' Gemma3nTextMLP (gelu tanh,
    the gaussian top-k at ``sparsity``) in float64 on the same weights: attention over a
    single position is its values, attn = o(v(n1(x))) per kv group."""
    torch = pytest.importorskip("torch")
    modeling = pytest.importorskip("transformers.models.gemma3n.modeling_gemma3n")
    from transformers import Gemma3nTextConfig

    def rms(x, name):
        return x / np.sqrt(np.mean(x * x) + 1e-6) * w[name + ".weight"]

    L = "model.layers.0."
    config = Gemma3nTextConfig(hidden_size=E, intermediate_size=48, num_hidden_layers=1,
                               hidden_activation="gelu_pytorch_tanh",
                               activation_sparsity_pattern=[sparsity], vocab_size=V,
                               vocab_size_per_layer_input=V, hidden_size_per_layer_input=2,
                               laurel_rank=2, num_kv_shared_layers=0)
    mlp = modeling.Gemma3nTextMLP(config, layer_idx=0).double()
    mlp.load_state_dict({n + ".weight": torch.tensor(w[L + "mlp." + n + ".weight"]) for n in
                         ("gate_proj", "up_proj", "down_proj")})
    x = w["model.embed_tokens.weight"][token]
    v = (w[L + "self_attn.v_proj.weight"] @ rms(x, L + "input_layernorm")).reshape(2, 8)
    x = x + w[L + "self_attn.o_proj.weight"] @ np.repeat(v, 2, axis=0).reshape(-1)
    with torch.no_grad():
        x = x + mlp(torch.tensor(rms(x, L + "post_attention_layernorm"))).numpy()
    return w["lm_head.weight"] @ rms(x, "model.norm")


def test_activation_sparsity_matches_transformers_mlp_and_is_seen():
    attention = AttentionOptions(heads=4, kv_heads=2, head_dim=8, rope=None)
    mlp = MLPOptions(48, act="gelu_pytorch_tanh", activation_sparsity=0.95)
    lo = LayerOptions(attention, mlp, NormOptions(eps=1e-6))
    lm = CausalLM(CausalOptions(V, E, (lo,), lo.norm, {}, max_seq_len=8, prefill_chunk=4))
    fill(lm, draw_weights(lm, 3))
    w = {n: p.array.astype(np.float64) for n, p in lm.named_params()}
    want = _one_token_sparse_mlp_by_transformers(w, 9, 0.95)
    np.testing.assert_allclose(Session(lm).logits([9]), want, atol=2e-5, rtol=0)
    dense = CausalLM(dataclasses.replace(lm.config, layers=(
        dataclasses.replace(lo, mlp=dataclasses.replace(mlp, activation_sparsity=0.0)),)))
    fill(dense, {n: p.array for n, p in lm.named_params()})
    assert not np.allclose(Session(dense).logits([9]), want, atol=1e-3)


@pytest.mark.parametrize("mlp", [{"mlp_kind": "plain"}, {"mlp_fused": True}])
def test_activation_sparsity_only_on_a_gated_unfused_mlp(mlp):
    with pytest.raises(ValueError, match="activation sparsity cuts a gated MLP's own gate_proj"):
        model(mlp_activation_sparsity=0.9, **mlp)
