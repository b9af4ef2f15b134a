"""Rename tables: patterns over the layer index, composition, and their inverse, each against
names worked out by hand; stored layouts (transposed, row-ordered) read and written back."""

import numpy as np
import pytest
from safetensors.numpy import save_file

from iron_spec.runtime.checkpoint import Checkpoint, CheckpointError, bind, load, mark_transposed
from iron_spec.runtime.module import Module, Param
from iron_spec.runtime.renames import Pattern, Rename, RenameError, renamed, source, sources

GPT2 = {"transformer.h": "model.layers", "transformer.wte": "model.embed_tokens",
        "transformer.ln_f": "model.norm", "attn.c_attn": "self_attn.qkv_proj",
        "attn.c_proj": "self_attn.o_proj", "ln_1": "input_layernorm",
        "mlp.c_proj": "mlp.down_proj"}


def test_a_table_composes_at_any_depth():
    assert renamed("transformer.h.0.attn.c_attn.weight", GPT2) == "model.layers.0.self_attn.qkv_proj.weight"
    assert renamed("transformer.h.117.ln_1.bias", GPT2) == "model.layers.117.input_layernorm.bias"
    assert renamed("transformer.h.3.mlp.c_proj.weight", GPT2) == "model.layers.3.mlp.down_proj.weight"
    assert renamed("transformer.ln_f.weight", GPT2) == "model.norm.weight"
    assert renamed("lm_head.weight", GPT2) == "lm_head.weight"


def test_holes_catch_the_layer_index_and_one_part():
    r = {"h.{layer}.*.w": "layers.{layer}.*.weight"}
    assert renamed("t.h.12.attn.w", r) == "t.layers.12.attn.weight"
    assert renamed("t.h.x.attn.w", r) == "t.h.x.attn.w"  # {layer} is digits only
    assert renamed("t.h.1.a.b.w", r) == "t.h.1.a.b.w"  # * is one part
    # Each * gets the part the same-numbered * caught.
    assert renamed("p.q.r", {"*.*.r": "*.s.*"}) == "p.s.q"
    assert Pattern("model.layers.{layer}.mlp.*.weight").matches("model.layers.3.mlp.c_fc.weight")
    assert not Pattern("model.layers.{layer}.mlp.*.weight").matches("model.layers.3.mlp.c_fc.bias")


def test_malformed_patterns_are_refused():
    for old, new in [("a..b", "c"), ("a.x*", "b.x*"), ("{layer}.{layer}", "a.{layer}"),
                     ("h.{layer}", "layers"), ("h.*", "layers.{layer}"), ("", "x")]:
        with pytest.raises(RenameError):
            Rename(old, new)


def test_the_inverse_is_the_name_through_the_most_renames():
    # model.layers.0.self_attn.qkv_proj.weight comes from four names (each of the two
    # renames applied or not); the checkpoint's is the one through both.
    found = sources("model.layers.0.self_attn.qkv_proj.weight", GPT2)
    assert found[0] == ("transformer.h.0.attn.c_attn.weight", 2)
    assert {n for n, _ in found} == {
        "transformer.h.0.attn.c_attn.weight", "transformer.h.0.self_attn.qkv_proj.weight",
        "model.layers.0.attn.c_attn.weight", "model.layers.0.self_attn.qkv_proj.weight"}
    assert source("model.layers.9.input_layernorm.weight", GPT2) == "transformer.h.9.ln_1.weight"
    assert source("lm_head.weight", GPT2) == "lm_head.weight"
    assert source("model.layers.1.norm", {"language_model": ""}) == "language_model.model.layers.1.norm"
    assert source("p.s.q", {"*.*.r": "*.s.*"}) == "p.q.r"


def test_a_swap_through_a_third_name_inverts():
    swap = {"gate": "tmp", "up": "gate", "tmp": "up"}
    assert renamed("mlp.gate.w", swap) == "mlp.up.w" and renamed("mlp.up.w", swap) == "mlp.gate.w"
    assert source("mlp.up.w", swap) == "mlp.gate.w" and source("mlp.gate.w", swap) == "mlp.up.w"


def test_two_names_tying_for_one_are_refused():
    with pytest.raises(RenameError, match="from both a.x and b.x"):
        source("m.x", {"a": "m", "b": "m"})


def test_stored_layouts_round_trip():
    p = Param(2, 3)
    p.transposed = True
    assert p.stored_shape == (3, 2)
    stored = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert p.from_stored(stored).tolist() == [[0, 2, 4], [1, 3, 5]]
    assert np.array_equal(p.to_stored(p.from_stored(stored)), stored)
    q = Param(3)
    q.rows = np.array([2, 0, 1])
    assert q.from_stored(np.array([10.0, 11.0, 12.0])).tolist() == [12.0, 10.0, 11.0]
    assert q.to_stored(np.array([12.0, 10.0, 11.0])).tolist() == [10.0, 11.0, 12.0]


class Conv(Module):
    def __init__(self):
        self.weight = Param(2, 3)
        self.bias = Param(2)


class Net(Module):
    def __init__(self):
        self.layers = [Conv(), Conv()]


def test_transposed_and_unused_tensors_load(tmp_path):
    net = Net().name_tree()
    assert mark_transposed(net, ["layers.{layer}.weight", "nothing.*"]) == ["nothing.*"]
    w = np.arange(6, dtype=np.float32).reshape(3, 2)  # stored [in, out]
    arrays = {"h.0.weight": w, "h.1.weight": w + 6, "h.0.bias": np.zeros(2, np.float32),
              "h.1.bias": np.ones(2, np.float32), "h.0.attn.masked_bias": np.zeros(1, np.float32),
              "h.1.attn.masked_bias": np.zeros(1, np.float32)}
    save_file(arrays, str(tmp_path / "model.safetensors"))
    report = load(net, Checkpoint(tmp_path), {"h": "layers"}, unused=["h.{layer}.attn.masked_bias"])
    assert net.layers[1].weight.array.tolist() == [[6, 8, 10], [7, 9, 11]]
    assert report.ignored == ["h.0.attn.masked_bias", "h.1.attn.masked_bias"]


def test_a_transposed_matrix_of_the_wrong_shape_says_so():
    net = Net().name_tree()
    mark_transposed(net, ["layers.*.weight"])
    shapes = {"layers.0.weight": (2, 3), "layers.1.weight": (3, 2), "layers.0.bias": (2,),
              "layers.1.bias": (2,)}
    with pytest.raises(CheckpointError, match=r"layers.0.weight is \[2, 3\]; the spec expects "
                       r"layers.0.weight to be \[3, 2\] stored transposed"):
        bind(net, shapes, {})


def test_drawn_tensors_fill_a_transposed_param_in_the_model_layout():
    from iron_spec.runtime.checkpoint import fill
    net = Net().name_tree()
    mark_transposed(net, ["layers.{layer}.weight"])
    w = np.arange(6, dtype=np.float32).reshape(2, 3)  # the model's (out, in)
    fill(net, {"layers.0.weight": w, "layers.1.weight": w, "layers.0.bias": np.zeros(2, np.float32),
               "layers.1.bias": np.zeros(2, np.float32)})
    assert net.layers[0].weight.array.tolist() == w.tolist()
    assert net.layers[0].weight.to_stored(w).shape == (3, 2)  # written back [in, out]
