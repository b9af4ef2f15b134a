"""Bad model.safetensors refused at load, naming the file and the tensor (issue 13): every
header the ``safetensors`` library refuses (overlapping or shifted offsets, a tensor listed
twice, bytes after the data, unknown dtypes), integer tensors where weights belong, files
that are not regular files, and finite float64 weights past float32's range."""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from iron_spec.spec.build import load_model
from iron_spec.runtime.checkpoint import Checkpoint, CheckpointError
from tests.bad.corpus import LLAMA

EMBED = "model.embed_tokens.weight"
NORM = "model.norm.weight"


def split(path):
    """The header (its pairs in file order, as a list) and the data of a safetensors file."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return list(json.loads(raw[8:8 + n]).items()), raw[8 + n:]


def join(path, pairs, data: bytes) -> None:
    head = ("{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in pairs) + "}").encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + data)


def entry(pairs, name):
    return next(v for k, v in pairs if k == name)


def by_offset(pairs):
    return sorted((p for p in pairs if p[0] != "__metadata__"),
                  key=lambda p: p[1]["data_offsets"][0])


def shift_into_previous(pairs, data):
    first, second = by_offset(pairs)[:2]
    b, e = second[1]["data_offsets"]
    second[1]["data_offsets"] = [b - 4, e - 4]
    return pairs, data, second[0]


def overlap(pairs, data):
    first, second = by_offset(pairs)[:2]
    second[1]["data_offsets"] = list(first[1]["data_offsets"])
    return pairs, data, second[0]


def listed_twice(pairs, data):
    name, value = by_offset(pairs)[0]
    return pairs + [(name, dict(value))], data, name


def trailing(pairs, data):
    return pairs, data + b"\0" * 8, "after the last tensor"


def gap(pairs, data):
    last = by_offset(pairs)[-1]
    b, e = last[1]["data_offsets"]
    last[1]["data_offsets"] = [b + 4, e + 4]
    return pairs, data + b"\0" * 4, last[0]


def truncated(pairs, data):
    return pairs, data[:-4], "past the file"


def dtype_unknown(pairs, data):
    entry(pairs, NORM)["dtype"] = "F33"
    return pairs, data, NORM


def dtype_text_lower(pairs, data):
    entry(pairs, NORM)["dtype"] = "f32"
    return pairs, data, NORM


def shape_negative(pairs, data):
    entry(pairs, NORM)["shape"] = [-64]
    return pairs, data, NORM


def shape_wrong_size(pairs, data):
    entry(pairs, NORM)["shape"] = [63]
    return pairs, data, NORM


def shape_text(pairs, data):
    entry(pairs, NORM)["shape"] = ["64"]
    return pairs, data, NORM


def offsets_reversed(pairs, data):
    e = entry(pairs, NORM)
    e["data_offsets"] = e["data_offsets"][::-1]
    return pairs, data, NORM


def offsets_float(pairs, data):
    e = entry(pairs, NORM)
    e["data_offsets"] = [float(x) for x in e["data_offsets"]]
    return pairs, data, NORM


def offsets_missing(pairs, data):
    del entry(pairs, NORM)["data_offsets"]
    return pairs, data, NORM


def entry_not_object(pairs, data):
    pairs = [(k, 5 if k == NORM else v) for k, v in pairs]
    return pairs, data, NORM


def metadata_not_text(pairs, data):
    return [("__metadata__", {"format": 1})] + pairs, data, "safetensors library refuses"


def offsets_huge(pairs, data):
    entry(pairs, NORM)["data_offsets"] = [0, 10**30]
    return pairs, data, NORM


HEADERS = [shift_into_previous, overlap, listed_twice, trailing, gap, truncated, dtype_unknown,
           dtype_text_lower, shape_negative, shape_wrong_size, shape_text, offsets_reversed,
           offsets_float, offsets_missing, entry_not_object, metadata_not_text, offsets_huge]


@pytest.mark.parametrize("mutate", HEADERS, ids=lambda f: f.__name__)
def test_a_header_the_library_refuses_is_refused_naming_file_and_tensor(toy_dir, mutate):
    path = toy_dir / "model.safetensors"
    pairs, data = split(path)
    pairs, data, names = mutate(pairs, data)
    join(path, pairs, data)
    with pytest.raises(Exception):  # the safetensors library's own verdict: refused too
        with safe_open(str(path), framework="numpy") as f:
            [f.get_slice(k) for k in f.keys()]
        if mutate is listed_twice:  # it keeps the last of a name given twice, silently
            raise ValueError
    with pytest.raises(CheckpointError) as e:
        load_model(LLAMA, checkpoint=toy_dir)
    assert str(e.value).startswith(f"{path}: ") and names in str(e.value), e.value


RAW = [
    ("empty", b"", "too short"),
    ("seven_bytes", b"\0" * 7, "too short"),
    ("header_past_file", struct.pack("<Q", 10**6) + b"{}", "does not fit"),
    ("header_not_json", struct.pack("<Q", 4) + b"{{{{", "not JSON"),
    ("header_not_utf8", struct.pack("<Q", 4) + b'"\xff"}', "not JSON"),
    ("header_a_list", struct.pack("<Q", 2) + b"[]", "not a JSON object"),
    ("header_deep", struct.pack("<Q", 200_000) + b"[" * 100_000 + b"]" * 100_000, "nested"),
]


@pytest.mark.parametrize("case, raw, says", RAW, ids=[r[0] for r in RAW])
def test_a_file_that_is_no_safetensors_is_refused_naming_it(toy_dir, case, raw, says):
    path = toy_dir / "model.safetensors"
    path.write_bytes(raw)
    with pytest.raises(CheckpointError) as e:
        load_model(LLAMA, checkpoint=toy_dir)
    assert str(e.value).startswith(f"{path}: ") and says in str(e.value), e.value


def _tensors(path):
    with safe_open(str(path), framework="numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int8, np.uint8, np.bool_])
def test_an_integer_tensor_where_a_weight_belongs_is_refused_naming_it(toy_dir, dtype):
    path = toy_dir / "model.safetensors"
    tensors = _tensors(path)
    tensors[NORM] = np.ones_like(tensors[NORM]).astype(dtype)
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError) as e:
        load_model(LLAMA, checkpoint=toy_dir)
    stored = {np.int64: "I64", np.int32: "I32", np.int8: "I8", np.uint8: "U8", np.bool_: "BOOL"}
    assert f"{NORM} ({stored[dtype]})" in str(e.value) and str(path) in str(e.value), e.value


def test_a_finite_float64_weight_past_float32_is_called_what_it_is(toy_dir):
    path = toy_dir / "model.safetensors"
    tensors = _tensors(path)
    norm = tensors[NORM].astype(np.float64)
    norm[3] = 1e300
    tensors[NORM] = norm
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError) as e:
        load_model(LLAMA, checkpoint=toy_dir)
    said = str(e.value)
    assert f"tensor {NORM} (F64) holds 1 finite value past float32's range" in said, said
    assert "largest magnitude 1e+300" in said and "NaN" not in said, said


def test_a_nan_weight_is_still_called_damaged(toy_dir):
    path = toy_dir / "model.safetensors"
    tensors = _tensors(path)
    tensors[NORM][5] = np.nan
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError, match=f"tensor {NORM} holds 1 NaN or infinite values"):
        load_model(LLAMA, checkpoint=toy_dir)


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_weights_file_that_is_no_regular_file_is_refused_at_once(toy_dir, kind):
    path = toy_dir / "model.safetensors"
    path.unlink()
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    with pytest.raises(CheckpointError) as e:
        Checkpoint(toy_dir)
    what = "a FIFO (named pipe)" if kind == "fifo" else "a directory"
    assert str(e.value) == f"{path}: is {what}, not a regular safetensors file"


def test_a_shard_that_is_a_fifo_is_refused_at_once(toy_dir):
    path = toy_dir / "model.safetensors"
    (toy_dir / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: "model-00001.safetensors" for k in _tensors(path)}}))
    os.mkfifo(toy_dir / "model-00001.safetensors")
    with pytest.raises(CheckpointError, match="model-00001.safetensors: is a FIFO"):
        Checkpoint(toy_dir)


def test_an_index_that_is_a_fifo_is_refused_at_once(toy_dir):
    os.mkfifo(toy_dir / "model.safetensors.index.json")
    with pytest.raises(CheckpointError, match="index.json: is a FIFO"):
        Checkpoint(toy_dir)
