"""Record transformers' own routers and experts on drawn inputs, for ``test_router.py`` and
``test_experts.py`` (which need neither torch nor transformers).

Each case builds the family's module from its config class (transformers 5.25), draws its
weights and inputs in float64 (standard normal: no two router values within 1e-9 of each
other, so every choice is far from a tie), runs it, and stores the inputs, the module's
weights as it holds them, and what it returned: the chosen experts ascending with their
weights (routers), or the output rows (experts). Run from the checkout's root, golden extra:

    python tests/operators/moe_golden/record.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig

OUT = Path(__file__).parent
N, H, E = 7, 24, 8  # rows, hidden, experts


def _config(model_type: str, **fields):
    if model_type != "dbrx":  # heads that divide the hidden size (DbrxConfig's n_heads: 16)
        fields = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 6, **fields}
    else:
        fields = {"n_heads": 4, "attn_config": {"kv_n_heads": 2}, **fields}
    cfg = AutoConfig.for_model(model_type, **fields)
    cfg._experts_implementation = "eager"
    return cfg


def _draw(module, rng, gain=()):
    """Every parameter and float buffer of ``module`` drawn from a standard normal (names in
    ``gain`` around 1)."""
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if t.dtype.is_floating_point:
                v = rng.standard_normal(tuple(t.shape))
                if name in gain:
                    v = 1.0 + 0.25 * v
                t.copy_(torch.from_numpy(v))


def _tensors(module) -> dict[str, np.ndarray]:
    return {n: t.detach().numpy().copy() for n, t in
            list(module.named_parameters()) + list(module.named_buffers()) if t.dtype.is_floating_point}


def _chosen(indices, weights) -> tuple[np.ndarray, np.ndarray]:
    """Each row's (experts ascending, their weights)."""
    idx = indices.detach().numpy().astype(np.int64)
    w = weights.detach().numpy().astype(np.float64)
    order = np.argsort(idx, axis=-1)
    return np.take_along_axis(idx, order, -1), np.take_along_axis(w, order, -1)


