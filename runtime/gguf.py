"""Reading a GGUF file (llama.cpp's checkpoint format) as a Hugging Face checkpoint: a
config.json dict, tensors under transformers' names in transformers' layout, and the raw
quantized blocks for kernels that run them as they are.

The file's header (metadata and tensor table) is parsed here and held to what llama.cpp's
own loader (ggml's ``gguf.cpp``) and gguf-py's ``GGUFReader`` accept: little-endian, no key
or tensor given twice, an alignment that is a power of two and a ``uint32``, every tensor's
bytes where GGUF puts them (in table order, each at the previous one's end padded to the
alignment: nothing overlapping, out of order or misaligned), every length and offset inside
the file. A file that breaks one of these is refused naming the key or tensor. The ``gguf``
package gives the format's constants (value and tensor types, block sizes) and llama.cpp's
tensor names per architecture (``gguf.TensorNameMap``, the table convert_hf_to_gguf.py
renames with). Its own ``GGUFReader`` is not used: it builds a Python object per array item,
28 s for a 262k-token vocabulary, where this reader takes well under one.

What llama.cpp's converter did to a family's tensors (q/k rows permuted, norms shifted, a
fused qkv reordered) and which config.json keys its metadata holds is not in the file: the
spec says it (``Layout``, from a spec's ``gguf`` section).

Not for: the tokenizer (``runtime.gguf_vocab``), dequantizing (``runtime.quants``).
"""

from __future__ import annotations

import math
import mmap
import re
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable

import gguf as ggml
import ml_dtypes
import numpy as np

from . import holding
from .checkpoint import CheckpointError
from .quants import FORMATS, Format, dequantize

MAGIC = b"GGUF"
VERSIONS = (2, 3)
# GGUFValueType -> struct format of its scalar.
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
INTEGERS = (0, 1, 2, 3, 4, 5, 10, 11)
UINT32, FLOAT32, BOOL, FLOAT64 = 4, 6, 7, 12
STRING, ARRAY = 8, 9
TYPE_NAMES = {t.value: t.name.lower() for t in ggml.GGUFValueType}
MAX_DIMS = 4      # GGML_MAX_DIMS: ggml's loader refuses a tensor of more dimensions
MAX_NAME = 64     # GGML_MAX_NAME: a tensor name of this many bytes or more is refused by it
# The least bytes one metadata entry and one tensor-table entry take (a key's length, type
# and a one-byte value; a name's length, dimension count, type and offset): a count that
# cannot fit in the file is refused before anything loops over it.
LEAST_KV, LEAST_TENSOR = 8 + 4 + 1, 8 + 4 + 4 + 8


class GGUFError(CheckpointError):
    """A GGUF file that cannot be read or served; says which file, and which key or tensor."""


@dataclass(frozen=True)
class Layout:
    """What llama.cpp's convert_hf_to_gguf.py did to one family's checkpoint, undone on read,
    and where its metadata holds the family's config.json keys.

    ``architecture`` is the file's ``general.architecture``; ``architectures`` the
    config.json ``architectures`` it serves (the spec's); ``rope_permuted``: q_proj and
    k_proj rows (weights and biases) were permuted from transformers' half-rotated RoPE
    layout to interleaved pairs, per head (convert_hf_to_gguf.py's ``LlamaModel.permute``,
    undone as transformers' ``LlamaTensorProcessor``); ``norm_offset`` was added to every
    ``*norm.weight`` (a ``1 + w`` RMSNorm stored as ``1 + w``, as transformers'
    ``Gemma2TensorProcessor`` undoes it); ``qkv``: the fused q/k/v rows were reordered from
    transformers' ``heads`` layout (per head: q, k, v; GPT-NeoX) or ``groups`` layout (per
    kv group: its query heads, k, v; Falcon) to llama.cpp's [q; k; v]; ``config``: pairs
    (config.json key, ``Source``) this family's files give beside or instead of the common
    ones (``COMMON``); a key whose source is None is not given."""

    architecture: str
    architectures: tuple[str, ...]
    rope_permuted: bool = False
    norm_offset: float = 0.0
    qkv: str | None = None
    config: tuple[tuple[str, "Source | None"], ...] = ()


@dataclass(frozen=True)
class Source:
    """Where a config.json value comes from in a GGUF file: ``metadata`` (a key, under
    ``{arch}.`` unless it begins ``general.`` or ``tokenizer.``), ``value`` (a constant:
    what llama.cpp assumes of the architecture), ``tensor`` (``present`` where the file holds
    that tensor, else ``absent``) or ``computed`` (``COMPUTED``: worked out of several keys or
    tensors)."""

    metadata: str | None = None
    value: Any = None
    tensor: str | None = None
    present: Any = None
    absent: Any = None
    computed: str | None = None


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
        if count * 8 > end - pos:
            raise GGUFError(f"{self.path}: {what} holds {count} strings, more than the file's "
                            f"{end} bytes can (truncated, or not a GGUF file)")
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

    def value(self, kind: int, what: str) -> tuple[Any, int | None]:
        """The value of GGUF value type ``kind``, and its items' type where it is an array."""
        if kind in SCALARS:
            value = self.scalar(SCALARS[kind], what)
            # A float32's shortest decimal (1e-05, not 9.999999747378752e-06): the value
            # config.json held before conversion, and the same float32.
            return (float(str(np.float32(value))) if kind == FLOAT32 else value), None
        if kind == STRING:
            return self.string(what), None
        if kind != ARRAY:
            raise GGUFError(f"{self.path}: {what} has value type {kind}, not a GGUF value type "
                            "(0..12)")
        item, count = self.scalar("I", what), self.scalar("Q", what)
        if item in SCALARS:
            dtype = np.dtype(f"<{SCALARS[item]}")
            values = np.frombuffer(self.take(count * dtype.itemsize, what), dtype)
            return ([float(str(np.float32(v))) for v in values] if item == FLOAT32
                    else values.tolist()), item
        if item == STRING:
            return self.strings(count, what), item
        raise GGUFError(f"{self.path}: {what} is an array of "
                        f"{'arrays' if item == ARRAY else f'value type {item}'}, not of numbers "
                        "or strings (what ggml's loader reads)")


