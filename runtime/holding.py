"""What a model's weights are held as once loaded: the form the checkpoint stores, or one
the user asks for, converted at load.

``WEIGHTS`` names the choices (``load(weights=...)``, ``--weights``):

- ``stored`` (the default): each projection's and embedding's matrix (``Param.holdable``) in
  the form its file stores it: a bfloat16 or float16 safetensors tensor as a read-only view of
  the memory-mapped file, a GGUF tensor as its blocks (``operators.held``); float32 where the
  file stores float32 (or float64). Nothing is widened, nothing is copied but where the model's
  layout moves a tensor's rows (a fused projection stored per head, GGUF's permuted q/k).
- ``float32``: every weight widened to float32 at load (the reference kernels' form; four
  bytes a weight).
- ``bfloat16``, ``float16``: each holdable matrix rounded to nearest (ties to even) at load;
  a tensor stored in that form is held as stored.
- ``q8_0``, ``q4_0``, ``q4_1``, ``q5_0``, ``q5_1``: each holdable matrix whose rows are whole
  32-value blocks quantized at load by gguf-py's ``quants.quantize`` (llama.cpp's reference
  quantizers, the bytes its ``llama-quantize`` writes for these types), from the values the
  file holds; a tensor stored in that form is held as stored, one in another block form is
  widened first (quantized twice: what llama.cpp's ``--allow-requantize`` does; its
  llama-quantize refuses it without, here it is done and a load says so once, a warning
  on the ``iron_spec`` logger: ``runtime.checkpoint.requantized``). So is a block form
  rounded to ``bfloat16`` or ``float16``.

What every other param holds (norm weights, biases, tables other operators read) is float32.
What a conversion costs is judged by ``check``'s KL gates, as any reduced precision.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from iron_spec.operators import formats, held, native
from iron_spec.operators.held import Blocks

from .quants import FORMATS

#: Each choice of ``weights`` and the form a holdable matrix takes (None: as stored).
WEIGHTS = {"stored": None, "float32": "F32", "bfloat16": "BF16", "float16": "F16",
           "q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1", "q5_0": "Q5_0", "q5_1": "Q5_1"}
#: The stored dtypes a safetensors tensor may be held in as it is.
STORED = {"BF16": "BF16", "F16": "F16"}

#: The forms whose conversion holds the output matrix (``OUTPUT``) at Q8_0 instead, as
#: llama.cpp's quantizer keeps it (``llama_tensor_get_type``: the output matrix, or the
#: token embedding where it is tied, at Q6_K, Q8_0 where its rows are not whole 256-value
#: blocks; no Q6_K quantizer here, so Q8_0 throughout). On SmolLM2 this makes ``q4_0`` the
#: bytes of llama.cpp's own Q4_0 file: KL vs the golden mean 0.183 where the lm_head at Q4_0
#: cost 0.275 (docs/checking.md).
OUTPUT_Q8_0 = ("Q4_0", "Q4_1", "Q5_0", "Q5_1")
OUTPUT = "lm_head.weight"  # the model's name of the output matrix (every causal spec's)

PIECE_BYTES = 8 * 2**20  # float32 bytes of a matrix converted at a time (gguf-py's quantizers
#                          take several temporaries of a piece: a transient of ~50 MB)


def choice(weights: str) -> str | None:
    """The form ``weights`` holds a holdable matrix in (None: as stored).

    Raises:
        ValueError: ``weights`` is none of ``WEIGHTS``.
    """
    if weights not in WEIGHTS:
        raise ValueError(f"weights={weights!r} is not one of {', '.join(WEIGHTS)}")
    return WEIGHTS[weights]


def form_for(name: str, form: str | None, output: set[str]) -> str | None:
    """The form param ``name`` is held in where ``form`` is asked for: Q8_0 for the output
    matrix (a name in ``output``: ``OUTPUT`` and the param it is tied to) under a 4- or 5-bit
    form (``OUTPUT_Q8_0``), else ``form``."""
    return "Q8_0" if form in OUTPUT_Q8_0 and name in output else form


def blocks(form: str, data: np.ndarray, shape: tuple[int, int]) -> Blocks:
    """``data`` (uint8 rows of ``form``'s blocks) as a held matrix of ``shape``, widened by
    ``runtime.quants``' numpy dequantizer where a reference needs its values."""
    return Blocks(form, data, shape, FORMATS[form].blocks)


def held_form(weight) -> str:
    """The form a param's array is held in (``operators.held.form``)."""
    return held.form(weight)


def convert(values, form: str, name: str):
    """``values`` (a held matrix in any form, or float32) as ``form`` (``WEIGHTS``' values),
    a piece of rows at a time: never a float32 copy of the whole. Returns ``values`` itself
    where it is held so already.

    Raises:
        ValueError: a block form on rows that are not whole 32-value blocks, or values not
            finite (naming ``name``).
    """
    if form == "F32":
        return held.widen_all(values) if held.is_held(values) else values
    if held.is_held(values) and held.form(values) == form:
        return values
    rows, k = values.shape
    if form in held.BLOCKS and k % held.BLOCKS[form][0]:
        raise ValueError(f"{name}: rows of {k} values are not whole {form} blocks of "
                         f"{held.BLOCKS[form][0]}, so this model cannot be held as {form}; "
                         "hold it as stored, bfloat16 or float32 (--weights / weights=)")
    step = max(1, PIECE_BYTES // (4 * k))
    if form == "BF16":
        out = np.empty((rows, k), np.uint16)
    elif form == "F16":
        out = np.empty((rows, k), np.float16)
    else:
        out = np.empty((rows, k // held.BLOCKS[form][0] * held.BLOCKS[form][1]), np.uint8)
    for lo in range(0, rows, step):
        piece = held.widen(values, lo, lo + step)
        if not np.isfinite(piece).all():
            raise ValueError(f"{name}: holds values that are not finite")
        if form == "BF16":
            out[lo: lo + step] = formats.round_bfloat16(piece)
        elif form == "F16":
            with np.errstate(over="ignore"):
                out[lo: lo + step] = piece.astype(np.float16)
            if not np.isfinite(out[lo: lo + step]).all():
                raise ValueError(f"{name}: a value past float16's largest (65504)")
        else:
            out[lo: lo + step] = gguf_quants.quantize(piece, GGMLQuantizationType[form])
    if form == "BF16":
        return out.view(ml_dtypes.bfloat16)
    if form == "F16":
        return out
    return blocks(form, out, (rows, k))


def not_finite(weight) -> int:
    """How many values of a held matrix are not finite (NaN or infinite): a float form's by
    its bit patterns, a block form's by its scales (its values are finite exactly where they
    are). On the pool where it is built (the first pass over a mapped file's pages: it brings
    them in too), else by numpy a piece at a time."""
    lib = native.lib()
    if lib is not None and held.contiguous(weight):
        return lib.nonfinite(held.raw(weight), held.code(weight))
    bad = 0
    if isinstance(weight, Blocks):
        block, nbytes = held.BLOCKS[weight.form]
        flat = weight.data.reshape(-1, nbytes)
        # Where each form keeps its float16 scale and minimum (ggml-common.h).
        offsets = {"Q6_K": (208,), "Q4_1": (0, 2), "Q5_1": (0, 2), "Q4_K": (0, 2),
                   "Q5_K": (0, 2)}.get(weight.form, (0,))
        step = max(1, PIECE_BYTES // nbytes)
        for lo in range(0, len(flat), step):
            part = flat[lo: lo + step]
            bits = [np.ascontiguousarray(part[:, at: at + 2]).view(np.uint16).reshape(-1)
                    for at in offsets]
            bad += int(np.count_nonzero(np.logical_or.reduce(
                [(b & 0x7C00) == 0x7C00 for b in bits]))) * block
        return bad
    bits = held.raw(weight).reshape(-1).view(np.uint16)
    mask = 0x7F80 if held.form(weight) == "BF16" else 0x7C00
    step = PIECE_BYTES // 2
    for lo in range(0, bits.size, step):
        bad += int(np.count_nonzero((bits[lo: lo + step] & mask) == mask))
    return bad


def hold_all(module, weights: str) -> None:
    """Convert every holdable matrix of ``module`` (filled, float32: drawn weights) to what
    ``weights`` holds (``convert``); ``stored`` and ``float32`` leave them as they are."""
    form = choice(weights)
    if form in (None, "F32"):
        return
    params = list(module.named_params())
    out = {id(p) for name, p in params if name == OUTPUT}
    seen = set()
    for name, p in params:
        if p.holdable and p.array is not None and id(p) not in seen:
            seen.add(id(p))
            p.array = convert(p.array, form_for(name, form, {name} if id(p) in out else set()), name)


def held_stored(param, stored: str | None) -> str:
    """The form ``param`` is held in under ``weights="stored"`` (the default) where its
    tensor is stored as ``stored`` (a checkpoint's ``stored_form``: None where it is read
    into float32): that form for a holdable matrix (``Param.holdable``) whose layout it can
    take (``layout``), else F32: what ``runtime.checkpoint.load`` holds, said from the
    headers alone (``iron-spec show``)."""
    if not param.holdable or stored is None or (stored in held.BLOCKS and not _lays_out(param)):
        return "F32"
    return stored


def _lays_out(param) -> bool:
    """Whether blocks stored along a row can be put in ``param``'s layout (rows moved, not
    transposed nor reshaped)."""
    return not param.transposed and param.reshaped is None


def layout(param, stored):
    """A stored matrix (a held form's array or blocks) in ``param``'s model layout, its rows
    C-contiguous: the view itself where the layouts agree, else a copy in the same form (rows
    moved, or a transposed float form). None where the form cannot be laid out so (blocks run
    along a stored row: a transposed block form is widened instead)."""
    if isinstance(stored, Blocks):
        if not _lays_out(param):
            return None
        if param.rows is None:
            return stored
        return blocks(stored.form, np.ascontiguousarray(stored.data[param.rows]), stored.shape)
    return np.ascontiguousarray(param.from_stored(stored))
