"""Reading a Hugging Face checkpoint's safetensors, strictly, and binding it to a module tree.

A checkpoint is ``model.safetensors`` or a sharded ``model.safetensors.index.json`` whose
shards sit beside it. The safetensors header is parsed here (its size and every tensor's
offsets validated against the file) and tensors are read through a memory map, so bfloat16
works without torch (ml_dtypes). Nothing is unpickled, ever.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

import ml_dtypes
import numpy as np

from .module import Module, Param

DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}
MAX_HEADER = 100 * 2**20  # bytes; safetensors' own limit


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit the model; says which file or tensors."""


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int  # byte offset in the file
    end: int


def _count(x) -> bool:
    """Whether a header's shape entry or offset is what the format allows: an integer >= 0."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _header(path: Path) -> dict[str, TensorInfo]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: {size} bytes is too short for a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise CheckpointError(f"{path}: header of {n} bytes does not fit the file's {size} bytes "
                                  "(truncated or not safetensors)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header is not a JSON object")
    data = 8 + n
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (b, e) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: tensor {name!r} has a malformed header entry") from None
        if not isinstance(dtype, str) or not all(_count(x) for x in (*shape, b, e)):
            raise CheckpointError(f"{path}: tensor {name!r} has a malformed header entry (dtype "
                                  f"{dtype!r}, shape {list(shape)}, data_offsets {[b, e]})")
        if dtype not in DTYPES:
            raise CheckpointError(f"{path}: tensor {name!r} has dtype {dtype}, not one of "
                                  f"{', '.join(DTYPES)}")
        nbytes = math.prod(shape) * np.dtype(DTYPES[dtype]).itemsize  # exact: no int64 wrap
        if not (0 <= b <= e) or e - b != nbytes:
            raise CheckpointError(f"{path}: tensor {name!r} {dtype}{list(shape)} spans bytes "
                                  f"{b}..{e}, not {nbytes} bytes")
        if data + e > size:
            raise CheckpointError(f"{path}: tensor {name!r} ends at byte {data + e}, past the "
                                  f"file's {size} bytes (truncated)")
        out[name] = TensorInfo(path, dtype, shape, data + b, data + e)
    return out


class Checkpoint:
    """Every tensor of a checkpoint, by its own name, read on demand as float32.

    Args:
        path: a checkpoint directory (its ``model.safetensors.index.json``, else its
            ``model.safetensors``), a ``.safetensors`` file, or an index.

    Raises:
        FileNotFoundError: no weights file is there.
        CheckpointError: a header is malformed or truncated, a shard is not beside its
            index, or a shard holds other tensors than the index names.
    """

    def __init__(self, path: str | Path):
        path = Path(path)
        if path.is_dir():
            index = path / "model.safetensors.index.json"
            path = index if index.exists() else path / "model.safetensors"
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such weights file (a checkpoint directory holds "
                                    "model.safetensors or model.safetensors.index.json)")
        self.path = path
        self.tensors: dict[str, TensorInfo] = {}
        if path.name.endswith(".json"):
            self._sharded(path)
        else:
            self.tensors = _header(path)
        self._maps: dict[Path, np.memmap] = {}

    def _sharded(self, index: Path) -> None:
        try:
            weight_map = json.loads(index.read_bytes())["weight_map"]
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: not a safetensors index with a weight_map ({e})") from None
        if not isinstance(weight_map, dict) or not all(
                isinstance(s, str) for s in weight_map.values()):
            raise CheckpointError(f"{index}: its weight_map is not an object of tensor -> shard file")
        for shard in sorted(set(weight_map.values())):
            if Path(shard).name != shard or shard in ("", ".", ".."):
                raise CheckpointError(f"{index}: shard {shard!r} is not a file beside the index")
            file = index.parent / shard
            if not file.exists():
                raise CheckpointError(f"{index}: shard {shard} is missing")
            held = _header(file)
            named = {n for n, s in weight_map.items() if s == shard}
            if named != held.keys():
                raise CheckpointError(
                    f"{file}: holds {sorted(held.keys() - named)} the index does not name and "
                    f"lacks {sorted(named - held.keys())}")
            self.tensors.update(held)

    def raw(self, name: str) -> np.ndarray:
        """Tensor ``name`` as stored (its own dtype), a read-only view of the mapped file."""
        info = self.tensors[name]
        m = self._maps.get(info.file)
        if m is None:
            m = self._maps[info.file] = np.memmap(info.file, np.uint8, mode="r")
        return m[info.begin: info.end].view(DTYPES[info.dtype]).reshape(info.shape)

    def read(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a new float32 array."""
        return self.raw(name).astype(np.float32)

    @property
    def nbytes(self) -> int:
        return sum(t.end - t.begin for t in self.tensors.values())