class GGUFFile:
    """A GGUF file's metadata and tensor table, its tensors read on demand.

    Args:
        path: the ``.gguf`` file.

    Raises:
        FileNotFoundError: no such file.
        GGUFError: not GGUF (magic, version, a big-endian file), truncated (naming the key
            or tensor that runs past the end), a key or tensor given twice, an alignment that
            is not a ``uint32`` power of two, a tensor of a type this reader does not
            dequantize (naming it and the types read), of more than 4 dimensions or a name of
            64 bytes or more (llama.cpp's limits), or whose bytes are not where GGUF puts them
            (overlapping another's, out of table order, misaligned, past the file's end).
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
        if version not in VERSIONS and version & 0xFFFF == 0 and \
                int.from_bytes(version.to_bytes(4, "little"), "big") in VERSIONS:
            raise GGUFError(f"{path}: a big-endian GGUF file (version "
                            f"{int.from_bytes(version.to_bytes(4, 'little'), 'big')} written for "
                            "big-endian hosts, convert_hf_to_gguf.py --bigendian); this reader "
                            "reads little-endian GGUF files, the converter's default: convert "
                            "without --bigendian")
        if version not in VERSIONS:
            raise GGUFError(f"{path}: GGUF version {version}; this reader reads versions "
                            f"{', '.join(map(str, VERSIONS))}")
        n_tensors, n_kv = h.scalar("Q", "the tensor count"), h.scalar("Q", "the key count")
        size = len(self._map)
        if n_kv * LEAST_KV > size or n_tensors * LEAST_TENSOR > size:
            what, n = ("key", n_kv) if n_kv * LEAST_KV > size else ("tensor", n_tensors)
            raise GGUFError(f"{path}: the header says {n} {what}s, more than the file's {size} "
                            "bytes can hold (truncated, damaged, or not a GGUF file)")
        #: Every metadata key's value: numbers, text, or lists of them.
        self.metadata: dict[str, Any] = {}
        #: Every metadata key's GGUF value type, and its items' where it is an array.
        self.types: dict[str, tuple[int, int | None]] = {}
        for i in range(n_kv):
            key = h.string(f"metadata key {i}")
            if not key:
                raise GGUFError(f"{path}: metadata key {i} is empty")
            if key in self.metadata:
                raise GGUFError(f"{path}: metadata key {key} is given twice (keys {i} and an "
                                "earlier one): which value holds is not said; ggml's loader and "
                                "gguf's reader refuse the file")
            kind = h.scalar("I", f"metadata key {key}")
            self.metadata[key], item = h.value(kind, f"metadata key {key}")
            self.types[key] = (kind, item)
        infos = []
        for i in range(n_tensors):
            name = h.string(f"tensor {i}'s name")
            n_dims = h.scalar("I", f"tensor {name}")
            if n_dims > MAX_DIMS:
                raise GGUFError(f"{path}: tensor {name} has {n_dims} dimensions; GGUF tensors "
                                f"have at most {MAX_DIMS}")
            dims = [h.scalar("Q", f"tensor {name}") for _ in range(n_dims)]
            infos.append((name, dims, h.scalar("I", f"tensor {name}"), h.scalar("Q", f"tensor {name}")))
        self.alignment = align = self._alignment()
        start = -(-h.pos // align) * align
        #: Every tensor by its GGUF name, in file order.
        self.tensors: dict[str, GGUFTensor] = {}
        expected = 0  # where the next tensor's bytes begin in the data section (ggml's rule)
        for name, dims, kind, offset in infos:
            if len(name.encode()) >= MAX_NAME:
                raise GGUFError(f"{path}: tensor name {name[:80]!r} is {len(name.encode())} bytes; "
                                f"ggml's loader takes names of at most {MAX_NAME - 1}")
            if name in self.tensors:
                raise GGUFError(f"{path}: tensor {name} is listed twice in the tensor table: "
                                "which one holds is not said; ggml's loader and gguf's reader "
                                "refuse the file")
            t = self._tensor(name, dims, kind, start + offset)
            if offset != expected:
                where = ("is not aligned to the file's alignment of " f"{align} bytes"
                         if offset % align else
                         "overlaps the bytes of the tensor before it (or lies before them)"
                         if offset < expected else "leaves a gap after the tensor before it")
                raise GGUFError(f"{path}: tensor {name}'s data begins at byte {offset} of the data "
                                f"section, where GGUF puts it at byte {expected} (each tensor at "
                                f"the end of the one before it in the table, padded to {align} "
                                f"bytes): it {where}")
            self.tensors[name] = t
            expected += -(-(t.end - t.begin) // align) * align

    def _alignment(self) -> int:
        if "general.alignment" not in self.metadata:
            return ggml.GGUF_DEFAULT_ALIGNMENT
        value, (kind, _) = self.metadata["general.alignment"], self.types["general.alignment"]
        if kind != UINT32:
            raise GGUFError(f"{self.path}: metadata key general.alignment is "
                            f"{TYPE_NAMES.get(kind, kind)} {value!r}; GGUF stores it as a uint32 "
                            f"(a power of two; {ggml.GGUF_DEFAULT_ALIGNMENT} by default)")
        if value <= 0 or value & (value - 1):
            raise GGUFError(f"{self.path}: metadata key general.alignment is {value}, not a power "
                            f"of two (GGUF aligns tensor data to one; "
                            f"{ggml.GGUF_DEFAULT_ALIGNMENT} by default)")
        return value

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
        return self.text("general.architecture")

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

    def _typed(self, key: str, want: str) -> GGUFError:
        kind, item = self.types[key]
        held = TYPE_NAMES.get(kind, str(kind)) + (f" of {TYPE_NAMES.get(item, item)}"
                                                   if item is not None else "")
        value = self.metadata[key]
        shown = f"{value!r}" if not isinstance(value, list) else f"({len(value)} items)"
        return GGUFError(f"{self.path}: metadata key {key} is {held} {shown[:80]}; it must be "
                         f"{want}")

    def text(self, key: str, *default) -> str:
        """Metadata ``key``, a string (GGUFError naming the key where it is another type)."""
        if key not in self.metadata and default:
            return default[0]
        value = self.get(key)
        if self.types[key][0] != STRING:
            raise self._typed(key, "a string")
        return value

    def flag(self, key: str, *default) -> bool:
        """Metadata ``key``, a bool (GGUFError naming the key where it is another type)."""
        if key not in self.metadata and default:
            return default[0]
        value = self.get(key)
        if self.types[key][0] != BOOL:
            raise self._typed(key, "a bool")
        return bool(value)

    def count(self, key: str, *default, least: int = 1) -> int:
        """Metadata ``key``, a whole number of at least ``least`` (a count: a head count of 0
        would divide by zero later).

        Raises:
            GGUFError: missing with no default, another type, or below ``least``.
        """
        if key not in self.metadata and default:
            return default[0]
        value = self.get(key)
        if self.types[key][0] not in INTEGERS:
            raise self._typed(key, f"a whole number of at least {least}")
        if value < least:
            raise GGUFError(f"{self.path}: metadata key {key} is {value}; it must be at least "
                            f"{least}")
        return value

    def number(self, key: str, *default, positive: bool = True) -> float:
        """Metadata ``key``, a finite number (above 0 where ``positive``: an epsilon, a RoPE
        base, a softcap).

        Raises:
            GGUFError: missing with no default, another type, not finite, or not positive.
        """
        if key not in self.metadata and default:
            return default[0]
        value = self.get(key)
        if self.types[key][0] not in INTEGERS + (FLOAT32, FLOAT64):
            raise self._typed(key, "a number")
        if not math.isfinite(value) or (positive and value <= 0):
            raise GGUFError(f"{self.path}: metadata key {key} is {value}; it must be a finite "
                            f"number{' above 0' if positive else ''}")
        return value

    def array(self, key: str, item: str, *default) -> list:
        """Metadata ``key``, an array of ``item`` (``string``, ``integer`` or ``number``)."""
        if key not in self.metadata and default:
            return default[0]
        value = self.get(key)
        kind, items = self.types[key]
        ok = {"string": (STRING,), "integer": INTEGERS,
              "number": INTEGERS + (FLOAT32, FLOAT64)}[item]
        if kind != ARRAY or items not in ok:
            raise self._typed(key, f"an array of {item}s")
        return value

    def blocks(self, name: str) -> tuple[Format, np.ndarray]:
        """Tensor ``name`` as stored: its format and a read-only uint8 view of the mapped
        file, ``(rows, row bytes)`` with rows in numpy's order (``shape[:-1]`` flattened),
        each row ``shape[-1] / format.block`` blocks of ``format.nbytes`` bytes. What a
        kernel reading Q8_0 (or any block format) as it is takes; ``read`` dequantizes."""
        t = self.tensors[name]
        raw = np.frombuffer(self._map, np.uint8, t.end - t.begin, t.begin)
        cols = t.shape[-1] // t.format.block * t.format.nbytes if t.shape else t.format.nbytes
        return t.format, raw.reshape(-1, cols) if cols else raw.reshape(0, 0)

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


# config.json key <- GGUF metadata key (under {arch}., general.architecture), as llama.cpp's
# convert_hf_to_gguf.py writes them (TextModel.set_gguf_parameters) and transformers'
# GGUF_CONFIG_MAPPING reads them back: the keys most families share, under transformers'
# common names. A spec's gguf.config renames them (GPT-2's n_embd) and adds its own.
COMMON: dict[str, Source] = {
    "hidden_size": Source("embedding_length"),
    "intermediate_size": Source("feed_forward_length"),
    "num_hidden_layers": Source("block_count"),
    "num_attention_heads": Source("attention.head_count"),
    "num_key_value_heads": Source("attention.head_count_kv"),
    "head_dim": Source("attention.key_length"),
    "max_position_embeddings": Source("context_length"),
    "rope_theta": Source("rope.freq_base"),
    "rms_norm_eps": Source("attention.layer_norm_rms_epsilon"),
    "layer_norm_eps": Source("attention.layer_norm_epsilon"),
    "sliding_window": Source("attention.sliding_window"),
    "attn_logit_softcapping": Source("attn_logit_softcapping"),
    "final_logit_softcapping": Source("final_logit_softcapping"),
    "vocab_size": Source(computed="vocab_size"),
    "tie_word_embeddings": Source(computed="tie_word_embeddings"),
    "partial_rotary_factor": Source(computed="partial_rotary_factor"),
    "rope_scaling": Source(computed="rope_scaling"),
    "bos_token_id": Source("tokenizer.ggml.bos_token_id"),
    "eos_token_id": Source("tokenizer.ggml.eos_token_id"),
    "pad_token_id": Source("tokenizer.ggml.padding_token_id"),
}
# What each computed source gives (Source.computed).
COMPUTED = {
    "vocab_size": "the vocabulary's size: {arch}.vocab_size, else tokenizer.ggml.tokens' count",
    "tie_word_embeddings": "true where the file holds no output.weight (the head is the "
                           "embedding), as transformers' load_gguf_checkpoint",
    "partial_rotary_factor": "rope.dimension_count / the head size, where RoPE turns part of "
                             "each head",
    "rope_scaling": "RoPE scaling from rope.scaling.* (linear, yarn), the rope_factors_long "
                    "and rope_factors_short tensors (longrope) or rope_freqs (per-frequency "
                    "factors, as a longrope table of them over the whole context)",
}
# The type each metadata key llama.cpp reads must have (a key a spec names that is not here
# may hold any one number, string or bool): counts (the least each may be), positive numbers,
# numbers, bools, token ids.
COUNTS = {"block_count": 1, "embedding_length": 1, "feed_forward_length": 1,
          "attention.head_count": 1, "attention.head_count_kv": 1, "attention.key_length": 1,
          "attention.value_length": 1, "context_length": 1, "vocab_size": 1,
          "rope.dimension_count": 0, "attention.sliding_window": 0,
          "rope.scaling.original_context_length": 1, "expert_count": 0}
POSITIVE = ("attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon", "rope.freq_base",
            "attn_logit_softcapping", "final_logit_softcapping", "rope.scaling.factor",
            "embedding_scale", "residual_scale", "attention.scale", "logit_scale",
            "rope.scaling.attn_factor", "rope.scaling.yarn_attn_factor")
NUMBERS = ("rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow",
           "rope.scaling.yarn_ext_factor")
FLAGS = ("use_parallel_residual", "attention.causal")
# Metadata this reader cannot give a config.json for, with why (a value that says "none of
# it" is no refusal; a key a spec maps to a config.json key of its own is the spec's to judge:
# BERT's attention.causal false is its is_decoder false).
REFUSED = {
    "expert_count": ("mixture-of-experts layers", 0),
    "attention.q_lora_rank": ("low-rank attention projections", 0),
    "rope.dimension_sections": ("multimodal RoPE sections (M-RoPE)", None),
    "attention.causal": ("attention both ways (attention.causal false)", True),
}
ROPE_SCALINGS = ("none", "linear", "yarn", "longrope")
REFUSED_TENSORS: dict[str, str] = {}
LONGROPE = ("rope_factors_long.weight", "rope_factors_short.weight")
# Per-frequency divisors of RoPE's inverse frequencies (llama.cpp's freq_factors): what
# convert_hf_to_gguf.py's LlamaModel writes for llama3 RoPE scaling, its parameters gone.
ROPE_FREQS = "rope_freqs.weight"
FACTORS = LONGROPE + (ROPE_FREQS,)  # read by config, no tensors of the model
_ABSENT = object()


def _key(arch: str, key: str) -> str:
    return key if key.startswith(("general.", "tokenizer.")) else f"{arch}.{key}"


def metadata(file: GGUFFile, arch: str, key: str, default: Any = _ABSENT) -> Any:
    """Metadata ``key`` (under ``{arch}.`` unless ``general.``/``tokenizer.``), checked for
    the type llama.cpp reads it as (``COUNTS``, ``POSITIVE``, ``NUMBERS``, ``FLAGS``, token
    ids), or ``default`` where the file has none.

    Raises:
        GGUFError: a value of another type or out of range (naming the key and what it must
            be), or a list (one value per layer: config.json takes one).
    """
    full = _key(arch, key)
    if full not in file.metadata:
        return default
    if file.types[full][0] == ARRAY:
        raise GGUFError(f"{file.path}: metadata key {full} is a list of "
                        f"{len(file.metadata[full])} values (one per layer?); config.json takes "
                        "one, and no spec maps a list")
    if key in COUNTS:
        return file.count(full, least=COUNTS[key])
    if key in POSITIVE or key in NUMBERS:
        return file.number(full, positive=key in POSITIVE)
    if key in FLAGS:
        return file.flag(full)
    if full.startswith("tokenizer.ggml.") and full.endswith("_token_id"):
        return file.count(full, least=0)
    return file.metadata[full]


def _resolve(file: GGUFFile, arch: str, source: Source, own: bool = False) -> Any:
    """``source``'s value in ``file`` (``_ABSENT``: the file gives none); ``own``: the
    spec's own key (a computed RoPE fraction of 1 is given, not left to its default)."""
    if source.metadata is not None:
        return metadata(file, arch, source.metadata)
    if source.tensor is not None:
        return source.present if source.tensor in file.tensors else source.absent
    if source.computed is None:
        return source.value
    if source.computed == "vocab_size":
        return vocab_size(file, arch)
    if source.computed == "tie_word_embeddings":
        return "output.weight" not in file.tensors
    if source.computed == "partial_rotary_factor":
        rotary = metadata(file, arch, "rope.dimension_count", None)
        head = _head_dim(file, arch)
        return _ABSENT if rotary is None or (rotary == head and not own) else rotary / head
    if source.computed == "rope_scaling":
        return _rope_scaling(file, arch)
    raise GGUFError(f"computed config source {source.computed!r} is not one of "
                    f"{', '.join(COMPUTED)}")


