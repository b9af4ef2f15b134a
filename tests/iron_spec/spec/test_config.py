"""config.json accounting at every load: every key read by a field, ignored on purpose, or
the load refused (``iron_spec.spec.accounting.account``), as ``lint --config`` reports it."""

from __future__ import annotations

import json
import re

import pytest
import typer
from safetensors.numpy import save_file
from typer.testing import CliRunner

from iron_spec.spec.build import load_model
from iron_spec.cli.app import app
from iron_spec.spec.encoder import load_encoder
from iron_spec.spec.errors import SpecError
from iron_spec.spec.loader import load_spec
from iron_spec.cli.show import gather, render_text
from tests.conftest import ROOT, SPECS

LLAMA = SPECS / "llama3.yaml"
runner = CliRunner()


def config_dir(tmp_path, spec=LLAMA, **extra):
    """A checkpoint directory holding only ``spec``'s toy config.json plus ``extra`` keys
    (weights are drawn: ``random_weights``)."""
    config = {**load_spec(spec).get("toy", "config"), **extra}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_every_key_transformers_reads_refused_in_one_error_naming_the_file(tmp_path):
    # transformers' cache keeps only the last sliding_window positions of a Llama
    # (cache_utils), and layer_types picks each layer's attention: read by transformers, not
    # by the spec, they are refused.
    d = config_dir(tmp_path, sliding_window=8, layer_types=["full_attention"] * 2)
    with pytest.raises(SpecError) as e:
        load_model(LLAMA, checkpoint=d, random_weights=0)
    text = str(e.value)
    path = re.escape(str(d / "config.json"))
    assert re.search(rf"{path}: key 'sliding_window' \(= 8\), read by cache_utils.py, "
                     "masking_utils.py ..., is neither mapped", text)
    assert re.search(rf"{path}: key 'layer_types' \(= \['full_attention', 'full_attention'\]\), "
                     "read by LlamaConfig as it is built, is neither mapped", text)
    # At the spec's ignore: list, where the fix goes.
    line = next(i for i, t in enumerate(LLAMA.read_text().splitlines(), 1) if t.startswith("ignore:"))
    assert (e.value.line, e.value.col) == (line, 1)


def test_keys_transformers_never_reads_load_and_show_lists_them(tmp_path):
    # Metadata, generation settings and legacy names no LlamaConfig field, alias or Llama
    # code names: transformers stores them and reads none (issue 29's Phi-3, Gemma 3 and
    # Falcon keys).
    extra = {"_name_or_path": "x/y", "auto_map": {"AutoConfig": "c.C"},
             "cache_implementation": "hybrid", "use_parallel_residual": True, "rope_thetaa": 1.0}
    d = config_dir(tmp_path, **extra)
    loaded = load_model(LLAMA, checkpoint=d, random_weights=0)
    assert loaded.lm.config.hidden_size == 64
    save_file(dict(loaded.checkpoint_tensors()), str(d / "model.safetensors"))
    view = gather(LLAMA, str(d))
    assert [k for k, _, _ in view.unread] == list(extra)
    assert "no field, alias or code of LlamaConfig's reads it" in view.unread[0][2]
    text = render_text(view)
    assert "config.json keys unread" in text
    assert re.search(r"cache_implementation +'hybrid' +read by neither the spec nor "
                     "transformers", text)