def renamed(name: str, renames: Mapping[str, str]) -> str:
    """``name`` with the first rename whose key is a run of whole dotted parts of it applied
    (a rename to ``""`` drops the run)."""
    dotted = f".{name}."
    for old, new in renames.items():
        at = dotted.find(f".{old}.")
        if at >= 0:
            return (dotted[:at] + (f".{new}" if new else "") + dotted[at + 1 + len(old):]).strip(".")
    return name


@dataclass
class LoadReport:
    """Where each param came from: ``sources`` maps a param name to its checkpoint tensor;
    ``tied`` maps a tied name to the param it shares; ``ignored`` lists checkpoint tensors
    read by nothing because the model ties them."""

    sources: dict[str, str]
    tied: dict[str, str]
    ignored: list[str]


def bind(module: Module, names: Iterable[str], shapes: Mapping[str, tuple[int, ...]],
         renames: Mapping[str, str]) -> tuple[dict[str, tuple[str, Param]], LoadReport]:
    """Match checkpoint tensors (``names``, their ``shapes``) to ``module``'s params.

    Returns each param's checkpoint tensor and the report. Raises CheckpointError listing
    every missing, unexpected and mis-shaped tensor together.
    """
    params: dict[str, Param] = {}
    tied: dict[str, str] = {}
    first: dict[int, str] = {}
    for name, p in module.named_params():
        if id(p) in first:
            tied[name] = first[id(p)]
        else:
            first[id(p)] = name
            params[name] = p
    by_param: dict[str, str] = {}
    unexpected, ignored, misshaped = [], [], []
    for source in names:
        target = renamed(source, renames)
        if target in tied:
            ignored.append(source)
        elif target not in params or target in by_param:
            unexpected.append(source if target == source else f"{source} (renamed {target})")
        else:
            by_param[target] = source
            if tuple(shapes[source]) != params[target].shape:
                misshaped.append(f"{source} is {list(shapes[source])}, the model's "
                                 f"{target} is {list(params[target].shape)}")
    missing = sorted(set(params) - set(by_param))
    if missing or unexpected or misshaped:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)}: {', '.join(missing)}")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)}: {', '.join(sorted(unexpected))}")
        if misshaped:
            parts.append(f"mis-shaped {len(misshaped)}: {'; '.join(misshaped)}")
        raise CheckpointError("the checkpoint does not fit the model: " + "; ".join(parts))
    return ({n: (by_param[n], params[n]) for n in params},
            LoadReport({n: by_param[n] for n in params}, tied, sorted(ignored)))


def load(module: Module, checkpoint: Checkpoint, renames: Mapping[str, str] = {},
         progress: Callable[[int, int], None] | None = None) -> LoadReport:
    """Fill every param of ``module`` from ``checkpoint`` (float32), strictly (``bind``).

    Nothing is read unless every tensor fits; ``progress(done, total)`` follows the reads.
    """
    shapes = {n: t.shape for n, t in checkpoint.tensors.items()}
    bound, report = bind(module, checkpoint.tensors, shapes, renames)
    for i, (name, (source, p)) in enumerate(bound.items()):
        p.array = checkpoint.read(source)
        if progress is not None:
            progress(i + 1, len(bound))
    return report


def fill(module: Module, tensors: Mapping[str, np.ndarray]) -> LoadReport:
    """Fill every param of ``module`` from in-memory ``tensors``, as strictly as ``load``."""
    shapes = {n: t.shape for n, t in tensors.items()}
    bound, report = bind(module, tensors, shapes, {})
    for name, (source, p) in bound.items():
        p.array = np.ascontiguousarray(tensors[source], np.float32)
    return report
