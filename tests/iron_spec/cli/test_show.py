"""``iron-spec show``: the expanded model, each parameter's source tensor, leftovers."""

from __future__ import annotations

import json

import numpy as np
from safetensors.numpy import save_file
from typer.testing import CliRunner

from iron_spec.cli.app import app
from tests.conftest import SPECS, edited_spec

LLAMA = str(SPECS / "llama3.yaml")
runner = CliRunner()


def show(*args):
    return runner.invoke(app, ["show", *args])


def test_toy_text_shows_sources_pattern_and_tree():
    result = show(LLAMA, "--toy")
    assert result.exit_code == 0, result.output
    out = result.stdout
    # Values and sources from specs/llama3.yaml's toy config and its defaults.
    assert "  num_key_value_heads      2                         toy.config: num_key_value_heads" in out
    assert "  attention_bias           False                     default" in out
    assert "  0-1     rope default, full attention" in out
    assert "      weight   [64, 64]       float32" in out  # q_proj: 4 heads x 16 = 64


def test_toy_json_lists_every_param():
    data = json.loads(show(LLAMA, "--format", "json").stdout)
    names = [p["name"] for p in data["params"]]
    # 2 layers x 9 + embed_tokens + norm + lm_head (untied in the toy).
    assert len(names) == 21 and names[-1] == "lm_head.weight"
    assert data["config"]["head_dim"] == {"value": 16, "source": "toy.config: head_dim"}
    assert [l["attention.rope"] for l in data["layers"]] == ["default", "default"]
    assert data["checkpoint"] is None


def _toy_tensors(directory, tied: bool) -> dict:
    """The toy's config.json (tied or not) written into ``directory``, and a zero tensor for
    each of the toy's params, by name, for the caller to edit and save."""
    config = json.loads(show(LLAMA, "--format", "json").stdout)
    toy = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "max_position_embeddings": 512, "tie_word_embeddings": tied}
    (directory / "config.json").write_text(json.dumps(toy))
    return {p["name"]: np.zeros(p["shape"], np.float32) for p in config["params"]}


def test_a_checkpoint_that_does_not_fit_shows_what_is_left(tmp_path):
    tensors = _toy_tensors(tmp_path, tied=True)
    del tensors["model.norm.weight"]
    tensors["model.extra.weight"] = np.zeros(3, np.float32)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    result = show(LLAMA, "--checkpoint", str(tmp_path), "--format", "json")
    assert result.exit_code == 1
    c = json.loads(result.stdout)["checkpoint"]
    assert c["unfilled"] == ["model.norm.weight"]
    assert c["unplaced"] == ["model.extra.weight"]
    # Tied in this config: the file's lm_head.weight is read by nothing, on purpose.
    assert c["ignored"] == ["lm_head.weight"] and c["tied"] == {
        "lm_head.weight": "model.embed_tokens.weight"}
    assert c["tensors"] == 21 and c["placed"] == 19 and c["fits"] is False


def test_an_integer_tensor_where_a_weight_belongs_does_not_fit(tmp_path):
    # run and load refuse it ("hold integers"); show says so too, and exits 1.
    tensors = _toy_tensors(tmp_path, tied=False)
    tensors["model.norm.weight"] = np.zeros(64, np.int32)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    result = show(LLAMA, "--checkpoint", str(tmp_path))
    assert result.exit_code == 1, result.output
    assert "1 not float" in result.stdout
    assert "not float: checkpoint tensor model.norm.weight is I32; weights are F64, F32" in \
        result.stdout
    data = json.loads(show(LLAMA, "--checkpoint", str(tmp_path), "--format", "json").stdout)
    assert data["checkpoint"]["not_float"] == ["model.norm.weight"]
    assert data["checkpoint"]["fits"] is False


def test_could_not_run(tmp_path):
    assert show(str(tmp_path / "none.yaml")).exit_code == 1  # refused input
    assert show(LLAMA, "--toy", "--checkpoint", str(tmp_path)).exit_code == 2
    assert show(LLAMA, "--format", "yaml").exit_code == 2