def routers(rng) -> dict[str, np.ndarray]:
    """Each router case: ``NAME.x``, ``NAME.<param>`` as the module names it, ``NAME.attrs``
    (our router's attributes, JSON), ``NAME.indices``, ``NAME.weights``."""
    from transformers.models.dbrx.modeling_dbrx import DbrxFFN
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
    from transformers.models.ergo.modeling_ergo import ErgoTopkRouter
    from transformers.models.ernie4_5_moe.modeling_ernie4_5_moe import Ernie4_5_MoeTopKRouter
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRouter
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssTopKRouter
    from transformers.models.granitemoe.modeling_granitemoe import GraniteMoeTopKRouter
    from transformers.models.jetmoe.modeling_jetmoe import JetMoeTopKGating
    from transformers.models.kolibri1.modeling_kolibri1 import Kolibri1TopKRouter
    from transformers.models.llama4.modeling_llama4 import Llama4Router
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
    from transformers.models.phimoe.modeling_phimoe import PhimoeTopKRouter
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    out = {}
    x = rng.standard_normal((N, H))
    xt = torch.from_numpy(x)

    def put(name, module, attrs, indices, weights, inputs=None):
        idx, w = _chosen(indices, weights)
        out[f"{name}.x"] = x if inputs is None else inputs
        for k, v in _tensors(module).items():
            out[f"{name}.{k}"] = v
        out[f"{name}.attrs"] = np.array(json.dumps(attrs))
        out[f"{name}.indices"], out[f"{name}.weights"] = idx, w

    for norm in (True, False):
        m = Qwen3MoeTopKRouter(_config("qwen3_moe", hidden_size=H, num_experts=E,
                                       num_experts_per_tok=3, norm_topk_prob=norm)).double()
        _draw(m, rng)
        _, w, i = m(xt)
        put(f"qwen3_moe_norm{int(norm)}", m, {"top_k": 3, "score": "softmax",
                                              "normalize": "sum" if norm else None}, i, w)

    m = MixtralTopKRouter(_config("mixtral", hidden_size=H, num_local_experts=E,
                                  num_experts_per_tok=2)).double()
    _draw(m, rng)
    _, w, i = m(xt)
    put("mixtral", m, {"top_k": 2, "score": "softmax", "normalize": "sum"}, i, w)

    for method in ("greedy", "group_limited_greedy"):
        m = DeepseekV2TopkRouter(_config("deepseek_v2", hidden_size=H, n_routed_experts=E,
                                         num_experts_per_tok=3, topk_method=method, n_group=4,
                                         topk_group=2, routed_scaling_factor=1.5)).double()
        _draw(m, rng)
        _, w, i = m(xt)
        put(f"deepseek_v2_{method}", m, {
            "top_k": 3, "score": "softmax", "scale": 1.5,
            "groups": [4, 2] if method != "greedy" else None, "group_score": "max"}, i, w)

    m = DeepseekV3TopkRouter(_config("deepseek_v3", hidden_size=H, n_routed_experts=E,
                                     num_experts_per_tok=3, n_group=4, topk_group=2,
                                     routed_scaling_factor=2.5, norm_topk_prob=True)).double()
    _draw(m, rng)
    _, w, i = m(xt)
    put("deepseek_v3", m, {"top_k": 3, "score": "sigmoid", "groups": [4, 2],
                           "group_score": "top2", "normalize": "sum", "norm_eps": 1e-20,
                           "scale": 2.5}, i, w)

    m = GptOssTopKRouter(_config("gpt_oss", hidden_size=H, num_local_experts=E,
                                 num_experts_per_tok=3)).double()
    _draw(m, rng)
    _, w, i = m(xt)
    put("gpt_oss", m, {"top_k": 3, "score": "logits", "select": "logits",
                       "weights": "softmax"}, i, w)

    m = GraniteMoeTopKRouter(_config("granitemoe", hidden_size=H, num_local_experts=E,
                                     num_experts_per_tok=2)).double()
    _draw(m, rng)
    _, w, i = m(xt)
    put("granitemoe", m, {"top_k": 2, "score": "logits", "select": "logits",
                          "weights": "softmax"}, i, w)

    m = JetMoeTopKGating(H, E, 2).double()
    _draw(m, rng)
    sorted_experts, batch_index, batch_gates, expert_size, _ = m(xt)
    # Its grouped form back to rows: the k slots of each row, by expert.
    flat = torch.zeros(N * 2, dtype=torch.long)
    gates = torch.zeros(N * 2, dtype=torch.float64)
    experts_sorted = torch.repeat_interleave(torch.arange(E), torch.tensor(expert_size))
    flat[sorted_experts] = experts_sorted
    gates[sorted_experts] = batch_gates
    put("jetmoe", m, {"top_k": 2, "score": "logits", "select": "logits",
                      "weights": "softmax"}, flat.view(N, 2), gates.view(N, 2).detach())

    m = Llama4Router(_config("llama4_text", hidden_size=H, num_local_experts=E,
                             num_experts_per_tok=2)).double()
    _draw(m, rng)
    scores, _ = m(xt)
    i = torch.topk(scores, 2, dim=-1).indices
    put("llama4", m, {"top_k": 2, "score": "sigmoid", "select": "logits"}, i,
        scores.gather(1, i))

    m = PhimoeTopKRouter(_config("phimoe", hidden_size=H, num_local_experts=E,
                                 num_experts_per_tok=2, router_jitter_noise=0.3)).double().eval()
    _draw(m, rng)
    _, w, i = m(xt)
    put("phimoe", m, {"top_k": 2, "sparsemixer": 0.3}, i, w)

    m = Ernie4_5_MoeTopKRouter(_config("ernie4_5_moe", hidden_size=H, moe_num_experts=E,
                                       moe_k=3, moe_norm_min=1e-12)).double()
    _draw(m, rng)
    with torch.no_grad():  # its selection bias near the scores' scale, so it moves the choice
        m.moe_statics.e_score_correction_bias.mul_(0.1)
    _, w, i = m(xt)
    put("ernie4_5_moe", m, {"top_k": 3, "score": "softmax", "normalize": "sum",
                            "norm_min": 1e-12}, i, w)

    cfg = _config("dbrx", d_model=H, ffn_config={"moe_num_experts": E, "moe_top_k": 3,
                                                  "moe_normalize_expert_weights": 2.0})
    ffn = DbrxFFN(cfg).double()
    _draw(ffn, rng)
    w, i = ffn.route_tokens_to_experts(ffn.router(xt))
    put("dbrx", ffn.router, {"top_k": 3, "score": "softmax", "normalize": "p", "norm_p": 2.0},
        i, w)

    m = Gemma4TextRouter(_config("gemma4_text", hidden_size=H, num_experts=E,
                                 top_k_experts=3, enable_moe_block=True,
                                 moe_intermediate_size=8)).double()
    _draw(m, rng, gain=("scale", "per_expert_scale"))
    _, w, i = m(xt)
    # Our router reads the input after the router's own norm and scales (a norm step before
    # it): that input is recorded in place of x.
    with torch.no_grad():
        normed = (m.norm(xt) * m.scale * m.scalar_root_size).numpy()
    put("gemma4", m, {"top_k": 3, "score": "softmax", "normalize": "sum"}, i, w, normed)

    m = Kolibri1TopKRouter(_config("kolibri1", hidden_size=H, num_experts=E,
                                   num_experts_per_tok=3, norm_topk_prob=True)).double()
    _draw(m, rng)
    _, w, i = m(xt)
    put("kolibri1", m, {"top_k": 3, "score": "sigmoid", "select": "logits",
                        "normalize": "sum"}, i, w)

    m = ErgoTopkRouter(_config("ergo", hidden_size=H, num_experts=E, num_experts_per_tok=3,
                               moe_routed_scaling_factor=2.0)).double()
    _draw(m, rng)
    with torch.no_grad():
        m.e_score_correction_bias.mul_(0.3)
    _, w, i = m(xt)
    put("ergo", m, {"top_k": 3, "score": "sigmoid", "normalize": "sum", "norm_eps": 1e-20,
                    "scale": 2.0}, i, w)
    return out


