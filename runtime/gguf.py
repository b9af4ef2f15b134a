"""Reading a GGUF file (llama.cpp's checkpoint format) as a Hugging Face checkpoint: a
config.json dict, tensors under transformers' names in transformers' layout, and the raw
quantized blocks for kernels that run them as they are.

The file's header (metadata and tensor table) is parsed here, every length and offset checked
against the file, so a truncated or damaged file is refused naming the key or tensor; the
``gguf`` package gives the format's constants (value and tensor types, block sizes) and
llama.cpp's tensor names per architecture (``gguf.TensorNameMap``, the table
convert_hf_to_gguf.py renames with). Its own ``GGUFReader`` is not used: it builds a Python
object per array item, 28 s for a 262k-token vocabulary, where this reader takes well under one.

What llama.cpp's converter did to a family's tensors (q/k rows permuted, norms shifted) is
not in the file: the spec says it (``Layout``, from a spec's ``gguf`` section).

Not for: the tokenizer (``runtime.gguf_vocab``), dequantizing (``runtime.quants``).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import gguf as ggml
import numpy as np

from .checkpoint import CheckpointError
from .quants import FORMATS, Format, dequantize

MAGIC = b"GGUF"
VERSIONS = (2, 3)
# GGUFValueType -> struct format of its scalar.
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
FLOAT32 = 6
STRING, ARRAY = 8, 9


class GGUFError(CheckpointError):
    """A GGUF file that cannot be read or served; says which file, and which key or tensor."""


@dataclass(frozen=True)
class Layout:
    """What llama.cpp's convert_hf_to_gguf.py did to one family's checkpoint, undone on read.

    ``architecture`` is the file's ``general.architecture``; ``architectures`` the
    config.json ``architectures`` it serves (the spec's); ``rope_permuted``: q_proj and
    k_proj rows (weights and biases) were permuted from transformers' half-rotated RoPE
    layout to interleaved pairs, per head (convert_hf_to_gguf.py's ``LlamaModel.permute``,
    undone as transformers' ``LlamaTensorProcessor``); ``norm_offset`` was added to every
    ``*norm.weight`` (a ``1 + w`` RMSNorm stored as ``1 + w``, as transformers'
    ``Gemma2TensorProcessor`` undoes it)."""

    architecture: str
    architectures: tuple[str, ...]
    rope_permuted: bool = False
    norm_offset: float = 0.0


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of the file: its GGUF ``name``, element ``format``, ``shape`` in numpy's
    order (GGUF lists dimensions innermost first: ``[in, out]`` for a matrix is ``(out, in)``
    here, transformers' own) and its bytes ``begin..end`` in the file."""

    name: str
    format: Format
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def dtype(self) -> str:
        """The safetensors dtype it reads as (``checkpoint.load`` takes floats only): its
        own where it is one, float32 for quantized blocks, which dequantize to it."""
        return self.format.name if self.format.name in ("F32", "F16", "BF16") else "F32"

    @property
    def stored(self) -> str:
        """The element type as stored (``Q4_1``, ``F32``): what ``show`` reports."""
        return self.format.name


def is_gguf(path: str | Path) -> bool:
    """Whether ``path`` is a file that begins with GGUF's magic bytes."""
    path = Path(path)
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == MAGIC


class _Header:
    """A cursor over the mapped file that refuses to read past its end."""

    def __init__(self, path: Path, data: mmap.mmap):
        self.path, self.data, self.pos = path, data, 0

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise GGUFError(f"{self.path}: {what} runs past the file's end at byte "
                            f"{len(self.data)} (truncated, or not a GGUF file)")
        view = memoryview(self.data)[self.pos:self.pos + n]
        self.pos += n
        return view

    def scalar(self, code: str, what: str):
        return struct.unpack(f"<{code}", self.take(struct.calcsize(code), what))[0]

    def string(self, what: str) -> str:
        raw = bytes(self.take(self.scalar("Q", what), what))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{self.path}: {what} is not UTF-8 text") from None

    def strings(self, count: int, what: str) -> list[str]:
        """``count`` strings in a row (a vocabulary: 262k of them), read in one tight loop."""
        data, pos, end, out = self.data, self.pos, len(self.data), []
        length = struct.Struct("<Q").unpack_from
        try:
            for i in range(count):
                (n,) = length(data, pos)
                pos += 8
                if pos + n > end:
                    raise struct.error
                out.append(data[pos:pos + n].decode("utf-8"))
                pos += n
        except struct.error:
            raise GGUFError(f"{self.path}: {what}[{len(out)}] runs past the file's end at byte "
                            f"{end} (truncated, or not a GGUF file)") from None
        except UnicodeDecodeError:
            raise GGUFError(f"{self.path}: {what}[{len(out)}] is not UTF-8 text") from None
        self.pos = pos
        return out

    def value(self, kind: int, what: str) -> Any:
        if kind in SCALARS:
            value = self.scalar(SCALARS[kind], what)
            # A float32's shortest decimal (1e-05, not 9.999999747378752e-06): the value
            # config.json held before conversion, and the same float32.
            return float(str(np.float32(value))) if kind == FLOAT32 else value
        if kind == STRING:
            return self.string(what)
        if kind != ARRAY:
            raise GGUFError(f"{self.path}: {what} has value type {kind}, not a GGUF value type "
                            "(0..12)")
        item, count = self.scalar("I", what), self.scalar("Q", what)
        if item in SCALARS:
            dtype = np.dtype(f"<{SCALARS[item]}")
            raw = self.take(count * dtype.itemsize, what)
            values = np.frombuffer(raw, dtype)
            return [float(str(np.float32(v))) for v in values] if item == FLOAT32 \
                else values.tolist()
        if item == STRING:
            return self.strings(count, what)
        raise GGUFError(f"{self.path}: {what} is an array of value type {item}, not of numbers "
                        "or strings")


class GGUFFile:
    """A GGUF file's metadata and tensor table, its tensors read on demand.

    Args:
        path: the ``.gguf`` file.

    Raises:
        FileNotFoundError: no such file.
        GGUFError: not GGUF (magic, version), truncated (naming the key or tensor that runs
            past the end), a tensor of a type this reader does not dequantize (naming it and
            the types read), or a tensor's bytes outside the file.
    """

    def __init__(self, path: str | Path):
        self.path = path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such GGUF file")
        with open(path, "rb") as f:
            if path.stat().st_size == 0:
                raise GGUFError(f"{path}: empty file, not GGUF")
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        h = _Header(path, self._map)
        if bytes(h.take(4, "the magic bytes")) != MAGIC:
            raise GGUFError(f"{path}: does not begin with GGUF's magic bytes: not a GGUF file")
        version = h.scalar("I", "the version")
        if version not in VERSIONS:
            raise GGUFError(f"{path}: GGUF version {version}; this reader reads versions "
                            f"{', '.join(map(str, VERSIONS))}")
        n_tensors, n_kv = h.scalar("Q", "the tensor count"), h.scalar("Q", "the key count")
        #: Every metadata key's value: numbers, text, or lists of them.
        self.metadata: dict[str, Any] = {}
        for i in range(n_kv):
            key = h.string(f"metadata key {i}")
            self.metadata[key] = h.value(h.scalar("I", f"metadata key {key}"), f"metadata key {key}")
        infos = []
        for i in range(n_tensors):
            name = h.string(f"tensor {i}'s name")
            n_dims = h.scalar("I", f"tensor {name}")
            dims = [h.scalar("Q", f"tensor {name}") for _ in range(n_dims)]
            infos.append((name, dims, h.scalar("I", f"tensor {name}"), h.scalar("Q", f"tensor {name}")))
        align = self.metadata.get("general.alignment", ggml.GGUF_DEFAULT_ALIGNMENT)
        start = -(-h.pos // align) * align
        #: Every tensor by its GGUF name, in file order.
        self.tensors: dict[str, GGUFTensor] = {}
        for name, dims, kind, offset in infos:
            self.tensors[name] = self._tensor(name, dims, kind, start + offset)

    def _tensor(self, name: str, dims: list[int], kind: int, begin: int) -> GGUFTensor:
        try:
            type_name = ggml.GGMLQuantizationType(kind).name
        except ValueError:
            type_name = f"type {kind}"
        if type_name not in FORMATS:
            raise GGUFError(f"{self.path}: tensor {name} is {type_name}; this reader "
                            f"dequantizes {', '.join(FORMATS)}")
        fmt = FORMATS[type_name]
        n = int(np.prod(dims, dtype=object)) if dims else 1
        if dims and dims[0] % fmt.block:
            raise GGUFError(f"{self.path}: tensor {name} has rows of {dims[0]} values, not whole "
                            f"{fmt.name} blocks of {fmt.block}")
        end = begin + n // fmt.block * fmt.nbytes
        if end > len(self._map):
            raise GGUFError(f"{self.path}: tensor {name} ends at byte {end}, past the file's "
                            f"{len(self._map)} bytes (truncated)")
        return GGUFTensor(name, fmt, tuple(reversed(dims)), begin, end)

    @property
    def architecture(self) -> str:
        """``general.architecture``: llama.cpp's name of the family."""
        return self.get("general.architecture")

    def get(self, key: str, *default) -> Any:
        """Metadata ``key``'s value, or ``default`` where the file has no such key.

        Raises:
            GGUFError: no such key and no default, naming the key and the file.
        """
        if key in self.metadata:
            return self.metadata[key]
        if default:
            return default[0]
        raise GGUFError(f"{self.path}: no metadata key {key} (a GGUF of this kind holds one)")

    def blocks(self, name: str) -> tuple[Format, np.ndarray]:
        """Tensor ``name`` as stored: its format and a read-only uint8 view of the mapped
        file, ``(rows, row bytes)`` with rows in numpy's order (``shape[:-1]`` flattened),
        each row ``shape[-1] / format.block`` blocks of ``format.nbytes`` bytes. What a
        kernel reading Q8_0 (or any block format) as it is takes; ``read`` dequantizes."""
        t = self.tensors[name]
        raw = np.frombuffer(self._map, np.uint8, t.end - t.begin, t.begin)
        cols = t.shape[-1] // t.format.block * t.format.nbytes if t.shape else t.format.nbytes
        return t.format, raw.reshape(-1, cols)

    def read(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a new float32 array of its numpy ``shape``, as the file holds it
        (llama.cpp's layout: see ``Checkpoint`` for transformers')."""
        fmt, raw = self.blocks(name)
        return dequantize(raw, fmt).reshape(self.tensors[name].shape)

    def release(self, name: str) -> None:
        """Drop tensor ``name``'s file pages from this process's resident memory, once read."""
        t = self.tensors[name]
        advice = getattr(mmap, "MADV_DONTNEED", None)
        begin = -(-t.begin // mmap.PAGESIZE) * mmap.PAGESIZE
        end = t.end // mmap.PAGESIZE * mmap.PAGESIZE
        if advice is not None and end > begin:
            self._map.madvise(advice, begin, end - begin)


def file_architecture(path: str | Path) -> str:
    """``general.architecture`` of the GGUF file at ``path`` (GGUFFile's errors)."""
    return GGUFFile(path).architecture


# config.json field <- GGUF metadata key ({arch}: general.architecture), as llama.cpp's
# convert_hf_to_gguf.py writes them (TextModel.set_gguf_parameters) and transformers'
# GGUF_CONFIG_MAPPING reads them back.
CONFIG_KEYS = {
    "hidden_size": "{arch}.embedding_length",
    "intermediate_size": "{arch}.feed_forward_length",
    "num_hidden_layers": "{arch}.block_count",
    "num_attention_heads": "{arch}.attention.head_count",
    "num_key_value_heads": "{arch}.attention.head_count_kv",
    "head_dim": "{arch}.attention.key_length",
    "max_position_embeddings": "{arch}.context_length",
    "rope_theta": "{arch}.rope.freq_base",
    "rms_norm_eps": "{arch}.attention.layer_norm_rms_epsilon",
    "layer_norm_eps": "{arch}.attention.layer_norm_epsilon",
    "sliding_window": "{arch}.attention.sliding_window",
    "attn_logit_softcapping": "{arch}.attn_logit_softcapping",
    "final_logit_softcapping": "{arch}.final_logit_softcapping",
    "vocab_size": "{arch}.vocab_size",
    "bos_token_id": "tokenizer.ggml.bos_token_id",
    "eos_token_id": "tokenizer.ggml.eos_token_id",
    "pad_token_id": "tokenizer.ggml.padding_token_id",
}
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads")
# Metadata of what this reader cannot give a config.json for, with why.
REFUSED = {
    "{arch}.expert_count": "mixture-of-experts layers",
    "{arch}.rope.scaling.type": "RoPE scaling of a type other than none",
    "{arch}.attention.q_lora_rank": "low-rank attention projections",
}
REFUSED_TENSORS = {"rope_freqs.weight": "per-frequency RoPE factors (a scaled RoPE whose "
                                        "config.json parameters the file does not keep)"}


def config(file: GGUFFile, layout: Layout) -> dict:
    """The config.json of ``file``'s model: the fields ``CONFIG_KEYS`` maps that the file
    holds, ``architectures`` from ``layout``, ``tie_word_embeddings`` where the file holds no
    ``output.weight`` (as transformers' ``load_gguf_checkpoint``), ``vocab_size`` from the
    vocabulary where no key gives it, ``partial_rotary_factor`` where RoPE covers part of a
    head. Fields the file does not hold are left out: the spec's defaults (transformers'
    config class's, which llama.cpp assumes too) apply.

    Raises:
        GGUFError: ``general.architecture`` is not ``layout``'s, a required key is missing
            (named), a per-layer list where one value is read, or metadata this reader
            cannot serve (``REFUSED``, naming the key).
    """
    arch = file.architecture
    if arch != layout.architecture:
        raise GGUFError(f"{file.path}: general.architecture is {arch}, not {layout.architecture} "
                        f"(the spec's gguf.architecture)")
    for key, what in REFUSED.items():
        key = key.format(arch=arch)
        if key in file.metadata and not (key.endswith("scaling.type")
                                         and file.metadata[key] == "none"):
            raise GGUFError(f"{file.path}: metadata {key} = {file.metadata[key]!r}: {what}, which "
                            "this reader does not map to a config.json")
    for name, what in REFUSED_TENSORS.items():
        if name in file.tensors:
            raise GGUFError(f"{file.path}: tensor {name} holds {what}; not served")
    out: dict[str, Any] = {"architectures": list(layout.architectures)}
    for field, key in CONFIG_KEYS.items():
        key = key.format(arch=arch)
        if key in file.metadata:
            value = file.metadata[key]
            if isinstance(value, list):
                raise GGUFError(f"{file.path}: metadata {key} is a list of {len(value)} values "
                                f"(one per layer?); config.json's {field} takes one")
            out[field] = value
        elif field in REQUIRED:
            file.get(key)  # raises, naming the key
    if "vocab_size" not in out:
        out["vocab_size"] = len(file.get("tokenizer.ggml.tokens"))
    out["tie_word_embeddings"] = "output.weight" not in file.tensors
    rotary = file.metadata.get(f"{arch}.rope.dimension_count")
    head = out.get("head_dim", out["hidden_size"] // out["num_attention_heads"])
    if rotary is not None and rotary != head:
        out["partial_rotary_factor"] = rotary / head
    return out


class GGUFCheckpoint:
    """A GGUF file's tensors under transformers' checkpoint names, in transformers' layout,
    read on demand as float32: what ``runtime.checkpoint.load`` takes, as it takes a
    safetensors ``Checkpoint``.

    Each name of ``names`` (the checkpoint names a model reads) is renamed to llama.cpp's as
    its converter renames it (``gguf.TensorNameMap`` of the file's architecture); a file's
    tensor no name leads to keeps its GGUF name (so loading reports it, by that name).

    Args:
        file: the GGUF file.
        layout: what the converter did (``Layout``), undone on read.
        config: the file's config.json (``config``): head counts for ``rope_permuted``.
        names: the checkpoint names to look for.

    Raises:
        GGUFError: the file's architecture is one the gguf package does not know.
    """

    def __init__(self, file: GGUFFile, layout: Layout, config: dict, names: Iterable[str]):
        self.file, self.layout, self.path = file, layout, file.path
        arch = {v: k for k, v in ggml.MODEL_ARCH_NAMES.items()}.get(file.architecture)
        if arch is None:
            raise GGUFError(f"{file.path}: general.architecture {file.architecture} is not one the "
                            "gguf package names tensors for")
        table = ggml.get_tensor_name_map(arch, config["num_hidden_layers"])
        heads = config["num_attention_heads"]
        self._heads = {ggml.MODEL_TENSOR.ATTN_Q: heads,
                       ggml.MODEL_TENSOR.ATTN_K: config.get("num_key_value_heads", heads)}
        self._source: dict[str, tuple[str, Any]] = {}  # checkpoint name -> (GGUF name, type)
        for name in names:
            found = table.get_type_and_name(name, try_suffixes=(".weight", ".bias"))
            if found is not None and found[1] in file.tensors:
                self._source.setdefault(name, (found[1], found[0]))
        taken = {g for g, _ in self._source.values()}
        for g in file.tensors:
            if g not in taken:
                self._source[g] = (g, None)
        #: Every tensor by its checkpoint name: ``.shape`` (transformers'), ``.begin``, ``.end``.
        self.tensors = {n: file.tensors[g] for n, (g, _) in self._source.items()}

    def gguf_name(self, name: str) -> str:
        """The file's name of checkpoint tensor ``name``."""
        return self._source[name][0]

    def raw(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a new float32 array, transformers' layout restored."""
        gname, kind = self._source[name]
        array = self.file.read(gname)
        if self.layout.rope_permuted and kind in self._heads:
            array = unpermute(array, self._heads[kind])
        if self.layout.norm_offset and name.endswith("norm.weight"):
            array -= np.float32(self.layout.norm_offset)
        return array

    def read(self, name: str) -> np.ndarray:
        array = self.raw(name)
        self.release(name)
        return array

    def blocks(self, name: str) -> tuple[Format, np.ndarray]:
        """Tensor ``name`` as stored, its blocks untouched, rows in transformers' order: its
        format and a uint8 array ``(rows, row bytes)`` (``GGUFFile.blocks``; a view of the
        file, or a copy where a ``rope_permuted`` projection's rows are put back, which moves
        whole rows and so keeps every block). ``dequantize(*reversed(blocks(name)))``
        reshaped is ``raw(name)``: what a kernel running Q8_0 (or any block format) weights
        as they are reads.

        Raises:
            GGUFError: the tensor is one ``norm_offset`` shifts (its values change: ``raw``).
        """
        gname, kind = self._source[name]
        if self.layout.norm_offset and name.endswith("norm.weight"):
            raise GGUFError(f"{self.path}: tensor {gname} is stored shifted by "
                            f"{self.layout.norm_offset}; read it with raw()")
        fmt, rows = self.file.blocks(gname)
        if self.layout.rope_permuted and kind in self._heads:
            rows = unpermute(rows, self._heads[kind])
        return fmt, rows

    def release(self, name: str) -> None:
        self.file.release(self._source[name][0])

    def close(self) -> None:
        """Nothing to unmap until the file is dropped; pages read are released as read."""

    @property
    def nbytes(self) -> int:
        return sum(t.end - t.begin for t in self.file.tensors.values())


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Rows ``(heads * D, ...)`` permuted by convert_hf_to_gguf.py's ``LlamaModel.permute``
    (each head's rows as interleaved (even, odd) pairs) back to transformers' half-rotated
    order (each head's D/2 first halves, then its D/2 second halves), as transformers'
    ``LlamaTensorProcessor._reverse_permute_weights``.

    Raises:
        GGUFError: the rows do not split into ``heads`` heads of an even size.
    """
    rows = w.shape[0]
    if rows % (2 * heads):
        raise GGUFError(f"{rows} rows do not split into {heads} heads of pairs")
    return np.ascontiguousarray(
        w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))