def _head_dim(file: GGUFFile, arch: str) -> int:
    hidden = metadata(file, arch, "embedding_length")
    heads = metadata(file, arch, "attention.head_count")
    return metadata(file, arch, "attention.key_length", None) or hidden // heads


def vocab_size(file: GGUFFile, arch: str) -> int:
    """The vocabulary's size: ``{arch}.vocab_size``, else ``tokenizer.ggml.tokens``' count;
    the token list as long as the embedding's rows, and ``vocab_size`` as either.

    Raises:
        GGUFError: no token list and no ``vocab_size``; a token list of another length than
            the embedding's rows or ``vocab_size`` (naming both).
    """
    size = metadata(file, arch, "vocab_size", None)
    tokens = file.array("tokenizer.ggml.tokens", "string", None) \
        if "tokenizer.ggml.tokens" in file.metadata else None
    if size is None:
        size = len(file.get("tokenizer.ggml.tokens") if tokens is None else tokens)
    rows = file.tensors.get("token_embd.weight")
    rows = rows.shape[0] if rows is not None and rows.shape else None
    if tokens is not None and len(tokens) != size:
        raise GGUFError(f"{file.path}: tokenizer.ggml.tokens holds {len(tokens)} tokens and "
                        f"{_key(arch, 'vocab_size')} is {size}: every id the model scores needs "
                        "a token, and every token an id")
    if rows is not None and rows != size:
        raise GGUFError(f"{file.path}: tokenizer.ggml.tokens holds {size} tokens and "
                        f"token_embd.weight has {rows} rows (one per token): "
                        + ("ids past the vocabulary would have no text"
                           if size < rows else "tokens past the embedding would have no row"))
    return size


