"""The shrink rule: a published config.json made a toy of the same architecture, every key
kept, only its sizes smaller (the corpus, tests/corpus/; record.py applies it).

Sizes shrunk, under whichever of transformers' spellings the file uses (``SIZES``):

- attention heads to at most 4 (``H'``); key/value heads to ``H'`` where every head has its
  own (MHA), 1 where one is shared (MQA), else 2 (GQA); a head to at most 16 wide;
- the hidden size to ``H' x head'`` where the file has ``hidden = heads x head``, else in
  the file's own proportion to it (Gemma 7B's 3072 against 16 x 256: 48), a multiple of 8;
- every width proportional to the hidden size (the MLP's intermediate size, ALBERT's
  embedding_size, OPT's word_embed_proj_dim), at least 8, a multiple of 8; a rotary width (``rotary_dim``) in
  proportion to the head, even, at least 2;
- the layers to the fewest (at least 2) that still hold every kind of layer the file's
  pattern names (``sliding_window_pattern`` 6: 6 layers, 5 sliding and 1 full; a
  ``layer_types`` list: up to its first layer of each type); every list with one entry a
  layer (``layer_types``, ``no_rope_layers``) cut to them; a count of layers
  (``max_window_layers``) in proportion; GPT-Neo's ``attention_types`` rewritten for them;
- the vocabulary to 256 rows, or one past the largest token id the file names where that
  is more (a token id is a value: it is never changed);
- per-frequency lists of a RoPE table (longrope's ``short_factor``/``long_factor``) to one
  entry a rotary pair, sampled evenly from the file's.

A composite checkpoint's file (``*ForConditionalGeneration``: ``text_config``,
``vision_config``, ``audio_config``) has each of those parts shrunk by the same rule, token
ids anywhere in the file kept within the text part's vocabulary; a part that names a hidden
size but no heads (Gemma 3 4B's ``text_config`` leaves them at the class's defaults) has the
hidden size cut to ``4 x 16`` and its widths in proportion, the heads left to the defaults.

Everything else is kept as the file has it: context lengths, windows, RoPE parameters,
epsilons, scales (Gemma's ``query_pre_attn_scalar``), flags and metadata.
"""

from __future__ import annotations

import copy
import math
from typing import Any

SIZES = {
    "hidden": ("hidden_size", "n_embd", "d_model", "n_embed", "model_dim"),
    "heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "intermediate": ("intermediate_size", "n_inner", "ffn_hidden_size", "ffn_dim"),
    "head_dim": ("head_dim",),
    "rotary": ("rotary_dim",),
    "width": ("embedding_size", "word_embed_proj_dim"),
    "vocab": ("vocab_size",),
}
PERIODS = ("sliding_window_pattern", "_sliding_window_pattern", "no_rope_layer_interval",
           "global_attn_every_n_layers")
LAYER_COUNTS = ("max_window_layers",)
ROPE_LISTS = ("short_factor", "long_factor")
MAX_HEADS, MAX_HEAD_DIM, MIN_VOCAB = 4, 16, 256


def _keys(config: dict, kind: str) -> list[str]:
    return [k for k in SIZES[kind] if isinstance(config.get(k), int) and not isinstance(config.get(k), bool)]


def _one(config: dict, kind: str) -> int | None:
    keys = _keys(config, kind)
    return config[keys[0]] if keys else None


def _eight(x: float) -> int:
    return max(8, int(round(x / 8)) * 8)


def _token_ids(config: Any) -> list[int]:
    out = []
    if isinstance(config, dict):
        for k, v in config.items():
            if k.endswith(("_token_id", "_token_ids", "_token_index")):
                out += [v] if isinstance(v, int) and not isinstance(v, bool) else \
                    [i for i in v if isinstance(i, int)] if isinstance(v, list) else []
    return out