def test_smollm2_every_tensor_placed(smollm2):
    result = show(LLAMA, "--checkpoint", str(smollm2))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert ("checkpoint: 272 of 272 tensors placed, 0 ignored (tied), 0 unused "
            "(checkpoint.unused), 0 left over; 0 parameters unfilled, 0 mis-shaped") in out
    assert "tied: lm_head.weight -> model.embed_tokens.weight (no tensor of its own)" in out
    assert "<- model.layers.29.mlp.down_proj.weight (BF16 [576, 1536])" in out
    data = json.loads(show(LLAMA, "--checkpoint", str(smollm2), "--format", "json").stdout)
    sources = [p["source"] for p in data["params"] if p["source"]]
    assert len(sources) == len(set(sources)) == 272


def test_toy_parameter_count_and_bytes():
    # specs/llama3.yaml's toy by hand: V 256, E 64, I 128, 2 layers, 4 heads and 2 kv heads
    # of 16, untied head: embed 256*64, per layer q,o 64*64, k,v 32*64, gate/up/down
    # 3*128*64 and two norms of 64; the final norm 64 and lm_head 256*64.
    count = 256 * 64 + 2 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 128 * 64 + 2 * 64) + 64 + 256 * 64
    result = show(LLAMA, "--toy")
    assert f"params    {count:,} float32 ({4 * count:,} bytes, 0.4 MiB) widened (--weights " \
        "float32)" in result.stdout
    data = json.loads(show(LLAMA, "--toy", "--format", "json").stdout)["parameters"]
    assert data == {"count": count, "bytes": 4 * count,
                    "by_dtype": {"float32": {"count": count, "bytes": 4 * count}}}


def test_smollm2_parameter_count_is_hugging_faces(smollm2):
    # The model card's count: 134,515,008 (embeddings tied: counted once), stored bfloat16.
    out = show(LLAMA, "--checkpoint", str(smollm2)).stdout
    # Found by a new user's trial: "float32 ... as held" where a run holds the BF16 weights.
    assert "params    134,515,008 float32 (538,060,032 bytes, 513.1 MiB) widened (--weights " \
        "float32)" in out
    assert "stored    134,515,008 BF16 (269,030,016 bytes, 256.6 MiB) in the checkpoint's files, " \
        "held so by --weights stored" in out


def test_a_checkpoint_of_another_architecture_is_said_so_not_its_unread_keys(smollm2):
    # SmolLM2 is a LlamaForCausalLM: gemma3's spec would list the keys it does not read
    # (hidden_act, mlp_bias, ...) as if they were what stood in the way.
    result = show(str(SPECS / "gemma3.yaml"), "--checkpoint", str(smollm2))
    assert result.exit_code == 1, result.output
    said = " ".join(result.output.split())
    assert (f"{smollm2 / 'config.json'} is LlamaForCausalLM (model_type llama); this spec serves "
            "Gemma3ForCausalLM (model_type gemma3_text, as its toy config): the architecture "
            "does not match") in said, said
    assert "neither mapped under config" not in said


def test_a_recurrence_schedule_is_shown_as_the_spec_nests_it(tmp_path):
    # Found by a new user's trial: show printed hrm_text's layers and tree but not its
    # recurrence:, the schedule they run in. On a toy of H_cycles 1, L_cycles 3 (counts that
    # differ, so a swap shows): HrmTextModel's loop runs L_module L_cycles times, then
    # H_module, each of H_cycles times: 1 * (3 + 1) = 4 runs, as its cycle_offset slots count.
    spec = edited_spec(tmp_path, "hrm_text", "    H_cycles: 2\n    L_cycles: 2\n",
                       "    H_cycles: 1\n    L_cycles: 3\n")
    result = show(str(spec))
    assert result.exit_code == 0, result.output
    shown = result.output.split("\nrecurrence\n")[1].split("\n\n")[0].splitlines()
    assert shown == [
        "  stacks    L_module (2 layers, final norm), H_module (2 layers, final norm)",
        "  states    z_H from embeddings, z_L from learned",
        "  steps",
        "    repeat 1 (H_cycles):",
        "      repeat 3 (L_cycles):",
        "        z_L <- L_module(z_L + z_H)",
        "      z_H <- H_module(z_H + z_L)",
        "  output    z_H",
        "  unrolled  4 runs a token: each L_module layer 3 times, each H_module layer 1 time"]
    runs = json.loads(show(str(spec), "--format", "json").output)["recurrence"]["runs"]
    assert [(r["stack"], r["into"], [i["state"] for i in r["inputs"]]) for r in runs] == \
        [("L_module", "z_L", ["z_L", "z_H"])] * 3 + [("H_module", "z_H", ["z_H", "z_L"])]
    assert "recurrence" not in show(LLAMA).output
    assert json.loads(show(LLAMA, "--format", "json").output)["recurrence"] is None