def _rope_scaling(file: GGUFFile, arch: str) -> Any:
    kind = file.text(_key(arch, "rope.scaling.type"), "none")
    if kind not in ROPE_SCALINGS:
        raise GGUFError(f"{file.path}: metadata key {_key(arch, 'rope.scaling.type')} is "
                        f"{kind!r}; this reader maps {', '.join(ROPE_SCALINGS)} to a config.json")
    if ROPE_FREQS in file.tensors:
        # llama.cpp divides each inverse frequency by its factor at every position: a
        # longrope table of these factors, short and long alike, over the whole context
        # (original_max_position_embeddings = max_position_embeddings: no attention factor).
        if kind != "none" or any(n in file.tensors for n in LONGROPE):
            raise GGUFError(f"{file.path}: tensor {ROPE_FREQS} holds RoPE factors beside "
                            f"{_key(arch, 'rope.scaling.type')} {kind!r} or longrope's factors")
        factors = _factors(file, arch, ROPE_FREQS)
        return {"rope_type": "longrope", "long_factor": factors, "short_factor": factors,
                "original_max_position_embeddings":
                    metadata(file, arch, "context_length", None) or file.get(_key(arch, "context_length"))}
    long = [n for n in LONGROPE if n in file.tensors]
    if long and kind not in ("none", "longrope"):
        raise GGUFError(f"{file.path}: tensor {long[0]} holds longrope factors, and "
                        f"{_key(arch, 'rope.scaling.type')} is {kind!r}")
    if long:
        if len(long) != 2:
            raise GGUFError(f"{file.path}: tensor {long[0]} is in the file and "
                            f"{(set(LONGROPE) - set(long)).pop()} is not: longrope takes both")
        factors = [_factors(file, arch, name) for name in LONGROPE]
        out = {"rope_type": "longrope", "long_factor": factors[0], "short_factor": factors[1]}
        original = metadata(file, arch, "rope.scaling.original_context_length", None)
        if original is not None:
            out["original_max_position_embeddings"] = original
        return out
    if kind == "none":
        return _ABSENT
    factor = metadata(file, arch, "rope.scaling.factor", None)
    if factor is None:
        file.get(_key(arch, "rope.scaling.factor"))  # raises, naming the key
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "longrope":
        raise GGUFError(f"{file.path}: {_key(arch, 'rope.scaling.type')} is longrope and the "
                        f"file holds no {LONGROPE[0]} and {LONGROPE[1]} (its factors)")
    out = {"rope_type": "yarn", "factor": factor,
           "original_max_position_embeddings":
               metadata(file, arch, "rope.scaling.original_context_length", None)
               or file.get(_key(arch, "rope.scaling.original_context_length"))}
    for key, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
        value = metadata(file, arch, f"rope.scaling.{key}", None)
        if value is not None:
            out[name] = value
    return out