@pytest.mark.parametrize("quantization", [
    {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False},
    {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
])
def test_a_quantized_checkpoint_is_refused_naming_quantization_config(tmp_path, quantization):
    # from_pretrained reads quantization_config for every model (its quantizer reads the
    # tensors as stored quantized): no config class field, so it is named by keys.LOADER.
    d = config_dir(tmp_path, quantization_config=quantization)
    with pytest.raises(SpecError, match=r"key 'quantization_config' .*read by from_pretrained's "
                       r"quantizer \(quantizers/auto.py\): the weights are stored quantized"):
        load_model(LLAMA, checkpoint=d, random_weights=0)


def test_without_a_recorded_model_type_every_key_is_read(tmp_path):
    # No model_type: which keys transformers reads is not known, and the load is as strict
    # as a spec's own words.
    d = config_dir(tmp_path, rope_thetaa=1.0, model_type=None)
    with pytest.raises(SpecError, match=r"(?s)key 'rope_thetaa' \(= 1.0\) is neither mapped.*"
                       "every key is read here: config.json names no model_type"):
        load_model(LLAMA, checkpoint=d, random_weights=0)


def test_allow_unread_config_loads_anyway(tmp_path):
    d = config_dir(tmp_path, sliding_window=8)
    lm = load_model(LLAMA, checkpoint=d, random_weights=0, allow_unread_config=True).lm
    assert lm.config.hidden_size == 64


def test_ignored_and_mapped_keys_load(tmp_path):
    d = config_dir(tmp_path, initializer_range=0.02)  # under llama3's ignore:
    assert load_model(LLAMA, checkpoint=d, random_weights=0).lm.config.vocab_size == 256


def test_encoder_and_show_refuse_too(tmp_path):
    bert = SPECS / "bert.yaml"
    d = config_dir(tmp_path, bert, chunk_size_feed_forward=4)
    with pytest.raises(SpecError, match="key 'chunk_size_feed_forward' .* neither mapped"):
        load_encoder(bert, checkpoint=d, random_weights=0)
    assert load_encoder(bert, checkpoint=d, random_weights=0, allow_unread_config=True)
    with pytest.raises(SpecError, match="key 'chunk_size_feed_forward'"):
        gather(bert, str(d))
    with pytest.raises(FileNotFoundError, match="no such weights file"):  # past the config
        gather(bert, str(d), allow_unread_config=True)


ENCODERS_WITH_A_DECODER_MODE = ["bert", "camembert", "electra", "megatron_bert", "roberta",
                                "roberta_prelayernorm", "xlm_roberta"]


@pytest.mark.parametrize("name", ENCODERS_WITH_A_DECODER_MODE)
@pytest.mark.parametrize("key", ["is_decoder", "add_cross_attention"])
def test_an_encoder_config_in_decoder_mode_is_refused(tmp_path, name, key):
    # transformers builds these layers with is_causal=config.is_decoder (modeling_bert.py's
    # BertLayer and its copies), and cross-attention where add_cross_attention: run
    # bidirectionally, such a config would be silently another model.
    spec = SPECS / f"{name}.yaml"
    d = config_dir(tmp_path, spec, **{key: True})
    with pytest.raises(SpecError, match=key):
        load_encoder(spec, checkpoint=d, random_weights=0)
    assert load_encoder(spec, checkpoint=config_dir(tmp_path, spec, **{key: False}),
                        random_weights=0)


@pytest.mark.parametrize("command", ["run", "check", "show", "bench"])
def test_every_loading_command_refuses_and_takes_the_flag(tmp_path, command):
    d = config_dir(tmp_path, sliding_window=8)
    args = [command, str(LLAMA), "--checkpoint", str(d)]
    if command != "show":
        args += ["--random-weights", "0"]
    refused = runner.invoke(app, args)
    assert refused.exit_code != 0 and "key 'sliding_window' (= 8)" in refused.output


def flags(command: str) -> set[str]:
    return {o for p in typer.main.get_command(app).commands[command].params for o in p.opts}


@pytest.mark.parametrize("command", ["run", "check", "show", "bench", "embed"])
def test_every_loading_command_takes_the_flag(command):
    assert "--allow-unread-config" in flags(command)


GEMMA3 = SPECS / "gemma3.yaml"


def test_a_refused_value_is_refused_at_load_naming_key_value_and_why(tmp_path):
    # Gemma3Attention.is_causal = not config.use_bidirectional_attention: with it true,
    # transformers' model attends both ways, which this causal spec cannot serve (7j).
    d = config_dir(tmp_path, GEMMA3, use_bidirectional_attention=True)
    for allow in (False, True):  # no flag lets a refused value through
        with pytest.raises(SpecError) as e:
            load_model(GEMMA3, checkpoint=d, random_weights=0, allow_unread_config=allow)
        assert f"{d / 'config.json'}: use_bidirectional_attention is True, which this spec " \
               "cannot serve: transformers' Gemma3 then attends both ways" in str(e.value)
    line = next(i for i, t in enumerate(GEMMA3.read_text().splitlines(), 1)
                if t.strip() == "- key: use_bidirectional_attention")
    assert e.value.line == line


def test_a_refused_key_with_another_value_is_served(tmp_path):
    d = config_dir(tmp_path, GEMMA3, use_bidirectional_attention=False)
    assert load_model(GEMMA3, checkpoint=d, random_weights=0).lm.config.layers[0].attention


def test_lint_config_reports_a_refused_value(tmp_path):
    d = config_dir(tmp_path, GEMMA3, use_bidirectional_attention=True)
    result = runner.invoke(app, ["lint", str(GEMMA3), "--config", str(d)])
    assert result.exit_code == 1
    assert "use_bidirectional_attention is True, which this spec cannot serve" in result.output


def test_a_refusal_by_condition(tmp_path):
    text = LLAMA.read_text().replace("layer:\n", 'refuse:\n  - when: "num_key_value_heads == '
                                     'num_attention_heads and hidden_size > 32"\n    why: no '
                                     'full multi-head attention here\n\nlayer:\n', 1)
    spec = tmp_path / "llama3.yaml"
    spec.write_text(text)
    assert load_model(spec, random_weights=0, toy=True)  # the toy: 2 kv heads of 4
    d = config_dir(tmp_path, num_key_value_heads=4)
    with pytest.raises(SpecError, match=r"num_key_value_heads == num_attention_heads and "
                       r"hidden_size > 32 \(hidden_size = 64, num_attention_heads = 4, "
                       r"num_key_value_heads = 4\), which this spec cannot serve: no full"):
        load_model(spec, checkpoint=d, random_weights=0)


def lint_variant(tmp_path, old: str, new: str) -> list[str]:
    from iron_spec.spec.lint import lint_paths
    text = LLAMA.read_text()
    assert old in text
    path = tmp_path / "llama3.yaml"
    path.write_text(text.replace(old, new, 1))
    return [p.message for p in lint_paths([path])[0]]


def test_a_field_no_option_reads_is_a_lint_error(tmp_path):
    problems = lint_variant(tmp_path, "  mlp: {kind: gated, act: hidden_act, bias: mlp_bias}",
                            "  mlp: {kind: gated, act: hidden_act}")
    assert [p for p in problems if "read by nothing" in p] == [
        "config.mlp_bias is read by nothing: no option, no other field and no required "
        "field names it, so the config.json key mapped here changes nothing (use it where it "
        "acts, or drop the field and list the key under ignore:)"]


def test_an_option_left_to_its_default_reads_the_default_field(tmp_path):
    # mlp.act left out is the interpreter's "hidden_act": that field is read.
    assert lint_variant(tmp_path, "  mlp: {kind: gated, act: hidden_act, bias: mlp_bias}",
                        "  mlp: {kind: gated, bias: mlp_bias}") == []


def test_gemma4_refuses_bidirectional_and_serves_the_rest(tmp_path):
    # Gemma4TextAttention.is_causal = use_bidirectional_attention != "all"; "vision" bears on
    # image tokens only, and a text model has none.
    gemma4 = SPECS / "gemma4.yaml"
    (tmp_path / "all").mkdir()
    d = config_dir(tmp_path / "all", gemma4, use_bidirectional_attention="all")
    with pytest.raises(SpecError, match="use_bidirectional_attention is 'all', which this spec cannot serve"):
        load_model(gemma4, checkpoint=d, random_weights=0)
    # enable_moe_block: the mixture beside every layer's MLP (the toy's own is on).
    for moe in (False, True):
        (tmp_path / str(moe)).mkdir()
        d = config_dir(tmp_path / str(moe), gemma4, use_bidirectional_attention="vision",
                       enable_moe_block=moe)
        lm = load_model(gemma4, checkpoint=d, random_weights=0).lm
        assert all((lo.experts is not None) == moe for lo in lm.config.layers)


def test_a_whole_number_part_indexes_a_list():
    from iron_spec.spec.config import MISSING, lookup
    data = {"layer_rope_theta": [10000.0, 0, None], "a": {"b": [1, {"c": 2}]}}
    assert lookup(data, "layer_rope_theta.1") == 0
    assert lookup(data, "layer_rope_theta.2") is None  # a null entry
    assert lookup(data, "layer_rope_theta.3") is MISSING  # past the end
    assert lookup(data, "a.b.1.c") == 2
    assert lookup(data, "a.b.x") is MISSING



@pytest.mark.parametrize("name,key,value,why", [
    # The Hub's BitNet b1.58 config.json names transformers' quantizer; its weights are
    # packed uint8, which this spec does not unpack.
    ("bitnet", "quantization_config", {"quant_method": "bitnet", "linear_class":
                                       "autobitlinear", "quantization_mode": "offline"},
     "packed low-bit weights"),
    ("bitnet", "head_dim", 8, "attn_sub_norm is hidden_size wide"),
    ("doge", "is_moe", True, "DogeCDMoE"),
    ("doge", "keep_window_size", 256, "top keep_window_size"),
    ("doge", "sliding_window", 64, "sliding window beside the dynamic mask"),
])
def test_a_config_outside_what_the_spec_serves_is_refused(tmp_path, name, key, value, why):
    spec = SPECS / f"{name}.yaml"
    (tmp_path / "served").mkdir()
    assert load_model(spec, checkpoint=config_dir(tmp_path / "served", spec), random_weights=0).lm
    d = config_dir(tmp_path, spec, **{key: value})
    with pytest.raises(SpecError, match=why):
        load_model(spec, checkpoint=d, random_weights=0)


def test_int_truncates_a_fractional_rotary_width_as_transformers_does(tmp_path):
    # transformers' RoPE init: dim = int(head_dim * partial_rotary_factor). The bad corpus's
    # rotary_dim 4.8, written "int(head_dim * 0.3)", is int(16 * 0.3) = 4; phi-2's factor
    # 0.4 on a toy's 16-wide heads is 6.
    from iron_spec.spec.interpreter import expand

    text = (ROOT / "tests" / "specs" / "bad" / "rotary_fraction.yaml").read_text()
    path = tmp_path / "truncated.yaml"
    path.write_text(text.replace('"head_dim * 0.3"', '"int(head_dim * 0.3)"'))
    spec = load_spec(path)
    rope = expand(spec, spec.get("toy", "config")).options.ropes["default"]
    assert rope.rotary_dim == int(16 * 0.3) == 4
    phi = load_spec(SPECS / "phi.yaml")
    config = {**phi.get("toy", "config"), "partial_rotary_factor": 0.4}
    assert expand(phi, config).options.ropes["default"].rotary_dim == int(16 * 0.4) == 6


def test_heads_that_do_not_group_name_the_fields_the_file_and_the_spec(tmp_path):
    # Found by a new user's trial: "7 attention heads do not group into 3 kv heads" named
    # neither the config fields nor where their values came from.
    config = {**load_spec(LLAMA).get("toy", "config"), "num_attention_heads": 7,
              "num_key_value_heads": 3, "hidden_size": 70}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecError) as e:
        load_model(LLAMA, checkpoint=tmp_path, random_weights=0)
    where = tmp_path / "config.json"
    assert str(e.value).startswith(f"{LLAMA}:")
    assert (f"7 attention heads (num_attention_heads, from {where}: num_attention_heads) do "
            f"not group into 3 kv heads (num_key_value_heads, from {where}: "
            "num_key_value_heads): the heads must be a multiple of the kv heads") in str(e.value)
