"""Fused q/k/v rows as checkpoints store them (per head, per kv group), worked out by hand
from transformers' splits; a model with learned positions, an lm_head bias and a per-group
fused q/k/v, compiled against its float64 reference."""

import dataclasses

import numpy as np
import pytest

from iron_spec.runtime.blocks.attention import AttentionOptions
from iron_spec.runtime.blocks.mlp import MLPOptions
from iron_spec.runtime.blocks.norms import NormOptions
from iron_spec.runtime.blocks.projections import qkv_rows
from iron_spec.runtime.layers import LayerOptions
from iron_spec.runtime.causal import CausalLM, CausalOptions
from iron_spec.runtime.checkpoint import fill
from iron_spec.runtime.session import Session
from iron_spec.runtime.weights import draw_weights


def test_blocks_are_stored_as_the_model_holds_them():
    assert qkv_rows("blocks", 4, 1, 2) is None


def test_per_head_rows():
    # GPTNeoXAttention: view (heads, 3 * head_dim), chunk 3: stored rows of head h are
    # q_h, k_h, v_h. Two heads of two: q0 0-1, k0 2-3, v0 4-5, q1 6-7, k1 8-9, v1 10-11.
    assert qkv_rows("heads", 2, 2, 2).tolist() == [0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11]


def test_per_group_rows():
    # FalconAttention new_decoder_architecture: view (kv_heads, heads / kv_heads + 2,
    # head_dim). Four heads in two groups of one row each: stored q0 q1 k0 v0 q2 q3 k1 v1.
    assert qkv_rows("groups", 4, 2, 1).tolist() == [0, 1, 4, 5, 2, 6, 3, 7]
    # As many groups as heads is per head; one group is blocks.
    assert qkv_rows("groups", 2, 2, 2).tolist() == qkv_rows("heads", 2, 2, 2).tolist()
    assert qkv_rows("groups", 4, 1, 2).tolist() == list(range(12))


def test_model_parallel_shard_rows():
    # Two shards of q, v, k (CodeGen's order): stored [q0 q1 v0 v1 k0 k1 | q2 q3 v2 v3 k2 k3],
    # rows of one head (head_dim 2) each; the model's [q0..q3; k0..k3; v0..v3].
    assert qkv_rows("shards", 2, 2, 2, 2, "qvk").tolist() == [0, 1, 6, 7, 4, 5, 10, 11,
                                                              2, 3, 8, 9]
    # One shard in order qkv is blocks; k and v narrower than q (GQA) split as well.
    assert qkv_rows("shards", 4, 1, 2, 1, "qkv").tolist() == list(range(12))
    assert qkv_rows("shards", 4, 2, 1, 2, "qkv").tolist() == [0, 1, 4, 5, 2, 6, 3, 7]


def test_shards_that_do_not_split_the_rows_are_refused():
    with pytest.raises(ValueError, match="do not split"):
        qkv_rows("shards", 2, 1, 2, 4, "qvk")
    with pytest.raises(ValueError, match="not a permutation"):
        qkv_rows("shards", 2, 2, 2, 2, "qqk")


def test_per_head_needs_as_many_kv_heads():
    with pytest.raises(ValueError, match="groups stores them per kv group"):
        qkv_rows("heads", 4, 2, 2)


def test_stored_rows_load_into_blocks():
    lm = model(qkv_layout="groups")
    p = dict(lm.named_params())["model.layers.0.self_attn.qkv_proj.weight"]
    stored = np.arange(p.shape[0], dtype=np.float32)[:, None] * np.ones(p.shape[1], np.float32)
    # Stored per group (2 groups of 2 query heads, head_dim 8): group g's rows are its two
    # query heads, its key, its value; the model's q are the query heads in order.
    model_rows = p.from_stored(stored)[:, 0].astype(int).tolist()
    assert model_rows[:16] == list(range(16)) and model_rows[16:32] == list(range(32, 48))
    assert model_rows[32:40] == list(range(16, 24)) and model_rows[40:48] == list(range(48, 56))
    assert np.array_equal(p.to_stored(p.from_stored(stored)), stored)


def model(**attention) -> CausalLM:
    a = dataclasses.replace(AttentionOptions(heads=4, kv_heads=2, head_dim=8, rope=None,
                                             fused_qkv=True, bias=True), **attention)
    lo = LayerOptions(a, MLPOptions(48, kind="plain", act="relu", bias=True), NormOptions())
    o = CausalOptions(64, 32, (lo, lo), lo.norm, max_seq_len=20, prefill_chunk=8,
                      positions=24, position_offset=2, head_bias=True)
    lm = CausalLM(o)
    fill(lm, draw_weights(lm, 0))
    return lm


def test_positions_and_head_bias_compile_to_the_reference():
    lm = model(qkv_layout="groups")
    names = dict(lm.named_params())
    assert names["model.embed_positions.weight"].shape == (24, 32)
    assert names["lm_head.bias"].shape == (64,)
    prompt = list(range(3, 16))  # a chunk and a part
    assert list(Session(lm).generate(prompt, 6)) == list(Session(lm, reference=True).generate(prompt, 6))
    lm._versions.clear()
    for prompt_chunk in (True, False):
        lm._versions[(prompt_chunk, False)] = lm.version(prompt_chunk, check=True)
    Session(lm).logits(prompt + [1])
    # Positions matter: the same ids one place later give other logits.
    a, b = Session(lm).logits([5, 6]), Session(lm).logits([1, 5, 6])
    assert not np.allclose(a, b, atol=1e-3)


def test_a_context_past_the_position_table_is_refused():
    lo = LayerOptions(AttentionOptions(4, 2, 8, rope=None), MLPOptions(48), NormOptions())
    with pytest.raises(ValueError, match="does not fit the position table's 24 rows from offset 2"):
        CausalLM(CausalOptions(64, 32, (lo,), lo.norm, max_seq_len=23, prefill_chunk=8,
                               positions=24, position_offset=2))