def _factors(file: GGUFFile, arch: str, name: str) -> list[float]:
    """Tensor ``name``'s RoPE factors: one per rotated pair, finite and above 0."""
    half = int(metadata(file, arch, "rope.dimension_count", None) or _head_dim(file, arch)) // 2
    t = file.tensors[name]
    if t.shape != (half,):
        raise GGUFError(f"{file.path}: tensor {name} has shape {list(t.shape)}; RoPE factors "
                        f"are one per rotated pair ({half})")
    values = file.read(name)
    if not np.isfinite(values).all() or (values <= 0).any():
        raise GGUFError(f"{file.path}: tensor {name} holds factors that are not finite and "
                        "above 0")
    return [float(v) for v in values]


def sources(layout: Layout) -> dict[str, Source]:
    """config.json key -> its source for ``layout``'s family: the common ones (``COMMON``),
    less any whose source a spec's key takes (its key, not the common one, holds it) or that
    a spec drops (None), with the spec's own."""
    out = dict(COMMON)
    own = dict(layout.config)
    for key, source in layout.config:
        for common, s in list(out.items()):
            if source is not None and s == source and common not in own:
                del out[common]
        out.pop(key, None)
        if source is not None:
            out[key] = source
    return out


def config(file: GGUFFile, layout: Layout) -> dict:
    """The config.json of ``file``'s model: each key of ``sources(layout)`` the file holds,
    and ``architectures`` from ``layout``. Keys the file does not hold are left out: the
    spec's defaults (transformers' config class's, which llama.cpp assumes too) apply.

    Raises:
        GGUFError: ``general.architecture`` is not ``layout``'s, a required key is missing
            (named), a value of the wrong type or range (named, with what it must be), a
            per-layer list where one value is read, a vocabulary of another size than the
            embedding, or metadata or a tensor this reader cannot serve (``REFUSED``,
            ``REFUSED_TENSORS``, naming the key or tensor).
    """
    arch = file.architecture
    if arch != layout.architecture:
        raise GGUFError(f"{file.path}: general.architecture is {arch}, not {layout.architecture} "
                        f"(the spec's gguf.architecture)")
    claimed = {s.metadata for _, s in layout.config if s is not None}
    for key, (what, harmless) in REFUSED.items():
        full = _key(arch, key)
        if full in file.metadata and file.metadata[full] != harmless and key not in claimed:
            raise GGUFError(f"{file.path}: metadata {full} = {file.metadata[full]!r}: {what}, "
                            "which no spec's GGUF reading serves")
    for name, what in REFUSED_TENSORS.items():
        if name in file.tensors:
            raise GGUFError(f"{file.path}: tensor {name} holds {what}; not served (a GGUF "
                            "converted from a checkpoint without RoPE scaling, or the "
                            "safetensors checkpoint, loads)")
    structure(file)
    out: dict[str, Any] = {"architectures": list(layout.architectures)}
    own = dict(layout.config)
    for key, source in sources(layout).items():
        value = _resolve(file, arch, source, key in own)
        if value is not _ABSENT:
            out[key] = value
    if out.get("sliding_window", None) == 0:  # llama.cpp's "no window" (Phi-3's converter)
        out["sliding_window"] = None
    size = vocab_size(file, arch)
    for key in ("bos", "eos", "padding", "unknown", "eot", "eom"):
        i = metadata(file, arch, f"tokenizer.ggml.{key}_token_id", None)
        if i is not None and i >= size:
            raise GGUFError(f"{file.path}: metadata key tokenizer.ggml.{key}_token_id is {i}, "
                            f"not an id of the {size} tokens")
    return out


