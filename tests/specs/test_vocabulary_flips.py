"""Layer-vocabulary behaviours flipped one at a time against their specs' goldens
(transformers' logits on the same weights): each flip must miss by far more than the gate.

A flip that keeps the model's tensors is judged by the golden as it is (``flipped_kl``); a
flip that adds a tensor is judged on the right model's weights with the new tensor set to
what a checkpoint would most plausibly hold (a norm's ones and zeros), under the right
model's fingerprint.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from iron_spec.spec.build import load_model
from iron_spec.cli.check import golden_path
from iron_spec.spec.errors import SpecError
from iron_spec.spec.interpreter import expand
from iron_spec.spec.loader import load_spec
from iron_spec.runtime.golden import Golden, GoldenError, kl_stats, teacher_forced
from iron_spec.runtime.session import Session
from tests.conftest import SPECS
from tests.specs.test_position_flips import flipped_kl
from tests.specs.test_goldens import judge
from tests.specs.test_stored_layouts import written


def _kl_on_the_right_weights(tmp_path, name: str, old: str, new: str, extra: dict) -> float:
    """The mean KL against spec ``name``'s golden of the spec with ``old`` replaced by
    ``new``, its params those of the right spec's drawn model by name and ``extra``'s
    (name: value) for the ones only it holds."""
    right = load_model(SPECS / f"{name}.yaml", random_weights=0, toy=True)
    golden = Golden.read(golden_path(right), right.fingerprint())
    text = (SPECS / f"{name}.yaml").read_text()
    assert old in text
    path = tmp_path / f"{name}.yaml"
    path.write_text(text.replace(old, new, 1))
    flipped = load_model(path, random_weights=0, toy=True)
    weights = dict(right.lm.named_params())
    held = dict(flipped.lm.named_params())
    assert set(held) - set(weights) == set(extra)
    for key, param in held.items():
        param.fill(np.broadcast_to(extra[key], param.shape) if key in extra
                   else weights[key].array)
    return kl_stats(teacher_forced(golden, Session(flipped.lm).logits))["mean"]


def test_the_head_transform_activation_flipped_misses_the_golden(tmp_path):
    # ModernBertDecoderPredictionHead's classifier_activation (the toy's silu) read as the
    # MLP's gelu: the transform runs between the final norm and lm_head.
    kl = flipped_kl(tmp_path, "modernbert_decoder", "transform: {act: classifier_activation",
                    "transform: {act: hidden_activation")
    assert kl > 1e-4


def test_the_first_layer_normed_misses_the_golden(tmp_path):
    # ModernBertDecoderLayer's attn_norm is an Identity at layer 0; a LayerNorm there (ones,
    # zeros: the plainest weights) normalizes the embeddings' norm output a second time.
    kl = _kl_on_the_right_weights(
        tmp_path, "modernbert_decoder", "first_attention_norm: false", "first_attention_norm: true",
        {"model.layers.0.input_layernorm.weight": 1.0, "model.layers.0.input_layernorm.bias": 0.0})
    assert kl > 1e-4



def test_codegens_rows_read_in_another_layout_miss_the_golden(tmp_path):
    # The toy's checkpoint as transformers loaded it, read through the spec with the rows
    # of CodeGenAttention's mp_num = 4 blocks (query, value, key each) taken as q, k, v, or
    # as one block ([q; k; v]): the same file, so the golden judges it, and it misses.
    drawn, _, fingerprint = written("codegen", tmp_path)
    golden = Golden.read(golden_path(drawn), fingerprint)
    text = (SPECS / "codegen.yaml").read_text()
    old = "qkv_layout: shards, qkv_shards: 4, qkv_order: qvk"
    assert old in text
    for i, new in enumerate(("qkv_layout: shards, qkv_shards: 4, qkv_order: qkv",
                             "qkv_layout: shards, qkv_shards: 1, qkv_order: qvk")):
        path = tmp_path / f"flip{i}.yaml"
        path.write_text(text.replace(old, new, 1))
        loaded = load_model(path, checkpoint=tmp_path)
        assert loaded.fingerprint() == fingerprint
        assert kl_stats(teacher_forced(golden, Session(loaded.lm).logits))["mean"] > 1e-4
    right = load_model(SPECS / "codegen.yaml", checkpoint=tmp_path)
    assert kl_stats(teacher_forced(golden, Session(right.lm).logits))["mean"] < 1e-6


def test_exaone4s_full_layers_turned_by_rope_miss_the_golden(tmp_path):
    # Exaone4Attention turns a full layer's queries and keys only where sliding_window is
    # null; the toy's is 6, so RoPE on every layer misses.
    kl = flipped_kl(tmp_path, "exaone4", 'rope_on: "sliding_window == null"', "rope_on: true")
    assert kl > 1e-4


def test_exaone4_without_a_window_turns_every_layer():
    # Exaone4Attention: `if self.sliding_window is None or self.is_sliding` turns q and k;
    # with a null sliding_window no layer has a window (its sliding mask is the causal one).
    spec = load_spec(SPECS / "exaone4.yaml")
    config = dict(spec.get("toy", "config"), sliding_window=None,
                  layer_types=["sliding_attention", "full_attention"] * 2)
    layers = expand(spec, config).options.layers
    assert [lo.attention.rope for lo in layers] == ["default"] * 4
    assert [lo.attention.window for lo in layers] == [None] * 4
    windowed = expand(spec, spec.get("toy", "config")).options.layers
    assert [lo.attention.rope for lo in windowed] == ["default", None, "default", None]
    assert [lo.attention.window for lo in windowed] == [6, None, 6, None]



@pytest.mark.parametrize("name,old,new,needle,key", [
    ("codegen", "qkv_order: qvk", "qkv_order: qqk", "not a permutation of qkv", "qkv_order"),
    ("codegen", "qkv_shards: 4", "qkv_shards: 3", "do not split", "qkv_shards"),
    ("codegen", "qkv_layout: shards, ", "", "under qkv_layout shards", "qkv_shards"),
    ("modernbert_decoder", "  placement: pre\n", "  placement: post\n",
     "without its attention norm is kind decoder", "first_attention_norm"),
], ids=["order", "shards", "layout", "first-norm-placement"])
def test_a_bad_option_is_refused_at_its_line(tmp_path, name, old, new, needle, key):
    text = (SPECS / f"{name}.yaml").read_text()
    assert old in text
    edited = text.replace(old, new, 1)
    path = tmp_path / f"{name}.yaml"
    path.write_text(edited)
    with pytest.raises(SpecError, match=needle) as e:
        load_model(path, random_weights=0, toy=True)
    assert key in edited.splitlines()[e.value.line - 1]


def _hyperclovax_config(tmp_path, **changes):
    config = dict(load_spec(SPECS / "hyperclovax.yaml").get("toy", "config"), **changes)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_use_post_norm_chooses_the_layer_and_its_names(tmp_path):
    # HyperCLOVAXDecoderLayer: post_norm1/post_norm2 RMSNorms where use_post_norm, else
    # nn.Identity (Granite's pre-norm layer, post_attention_layernorm the MLP's input norm).
    # Each config judged by a golden transformers recorded from it.
    directory = _hyperclovax_config(tmp_path, use_post_norm=False)
    pre = load_model(SPECS / "hyperclovax.yaml", checkpoint=directory, random_weights=0,
                     prefill_chunk=16)
    assert {lo.placement for lo in pre.expanded.options.layers} == {"pre"}
    assert pre.expanded.renames == {}
    judge(pre, Golden.read(SPECS.parent / "tests" / "goldens" / "hyperclovax" /
                           "pre-norm-seed0.npz", pre.fingerprint()))
    post = load_model(SPECS / "hyperclovax.yaml", random_weights=0, toy=True)
    assert {lo.placement for lo in post.expanded.options.layers} == {"sandwich"}
    assert post.expanded.renames["post_norm1"] == "post_attention_layernorm"
    judge(post, Golden.read(golden_path(post), post.fingerprint()))


def test_a_choice_chosen_the_other_way_misses_the_golden(tmp_path):
    # The pre-norm config read as a sandwich (the choice inverted) asks for post norms the
    # checkpoint transformers wrote from it does not hold.
    text = (SPECS / "hyperclovax.yaml").read_text()
    old = "placement: {when: use_post_norm, then: sandwich, else: pre}"
    assert old in text
    path = tmp_path / "flipped.yaml"
    path.write_text(text.replace(old, 'placement: {when: "not use_post_norm", then: sandwich, else: pre}'))
    (tmp_path / "pre").mkdir()
    directory = _hyperclovax_config(tmp_path / "pre", use_post_norm=False)
    flipped = load_model(path, checkpoint=directory, random_weights=0, prefill_chunk=16)
    assert {lo.placement for lo in flipped.expanded.options.layers} == {"sandwich"}
    with pytest.raises(GoldenError, match="stale"):
        Golden.read(SPECS.parent / "tests" / "goldens" / "hyperclovax" / "pre-norm-seed0.npz",
                    flipped.fingerprint())


def test_a_choice_whose_condition_is_no_boolean_is_refused_at_its_line(tmp_path):
    text = (SPECS / "hyperclovax.yaml").read_text()
    old = "placement: {when: use_post_norm,"
    edited = text.replace(old, "placement: {when: rms_norm_eps,", 1)
    path = tmp_path / "hyperclovax.yaml"
    path.write_text(edited)
    with pytest.raises(SpecError, match="not true or false") as e:
        load_model(path, random_weights=0, toy=True)
    assert "placement: {when: rms_norm_eps" in edited.splitlines()[e.value.line - 1]
