"""The recurrent token mixers' options flipped one at a time against their specs' goldens:
each keeps the weights (so the golden still judges) and must miss transformers' logits by far
more than the gate (1e-6), so the toys test what the specs say of their mixers."""

from __future__ import annotations

import pytest

from tests.specs.test_position_flips import flipped_kl


@pytest.mark.parametrize("name,old,new", [
    # Mamba2's gated norm: y * silu(z) normed, not normed then gated.
    ("mamba2", "norm: gate_first", "norm: norm_first"),
    # The norm's groups: one over the whole width, not one per group of heads.
    ("mamba2", "norm_groups: n_groups", "norm_groups: 1"),
    # Falcon-H1's toy norms before the gate.
    ("falcon_h1", "then: norm_first, else: gate_first", "then: gate_first, else: norm_first"),
    # Falcon-H1's mixers summed with their multipliers, and the mup vector.
    ("falcon_h1", "[[ssm_in_multiplier, ssm_out_multiplier]", "[[1.0, ssm_out_multiplier]"),
    ("falcon_h1", "projection_scales: ssm_multipliers", "projection_scales: null"),
    # Falcon Mamba's dt/B/C norms: without them, the same weights.
    ("falcon_mamba", "\n                   dtbc_norm: weightless, eps: mixer_rms_eps}", "}"),
    # Qwen3-Next's gated attention turns a quarter of each head: unturned is another model.
    ("qwen3_next", "qk_norm: head, rope: default,", "qk_norm: head, rope: null,"),
], ids=["mamba2-norm-order", "mamba2-norm-groups",
        "falcon-h1-norm-order", "falcon-h1-ssm-in-scale", "falcon-h1-no-mup",
        "falcon-mamba-no-dtbc-norm", "qwen3-next-no-rope"])
def test_a_flipped_mixer_option_misses_the_golden(tmp_path, name, old, new):
    assert flipped_kl(tmp_path, name, old, new) > 1e-4


@pytest.mark.parametrize("name,old,new", [
    # A conv layer run as attention would hold other tensors (stale): the layer types moved
    # instead, the convolution's layers shifted by one over the same tensor shapes.
    ("bamba", "at: attn_layer_indices", "at: [0]"),
])
def test_a_mixer_moved_to_another_layer_is_refused_or_misses(tmp_path, name, old, new):
    # Other layers hold other tensors: the weights no longer fit (a KeyError or ValueError
    # naming them), never a pass.
    with pytest.raises((KeyError, ValueError)):
        flipped_kl(tmp_path, name, old, new)
