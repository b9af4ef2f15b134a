"""GGUF files byte by byte, for the bad-input corpus and the GGUF header fuzzer: a file as a
``Parts`` (its metadata entries with their GGUF value types, its tensor table, its data),
serialized exactly as written, so a damaged file (a key given twice, an offset into another
tensor's bytes, an alignment of 48, a big-endian version) is one edit of a valid one.

The valid base is the llama3 spec's toy, drawn at seed 0, written as llama.cpp's converter
lays it out (``tests/specs/gguf/convert.py``) with float32 matrices, and read back into parts
with gguf-py's own ``GGUFReader``.
"""

from __future__ import annotations

import copy
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np

V = gguf.GGUFValueType
SCALAR_CODES = {V.UINT8: "B", V.INT8: "b", V.UINT16: "H", V.INT16: "h", V.UINT32: "I",
                V.INT32: "i", V.FLOAT32: "f", V.BOOL: "?", V.UINT64: "Q", V.INT64: "q",
                V.FLOAT64: "d"}


@dataclass
class Entry:
    """One metadata entry: ``key``, value ``type`` (an array's ``item`` type) and ``value``."""

    key: str
    type: int
    value: Any
    item: int | None = None


@dataclass
class TensorEntry:
    """One row of the tensor table: ``name``, GGUF ``dims`` (innermost first), GGML
    ``type`` and ``offset`` into the data section."""

    name: str
    dims: list[int]
    type: int
    offset: int


@dataclass
class Parts:
    version: int = 3
    entries: list[Entry] = field(default_factory=list)
    tensors: list[TensorEntry] = field(default_factory=list)
    data: bytes = b""
    alignment: int = 32
    big_endian: bool = False
    # counts written where they differ from the lists' lengths (a header that lies)
    n_kv: int | None = None
    n_tensors: int | None = None

    def copy(self) -> "Parts":
        return copy.deepcopy(self)

    def entry(self, key: str) -> Entry:
        return next(e for e in self.entries if e.key == key)


def _string(s: str | bytes, e: str) -> bytes:
    raw = s if isinstance(s, bytes) else s.encode("utf-8")
    return struct.pack(f"{e}Q", len(raw)) + raw


def _value(kind: int, value: Any, item: int | None, e: str) -> bytes:
    if kind in SCALAR_CODES:
        return struct.pack(f"{e}{SCALAR_CODES[kind]}", value)
    if kind == V.STRING:
        return _string(value, e)
    if kind == V.ARRAY:
        out = struct.pack(f"{e}IQ", item, len(value))
        return out + b"".join(_value(item, v, None, e) for v in value)
    raise ValueError(kind)


def serialize(p: Parts) -> bytes:
    """The file's bytes: header, metadata, tensor table, padding to the alignment, data."""
    e = ">" if p.big_endian else "<"
    out = bytearray(b"GGUF" + struct.pack(f"{e}I", p.version))
    out += struct.pack(f"{e}QQ", len(p.tensors) if p.n_tensors is None else p.n_tensors,
                       len(p.entries) if p.n_kv is None else p.n_kv)
    for x in p.entries:
        out += _string(x.key, e) + struct.pack(f"{e}I", x.type) + _value(x.type, x.value, x.item, e)
    for t in p.tensors:
        out += _string(t.name, e) + struct.pack(f"{e}I", len(t.dims))
        out += b"".join(struct.pack(f"{e}Q", d) for d in t.dims)
        out += struct.pack(f"{e}IQ", t.type, t.offset)
    align = p.alignment if isinstance(p.alignment, int) and p.alignment > 0 else 32
    out += b"\0" * (-len(out) % align)
    return bytes(out) + p.data


def write(p: Parts, path: Path) -> Path:
    path.write_bytes(serialize(p))
    return path


def parse(path: Path) -> Parts:
    """A valid GGUF file as parts, read with gguf-py's ``GGUFReader``."""
    r = gguf.GGUFReader(str(path))
    p = Parts(version=int(r.fields["GGUF.version"].parts[0][0]), alignment=r.alignment)
    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            continue
        kind = f.types[0]
        if kind == V.ARRAY:
            item = f.types[1]
            values = [f.parts[i] for i in f.data]
            value = [bytes(v).decode() if item == V.STRING else v[0].item() for v in values]
            p.entries.append(Entry(key, kind, value, item))
        elif kind == V.STRING:
            p.entries.append(Entry(key, kind, bytes(f.parts[-1]).decode()))
        else:
            p.entries.append(Entry(key, kind, f.parts[-1][0].item()))
    begin = r.data_offset
    raw = np.memmap(path, np.uint8, mode="r")
    p.data = bytes(raw[begin:])
    for t in r.tensors:
        p.tensors.append(TensorEntry(t.name, [int(d) for d in t.shape], int(t.tensor_type),
                                     int(t.data_offset - begin)))
    return p


_BASE: dict[str, Any] = {}


def base(root: Path) -> tuple[Parts, Path]:
    """The valid base file (the llama3 toy as llama.cpp lays it out) as parts, and its path."""
    if "parts" not in _BASE:
        from iron_spec.spec.build import load_model
        from tests.conftest import SPECS
        from tests.specs.gguf import convert

        toy = load_model(SPECS / "llama3.yaml", random_weights=0, toy=True)
        config = dict(toy.config_json)
        config.pop("rope_scaling")  # llama3 scaling is a rope_freqs tensor: refused
        root.mkdir(parents=True, exist_ok=True)
        path = convert.write(root / "base.gguf", "llama", config,
                             {n: np.asarray(t) for n, t in toy.weights().items()})
        _BASE["parts"], _BASE["path"] = parse(path), path
    return _BASE["parts"].copy(), _BASE["path"]
