"""runtime.checkpoint: safetensors files written by the ``safetensors`` library or by hand
from the format spec (8-byte little-endian header length, a JSON header, raw little-endian
bytes), read back; strict binding of a small module tree; renames; ties; damaged files."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from iron_spec.runtime.checkpoint import Checkpoint, CheckpointError, bind, fill, load, renamed
from iron_spec.runtime.module import Module, Param, pack


# --- a tiny module tree, named as a Hugging Face causal LM names its tensors -----------------

class Linear(Module):
    def __init__(self, n_in: int, n_out: int):
        self.weight = Param(n_out, n_in)


class Layer(Module):
    def __init__(self):
        self.q_proj = Linear(4, 6)
        self.norm = Param(4)


class Decoder(Module):
    def __init__(self):
        self.embed_tokens = Param(10, 4)
        self.layers = [Layer(), Layer()]


class LM(Module):
    def __init__(self, tied: bool = False):
        self.model = Decoder()
        self.lm_head = Linear(4, 10)
        if tied:
            self.lm_head.weight = self.model.embed_tokens


SHAPES = {  # written by hand: what LM() must be given
    "model.embed_tokens": (10, 4),
    "model.layers.0.q_proj.weight": (6, 4),
    "model.layers.0.norm": (4,),
    "model.layers.1.q_proj.weight": (6, 4),
    "model.layers.1.norm": (4,),
    "lm_head.weight": (10, 4),
}


def tensors(shapes=SHAPES, prefix: str = "") -> dict[str, np.ndarray]:
    """Distinct, exactly representable values per tensor: tensor i holds i*1000 + 0, 1, 2..."""
    return {prefix + name: (np.arange(int(np.prod(shape)), dtype=np.float32) + 1000 * i).reshape(shape)
            for i, (name, shape) in enumerate(shapes.items())}


def params(lm: Module) -> dict[str, Param]:
    return dict(lm.named_params())


def raw_file(path: Path, header: dict | bytes, data: bytes = b"") -> Path:
    """A safetensors file built from the spec: u64 LE header size, header, data."""
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + data)
    return path


# --- reading ---------------------------------------------------------------------------------

def test_float32_and_float16_written_by_safetensors_read_back(tmp_path):
    a = np.array([[1.5, -2.0, 3.25], [0.0, 1e-3, -7.0e5]], np.float32)
    h = np.array([0.5, -1.0, 65504.0, 2.0 ** -14], np.float16)  # float16's max and min normal
    s = np.array(42.0, np.float32)  # a 0-d tensor
    save_file({"a": a, "h": h, "s": s}, str(tmp_path / "model.safetensors"))

    ckpt = Checkpoint(tmp_path)
    assert ckpt.path == tmp_path / "model.safetensors"
    assert {n: (t.dtype, t.shape) for n, t in ckpt.tensors.items()} == {
        "a": ("F32", (2, 3)), "h": ("F16", (4,)), "s": ("F32", ())}
    got = ckpt.read("a")
    assert got.dtype == np.float32 and got.shape == (2, 3)
    assert got.tolist() == [[1.5, -2.0, 3.25], [0.0, np.float32(1e-3), np.float32(-7.0e5)]]
    got = ckpt.read("h")
    assert got.dtype == np.float32
    assert got.tolist() == [0.5, -1.0, 65504.0, 2.0 ** -14]
    assert ckpt.read("s").shape == () and float(ckpt.read("s")) == 42.0
    assert ckpt.nbytes == 6 * 4 + 4 * 2 + 4
    # a .safetensors file can be named directly as well
    assert Checkpoint(tmp_path / "model.safetensors").read("h").tolist() == got.tolist()


def test_read_returns_a_copy_not_a_view_of_the_file(tmp_path):
    save_file({"a": np.ones(3, np.float32)}, str(tmp_path / "model.safetensors"))
    ckpt = Checkpoint(tmp_path)
    x = ckpt.read("a")
    x[:] = 5.0  # writable, and the file is untouched
    assert ckpt.read("a").tolist() == [1.0, 1.0, 1.0]


def test_bfloat16_from_a_hand_built_header(tmp_path):
    values = [1.0, -2.5, 0.15625, 3.0, -0.0, 65536.0]  # all exact in bfloat16
    # bfloat16 is float32's upper 16 bits; written little-endian, with no help from ml_dtypes ...
    bits = (np.array(values, np.float32).view(np.uint32) >> 16).astype("<u2")
    assert bits[:2].tolist() == [0x3F80, 0xC020]  # 1.0 and -2.5, from the IEEE layout
    data = bits.tobytes()
    # ... and ml_dtypes agrees byte for byte
    assert np.array(values, dtype=ml_dtypes.bfloat16).tobytes() == data
    pad = np.arange(3, dtype="<f4").tobytes()
    header = {"__metadata__": {"format": "pt"},
              "pad": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},
              "w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [12, 24]}}
    head = json.dumps(header).encode() + b"   "  # spaces after the JSON are allowed padding
    raw_file(tmp_path / "model.safetensors", head, pad + data)

    ckpt = Checkpoint(tmp_path)
    assert set(ckpt.tensors) == {"pad", "w"}  # __metadata__ is not a tensor
    info = ckpt.tensors["w"]
    assert (info.dtype, info.shape) == ("BF16", (2, 3))
    assert (info.begin, info.end) == (8 + len(head) + 12, 8 + len(head) + 24)
    w = ckpt.read("w")
    assert w.dtype == np.float32
    assert w.tolist() == [[1.0, -2.5, 0.15625], [3.0, -0.0, 65536.0]]
    assert np.signbit(w[1, 1])  # -0.0 kept
    assert ckpt.read("pad").tolist() == [0.0, 1.0, 2.0]


# --- damaged files ---------------------------------------------------------------------------

def test_truncated_data_is_a_checkpoint_error_naming_the_file(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"a": np.zeros((4, 4), np.float32)}, str(path))
    whole = path.read_bytes()
    path.write_bytes(whole[:-5])  # the last tensor loses 5 bytes
    with pytest.raises(CheckpointError) as info:
        Checkpoint(tmp_path)
    assert str(path) in str(info.value) and "'a'" in str(info.value)
    assert "truncated" in str(info.value)


@pytest.mark.parametrize("keep", [0, 3, 8, 20])
def test_cut_inside_the_header_is_a_checkpoint_error(tmp_path, keep):
    path = tmp_path / "model.safetensors"
    save_file({"a": np.zeros(4, np.float32)}, str(path))
    path.write_bytes(path.read_bytes()[:keep])
    with pytest.raises(CheckpointError, match=re.escape(str(path))):
        Checkpoint(path)


@pytest.mark.parametrize("n", [1000, 2**63 + 5, 100 * 2**20 + 1])
def test_header_length_past_the_file_is_refused(tmp_path, n):
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", n) + b"{}" + b"\0" * 16)
    with pytest.raises(CheckpointError, match="does not fit"):
        Checkpoint(path)


@pytest.mark.parametrize("head", [b"not json at all", b"\xff\xfe\xfd\xfc", b'{"a": 1', b"[1, 2]", b"42"])
def test_a_header_that_is_not_a_json_object_is_refused(tmp_path, head):
    path = raw_file(tmp_path / "x.safetensors", head, b"\0" * 8)
    with pytest.raises(CheckpointError, match="not (JSON|a JSON object)") as info:
        Checkpoint(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("entry", [
    {"dtype": "F32", "shape": [2]},                                       # no offsets
    {"dtype": "F32", "shape": [2], "data_offsets": [0]},                  # one offset
    {"dtype": "F32", "shape": 2, "data_offsets": [0, 8]},                 # shape not a list
    {"dtype": "F99", "shape": [2], "data_offsets": [0, 8]},               # unknown dtype
    {"dtype": ["F32"], "shape": [2], "data_offsets": [0, 8]},             # dtype not text
    {"dtype": "F32", "shape": [-1, -2], "data_offsets": [0, 8]},          # negative dims
    {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]},             # float dim
    {"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]},             # text dim
    {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]},
    {"dtype": "F32", "shape": [True, 2], "data_offsets": [0, 8]},         # bool dim
    {"dtype": "F32", "shape": [2], "data_offsets": ["0", 8]},             # text offset
    {"dtype": "F32", "shape": [2], "data_offsets": [0.0, 8.0]},           # float offsets
    {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]},               # 4 bytes for 8
    {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]},               # backwards
    {"dtype": "F32", "shape": [2**62, 4], "data_offsets": [0, 0]},        # 2**66 bytes, not 0
    {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},              # past the end
    None,
])
def test_a_malformed_tensor_entry_is_a_checkpoint_error_naming_it(tmp_path, entry):
    path = raw_file(tmp_path / "x.safetensors", {"the_tensor": entry}, b"\0" * 8)
    with pytest.raises(CheckpointError) as info:
        Checkpoint(path)
    assert "the_tensor" in str(info.value) and str(path) in str(info.value)


def test_a_directory_without_weights_is_file_not_found(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError):
        Checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError):
        Checkpoint(tmp_path / "absent.safetensors")


# --- sharded checkpoints ---------------------------------------------------------------------

def write_sharded(directory: Path, arrays: dict[str, np.ndarray], split: int,
                  names=("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    items = list(arrays.items())
    first, second = dict(items[:split]), dict(items[split:])
    save_file(first, str(directory / names[0]))
    save_file(second, str(directory / names[1]))
    weight_map = {n: names[0] for n in first} | {n: names[1] for n in second}
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return index


def test_a_sharded_checkpoint_loads_across_its_shards(tmp_path):
    arrays = tensors()
    write_sharded(tmp_path, arrays, split=3)
    (tmp_path / "model.safetensors").write_bytes(b"junk")  # the index wins over it
    ckpt = Checkpoint(tmp_path)
    assert ckpt.path.name == "model.safetensors.index.json"
    assert set(ckpt.tensors) == set(SHAPES)
    assert {ckpt.tensors[n].file.name for n in SHAPES} == {
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    lm = LM().name_tree()
    report = load(lm, ckpt)
    for i, name in enumerate(SHAPES):
        p = params(lm)[name]
        assert p.array.dtype == np.float32 and p.array.shape == SHAPES[name]
        assert p.array.flat[0] == 1000 * i and p.array.flat[-1] == 1000 * i + p.array.size - 1
    assert report.sources == {n: n for n in SHAPES}


@pytest.mark.parametrize("bad", ["sub/shard.safetensors", "../shard.safetensors", "..", ".", "",
                                 "/abs/shard.safetensors"])
def test_a_shard_outside_the_index_directory_is_refused(tmp_path, bad):
    ckpt = tmp_path / "ckpt"
    (ckpt / "sub").mkdir(parents=True)
    a = {"a": np.ones(2, np.float32)}
    save_file(a, str(ckpt / "sub" / "shard.safetensors"))  # the files exist: only the name is wrong
    save_file(a, str(tmp_path / "shard.safetensors"))
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": bad}}))
    with pytest.raises(CheckpointError, match="not a file beside the index"):
        Checkpoint(ckpt)


def test_a_shard_holding_a_tensor_the_index_does_not_name_is_refused(tmp_path):
    arrays = tensors()
    index = write_sharded(tmp_path, arrays, split=3)
    del index["weight_map"]["model.layers.1.norm"]  # held by shard 2, no longer named
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="model.layers.1.norm") as info:
        Checkpoint(tmp_path)
    assert "model-00002-of-00002.safetensors" in str(info.value)


def test_a_shard_lacking_a_tensor_the_index_names_is_refused(tmp_path):
    index = write_sharded(tmp_path, tensors(), split=3)
    index["weight_map"]["model.ghost"] = "model-00001-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="model.ghost"):
        Checkpoint(tmp_path)


def test_a_missing_shard_is_refused(tmp_path):
    write_sharded(tmp_path, tensors(), split=3)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors is missing"):
        Checkpoint(tmp_path)


@pytest.mark.parametrize("text", ["not json", "[]", '{"metadata": {}}', '{"weight_map": ["a"]}',
                                  '{"weight_map": {"a": 5}}', b"\xff\xfe{"])
def test_a_malformed_index_is_a_checkpoint_error(tmp_path, text):
    index = tmp_path / "model.safetensors.index.json"
    index.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(CheckpointError, match="model.safetensors.index.json"):
        Checkpoint(tmp_path)


# --- binding to a module tree ----------------------------------------------------------------

def test_name_tree_names_params_as_the_checkpoint_does():
    assert {n: p.shape for n, p in LM().name_tree().named_params()} == SHAPES


def test_strict_load_fills_every_param(tmp_path):
    save_file(tensors(), str(tmp_path / "model.safetensors"))
    lm = LM().name_tree()
    seen = []
    report = load(lm, Checkpoint(tmp_path), progress=lambda done, total: seen.append((done, total)))
    assert seen == [(i, 6) for i in range(1, 7)]
    norm = params(lm)["model.layers.1.norm"].array
    assert norm.tolist() == [4000.0, 4001.0, 4002.0, 4003.0]  # the 5th tensor, by hand
    assert report.tied == {} and report.ignored == []


def test_a_large_tensor_is_read_in_slices_to_the_same_values(tmp_path, monkeypatch):
    # Slices of 24 bytes: embed_tokens (10 rows of 16 bytes) in slices of one row, each
    # slice's file pages released as it is copied; the values are the file's, by hand.
    import iron_spec.runtime.checkpoint as checkpoint
    monkeypatch.setattr(checkpoint, "SLICE_BYTES", 24)
    save_file(tensors(), str(tmp_path / "model.safetensors"))
    released = []
    original = Checkpoint.release
    monkeypatch.setattr(Checkpoint, "release", lambda self, name, upto=None: (
        released.append((name, upto)), original(self, name, upto))[1])
    lm = LM().name_tree()
    load(lm, Checkpoint(tmp_path))
    assert params(lm)["model.embed_tokens"].array[9].tolist() == [36.0, 37.0, 38.0, 39.0]
    assert params(lm)["lm_head.weight"].array[0].tolist() == [5000.0, 5001.0, 5002.0, 5003.0]
    assert [u for n, u in released if n == "model.embed_tokens"] == [16 * i for i in range(1, 11)] + [None]


def test_every_misfit_is_named_in_one_error_and_nothing_is_filled(tmp_path):
    arrays = tensors()
    del arrays["model.layers.1.norm"]                                # missing
    arrays["model.layers.0.q_proj.weight"] = np.zeros((4, 6), np.float32)  # transposed: wrong shape
    arrays["model.layers.0.k_proj.weight"] = np.zeros((6, 4), np.float32)  # unexpected
    arrays["model.rotary.inv_freq"] = np.zeros(2, np.float32)               # unexpected
    save_file(arrays, str(tmp_path / "model.safetensors"))
    lm = LM().name_tree()
    reads = []
    ckpt = Checkpoint(tmp_path)
    ckpt.read = lambda name: reads.append(name)  # any read would be recorded
    with pytest.raises(CheckpointError) as info:
        load(lm, ckpt)
    message = str(info.value)
    for name in ["model.layers.1.norm", "model.layers.0.q_proj.weight",
                 "model.layers.0.k_proj.weight", "model.rotary.inv_freq"]:
        assert name in message, name
    assert "[4, 6]" in message and "[6, 4]" in message  # both shapes told
    assert reads == []
    assert all(p.array is None for p in params(lm).values())


def test_fill_is_as_strict_as_load():
    lm = LM().name_tree()
    arrays = tensors()
    arrays["lm_head.weight"] = np.zeros((10, 5), np.float32)
    del arrays["model.embed_tokens"]
    with pytest.raises(CheckpointError) as info:
        fill(lm, arrays)
    assert "lm_head.weight" in str(info.value) and "model.embed_tokens" in str(info.value)
    assert all(p.array is None for p in params(lm).values())
    fill(lm, tensors())
    assert params(lm)["lm_head.weight"].array[0, 1] == 5001.0  # 6th tensor, 2nd value


def test_renames_move_whole_dotted_runs():
    r = {"language_model.model": "model"}
    assert renamed("language_model.model.layers.0.norm", r) == "model.layers.0.norm"
    assert renamed("xlanguage_model.model.layers.0.norm", r) == "xlanguage_model.model.layers.0.norm"
    assert renamed("language_model.modelx.layers.0.norm", r) == "language_model.modelx.layers.0.norm"
    assert renamed("a.language_model.model.b", r) == "a.model.b"
    assert renamed("language_model.model", r) == "model"
    assert renamed("lm_head.weight", r) == "lm_head.weight"
    # a rename to "" drops the run, wherever it is
    assert renamed("transformer.h.0.w", {"transformer": ""}) == "h.0.w"
    assert renamed("a.transformer.h", {"transformer": ""}) == "a.h"
    # every matching rename applies, in order, each to the name the previous one gave
    assert renamed("a.b.c", {"b": "x", "a": "y"}) == "y.x.c"
    assert renamed("a.b.c", {"b": "a", "a": "y"}) == "y.a.c"  # the leftmost run only


def test_load_applies_renames(tmp_path):
    arrays = tensors(prefix="")
    arrays = {("language_model." + n if n.startswith("model.") else n): a for n, a in arrays.items()}
    save_file(arrays, str(tmp_path / "model.safetensors"))
    lm = LM().name_tree()
    report = load(lm, Checkpoint(tmp_path), {"language_model.model": "model"})
    assert report.sources["model.layers.0.norm"] == "language_model.model.layers.0.norm"
    assert report.sources["lm_head.weight"] == "lm_head.weight"
    assert params(lm)["model.layers.0.norm"].array.tolist() == [2000.0, 2001.0, 2002.0, 2003.0]


def test_a_rename_does_not_match_part_of_a_name(tmp_path):
    arrays = {("language_model." + n if n.startswith("model.") else n): a
              for n, a in tensors().items()}
    arrays["xlanguage_model.model.layers.0.norm"] = np.zeros(4, np.float32)
    save_file(arrays, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError) as info:
        load(LM().name_tree(), Checkpoint(tmp_path), {"language_model.model": "model"})
    assert "unexpected 1: xlanguage_model.model.layers.0.norm" in str(info.value)
    assert "missing" not in str(info.value)


def test_two_tensors_renamed_onto_one_param_are_refused():
    names = list(SHAPES) + ["old.layers.0.norm"]
    shapes = dict(SHAPES, **{"old.layers.0.norm": (4,)})
    with pytest.raises(CheckpointError, match=r"unexpected 1: old.layers.0.norm \(renamed model.layers.0.norm\)"):
        bind(LM().name_tree(), shapes, {"old": "model"})


def test_tied_params_accept_the_tied_tensor_and_report_it(tmp_path):
    lm = LM(tied=True).name_tree()
    named = list(lm.named_params())
    assert [n for n, _ in named].count("lm_head.weight") == 1 and len(named) == 6
    save_file(tensors(), str(tmp_path / "model.safetensors"))  # holds lm_head.weight as well
    report = load(lm, Checkpoint(tmp_path))
    assert report.tied == {"lm_head.weight": "model.embed_tokens"}
    assert report.ignored == ["lm_head.weight"]
    assert "lm_head.weight" not in report.sources
    assert lm.lm_head.weight is lm.model.embed_tokens
    assert lm.lm_head.weight.array[0].tolist() == [0.0, 1.0, 2.0, 3.0]  # embed's values, not the head's


def test_tied_params_need_no_tied_tensor(tmp_path):
    arrays = tensors()
    del arrays["lm_head.weight"]
    save_file(arrays, str(tmp_path / "model.safetensors"))
    report = load(LM(tied=True).name_tree(), Checkpoint(tmp_path))
    assert report.ignored == [] and report.tied == {"lm_head.weight": "model.embed_tokens"}


def test_untied_model_still_needs_its_head(tmp_path):
    arrays = tensors()
    del arrays["lm_head.weight"]
    save_file(arrays, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="missing 1: lm_head.weight"):
        load(LM().name_tree(), Checkpoint(tmp_path))


# --- stacked projections -----------------------------------------------------------------------

def test_params_packed_before_loading_are_read_into_one_array(tmp_path):
    # The embedding and head have one width (4): stacked, each is a view of its rows, and
    # the checkpoint's values land there, cast from bfloat16, with no array of their own.
    arrays = tensors()
    save_file({n: a.astype(ml_dtypes.bfloat16) for n, a in arrays.items()},
              str(tmp_path / "model.safetensors"))
    lm = LM().name_tree()
    embed, head = lm.model.embed_tokens, lm.lm_head.weight
    pack(embed, head)
    base = embed.array.base
    assert base is head.array.base and base.shape == (20, 4) and base.flags.c_contiguous
    load(lm, Checkpoint(tmp_path))
    assert embed.array.base is base and head.array.base is base
    # tensor i holds i * 1000 + 0, 1, ...; bfloat16 keeps 8 bits, so compare with its cast
    expect = np.concatenate([arrays["model.embed_tokens"], arrays["lm_head.weight"]])
    np.testing.assert_array_equal(base, expect.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_packing_loaded_params_copies_them_in():
    a, b = Param(2, 3), Param(1, 3)
    a.fill(np.arange(6.0).reshape(2, 3))
    b.fill(np.array([[7.0, 8.0, 9.0]]))
    pack(a, b)
    assert a.array.base is b.array.base
    assert a.array.base.tolist() == [[0, 1, 2], [3, 4, 5], [7, 8, 9]]


def test_packing_matrices_of_different_widths_is_refused():
    with pytest.raises(ValueError, match="one width"):
        pack(Param(2, 3), Param(2, 4))


def test_a_long_list_of_misfits_names_eight_of_each_kind_and_counts_the_rest():
    class Wide(Module):
        def __init__(self):
            for i in range(20):
                setattr(self, f"p{i:02d}", Param(3))

    model = Wide().name_tree()
    tensors = {f"p{i:02d}": np.zeros(4, np.float32) for i in range(20)}  # all mis-shaped
    with pytest.raises(CheckpointError) as e:
        fill(model, tensors)
    text = str(e.value)
    assert text.count("the spec expects") == 8 and "... 12 more" in text
    assert "checkpoint tensor p00 is [4]; the spec expects p00 to be [3]" in text and \
        "p08" not in text
    assert "iron-spec show SPEC --checkpoint DIR` lists every tensor" in text