@dataclass(frozen=True)
class Structure:
    """The counts every GGUF of a transformer states, checked: ``layers``, ``hidden`` size,
    query ``heads``, ``kv_heads`` and the ``head_dim`` of q and k."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int


def structure(file: GGUFFile) -> Structure:
    """``file``'s ``Structure`` from its ``{arch}.block_count``, ``embedding_length``,
    ``attention.head_count`` (``_kv``, default every head) and ``attention.key_length``
    (default the hidden size over the heads).

    Raises:
        GGUFError: a key missing or of the wrong type or range, naming it.
    """
    arch = file.architecture
    need = {k: metadata(file, arch, k) for k in ("block_count", "embedding_length",
                                                  "attention.head_count")}
    for k, v in need.items():
        if v is _ABSENT:
            file.get(_key(arch, k))  # raises, naming it
    heads = need["attention.head_count"]
    return Structure(need["block_count"], need["embedding_length"], heads,
                     metadata(file, arch, "attention.head_count_kv", heads),
                     metadata(file, arch, "attention.key_length", None)
                     or need["embedding_length"] // heads)


@dataclass(frozen=True)
class _Entry:
    """Where one checkpoint tensor lies in the file: GGUF tensor ``gguf`` (of llama.cpp type
    ``kind``), all of it or its rows ``rows`` (a part of a fused q/k/v) or its row ``row``
    (one head's norm of a stacked per-head norm), ``transposed`` back to transformers'
    ``[in, out]`` Conv1D layout."""

    gguf: str
    kind: Any = None
    rows: tuple[int, int] | None = None
    row: int | None = None
    transposed: bool = False


_PER_HEAD = re.compile(r"^(.*)\.norms\.(\d+)\.weight$")
_QKV_PARTS = {ggml.MODEL_TENSOR.ATTN_Q: 0, ggml.MODEL_TENSOR.ATTN_K: 1, ggml.MODEL_TENSOR.ATTN_V: 2}


class GGUFCheckpoint:
    """A GGUF file's tensors under transformers' checkpoint names, in transformers' layout,
    read on demand as float32: what ``runtime.checkpoint.load`` takes, as it takes a
    safetensors ``Checkpoint``.

    Each name of ``names`` (the checkpoint names a model reads) is renamed to llama.cpp's as
    its converter renames it (``gguf.TensorNameMap`` of the file's architecture). Where the
    converter merged tensors, a name reads its part: q, k or v of an ``attn_qkv`` fused by
    ``--fuse-qkv`` (rows [q; k; v]), one head's row of a per-head norm stacked into one
    tensor (StableLM's ``q_layernorm.norms.{h}``). A file's tensor no name leads to keeps its
    GGUF name (so loading reports it, by that name); the longrope factors ``config`` read
    are not tensors of the model.

    Args:
        file: the GGUF file.
        layout: what the converter did (``Layout``), undone on read.
        config: the file's config.json (``config``; its counts are read from the metadata).
        names: the checkpoint names to look for.
        transposed: those of ``names`` transformers stores ``[in, out]`` (Conv1D): llama.cpp
            stores every matrix ``[out, in]``, so they are transposed back.

    Raises:
        GGUFError: the file's architecture is one the gguf package does not know.
    """

    def __init__(self, file: GGUFFile, layout: Layout, config: dict, names: Iterable[str],
                 transposed: Iterable[str] = ()):
        self.file, self.layout, self.path = file, layout, file.path
        arch = {v: k for k, v in ggml.MODEL_ARCH_NAMES.items()}.get(file.architecture)
        if arch is None:
            raise GGUFError(f"{file.path}: general.architecture {file.architecture} is not one the "
                            "gguf package names tensors for")
        self.structure = s = structure(file)
        table = ggml.get_tensor_name_map(arch, s.layers)
        transposed = set(transposed)
        self._source: dict[str, _Entry] = {}
        for name in names:
            entry = self._find(table, name)
            if entry is not None:
                self._source.setdefault(name, replace(entry, transposed=name in transposed))
        taken = {e.gguf for e in self._source.values()}
        for g in file.tensors:
            if g not in taken and g not in FACTORS:
                self._source[g] = _Entry(g)
        #: Every tensor by its checkpoint name: ``.shape`` (transformers'), ``.begin``, ``.end``.
        self.tensors = {n: self._info(e) for n, e in self._source.items()}

    def _find(self, table, name: str) -> _Entry | None:
        found = table.get_type_and_name(name, try_suffixes=(".weight", ".bias"))
        if found is not None and found[1] in self.file.tensors:
            return _Entry(found[1], found[0])
        if found is not None and found[0] in _QKV_PARTS:  # a fused attn_qkv (--fuse-qkv)
            suffix = found[1][found[1].rindex("."):]
            fused = re.sub(r"\.attn_[qkv]\.", ".attn_qkv.", found[1][:-len(suffix)] + ".") \
                .rstrip(".") + suffix
            if fused in self.file.tensors:
                s = self.structure
                q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
                begin = (0, q, q + kv)[_QKV_PARTS[found[0]]]
                return _Entry(fused, found[0], rows=(begin, begin + (q if begin == 0 else kv)))
        per_head = _PER_HEAD.match(name)
        if per_head is not None:  # one head of a stacked per-head norm
            whole = table.get_type_and_name(per_head[1] + ".weight", try_suffixes=(".weight",))
            if whole is not None and whole[1] in self.file.tensors:
                return _Entry(whole[1], whole[0], row=int(per_head[2]))
        return None

    def _info(self, e: _Entry) -> GGUFTensor:
        t = self.file.tensors[e.gguf]
        shape, begin, end = t.shape, t.begin, t.end
        if (e.rows is not None or e.row is not None) and shape:
            per_row = (end - begin) // max(1, shape[0])
            first, last = e.rows if e.rows is not None else (e.row, e.row + 1)
            if last > shape[0]:
                raise GGUFError(f"{self.path}: tensor {e.gguf} has {shape[0]} rows; its part "
                                f"{e.kind.name.lower()} needs rows {first}..{last - 1}")
            shape = (last - first, *shape[1:]) if e.rows is not None else shape[1:]
            begin, end = begin + first * per_row, begin + last * per_row
        if e.transposed:
            shape = shape[::-1]
        return replace(t, shape=tuple(shape), begin=begin, end=end)

    def gguf_name(self, name: str) -> str:
        """The file's name of checkpoint tensor ``name``."""
        return self._source[name].gguf

    def _order(self, e: _Entry, rows: int) -> np.ndarray | None:
        """The file's rows of entry ``e`` in transformers' order (None: as they are)."""
        s, order = self.structure, None
        if e.kind == ggml.MODEL_TENSOR.ATTN_QKV and self.layout.qkv is not None:
            order = regroup(np.arange(rows), self.layout.qkv, s.heads, s.kv_heads)
        heads = {ggml.MODEL_TENSOR.ATTN_Q: s.heads, ggml.MODEL_TENSOR.ATTN_K: s.kv_heads}
        if self.layout.rope_permuted and e.kind in heads:
            order = unpermute(np.arange(rows), heads[e.kind])
        return order

    def _part(self, e: _Entry, array: np.ndarray) -> np.ndarray:
        if e.rows is not None:
            array = array[e.rows[0]:e.rows[1]]
        elif e.row is not None:
            array = array[e.row]
        return array

    def raw(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a new float32 array, transformers' layout restored."""
        e = self._source[name]
        array = self._part(e, self.file.read(e.gguf))
        order = self._order(e, array.shape[0]) if array.ndim else None
        if order is not None:
            array = array[order]
        if self.layout.norm_offset and name.endswith("norm.weight"):
            array = array - np.float32(self.layout.norm_offset)
        if e.transposed:
            array = array.T
        return np.ascontiguousarray(array, dtype=np.float32)

    def read(self, name: str) -> np.ndarray:
        array = self.raw(name)
        self.release(name)
        return array

    def blocks(self, name: str) -> tuple[Format, np.ndarray]:
        """Tensor ``name`` as stored, its blocks untouched, rows in transformers' order: its
        format and a uint8 array ``(rows, row bytes)`` (``GGUFFile.blocks``; a view of the
        file, or a copy where rows are put back in transformers' order: a ``rope_permuted``
        projection's, a reordered fused q/k/v's, which moves whole rows and so keeps every
        block). ``dequantize(*reversed(blocks(name)))`` reshaped is ``raw(name)``: what a
        kernel running Q8_0 (or any block format) weights as they are reads.

        Raises:
            GGUFError: the tensor is one ``norm_offset`` shifts (its values change: ``raw``),
                or one transposed back to transformers' ``[in, out]`` (its blocks run along
                the other axis: ``raw``).
        """
        e = self._source[name]
        if self.layout.norm_offset and name.endswith("norm.weight"):
            raise GGUFError(f"{self.path}: tensor {e.gguf} is stored shifted by "
                            f"{self.layout.norm_offset}; read it with raw()")
        if e.transposed:
            raise GGUFError(f"{self.path}: tensor {e.gguf} is stored [out, in], transformers' "
                            f"{name} [in, out]; read it with raw()")
        fmt, rows = self.file.blocks(e.gguf)
        t = self.file.tensors[e.gguf]
        vector = len(t.shape) == 1
        if vector and fmt.block == 1:
            rows = rows.reshape(-1, fmt.nbytes)  # a value a row, to move values as rows
        if e.row is not None:
            rows = rows.reshape(t.shape[0], -1)[e.row].reshape(1, -1)
        else:
            rows = self._part(e, rows)
        order = self._order(e, rows.shape[0])
        if vector and fmt.block != 1 and (order is not None or e.rows is not None):
            raise GGUFError(f"{self.path}: tensor {e.gguf} is a {fmt.name} vector whose values "
                            "move on read; read it with raw()")
        if order is not None:
            rows = rows[order]
        return fmt, np.ascontiguousarray(rows.reshape(1, -1) if vector else rows)

    def stored(self, name: str):
        """Tensor ``name`` of two dimensions as a held form (``operators.held``): its blocks
        (``Blocks``) or its float16 / bfloat16 values, a view of the file (a copy where its
        rows are put back: ``blocks``); None where it is float32, not a matrix, or stored
        transposed from transformers' layout (GPT-2's Conv1D: read widened by ``raw``)."""
        t = self.tensors[name]
        if self.stored_form(name) is None:
            return None
        fmt, rows = self.blocks(name)
        if fmt.name == "F16":
            return rows.view(np.float16).reshape(t.shape)
        if fmt.name == "BF16":
            return rows.view(ml_dtypes.bfloat16).reshape(t.shape)
        return holding.blocks(fmt.name, np.ascontiguousarray(rows), t.shape)

    def stored_form(self, name: str) -> str | None:
        """The form ``stored(name)`` holds (``Q4_0``, ``BF16``, ...), from the header alone;
        None where it gives None."""
        t = self.tensors[name]
        if len(t.shape) != 2 or t.format.name == "F32" or self._source[name].transposed or (
                self.layout.norm_offset and name.endswith("norm.weight")):
            return None
        return t.format.name

    def release(self, name: str) -> None:
        self.file.release(self._source[name].gguf)

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


def regroup(w: np.ndarray, layout: str, heads: int, kv_heads: int) -> np.ndarray:
    """Fused q/k/v rows ``[q; k; v]`` (llama.cpp's) back to transformers' ``layout``:
    ``heads``, each head's q, k and v rows together (GPT-NeoX's ``query_key_value``, which
    convert_hf_to_gguf.py's ``GPTNeoXModel`` splits into three blocks); ``groups``, each kv
    group's query heads, then its k and v (Falcon's, which ``FalconModel`` splits so).

    Raises:
        GGUFError: the rows do not split into that many heads, or the layout is unknown.
    """
    rows = w.shape[0]
    if layout == "heads":
        if rows % (3 * heads):
            raise GGUFError(f"{rows} fused q/k/v rows do not split into 3 x {heads} heads")
        return np.ascontiguousarray(
            w.reshape(3, heads, rows // 3 // heads, *w.shape[1:]).swapaxes(0, 1).reshape(w.shape))
    if layout == "groups":
        if heads % kv_heads or rows % (heads + 2 * kv_heads):
            raise GGUFError(f"{rows} fused q/k/v rows do not split into {heads} query and "
                            f"2 x {kv_heads} kv heads")
        d = rows // (heads + 2 * kv_heads)
        q = w[:heads * d].reshape(kv_heads, heads // kv_heads, d, *w.shape[1:])
        k = w[heads * d:(heads + kv_heads) * d].reshape(kv_heads, 1, d, *w.shape[1:])
        v = w[(heads + kv_heads) * d:].reshape(kv_heads, 1, d, *w.shape[1:])
        return np.ascontiguousarray(np.concatenate([q, k, v], axis=1).reshape(w.shape))
    raise GGUFError(f"fused q/k/v layout {layout!r} is not heads or groups")