TOYS = SPECS.parent / "tests" / "checkpoints"


def test_a_composite_checkpoint_shows_each_tower_and_places_its_tensors():
    # SmolVLM 2's toy (tests/checkpoints/make_towers.py): the text model's part, then the
    # image tower (its config from vision_config), every tensor of the file placed once. The
    # file's own names, read from its header here: the text part takes model.text_model and
    # lm_head, the tower model.vision_model and the connector.
    from safetensors import safe_open

    directory = TOYS / "smolvlm2-toy"
    with safe_open(str(directory / "model.safetensors"), "np") as f:
        names = set(f.keys())
    result = show(LLAMA, "--checkpoint", str(directory), "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    [tower] = data["towers"]
    assert tower["tower"] == "image" and tower["checkpoint"]["fits"]
    assert tower["config"]["patch_size"]["source"].endswith("config.json: vision_config: patch_size")
    text = {p["source"] for p in data["params"] if p["source"]}
    image = {p["source"] for p in tower["params"]}
    assert text | image == names and not text & image
    assert image == {n for n in names if n.startswith(("model.vision_model.", "model.connector."))}
    assert data["checkpoint"]["unused"] == []  # the tower's tensors are no longer "unused"
    out = show(LLAMA, "--checkpoint", str(directory)).stdout
    assert "\ntower     image (Tower)\n" in out
    # A tower's weights are read into float32 (held so: only the text model's matrices are
    # held as stored).
    assert "patch_embedding  Linear\n      weight   [32, 48]       F32      <- " \
        "model.vision_model.embeddings.patch_embedding.weight (BF16 [32, 3, 4, 4])" in out


def test_a_tower_that_does_not_fit_its_tensors_fails_show(tmp_path):
    # The toy with vision_config's intermediate_size doubled: the tower's fc1/fc2 no longer
    # fit the file's tensors, so show names them and exits 1, as for the text model's.
    import shutil

    directory = tmp_path / "toy"
    shutil.copytree(TOYS / "smolvlm2-toy", directory)
    config = json.loads((directory / "config.json").read_text())
    config["vision_config"]["intermediate_size"] *= 2
    (directory / "config.json").write_text(json.dumps(config))
    result = show(LLAMA, "--checkpoint", str(directory))
    assert result.exit_code == 1, result.output
    assert "mis-shaped: checkpoint tensor model.vision_model.encoder.layers.0.mlp.fc1.weight" \
        in result.stdout


def _toy_gguf(path, qtype: str):
    """The llama3 toy (drawn at seed 0) written as llama.cpp's converter writes a GGUF, its
    matrices stored as ``qtype`` (``Q8_0``, ``Q4_0``)."""
    import gguf

    from iron_spec.spec.build import load_model
    from tests.specs.gguf import convert

    toy = load_model(SPECS / "llama3.yaml", random_weights=0, toy=True)
    config = dict(toy.config_json)
    config.pop("rope_scaling")  # llama3 scaling is a rope_freqs tensor: refused
    return convert.write(path, "llama", config,
                         {n: np.asarray(t) for n, t in toy.weights().items()},
                         qtype=gguf.GGMLQuantizationType[qtype])


def test_json_names_a_gguf_tensors_stored_block_form_as_the_text_does(tmp_path):
    # Found by a new user's trial: `show --checkpoint X.q8_0.gguf --format json` gave
    # source_dtype F32 for every tensor where the text view says Q8_0.
    path = _toy_gguf(tmp_path / "toy.q8_0.gguf", "Q8_0")
    rows = json.loads(show(LLAMA, "--checkpoint", str(path), "--format", "json").stdout)["params"]
    forms = {r["name"]: r["source_dtype"] for r in rows if r["source"]}
    assert forms["model.layers.0.self_attn.q_proj.weight"] == "Q8_0"
    assert forms["model.norm.weight"] == "F32"  # a vector stays float32, as llama.cpp writes it


def test_a_checkpoint_read_through_a_chosen_rename_target_is_placed(tmp_path):
    # Found writing a spec from the docs alone: a rename whose target is a choice ({when,
    # then, else}: granitemoehybrid's) made `show --checkpoint` fail (TypeError: unhashable
    # dict); load and check resolve it.
    import iron_spec

    spec = str(SPECS / "granitemoehybrid.yaml")
    loaded = iron_spec.load(spec, random_weights=0, toy=True).loaded
    save_file({source: np.ascontiguousarray(p.array).reshape(p.stored_shape)  # shapes alone
               for name, p in loaded.lm.named_params()  # matter to show
               for source in [loaded.report.sources.get(name)] if source is not None},
              str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(loaded.config_json))
    result = show(spec, "--checkpoint", str(tmp_path), "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    placed = data["checkpoint"]
    assert placed["fits"] and placed["placed"] == placed["tensors"] == 52, placed


def _held_by_a_load(checkpoint) -> dict[str, str]:
    """Each param's held form (``operators.held.form``) once ``iron_spec.load`` has read
    ``checkpoint`` with --weights stored: the text model's params and each tower's, by name
    (a tower's prefixed by ``{tower}:``)."""
    import iron_spec
    from iron_spec.operators import held

    loaded = iron_spec.load(checkpoint=str(checkpoint), max_seq_len=64).loaded
    out = {n: held.form(p.array) for n, p in loaded.lm.named_params()}
    for t in loaded.towers:
        out.update((f"{t.name}:{n}", held.form(p.array)) for n, p in t.tower.named_params())
    return out


def _held_by_show(checkpoint) -> tuple[dict[str, str], str]:
    data = json.loads(show("--checkpoint", str(checkpoint), "--format", "json").stdout)
    out = {p["name"]: p["held"] for p in data["params"]}
    for t in data["towers"]:
        out.update((f"{t['tower']}:{p['name']}", p["held"]) for p in t["params"])
    return out, show("--checkpoint", str(checkpoint)).stdout


def test_the_tree_shows_each_parameter_held_as_a_load_holds_it(tmp_path):
    # Found by a fresh user's trial: `show --checkpoint X` listed every parameter float32;
    # only the `stored` line said the weights are held as BF16 (or a GGUF's blocks). Each
    # param's form is judged by what a load holds it as.
    import shutil

    import ml_dtypes
    from safetensors.numpy import load_file

    q4 = _toy_gguf(tmp_path / "toy.q4_0.gguf", "Q4_0")
    # A mixture of experts stored bfloat16 (its stacks held so) beside a vision tower.
    scout = tmp_path / "scout-bf16"
    shutil.copytree(TOYS / "llama-4-scout-toy", scout)
    tensors = load_file(str(scout / "model.safetensors"))
    save_file({n: t.astype(ml_dtypes.bfloat16) for n, t in tensors.items()},
              str(scout / "model.safetensors"))
    for checkpoint in (q4, scout, TOYS / "smolvlm2-toy"):
        shown, text = _held_by_show(checkpoint)
        assert shown == _held_by_a_load(checkpoint), checkpoint
        assert set(shown.values()) > {"F32"}, shown  # some matrices are held as stored
    assert "q_proj  Linear\n          weight   [64, 64]       Q4_0     <- " \
        "model.layers.0.self_attn.q_proj.weight (Q4_0 [64, 64])" in _held_by_show(q4)[1]
    assert "input_layernorm  Norm\n        weight   [64]           F32      <- " \
        "model.layers.0.input_layernorm.weight (F32 [64])" in _held_by_show(q4)[1]
    shown, _ = _held_by_show(scout)
    assert {v for k, v in shown.items() if ".experts." in k} == {"BF16"}, shown


def test_smollm2_s_tree_shows_its_matrices_bf16_and_its_norms_float32(smollm2):
    shown, text = _held_by_show(smollm2)
    assert shown == _held_by_a_load(smollm2)
    assert "weight   [576, 576]     BF16     <- model.layers.0.self_attn.q_proj.weight " \
        "(BF16 [576, 576])" in text
    assert "weight   [576]          F32      <- model.norm.weight (BF16 [576])" in text
    assert "weight   [49152, 576]   BF16     tied: shares model.embed_tokens.weight" in text
