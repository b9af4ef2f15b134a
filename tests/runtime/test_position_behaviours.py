"""Position behaviours in a model's tree: ALiBi on a causal model's attention scores, a
computed sinusoidal position table, an encoder's relative position bias. Each compiled plan
is held to its float64 reference step by step (check=True), and each option to a model
without it (a test that cannot tell them apart would pass a spec that forgot it)."""

from __future__ import annotations

import numpy as np

from iron_spec.spec.encoder import load_encoder
from iron_spec.operators import native, sinusoidal_table
from iron_spec.operators.attention import alibi_slopes
from iron_spec.runtime.blocks.attention import AttentionOptions
from iron_spec.runtime.blocks.mlp import MLPOptions
from iron_spec.runtime.blocks.norms import NormOptions
from iron_spec.runtime.layers import LayerOptions
from iron_spec.runtime.causal import CausalLM, CausalOptions, Sinusoidal
from iron_spec.runtime.checkpoint import fill
from iron_spec.runtime.encoder import PoolingOptions
from iron_spec.runtime.session import Session
from iron_spec.runtime.weights import draw_weights
from tests.conftest import SPECS

E, V, H = 32, 64, 4
IDS = list(range(3, 3 + 13))  # a chunk and a part
NORM = NormOptions("layer", 1e-5)


def model(alibi=None, **options) -> CausalLM:
    attention = AttentionOptions(heads=H, kv_heads=2, head_dim=8, rope=None, alibi=alibi)
    lo = LayerOptions(attention, MLPOptions(48, kind="plain", act="gelu"), NORM)
    lm = CausalLM(CausalOptions(V, E, (lo, lo), NORM, max_seq_len=64, prefill_chunk=8,
                                **options))
    fill(lm, draw_weights(lm, 0))
    return lm


def compiled_equals_reference(lm: CausalLM) -> np.ndarray:
    a = list(Session(lm).generate(IDS, 12))
    assert a == list(Session(lm, reference=True).generate(IDS, 12))
    lm._versions.clear()
    for prompt in (True, False):
        lm._versions[(prompt, False)] = lm.version(prompt, check=True)
    return Session(lm).logits(IDS + [1])  # CheckError at the first step past its tolerance


def test_alibi_compiles_to_its_reference_in_the_native_program():
    lm = model(alibi_slopes(H))
    biased = compiled_equals_reference(lm)
    for version in (lm.decode_step, lm.prompt_chunk):
        runs = [r for r in version.plan.runs if r.step.op.name == "attention"]
        assert runs and (not native.PROGRAM or
                         all(r.index in version.plan._native for r in runs))
    plain = Session(model()).logits(IDS + [1])
    assert np.abs(biased - plain).max() > 1e-2


def test_sinusoidal_positions_are_a_computed_table_not_a_param():
    lm = model(positions=66, position_offset=2, sinusoidal=Sinusoidal(denominator=15.0))
    assert not any("embed_positions" in n for n, _ in lm.named_params())
    np.testing.assert_array_equal(lm.model.position_table,
                                  sinusoidal_table(66, E, denominator=15.0))
    moved = compiled_equals_reference(lm)
    assert np.abs(moved - Session(model()).logits(IDS + [1])).max() > 1e-2


def test_a_relative_bias_compiles_to_its_reference_and_moves_every_row():
    loaded = load_encoder(SPECS / "mpnet.yaml", random_weights=0, toy=True)
    ids = np.arange(3, 3 + loaded.model.config.max_tokens) % loaded.model.config.vocab_size
    states = loaded.model.version(PoolingOptions("none"), check=True)
    got = states(ids).copy()  # CheckError at the first step past its tolerance
    np.testing.assert_allclose(got, states.reference(ids), atol=1e-5)
    # The same weights with a zero table: the bias moves every row.
    loaded.model.encoder.relative_attention_bias.weight.array[:] = 0.0
    plain = loaded.model.version(PoolingOptions("none")).reference(ids)
    assert (np.abs(got - plain).max(axis=1) > 1e-3).all()
