"""GGUF files read as Hugging Face checkpoints.

A toy model is written as llama.cpp's convert_hf_to_gguf.py writes one (gguf-py's writer and
quantizer, llama.cpp's tensor names, its q/k row permutation and its norm shift, restated
here from the converter): loading the file must give back the transformers-layout tensors it
was made from (dequantized by gguf-py). Damaged files are refused naming the file and the
key or tensor.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from iron_spec.spec.build import load_model
from iron_spec.spec.errors import SpecError
from iron_spec.operators import held
from iron_spec.spec.registry import for_checkpoint
from iron_spec.runtime.gguf import GGUFError, GGUFFile, unpermute
from iron_spec.runtime.quants import dequantize
from iron_spec.runtime.weights import draw_weights
from tests.conftest import SPECS

LLAMA, GEMMA3 = SPECS / "llama3.yaml", SPECS / "gemma3.yaml"
# A toy vocabulary: a token per byte value but the last, which is "ab", merged from "a b".
BYTES = [chr(c) for c in range(255)] + ["ab"]


def permute(w: np.ndarray, n_head: int, n_head_kv: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, as llama.cpp writes it."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def test_unpermute_undoes_the_converters_permutation():
    w = np.arange(8 * 4 * 3, dtype=np.float32).reshape(8 * 4, 3)
    assert np.array_equal(unpermute(permute(w, 8, 8), 8), w)
    assert np.array_equal(unpermute(permute(w, 8, 2), 2), w)
    # head 0 of 4 rows (D = 4): rows (0, 1, 2, 3) were interleaved to (0, 2, 1, 3)
    assert permute(w, 8, 8)[:4, 0].tolist() == [0, 6, 3, 9]


def tensor_names(arch, n_layers: int) -> gguf.TensorNameMap:
    return gguf.get_tensor_name_map(arch, n_layers)


def write_gguf(path: Path, arch: str, meta: dict, tensors: dict[str, np.ndarray],
               qtype=gguf.GGMLQuantizationType.Q8_0, tokens: list[str] = BYTES) -> None:
    """A GGUF as llama.cpp's converter writes one: metadata under {arch}., tensors under
    llama.cpp's names (``gguf.TensorNameMap``), matrices quantized to ``qtype``."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in meta.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_string(key, value)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    w.add_token_merges(["a b"])
    w.add_eos_token_id(0)
    for name, t in tensors.items():
        if t.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, gguf.quants.quantize(t, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def toy_llama(tmp_path_factory):
    """The llama3 spec's toy (2 layers, 4 heads, 2 kv heads, head_dim 16), drawn, written as
    a Q8_0 GGUF; returns (path, the drawn weights in transformers' layout, as stored)."""
    path = tmp_path_factory.mktemp("gguf") / "toy-llama.Q8_0.gguf"
    return (path, *toy_gguf(path))


def toy_gguf(path: Path, qtype=gguf.GGMLQuantizationType.Q8_0) -> tuple[dict, dict]:
    """``toy_llama``'s file at ``path``, its matrices stored as ``qtype``; returns the
    weights it holds as Q8_0 would (transformers' layout) and the toy's config."""
    toy = load_model(LLAMA, random_weights=0, toy=True)
    cfg = toy.config_json
    table = tensor_names(gguf.MODEL_ARCH.LLAMA, cfg["num_hidden_layers"])
    tensors, expected = {}, {}
    for name, t in toy.weights().items():
        stored = t
        if name.endswith("q_proj.weight"):
            stored = permute(t, cfg["num_attention_heads"], cfg["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            stored = permute(t, cfg["num_attention_heads"], cfg["num_key_value_heads"])
        gname = table.get_name(name, try_suffixes=(".weight", ".bias"))
        tensors[gname] = stored
        # what the file holds, read back by gguf-py's own dequantizer, in transformers' order
        held = gguf.quants.dequantize(gguf.quants.quantize(t, gguf.GGMLQuantizationType.Q8_0),
                                      gguf.GGMLQuantizationType.Q8_0) if t.ndim == 2 else t
        expected[name] = held.astype(np.float32)
    write_gguf(path, "llama", {
        "llama.block_count": cfg["num_hidden_layers"], "llama.context_length": 512,
        "llama.embedding_length": cfg["hidden_size"],
        "llama.feed_forward_length": cfg["intermediate_size"],
        "llama.attention.head_count": cfg["num_attention_heads"],
        "llama.attention.head_count_kv": cfg["num_key_value_heads"],
        "llama.rope.freq_base": 10000.0, "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.rope.dimension_count": cfg["head_dim"]}, tensors, qtype)
    return expected, cfg


def test_a_gguf_loads_as_the_checkpoint_it_was_converted_from(toy_llama):
    path, expected, cfg = toy_llama
    loaded = load_model(LLAMA, checkpoint=path, max_seq_len=64)
    got = loaded.weights()
    # The toy's head is not tied: output.weight is in the file.
    assert loaded.config_json["tie_word_embeddings"] is False
    assert set(got) == set(expected)
    for name, t in expected.items():
        # Held as the file stores it (operators.held): a matrix as its Q8_0 blocks.
        assert held.form(got[name]) == ("Q8_0" if t.ndim == 2 else "F32"), name
        assert held.widen_all(got[name]).tobytes() == t.tobytes(), name
    assert loaded.config_json["rms_norm_eps"] == 1e-5  # the float32's shortest decimal
    assert loaded.config_json["num_key_value_heads"] == cfg["num_key_value_heads"]


def test_the_raw_blocks_are_the_files_in_transformers_row_order(toy_llama):
    path, expected, _ = toy_llama
    ckpt = load_model(LLAMA, checkpoint=path, max_seq_len=64).checkpoint
    for name in ("model.layers.1.self_attn.k_proj.weight", "model.layers.0.mlp.up_proj.weight"):
        fmt, rows = ckpt.blocks(name)
        assert fmt.name == "Q8_0" and rows.dtype == np.uint8
        assert rows.shape == (expected[name].shape[0], expected[name].shape[1] // 32 * 34)
        assert dequantize(rows, fmt).reshape(rows.shape[0], -1).tobytes() == expected[name].tobytes()


def test_the_spec_is_picked_by_the_files_architecture(toy_llama):
    assert for_checkpoint(toy_llama[0]) == for_checkpoint(toy_llama[0]).parent / "llama3.yaml"


def test_a_spec_of_another_architecture_refuses_the_file(toy_llama):
    with pytest.raises(SpecError, match="reads GGUF files of gemma3; .* is llama"):
        load_model(GEMMA3, checkpoint=toy_llama[0], max_seq_len=64)


def test_the_tokenizer_comes_from_the_metadata(toy_llama):
    loaded = load_model(LLAMA, checkpoint=toy_llama[0], max_seq_len=64)
    # a token per byte, and the merge (printable ASCII is its own byte-level spelling)
    assert loaded.tokenizer.encode("cab", add_special_tokens=False) == [ord("c"), 255]
    assert loaded.tokenizer.eos_ids == {0}


def small_file(tmp_path: Path, meta: dict | None = None) -> Path:
    path = tmp_path / "small.gguf"
    base = {"llama.block_count": 1, "llama.embedding_length": 32,
            "llama.attention.head_count": 2}
    write_gguf(path, "llama", base if meta is None else meta,
               {"token_embd.weight": np.ones((256, 32), np.float32)})
    return path


def test_a_truncated_file_names_what_runs_past_its_end(tmp_path):
    path = small_file(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - 100])
    with pytest.raises(GGUFError, match=r"small.gguf: tensor token_embd.weight ends at byte \d+, "
                                        r"past the file's \d+ bytes \(truncated\)"):
        GGUFFile(path)
    path.write_bytes(data[:200])
    with pytest.raises(GGUFError, match="small.gguf: metadata key .* runs past the file's end"):
        GGUFFile(path)


def test_an_unknown_tensor_type_is_named(tmp_path):
    path = small_file(tmp_path)
    data = bytearray(path.read_bytes())
    name = b"token_embd.weight"
    at = data.index(name) + len(name) + 4 + 2 * 8  # past n_dims and two dims: the type
    data[at:at + 4] = (99).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match="tensor token_embd.weight is type 99; this reader "
                                        "dequantizes F32, F16, BF16, Q8_0"):
        GGUFFile(path)


def test_a_missing_metadata_key_is_named(tmp_path):
    path = small_file(tmp_path, {"llama.block_count": 1, "llama.attention.head_count": 2})
    with pytest.raises(GGUFError, match="small.gguf: no metadata key llama.embedding_length"):
        load_model(LLAMA, checkpoint=path, max_seq_len=64)


def test_not_gguf_at_all(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGUF" + (7).to_bytes(4, "little"))
    with pytest.raises(GGUFError, match="GGUF version 7; this reader reads versions 2, 3"):
        GGUFFile(path)


def test_converting_already_quantized_blocks_is_said_once(toy_llama, tmp_path, caplog):
    # Found by a fresh user's trial: --weights q4_0 on a Q8_0 GGUF re-quantized every matrix
    # without a word (llama.cpp's llama-quantize refuses it without --allow-requantize; a
    # conversion at load leaves the file alone, so it is done, and said, once).
    import logging

    path, expected, _ = toy_llama
    matrices = sum(t.ndim == 2 for t in expected.values())  # each stored Q8_0 (write_gguf)
    said = {}
    for weights in ("q4_0", "bfloat16", "q8_0", "float32", "stored"):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="iron_spec"):
            load_model(LLAMA, checkpoint=path, max_seq_len=64, weights=weights)
        said[weights] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    # q4_0 holds the output matrix at Q8_0 (as llama.cpp's quantizer): that one is kept.
    for weights, n, how in (("q4_0", matrices - 1, "quantized"), ("bfloat16", matrices, "rounded")):
        assert len(said[weights]) == 1, said[weights]
        assert said[weights][0].startswith(
            f"weights={weights!r} converts {n} matrices from blocks {path.name} already holds "
            f"quantized (Q8_0: {n}): each is widened and {how} again"), said[weights]
        assert "(weights='stored')" in said[weights][0]
    assert said["q8_0"] == said["float32"] == said["stored"] == []  # as stored; widening is exact
    # Float weights in the file: a first quantization, nothing to say.
    f16 = tmp_path / "toy-llama.F16.gguf"
    toy_gguf(f16, gguf.GGMLQuantizationType.F16)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="iron_spec"):
        load_model(LLAMA, checkpoint=f16, max_seq_len=64, weights="q4_0")
    assert not caplog.records, caplog.records
