"""Causal-decoder behaviours beside the layer vocabulary: an embedding norm, q/k norms after
RoPE, negated RoPE. Each is held to a hand computation (or to the option flipped: a test that
cannot tell the two apart would pass a spec that forgot it) and to its float64 reference."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from iron_spec.operators import OPERATORS
from iron_spec.runtime.blocks.attention import AttentionOptions
from iron_spec.runtime.blocks.mlp import MLPOptions
from iron_spec.runtime.blocks.norms import NormOptions
from iron_spec.runtime.blocks.rope import RopeOptions, rope_table
from iron_spec.runtime.layers import LayerOptions
from iron_spec.runtime.causal import CausalLM, CausalOptions
from iron_spec.runtime.checkpoint import fill
from iron_spec.runtime.session import Session
from iron_spec.runtime.weights import draw_weights

E, V = 32, 64
IDS = list(range(3, 3 + 13))  # a chunk and a part


def model(rope: RopeOptions = RopeOptions(10000.0, 8), norm: NormOptions = NormOptions(eps=1e-6),
          **options) -> CausalLM:
    """Two layers; ``attn_*`` options go to the attention, the rest to CausalOptions."""
    a = {k[5:]: options.pop(k) for k in list(options) if k.startswith("attn_")}
    attention = AttentionOptions(heads=4, kv_heads=2, head_dim=8, **a)
    lo = LayerOptions(attention, MLPOptions(48), norm)
    lm = CausalLM(CausalOptions(V, E, (lo, lo), norm, {"default": rope}, max_seq_len=64,
                                prefill_chunk=8, **options))
    fill(lm, draw_weights(lm, 0))
    return lm


def same_weights(lm: CausalLM, like: CausalLM) -> CausalLM:
    fill(lm, {n: p.array for n, p in like.named_params()})
    return lm


def compiled_equals_reference(lm: CausalLM) -> None:
    a = list(Session(lm).generate(IDS, 12))
    assert a == list(Session(lm, reference=True).generate(IDS, 12))
    lm._versions.clear()
    for prompt in (True, False):
        lm._versions[(prompt, False)] = lm.version(prompt, check=True)
    Session(lm).logits(IDS + [1])  # CheckError at the first step past its tolerance


def test_negated_rope_turns_by_minus_theta_as_cat_x2_minus_x1():
    # NanoChat's rotate_half(x) = cat(x2, -x1): out = x * cos + rotate_half(x) * sin.
    rope = RopeOptions(10000.0, 8, negated=True)
    cos, sin = rope_table(rope, 6)
    plain_cos, plain_sin = rope_table(RopeOptions(10000.0, 8), 6)
    np.testing.assert_array_equal(cos, plain_cos)
    np.testing.assert_array_equal(sin, -plain_sin)
    x = np.random.default_rng(0).standard_normal((6, 2, 8))
    c, s = np.concatenate([plain_cos] * 2, 1)[:, None], np.concatenate([plain_sin] * 2, 1)[:, None]
    x1, x2 = x[..., :4], x[..., 4:]
    by_hand = x * c + np.concatenate([x2, -x1], -1) * s
    got = OPERATORS["rope"].reference(x, cos, sin, start=0)
    np.testing.assert_allclose(got, by_hand, atol=1e-12)


def test_negated_rope_changes_the_logits_and_compiles_to_its_reference():
    lm = model(rope=RopeOptions(10000.0, 8, negated=True))
    compiled_equals_reference(lm)
    plain = same_weights(model(), lm)
    assert not np.allclose(Session(lm).logits(IDS), Session(plain).logits(IDS), atol=1e-4)


def test_embedding_norm_is_embed_norm_before_the_first_layer():
    layer = NormOptions("layer", 1e-5)
    lm = model(norm=layer, embedding_norm=True)
    params = dict(lm.named_params())
    assert params["model.embed_norm.weight"].shape == (E,)
    assert params["model.embed_norm.bias"].shape == (E,)
    assert "model.embed_norm.weight" not in dict(model(norm=layer).named_params())
    compiled_equals_reference(lm)
    # A norm of the embeddings by hand: (x - mean) / sqrt(var + eps) * w + b.
    w = params["model.embed_norm.weight"].array.astype(np.float64)
    b = params["model.embed_norm.bias"].array.astype(np.float64)
    emb = params["model.embed_tokens.weight"].array.astype(np.float64)
    x = emb[IDS]
    by_hand = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * w + b
    rec_norm = lm.model.embed_norm.options
    assert (rec_norm.kind, rec_norm.eps) == ("layer", 1e-5)
    got = OPERATORS["layer_norm"].reference(emb[IDS].astype(np.float32), w.astype(np.float32),
                                            b.astype(np.float32), eps=1e-5)
    np.testing.assert_allclose(got, by_hand, atol=1e-6)
    # Without it the same weights give other logits.
    bare = CausalLM(dataclasses.replace(lm.config, embedding_norm=False))
    fill(bare, {n: p.array for n, p in lm.named_params() if "embed_norm" not in n})
    assert not np.allclose(Session(lm).logits(IDS), Session(bare).logits(IDS), atol=1e-4)


@pytest.mark.parametrize("qk_norm", ["head", "per_head_weights", "per_head_stacked"])
def test_qk_norm_after_rope_runs_on_turned_heads(qk_norm):
    lm = model(attn_qk_norm=qk_norm, attn_qk_norm_after_rope=True)
    compiled_equals_reference(lm)
    before = same_weights(model(attn_qk_norm=qk_norm), lm)
    # With weights the norm does not commute with the rotation: the order is seen.
    assert not np.allclose(Session(lm).logits(IDS), Session(before).logits(IDS), atol=1e-4)


def test_qk_norm_after_rope_without_weights_commutes_with_the_rotation():
    # RoPE keeps each head's sum of squares, so a weightless RMSNorm over the whole head is
    # the same before or after it (NanoChat's q/k norms): within float32 rounding.
    bare = NormOptions(eps=1e-6, weight=False)
    after = model(norm=bare, attn_qk_norm="head", attn_qk_norm_after_rope=True)
    before = same_weights(model(norm=bare, attn_qk_norm="head"), after)
    np.testing.assert_allclose(Session(after).logits(IDS), Session(before).logits(IDS), atol=1e-5)


@pytest.mark.parametrize("qk_norm", [None, "all"])
def test_qk_norm_after_rope_needs_a_per_head_norm(qk_norm):
    with pytest.raises(ValueError, match="qk_norm_after_rope norms each turned head"):
        model(attn_qk_norm=qk_norm, attn_qk_norm_after_rope=True)


def test_no_final_norm_holds_no_model_norm_and_feeds_the_head_the_last_layer():
    lm = model(final_norm=False)
    params = {n for n, _ in lm.named_params()}
    assert not {n for n in params if n.startswith("model.norm.")}
    compiled_equals_reference(lm)
    normed = model()
    fill(normed, {**{n: p.array for n, p in lm.named_params()},
                  "model.norm.weight": np.full(E, 3.0, np.float32)})
    assert not np.allclose(Session(lm).logits(IDS), Session(normed).logits(IDS), atol=1e-4)


def test_post_residual_norms_each_residual_sum():
    def with_placement(placement, like=None):
        lm = CausalLM(dataclasses.replace(model().config, layers=tuple(
            dataclasses.replace(lo, placement=placement) for lo in model().config.layers)))
        fill(lm, draw_weights(lm, 0) if like is None else {n: p.array for n, p in like.named_params()})
        return lm

    lm = with_placement("post_residual")
    layer = {n.split("layers.0.", 1)[1] for n, _ in lm.named_params() if "layers.0." in n}
    assert {n for n in layer if "layernorm" in n} == {"post_attention_layernorm.weight",
                                                       "post_feedforward_layernorm.weight"}
    compiled_equals_reference(lm)
    # The same params placed as Olmo 2 places them (x + norm(attn(x))) are another model.
    post = with_placement("post", like=lm)
    assert not np.allclose(Session(lm).logits(IDS), Session(post).logits(IDS), atol=1e-4)


def test_narrow_head_gives_logits_of_its_rows_and_reads_every_embedded_id():
    lm = model(head_rows=40)
    params = dict(lm.named_params())
    assert params["lm_head.weight"].shape == (40, E)
    assert params["model.embed_tokens.weight"].shape == (V, E)
    wide = [50, 63, 7, 44]  # ids the head cannot draw, still embedded
    logits = Session(lm).logits(wide)
    assert logits.shape == (40,)
    # The narrow head's logits are the first 40 of a full head holding the same rows.
    full = model()
    w = params["lm_head.weight"].array
    fill(full, {**{n: p.array for n, p in lm.named_params()},
                "lm_head.weight": np.concatenate([w, np.zeros((V - 40, E), np.float32)])})
    np.testing.assert_allclose(logits, Session(full).logits(wide)[:40], rtol=1e-5, atol=1e-6)
    assert all(t < 40 for t in Session(lm).generate(wide, 8))
    compiled_equals_reference(lm)
    with pytest.raises(ValueError, match="all of them where tied"):
        model(head_rows=40, tied=True)


def test_repetition_penalty_skips_ids_past_a_narrow_head():
    from iron_spec.operators.sampling import repetition_penalty
    out = repetition_penalty(np.array([2.0, -1.0, 4.0]), [0, 1, 7], 2.0)
    np.testing.assert_array_equal(out, [1.0, -2.0, 4.0])