def experts(rng) -> dict[str, np.ndarray]:
    """Each experts case: ``NAME.x``, ``NAME.indices``, ``NAME.weights`` (the routing given
    it), its tensors as the module holds them, ``NAME.out``."""
    from transformers.models.dbrx.modeling_dbrx import DbrxExperts
    from transformers.models.ergo.modeling_ergo import ErgoExperts
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts
    from transformers.models.jetmoe.modeling_jetmoe import JetMoeMoA
    from transformers.models.llama4.modeling_llama4 import Llama4TextExperts
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    out = {}
    I, k = 6, 3

    def routing():
        idx = np.stack([rng.choice(E, k, replace=False) for _ in range(N)])
        return idx, rng.uniform(0.1, 1.0, (N, k))

    def put(name, module, x, idx, w, y, extra=None):
        out[f"{name}.x"], out[f"{name}.indices"], out[f"{name}.weights"] = x, idx, w
        for key, v in {**_tensors(module), **(extra or {})}.items():
            out[f"{name}.{key}"] = v
        out[f"{name}.out"] = y.detach().numpy()

    x = rng.standard_normal((N, H))
    idx, w = routing()
    m = Qwen3MoeExperts(_config("qwen3_moe", hidden_size=H, num_experts=E,
                                moe_intermediate_size=I, hidden_act="silu")).double()
    _draw(m, rng)
    put("qwen3_moe", m, x, idx, w, m(torch.from_numpy(x), torch.from_numpy(idx),
                                     torch.from_numpy(w)))

    m = GptOssExperts(_config("gpt_oss", hidden_size=H, num_local_experts=E,
                              intermediate_size=I, swiglu_limit=1.5)).double()
    _draw(m, rng)
    put("gpt_oss", m, x, idx, w, m(torch.from_numpy(x), torch.from_numpy(idx),
                                   torch.from_numpy(w)),
        {"alpha": np.array(m.alpha), "limit": np.array(m.limit)})

    cfg = _config("dbrx", d_model=H, ffn_config={"moe_num_experts": E, "moe_top_k": k,
                                                  "ffn_hidden_size": I})
    m = DbrxExperts(cfg.ffn_config).double()
    _draw(m, rng)
    put("dbrx", m, x, idx, w, m(torch.from_numpy(x)[None], torch.from_numpy(idx),
                                torch.from_numpy(w))[0])

    cfg = _config("ergo", hidden_size=H, num_experts=E, moe_intermediate_size=I)
    m = ErgoExperts(cfg).double()
    _draw(m, rng, gain=("post_expert_norm.weight",))
    put("ergo", m, x, idx, w, m(torch.from_numpy(x), torch.from_numpy(idx), torch.from_numpy(w)),
        {"eps": np.array(cfg.rms_norm_eps)})

    # Llama 4: every expert on the input times its routing score (0 where not chosen).
    cfg = _config("llama4_text", hidden_size=H, num_local_experts=E, intermediate_size=I,
                  num_experts_per_tok=k)
    m = Llama4TextExperts(cfg).double()
    _draw(m, rng)
    scores = np.zeros((N, E))
    np.put_along_axis(scores, idx, w, axis=-1)
    routed_in = torch.from_numpy(x).repeat(E, 1) * torch.from_numpy(scores.T.reshape(-1, 1))
    y = m(routed_in).reshape(E, N, H).sum(0)
    put("llama4", m, x, idx, w, y)

    # JetMoE's mixture of attention heads: map (x -> each slot's queries), reduce (each
    # slot's attention output -> the weighted sum, plus its bias).
    cfg = _config("jetmoe", hidden_size=H, num_local_experts=E, num_experts_per_tok=2,
                  kv_channels=4, head_dim=4, num_key_value_heads=2)
    moa = JetMoeMoA(cfg).double()
    _draw(moa, rng)
    x3 = torch.from_numpy(x)[None]
    q, _, topo = moa.map(x3)
    per_slot = rng.standard_normal((1, N, 2, 8))
    reduced = moa.reduce(torch.from_numpy(per_slot), topo)
    # The routing the module chose, as rows' slots (its sorted form undone).
    sorted_experts, batch_index, batch_gates, expert_size = topo
    flat = torch.zeros(N * 2, dtype=torch.long)
    gates = torch.zeros(N * 2, dtype=torch.float64)
    flat[sorted_experts] = torch.repeat_interleave(torch.arange(E), torch.tensor(expert_size))
    gates[sorted_experts] = batch_gates
    ji, jw = flat.view(N, 2).numpy(), gates.view(N, 2).detach().numpy()
    out.update({"jetmoe_map.x": x, "jetmoe_map.indices": ji, "jetmoe_map.weights": jw,
                "jetmoe_map.input_linear.weight": moa.input_linear.weight.detach().numpy(),
                "jetmoe_map.out": q[0].detach().numpy()})
    out.update({"jetmoe_reduce.x": per_slot[0], "jetmoe_reduce.indices": ji,
                "jetmoe_reduce.weights": jw,
                "jetmoe_reduce.output_linear.weight": moa.output_linear.weight.detach().numpy(),
                "jetmoe_reduce.bias": moa.bias.detach().numpy(),
                "jetmoe_reduce.out": reduced[0].detach().numpy()})
    return out


def main() -> None:
    import transformers

    torch.set_default_dtype(torch.float64)
    rng = np.random.default_rng(33)
    meta = {"transformers": transformers.__version__, "torch": torch.__version__}
    np.savez_compressed(OUT / "routers.npz", meta=np.array(json.dumps(meta)), **routers(rng))
    np.savez_compressed(OUT / "experts.npz", meta=np.array(json.dumps(meta)), **experts(rng))
    print("recorded", OUT / "routers.npz", OUT / "experts.npz")


if __name__ == "__main__":
    main()