def _layers(config: dict, layers: int) -> int:
    need = 2
    for key in PERIODS:
        v = config.get(key)
        if isinstance(v, str):
            v = len(v)  # EXAONE 4's "LLLG"
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            need = max(need, v)
    for v in config.values():
        if isinstance(v, list) and len(v) == layers and len(set(map(str, v))) > 1:
            seen, first = set(), 0
            for i, x in enumerate(map(str, v)):
                if x not in seen:
                    seen.add(x)
                    first = i
            need = max(need, first + 1)
    return min(layers, need)


PARTS = ("text_config", "vision_config", "audio_config")


def _ids(config: Any) -> list[int]:
    """Every token id the file names, its parts' included."""
    return _token_ids(config) + [i for k in PARTS if isinstance(config.get(k), dict)
                                 for i in _ids(config[k])]


def shrink(config: dict, ids: list[int] | None = None) -> dict:
    """``config`` (a published config.json, as a dict) with its sizes shrunk by the rule
    above; a new dict, in the same key order. ``ids``: the token ids a vocabulary must hold
    (default: every one the file names). Raises ValueError where the file names no hidden
    size, nor parts that do."""
    ids = _ids(config) if ids is None else ids
    out = copy.deepcopy(config)
    parts = [k for k in PARTS if isinstance(config.get(k), dict)]
    for k in parts:
        out[k] = shrink(config[k], ids)
    H, hidden = _one(config, "heads"), _one(config, "hidden")
    if hidden is None:
        if parts:
            return out
        raise ValueError("the config names no hidden size")
    if H is None:  # the heads are the config class's defaults: the width alone is cut
        H, hd, H2, hd2 = 1, hidden, 1, min(hidden, MAX_HEADS * MAX_HEAD_DIM)
    else:
        hd = _one(config, "head_dim") or hidden // H
        H2, hd2 = min(H, MAX_HEADS), min(hd, MAX_HEAD_DIM)
    hidden2 = H2 * hd2 if hidden == H * hd else _eight(hidden * H2 * hd2 / (H * hd))
    for k in _keys(config, "heads"):
        out[k] = H2
    for k in _keys(config, "hidden"):
        out[k] = hidden2
    for k in _keys(config, "head_dim"):
        out[k] = hd2
    for k in _keys(config, "kv_heads"):
        kv = config[k]
        out[k] = H2 if kv == H else 1 if kv == 1 else max(1, H2 // 2)
    for kind in ("intermediate", "width"):
        for k in _keys(config, kind):
            out[k] = _eight(config[k] * hidden2 / hidden)
    for k in _keys(config, "rotary"):
        out[k] = max(2, 2 * int(round(config[k] * hd2 / hd / 2)))
    for k in _keys(config, "vocab"):
        out[k] = min(config[k], max(MIN_VOCAB, 1 + max(ids, default=0)))
    L = _one(config, "layers")
    if L is not None:
        L2 = _layers(config, L)
        for k in _keys(config, "layers"):
            out[k] = L2
        for k, v in config.items():
            if isinstance(v, list) and len(v) == L and k not in ("architectures",):
                out[k] = v[:L2]
        for k in LAYER_COUNTS:
            if isinstance(config.get(k), int):
                out[k] = max(1, math.ceil(config[k] * L2 / L))
        types = config.get("attention_types")  # GPT-Neo: [[["global", "local"], 12]]
        if isinstance(types, list) and types and isinstance(types[0], list):
            pattern = types[0][0]
            out["attention_types"] = [[pattern, max(1, L2 // len(pattern))]]
    for key in ("rope_scaling", "rope_parameters"):
        table = out.get(key)
        if isinstance(table, dict):
            for name in ROPE_LISTS:
                v = table.get(name)
                if isinstance(v, list) and v:
                    n = max(1, (len(v) * hd2) // (2 * hd) * 2 // 2) if hd else len(v)
                    n = max(1, round(len(v) * hd2 / hd))
                    table[name] = [v[round(i * (len(v) - 1) / max(1, n - 1))] for i in range(n)]
    return out
