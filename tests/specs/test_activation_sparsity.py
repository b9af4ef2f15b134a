"""layer.mlp.activation_sparsity from a per-layer config list (transformers'
activation_sparsity_pattern): each layer its own share, and bad shares refused at the line."""

from __future__ import annotations

import pytest

from iron_spec.spec.errors import SpecError
from iron_spec.spec.interpreter import expand
from iron_spec.spec.loader import load_spec
from tests.conftest import SPECS


def sparse_llama(tmp_path, mlp: str = "{kind: gated, act: hidden_act, bias: mlp_bias, "
                                      "activation_sparsity: layer_activation_sparsity}"):
    text = (SPECS / "llama3.yaml").read_text()
    text = text.replace("  mlp_bias: {json: mlp_bias, default: false}\n",
                        "  mlp_bias: {json: mlp_bias, default: false}\n  layer_activation_sparsity:"
                        " {json: \"activation_sparsity_pattern.{layer}\", default: 0.0}\n")
    text = text.replace("  mlp: {kind: gated, act: hidden_act, bias: mlp_bias}\n", f"  mlp: {mlp}\n")
    path = tmp_path / "sparse.yaml"
    path.write_text(text)
    spec = load_spec(path)
    return spec, dict(spec.get("toy", "config"))


def test_each_layer_takes_its_entry_of_the_pattern(tmp_path):
    spec, config = sparse_llama(tmp_path)
    n = config["num_hidden_layers"]
    pattern = [0.95] + [0.0] * (n - 1)
    layers = expand(spec, {**config, "activation_sparsity_pattern": pattern}).options.layers
    assert [lo.mlp.activation_sparsity for lo in layers] == pattern
    # A pattern shorter than the layers leaves the rest at the field's default, no cut.
    layers = expand(spec, {**config, "activation_sparsity_pattern": [0.5]}).options.layers
    assert [lo.mlp.activation_sparsity for lo in layers] == [0.5] + [0.0] * (n - 1)


def test_a_share_of_one_or_more_is_refused_at_its_line(tmp_path):
    spec, config = sparse_llama(tmp_path)
    with pytest.raises(SpecError, match=r"activation_sparsity is 1.0, not a share within \[0, 1\)"):
        expand(spec, {**config, "activation_sparsity_pattern": [1.0]})


def test_a_fused_mlp_takes_no_sparsity(tmp_path):
    spec, config = sparse_llama(tmp_path, "{kind: gated, act: hidden_act, fused: true, "
                                          "activation_sparsity: 0.9}")
    with pytest.raises(SpecError, match="activation_sparsity cuts a gated MLP's own gate_proj, "
                                        "not a fused gated MLP's"):
        expand(spec, config)
