"""Reading a Hugging Face checkpoint's safetensors, strictly, and binding it to a module tree.

A checkpoint is ``model.safetensors`` or a sharded ``model.safetensors.index.json`` whose
shards sit beside it. The safetensors header is parsed here (its size and every tensor's
offsets validated against the file) and tensors are read through a memory map, so bfloat16
works without torch (ml_dtypes). Nothing is unpickled, ever.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

import ml_dtypes
import numpy as np
from safetensors import SafetensorError, safe_open

from . import holding
from .files import FileError, open_regular
from .module import Module, Param
from .renames import matching, renamed

DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}
MAX_HEADER = 100 * 2**20  # bytes; safetensors' own limit
FLOATS = ("F64", "F32", "F16", "BF16")  # what a weight may be stored as


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


def _unique(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object's pairs as a dict, refusing a name given twice (json keeps the last)."""
    out = {}
    for k, v in pairs:
        if k in out:
            raise CheckpointError(f"tensor {k!r} is listed twice")
        out[k] = v
    return out


def _header(path: Path) -> dict[str, TensorInfo]:
    """The tensors of the safetensors file ``path``, its header validated as the
    ``safetensors`` library validates it (names unique, dtypes known, every tensor's bytes
    its shape's, offsets contiguous from 0 without overlap or gap, the data exactly covering
    the rest of the file), by our checks (which name the tensor) and then by the library's
    own ``safe_open``.

    Raises:
        CheckpointError: the file is not a regular file or its header is refused, naming
            the file and the tensor.
    """
    try:
        f = open_regular(path, "safetensors file")
    except FileError as e:
        raise CheckpointError(str(e)) from None
    with f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: {size} bytes is too short for a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise CheckpointError(f"{path}: header of {n} bytes does not fit the file's {size} bytes "
                                  "(truncated or not safetensors)")
        try:
            header = json.loads(f.read(n), object_pairs_hook=_unique)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: header is not JSON ({e})") from None
        except RecursionError:
            raise CheckpointError(f"{path}: header is JSON nested too deeply") from None
        except CheckpointError as e:
            raise CheckpointError(f"{path}: {e}") from None
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
    end = 0
    for name, info in sorted(out.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
        b, e = info.begin - data, info.end - data
        if b != end:
            raise CheckpointError(
                f"{path}: tensor {name!r} spans bytes {b}..{e} of the data, but the tensor "
                f"before it ends at {end}: " + ("they overlap" if b < end else "a gap between")
                + " (safetensors lays tensors end to end)")
        end = e
    if data + end != size:
        raise CheckpointError(f"{path}: the tensors' data ends at byte {data + end}, the file "
                              f"at {size}: {size - data - end} bytes after the last tensor "
                              "(safetensors refuses a file its tensors do not exactly cover)")
    try:
        with safe_open(str(path), framework="numpy"):
            pass
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: the safetensors library refuses it: {e}") from None
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
        if not path.exists() and not path.is_symlink():
            shards = sorted(p.name for p in path.parent.glob("*.safetensors"))[:4] \
                if path.name == "model.safetensors" else []
            raise FileNotFoundError(
                f"{path}: no such weights file (a checkpoint directory holds "
                "model.safetensors or model.safetensors.index.json)" + (
                    f"; {path.parent} holds {', '.join(shards)}"
                    f"{', ...' if len(shards) == 4 else ''} but no "
                    "model.safetensors.index.json, the index naming each shard's tensors"
                    if shards else ""))
        self.path = path
        self.tensors: dict[str, TensorInfo] = {}
        if path.name.endswith(".json"):
            self._sharded(path)
        else:
            self.tensors = _header(path)
        self._maps: dict[Path, mmap.mmap] = {}

    mapped = True  # raw() gives views of the file's pages (_fill reads large ones in slices)

    def _sharded(self, index: Path) -> None:
        try:
            with open_regular(index, "safetensors index") as f:
                weight_map = json.loads(f.read(MAX_HEADER))["weight_map"]
        except FileError as e:
            raise CheckpointError(str(e)) from None
        except RecursionError:
            raise CheckpointError(f"{index}: JSON nested too deeply") from None
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: not a safetensors index with a weight_map ({e})") from None
        if not isinstance(weight_map, dict) or not all(
                isinstance(s, str) for s in weight_map.values()):
            raise CheckpointError(f"{index}: its weight_map is not an object of tensor -> shard file")
        for shard in sorted(set(weight_map.values())):
            shown = shard if len(shard) <= 80 else f"{shard[:60]}... ({len(shard)} characters)"
            if Path(shard).name != shard or shard in ("", ".", ".."):
                raise CheckpointError(f"{index}: shard {shown!r} is not a file beside the index")
            file = index.parent / shard
            named = sorted(n for n, s in weight_map.items() if s == shard)
            try:
                there = file.exists() or file.is_symlink()
            except OSError as e:  # a name past the file system's (ENAMETOOLONG)
                raise CheckpointError(f"{index}: shard {shown!r} cannot be a file name here "
                                      f"({e.strerror})") from None
            if not there:
                raise CheckpointError(
                    f"{index}: shard {shown} is missing: no {file}, which the index says holds "
                    f"{len(named)} tensor{'s' * (len(named) != 1)} ({', '.join(named[:3])}"
                    f"{', ...' if len(named) > 3 else ''}); every shard the index names sits "
                    "beside it")
            held = _header(file)
            named = set(named)
            if named != held.keys():
                raise CheckpointError(
                    f"{file}: holds {sorted(held.keys() - named)} the index does not name and "
                    f"lacks {sorted(named - held.keys())}")
            self.tensors.update(held)

    def close(self) -> None:
        """Unmap the files (a later ``raw`` or ``read`` maps them again); a view ``raw``
        returned keeps its file mapped until it is dropped."""
        self._maps.clear()

    def stored(self, name: str) -> np.ndarray | None:
        """Tensor ``name`` as a held form (``runtime.holding.STORED``: bfloat16, float16), a
        read-only view of the mapped file; None where it is stored otherwise."""
        if self.stored_form(name) is None:
            return None
        return self.raw(name)

    def stored_form(self, name: str) -> str | None:
        """The held form ``stored(name)`` gives (``BF16``, ``F16``), from the header alone;
        None where it gives None."""
        t = self.tensors[name]
        return holding.STORED[t.dtype] if t.dtype in holding.STORED and len(t.shape) == 2 \
            else None

    def raw(self, name: str) -> np.ndarray:
        """Tensor ``name`` as stored (its own dtype), a read-only view of the mapped file."""
        info = self.tensors[name]
        m = self._maps.get(info.file)
        if m is None:
            with open(info.file, "rb") as f:
                m = self._maps[info.file] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        dtype = np.dtype(DTYPES[info.dtype])
        return np.frombuffer(m, dtype, (info.end - info.begin) // dtype.itemsize,
                             info.begin).reshape(info.shape)

    def read(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a new float32 array, its file pages released (``release``)."""
        array = self.raw(name).astype(np.float32)
        self.release(name)
        return array

    def release(self, name: str, upto: int | None = None) -> None:
        """Drop tensor ``name``'s file pages from this process's resident memory (they stay
        in the page cache), once read: loading never holds the file and the weights in
        memory together. A later ``raw`` reads them again. ``upto``: only the pages of its
        first ``upto`` bytes (a tensor read in slices)."""
        info = self.tensors[name]
        m = self._maps.get(info.file)
        advice = getattr(mmap, "MADV_DONTNEED", None)
        if m is None or advice is None:  # not mapped (nothing resident), or not Unix
            return
        last = info.end if upto is None else min(info.end, info.begin + upto)
        begin = -(-info.begin // mmap.PAGESIZE) * mmap.PAGESIZE  # whole pages of this tensor
        end = last // mmap.PAGESIZE * mmap.PAGESIZE
        if end > begin:
            m.madvise(advice, begin, end - begin)

    @property
    def nbytes(self) -> int:
        return sum(t.end - t.begin for t in self.tensors.values())


@dataclass
class LoadReport:
    """Where each param came from: ``sources`` maps a param name to its checkpoint tensor;
    ``tied`` maps a tied name to the param it shares; ``ignored`` lists checkpoint tensors
    read by nothing: a tied name's, or one the spec declares unused."""

    sources: dict[str, str]
    tied: dict[str, str]
    ignored: list[str]


@dataclass
class Placement:
    """Where a checkpoint's tensors go on a module's params, found without raising.

    ``sources`` maps a filled param to its tensor; ``tied`` a param name to the param it
    shares; ``ignored`` lists tensors of tied names; ``unused`` tensors declared unused;
    ``unplaced`` (tensor, renamed name) pairs no param takes; ``unfilled`` params no tensor
    fills; ``misshaped`` (tensor, param) pairs whose shapes differ; ``not_float`` placed
    tensors stored as integers or booleans (``FLOATS``: no weight; ``load`` refuses them),
    where the caller knows the dtypes (``place`` sees shapes alone).
    """

    params: dict[str, Param] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    tied: dict[str, str] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)
    unplaced: list[tuple[str, str]] = field(default_factory=list)
    unfilled: list[str] = field(default_factory=list)
    misshaped: list[tuple[str, str]] = field(default_factory=list)
    not_float: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not (self.unplaced or self.unfilled or self.misshaped or self.not_float)

    def report(self) -> LoadReport:
        return LoadReport(dict(self.sources), dict(self.tied), sorted(self.ignored + self.unused))


def place(module: Module, shapes: Mapping[str, tuple[int, ...]], renames: Mapping[str, str],
          unused: Iterable[str] = (), stored: bool = True) -> Placement:
    """Match checkpoint tensors (name -> shape) to ``module``'s params after ``renames``
    (``runtime.renames``: composed, in order): a tensor whose renamed name is a tied alias
    is ignored, unless the param it shares has no tensor of its own, which it then fills
    (transformers' ``tie_weights`` swaps source and target so); one whose own name a pattern
    of ``unused`` matches is left unread; every other must fill exactly one param of its
    stored shape (``Param.stored_shape``; its own shape where not ``stored``: tensors in
    the model's layout)."""
    out = Placement()
    first: dict[int, str] = {}
    for name, p in module.named_params():
        if id(p) in first:
            out.tied[name] = first[id(p)]
        else:
            first[id(p)] = name
            out.params[name] = p
    unused = list(unused)
    held = {renamed(source, renames) for source in shapes}
    for source in shapes:
        target = renamed(source, renames)
        if target in out.tied and out.tied[target] not in held \
                and out.tied[target] not in out.sources:
            target = out.tied[target]
        if target in out.tied:
            out.ignored.append(source)
        elif target in out.params and target not in out.sources:
            out.sources[target] = source
            p = out.params[target]
            if tuple(shapes[source]) != (p.stored_shape if stored else p.shape):
                out.misshaped.append((source, target))
        elif matching(source, unused):
            out.unused.append(source)
        else:
            out.unplaced.append((source, target))
    out.unfilled = [n for n in out.params if n not in out.sources]
    return out


def distinct_ties(module: Module, checkpoint: "Checkpoint", renames: Mapping[str, str]
                  ) -> list[tuple[str, str]]:
    """The tied names of ``module`` (``lm_head.weight`` sharing the embedding) whose own
    tensor ``checkpoint`` holds beside the shared param's, with other values: (tied name,
    the name it shares) pairs. transformers' ``PreTrainedModel.tie_weights`` ties neither of
    such a pair (it warns and loads each tensor into its own param); equal tensors are tied."""
    found = place(module, {n: t.shape for n, t in checkpoint.tensors.items()}, renames)
    own = {renamed(source, renames): source for source in checkpoint.tensors}
    out = []
    for alias, shared in found.tied.items():
        if alias in own and shared in found.sources:
            a, b = checkpoint.raw(own[alias]), checkpoint.raw(found.sources[shared])
            if a.shape != b.shape or not np.array_equal(a.astype(np.float32), b.astype(np.float32)):
                out.append((alias, shared))
    return out


def bind(module: Module, shapes: Mapping[str, tuple[int, ...]], renames: Mapping[str, str],
         unused: Iterable[str] = (), stored: bool = True,
         origin: Callable[[str], str] | None = None,
         expects: Callable[[str], str] | None = None) -> Placement:
    """``place``, strictly: raises CheckpointError listing every missing, unexpected and
    mis-shaped tensor together, by name. A mis-shaped one names both sides: the checkpoint's
    tensor (``origin(tensor)``: the file holding it, where given) and the spec's parameter
    (``expects(param)``: where its shape comes from, ``iron_spec.spec.shapes``)."""
    found = place(module, shapes, renames, unused, stored)
    if found.fits:
        return found
    parts = []
    if found.unfilled:
        parts.append(f"missing {len(found.unfilled)}: {_some(sorted(found.unfilled))}")
    if found.unplaced:
        names = sorted(s if t == s else f"{s} (renamed {t})" for s, t in found.unplaced)
        parts.append(f"unexpected {len(names)}: {_some(names)}")
    if found.misshaped:
        parts.append(f"mis-shaped {len(found.misshaped)}: " + _some([
            f"checkpoint tensor {s}" + (f" in {origin(s)}" if origin else "")
            + f" is {list(shapes[s])}; the spec expects {t} to be "
            + (f"{list(found.params[t].stored_shape)} stored transposed (checkpoint.transposed)"
               if stored and found.params[t].transposed else f"{list(found.params[t].shape)}")
            + (expects(t) if expects else "")
            for s, t in found.misshaped], "; "))
    cut = max(len(found.unfilled), len(found.unplaced), len(found.misshaped)) > SHOWN
    raise CheckpointError("the checkpoint does not fit the model: " + "; ".join(parts) + (
        " (a config.json of another model? `iron-spec show SPEC --checkpoint DIR` lists every "
        "tensor)" if cut else ""))


SHOWN = 8  # names of each kind of misfit an error gives; `iron-spec show` gives them all


def _some(items: list[str], sep: str = ", ") -> str:
    return sep.join(items[:SHOWN]) + (f"{sep}... {len(items) - SHOWN} more" if len(items) > SHOWN else "")


def load(module: Module, checkpoint: Checkpoint, renames: Mapping[str, str] = {},
         progress: Callable[[int, int], None] | None = None,
         unused: Iterable[str] = (), expects: Callable[[str], str] | None = None,
         weights: str = "stored",
         requantizing: Callable[[dict[str, int]], None] | None = None) -> LoadReport:
    """Fill every param of ``module`` from ``checkpoint``, strictly (``bind``).

    A projection's or embedding's matrix (``Param.holdable``) is held as ``weights`` says
    (``runtime.holding``): by default in the form the file stores it, a bfloat16 or float16
    tensor a read-only view of the mapped file (read as the kernels touch it), a GGUF
    tensor its blocks; every other param, and every weight under ``weights="float32"``, is
    read into float32.

    Nothing is read unless every tensor fits; a param stored in another layout
    (``Param.transposed``, ``Param.rows``) is turned into the model's as it is read; a tensor
    holding NaN or infinities is refused (CheckpointError naming it); ``progress(done,
    total)`` follows the reads; ``expects`` as ``bind``'s. The pages of what was read into
    float32 are unmapped afterwards, so they stop counting as resident memory; a held view
    keeps its file mapped. ``requantizing(forms)``, where given, is called once before any
    tensor is read where ``weights`` converts matrices the file holds as quantized blocks
    (a GGUF's Q8_0, Q4_K, ...) to another form: ``forms`` counts them by stored form
    (``requantized``).

    Raises:
        ValueError: ``weights`` is none of ``holding.WEIGHTS``, or a conversion it asks for
            does not fit a matrix (rows not whole blocks), naming the tensor.
    """
    form = holding.choice(weights)
    found = bind(module, {n: t.shape for n, t in checkpoint.tensors.items()}, renames, unused,
                 origin=lambda s: str(getattr(checkpoint.tensors[s], "file", checkpoint.path)),
                 expects=expects)
    # Every weight is a float: an integer or boolean tensor where one belongs is no weight
    # (a cast would be silent), named before anything is read.
    wrong = [f"{s} ({checkpoint.tensors[s].dtype})" for s in found.sources.values()
             if checkpoint.tensors[s].dtype not in FLOATS]
    if wrong:
        raise CheckpointError(f"{checkpoint.path}: {len(wrong)} tensor{'s' * (len(wrong) != 1)} "
                              f"where float weights belong hold integers or booleans: "
                              f"{_some(wrong)} (weights are {', '.join(FLOATS)})")
    output = {holding.OUTPUT, found.tied.get(holding.OUTPUT, holding.OUTPUT)}
    again = requantized(found, checkpoint, form, output)
    if again and requantizing is not None:
        requantizing(again)
    for i, (name, source) in enumerate(found.sources.items()):
        param = found.params[name]
        kept = _hold(param, checkpoint, source, holding.form_for(name, form, output)) \
            if param.holdable and form != "F32" else None
        if kept is not None:
            param.array = kept  # no longer a row view of a stack (runtime.module.pack)
            bad = holding.not_finite(kept)
            if bad:
                raise CheckpointError(f"{checkpoint.path}: tensor {source} holds {bad} NaN or "
                                      "infinite values; the weights are damaged")
            if progress is not None:
                progress(i + 1, len(found.sources))
            continue
        # Into the param's own rows where it has them, in the model's layout.
        with np.errstate(over="ignore"):  # a value past float32 is named just below
            _fill(param, checkpoint, source)
        checkpoint.release(source)
        array = param.array
        # A float64 sum is finite exactly when every value is (float32 values cannot add up
        # past float64's range), and takes no array of the tensor's size.
        total = np.add.reduce(array, axis=None, dtype=np.float64)
        if not np.isfinite(total) and not (param.infinite and not np.isnan(array).any()):
            raise CheckpointError(_not_finite(checkpoint, source, array))
        filled = getattr(param, "filled", None)  # a stack held once its tensors are read
        if filled is not None:
            filled(param, checkpoint, source)
        if progress is not None:
            progress(i + 1, len(found.sources))
    checkpoint.close()
    return found.report()


def requantized(found: Placement, checkpoint, form: str | None,
                output: set[str]) -> dict[str, int]:
    """The matrices ``load`` converts to ``form`` (``holding.WEIGHTS``' values) from blocks
    the file holds quantized (``operators.held.BLOCKS``: a GGUF's Q8_0, Q4_K, ...), counted
    by stored form: each is widened and quantized (or rounded) again, its values carrying
    both roundings, where converting the original float weights would carry one (what
    llama.cpp's llama-quantize refuses without ``--allow-requantize``). Nothing under
    ``stored`` or ``float32`` (widening is exact), nor for a matrix stored in the form asked
    (held as stored)."""
    if form in (None, "F32"):
        return {}
    again: dict[str, int] = {}
    for name, source in found.sources.items():
        param = found.params[name]
        stored = getattr(checkpoint.tensors[source], "stored", None)
        converted = param.holdable or getattr(param, "filled", None) is not None  # a stack
        if converted and stored in holding.held.BLOCKS and \
                holding.form_for(name, form, output) != stored:
            again[stored] = again.get(stored, 0) + 1
    return again


def _hold(param: Param, checkpoint, source: str, form: str | None):
    """Tensor ``source`` as ``param`` holds it under ``form`` (None: as stored), in the model's
    layout, or None where it is read into float32 instead (stored float32 and kept so, or a
    layout its form cannot take)."""
    stored = checkpoint.stored(source)
    if stored is not None:
        stored = holding.layout(param, stored)
    if form is None:
        return stored
    if stored is None:  # stored float32 (or float64): converted from its float32 values
        with np.errstate(over="ignore"):
            values = np.ascontiguousarray(param.from_stored(checkpoint.raw(source)), np.float32)
    else:
        values = stored
    try:
        converted = holding.convert(values, form, source)
    except ValueError as e:
        raise ValueError(f"{checkpoint.path}: {e}") from None
    if converted is not stored:  # the file's pages read for it leave resident memory
        checkpoint.release(source)
    return converted


def _not_finite(checkpoint: Checkpoint, source: str, array: np.ndarray) -> str:
    """What is wrong with tensor ``source`` whose float32 values are not all finite: NaN or
    infinities in the file, or finite values of a wider dtype past float32's range."""
    stored = checkpoint.raw(source)
    wide = np.isfinite(stored.astype(np.float64, copy=False))
    if wide.all():
        top = float(np.abs(stored.astype(np.float64)).max())
        n = int(array.size - np.isfinite(array).sum())
        return (f"{checkpoint.path}: tensor {source} ({checkpoint.tensors[source].dtype}) holds "
                f"{n} finite value{'s' * (n != 1)} past float32's range (largest magnitude "
                f"{top:.3g}, float32's {float(np.finfo(np.float32).max):.3g}); the model "
                "computes in float32")
    bad = int(stored.size - wide.sum())
    return (f"{checkpoint.path}: tensor {source} holds {bad} NaN or infinite values; the "
            "weights are damaged")


SLICE_BYTES = 32 * 2**20  # a large tensor is read this much at a time (_fill)


def _fill(param, checkpoint: Checkpoint, source: str) -> None:
    """``param`` from tensor ``source``; one stored as the model lays it out and larger than
    ``SLICE_BYTES`` in slices of rows, each slice's file pages released once copied, so its
    file pages and its float32 copy are never resident whole together (Gemma 3's 262144 x
    640 embedding: 335 MB of bfloat16 pages beside its 671 MB)."""
    raw = checkpoint.raw(source)
    # Only a safetensors file maps its pages (a GGUF tensor is dequantized into a new array);
    # a part of one (runtime.parts) reads the file's.
    if (not getattr(checkpoint, "mapped", False) or param.transposed or param.rows is not None
            or param.reshaped is not None or param.flat
            or raw.ndim == 0 or raw.nbytes <= SLICE_BYTES):
        param.fill(param.from_stored(raw))
        return
    if param.array is None:
        param.array = np.empty(param.shape, np.float32)
    row = raw.nbytes // max(1, raw.shape[0])
    step = max(1, SLICE_BYTES // max(1, row))
    for i in range(0, raw.shape[0], step):
        np.copyto(param.array[i:i + step], raw[i:i + step], casting="unsafe")
        checkpoint.release(source, upto=(i + step) * row)


def fill(module: Module, tensors: Mapping[str, np.ndarray]) -> LoadReport:
    """Fill every param of ``module`` from in-memory ``tensors`` in the model's layout (its
    names and shapes: drawn weights), as strictly as ``load``."""
    found = bind(module, {n: t.shape for n, t in tensors.items()}, {}, stored=False)
    for name, source in found.sources.items():
        found.params[name].fill(tensors[source])
    return found.report()


def mark_transposed(module: Module, patterns: Iterable[str]) -> list[str]:
    """Mark every matrix (or stack of matrices) of ``module`` whose model name one of
    ``patterns`` matches (whole names; ``runtime.renames`` patterns) as stored ``[in, out]``
    (``Param.transposed``), as transformers' ``Conv1D`` stores its weight (and GptOssExperts
    its ``(E, H, 2I)`` experts). Returns the patterns that match none.
    """
    patterns, hit = list(patterns), set()
    for name, p in module.named_params():
        for pattern in patterns:
            if len(p.shape) in (2, 3) and matching(name, [pattern]):
                p.transposed = True
                hit.add(pattern)
    return [p for p in patterns if p not in hit]
