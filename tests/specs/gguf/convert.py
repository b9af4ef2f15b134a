"""A Hugging Face checkpoint written as llama.cpp's convert_hf_to_gguf.py writes it, for the
GGUF cases: gguf-py's ``GGUFWriter``, llama.cpp's architecture and tensor names
(``gguf.TensorNameMap``), and per family the metadata its converter class writes
(``set_gguf_parameters``) and what it does to the tensors (``modify_tensors``), restated here
from llama.cpp's ``conversion/*.py``:

- llama, granite (``LlamaModel``): q and k rows (weights and biases) permuted per head into
  interleaved RoPE pairs (``LlamaModel.permute``), llama3 RoPE scaling as the per-frequency
  factors ``rope_freqs`` (``llama3_factors``); granite's multipliers as
  ``embedding_scale``, ``attention.scale``, ``residual_scale``, ``logit_scale``;
- gemma, gemma2, gemma3: every ``*norm.weight`` stored as ``1 + w``; gemma and gemma2 drop
  ``lm_head.weight`` (the head is the embedding);
- phi3 (``Phi3MiniModel``): its own metadata (``rope.dimension_count`` of the partial RoPE,
  the original context, a sliding window of 0 for none), longrope factors as the tensors
  ``rope_factors_long``/``rope_factors_short``;
- stablelm: the per-head q/k LayerNorms stacked into one ``(heads, head_dim)`` tensor;
- gpt2: Conv1D weights transposed to ``[out, in]``, the MLP width written as ``4 * n_embd``;
- gpt-neox: the fused ``query_key_value`` rows reordered from per head (q, k, v) to
  [q; k; v];
- falcon: the fused rows reordered from per kv group to [q; k; v], the context written as
  2048 and the MLP width as ``4 * hidden_size``;
- olmoe (``OlmoeModel``): each layer's experts stacked into one ``(E, out, in)`` tensor per
  projection (``ffn_{gate,up,down}_exps``), the router (``ffn_gate_inp``) kept float32, the
  expert counts written;
- bert: the pooler dropped, ``attention.causal`` false, the token type count, the vocabulary
  as WordPiece in "phantom space" form (``wordpieces``).

Matrices are written as float32 (``qtype`` quantizes them, as ``--outtype q8_0`` would), so a
file holds the checkpoint's own values. The vocabulary is a byte-level BPE one of the
checkpoint's ``vocab_size`` tokens (BERT's: WordPiece).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

ARCH = {"llama": "LLAMA", "qwen2": "QWEN2", "qwen3": "QWEN3", "phi3": "PHI3", "gemma": "GEMMA",
        "gemma2": "GEMMA2", "gemma3": "GEMMA3", "olmo2": "OLMO2", "granite": "GRANITE",
        "starcoder2": "STARCODER2", "stablelm": "STABLELM", "gpt2": "GPT2",
        "gpt_neox": "GPTNEOX", "falcon": "FALCON", "bert": "BERT", "olmoe": "OLMOE"}


def tokens(n: int) -> list[str]:
    """``n`` distinct tokens: byte-level BPE's spelling of bytes (of the first ``n - 1``
    where ``n`` is at most 256), ``ab`` (merged from ``a b``), then ``<tN>``s."""
    spelled = _byte_spellings()
    return (spelled[:min(n - 1, 256)] + ["ab"] + [f"<t{i}>" for i in range(n)])[:n]


def wordpieces(n: int) -> tuple[list[str], list[int]]:
    """``n`` BERT word pieces in convert_hf_to_gguf.py's "phantom space" form (``BertModel.
    set_vocab``: a word's first piece as U+2581 + piece, a continuation without its ``##``,
    control tokens as they are) and their token types: [PAD], [UNK], [CLS], [SEP], [MASK],
    then letters and digits as words and as continuations, then ``wN`` words."""
    control = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    plain = [c for c in "abcdefghijklmnopqrstuvwxyz0123456789.,!?"]
    pieces = (["\u2581" + c for c in plain] + plain
              + ["\u2581" + w for w in ("the", "cat", "sat", "on", "mat", "hello", "world")]
              + [f"\u2581w{i}" for i in range(n)])
    vocab = (control + pieces)[:n]
    return vocab, [gguf.TokenType.CONTROL if t in control else gguf.TokenType.NORMAL for t in vocab]


def phantom(tokens: list[str], types: list[int]) -> tuple[list[str], list[int]]:
    """BERT's WordPiece tokens as ``BertModel.set_vocab`` stores them: control tokens as they
    are, ``##piece`` as ``piece``, any other as U+2581 + token."""
    return ([t if k == gguf.TokenType.CONTROL else t[2:] if t.startswith("##") else "\u2581" + t
             for t, k in zip(tokens, types)], types)


def _byte_spellings() -> list[str]:
    """GPT-2's byte -> text table (bytes_to_unicode), in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def _theta(c: dict):
    return c.get("rope_theta", (c.get("rope_parameters") or {}).get("rope_theta",
                                                                      c.get("rotary_emb_base")))


def _base(w: gguf.GGUFWriter, c: dict) -> None:
    """TextModel.set_gguf_parameters: what most families write."""
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    if "num_key_value_heads" in c:
        w.add_head_count_kv(c["num_key_value_heads"])
    rope = c.get("rope_scaling") or c.get("rope_parameters") or {}
    kind = rope.get("rope_type", rope.get("type"))
    if kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    elif kind == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if _theta(c) is not None:
        w.add_rope_freq_base(_theta(c))
    if c.get("rope_local_base_freq") is not None:
        w.add_rope_freq_base_swa(c["rope_local_base_freq"])
    for key in ("rms_norm_eps",):
        if key in c:
            w.add_layer_norm_rms_eps(c[key])
    for key in ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"):
        if key in c:
            w.add_layer_norm_eps(c[key])
            break
    if c.get("head_dim") is not None:
        w.add_key_length(c["head_dim"])
        w.add_value_length(c["head_dim"])


def metadata(family: str, w: gguf.GGUFWriter, c: dict, t: dict[str, np.ndarray]) -> None:
    """The family's converter class's set_gguf_parameters (and its extra tensors)."""
    head = c.get("hidden_size", c.get("n_embd")) // c.get("num_attention_heads", c.get("n_head"))
    if family in ("llama", "granite"):
        c = dict(c)
        if family == "granite":
            c.pop("head_dim", None)
        _base(w, c)
        w.add_vocab_size(c["vocab_size"])
        w.add_rope_dimension_count(c.get("head_dim") or head)
        rope = c.get("rope_scaling") or c.get("rope_parameters") or {}
        if rope.get("rope_type") == "llama3":  # LlamaModel.generate_extra_tensors
            t["rope_freqs.weight"] = llama3_factors(_theta(c), c.get("head_dim") or head, rope)
        if family == "granite":
            w.add_attention_scale(c["attention_multiplier"])
            w.add_embedding_scale(c["embedding_multiplier"])
            w.add_residual_scale(c["residual_multiplier"])
            w.add_logit_scale(c["logits_scaling"])
    elif family == "olmoe":  # OlmoeModel: its rms eps written as 1e-5 whatever the config says
        _base(w, dict(c, rms_norm_eps=1e-5))
        w.add_expert_count(c["num_experts"])
        w.add_expert_used_count(c["num_experts_per_tok"])
    elif family in ("qwen2", "qwen3", "olmo2", "starcoder2", "gemma3"):
        _base(w, c)
        if family == "gemma3":
            if c.get("final_logit_softcapping"):
                w.add_final_logit_softcapping(c["final_logit_softcapping"])
            w.add_sliding_window(c["sliding_window"])
    elif family == "phi3":
        partial = c.get("partial_rotary_factor", 1.0)
        rope = c.get("rope_scaling") or {}
        original = c.get("original_max_position_embeddings", rope.get("original_max_position_embeddings"))
        w.add_context_length(c["max_position_embeddings"])
        w.add_rope_scaling_orig_ctx_len(original)
        w.add_embedding_length(c["hidden_size"])
        w.add_feed_forward_length(c["intermediate_size"])
        w.add_block_count(c["num_hidden_layers"])
        w.add_head_count(c["num_attention_heads"])
        w.add_head_count_kv(c["num_key_value_heads"])
        w.add_layer_norm_rms_eps(c["rms_norm_eps"])
        w.add_rope_dimension_count(int(partial * c["hidden_size"]) // c["num_attention_heads"])
        w.add_rope_freq_base(_theta(c))
        w.add_sliding_window(c.get("sliding_window") or 0)
        if rope.get("long_factor"):
            scale = c["max_position_embeddings"] / original
            w.add_rope_scaling_attn_factors(
                float(np.sqrt(1 + np.log(scale) / np.log(original))) if scale > 1 else 1.0)
            t["rope_factors_long.weight"] = np.array(rope["long_factor"], np.float32)
            t["rope_factors_short.weight"] = np.array(rope["short_factor"], np.float32)
    elif family in ("gemma", "gemma2"):
        w.add_context_length(c["max_position_embeddings"])
        w.add_embedding_length(c["hidden_size"])
        w.add_block_count(c["num_hidden_layers"])
        w.add_feed_forward_length(c["intermediate_size"])
        w.add_head_count(c["num_attention_heads"])
        w.add_head_count_kv(c.get("num_key_value_heads", c["num_attention_heads"]))
        w.add_layer_norm_rms_eps(c["rms_norm_eps"])
        w.add_key_length(c["head_dim"])
        w.add_value_length(c["head_dim"])
        if family == "gemma2":
            w.add_attn_logit_softcapping(c["attn_logit_softcapping"])
            w.add_final_logit_softcapping(c["final_logit_softcapping"])
            w.add_sliding_window(c["sliding_window"])
    elif family in ("stablelm", "gpt_neox"):
        partial = c.get("partial_rotary_factor", c.get("rotary_pct"))
        w.add_context_length(c["max_position_embeddings"])
        w.add_embedding_length(c["hidden_size"])
        w.add_block_count(c["num_hidden_layers"])
        w.add_feed_forward_length(c["intermediate_size"])
        w.add_rope_dimension_count(int(partial * head))
        w.add_head_count(c["num_attention_heads"])
        if family == "stablelm":
            w.add_head_count_kv(c["num_key_value_heads"])
        w.add_parallel_residual(c.get("use_parallel_residual", True))
        w.add_layer_norm_eps(c["layer_norm_eps"])
    elif family == "gpt2":
        w.add_block_count(c["n_layer"])
        w.add_context_length(c.get("n_ctx", c["n_positions"]))
        w.add_embedding_length(c["n_embd"])
        w.add_feed_forward_length(4 * c["n_embd"])
        w.add_head_count(c["n_head"])
        w.add_layer_norm_eps(c["layer_norm_epsilon"])
    elif family == "falcon":
        w.add_context_length(2048)
        w.add_tensor_data_layout("jploski")
        w.add_embedding_length(c["hidden_size"])
        w.add_feed_forward_length(4 * c["hidden_size"])
        w.add_block_count(c["num_hidden_layers"])
        w.add_head_count(c["num_attention_heads"])
        w.add_head_count_kv(c.get("num_kv_heads") or 1)
        w.add_layer_norm_eps(c["layer_norm_epsilon"])
    elif family == "bert":
        _base(w, c)
        w.add_causal_attention(False)
        w.add_pooling_type(gguf.PoolingType.MEAN)
        w.add_token_type_count(c.get("type_vocab_size", 1))
    else:
        raise ValueError(f"no converter restated for {family}")


def llama3_factors(base: float, dim: int, rope: dict) -> np.ndarray:
    """LlamaModel.generate_extra_tensors: llama3 RoPE scaling as one factor per frequency."""
    import math
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low = rope.get("factor", 8.0), rope.get("low_freq_factor", 1.0)
    high, old = rope.get("high_freq_factor", 4.0), rope.get("original_max_position_embeddings", 8192)
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def permute(x: np.ndarray, n_head: int, n_head_kv: int) -> np.ndarray:
    """LlamaModel.permute."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return x.reshape(n_head, 2, x.shape[0] // n_head // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


def tensors(family: str, c: dict, t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The family's modify_tensors: HF name -> the array llama.cpp stores (HF names kept;
    a stacked per-head norm under the name of its stack)."""
    out = {}
    heads = c.get("num_attention_heads", c.get("n_head"))
    kv = c.get("num_key_value_heads", heads)
    hidden = c.get("hidden_size", c.get("n_embd"))
    for name, x in t.items():
        if family in ("gemma", "gemma2") and name == "lm_head.weight":
            continue
        if family == "gpt2" and name.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        if family == "bert" and (name.startswith(("pooler.", "cls.")) or name.endswith("position_ids")):
            continue
        if family in ("llama", "granite"):
            if name.endswith(("q_proj.weight", "q_proj.bias")):
                x = permute(x, heads, heads)
            if name.endswith(("k_proj.weight", "k_proj.bias")):
                x = permute(x, heads, kv)
        if family in ("gemma", "gemma2", "gemma3") and name.endswith("norm.weight"):
            x = x + np.float32(1)
        if family == "gpt2" and name.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):
            x = x.T
        if family == "gpt_neox" and "attention.query_key_value" in name:
            q = x.reshape(heads, 3, hidden // heads, *x.shape[1:])
            x = np.concatenate([q[:, i].reshape(-1, *x.shape[1:]) for i in range(3)])
        if family == "falcon" and "query_key_value" in name:
            n_kv = c.get("num_kv_heads") or 1
            d = hidden // heads
            g = x.reshape(n_kv, heads // n_kv + 2, d, *x.shape[1:])
            x = np.concatenate([g[:, :-2].reshape(-1, *x.shape[1:]),
                                g[:, [-2]].reshape(-1, *x.shape[1:]),
                                g[:, [-1]].reshape(-1, *x.shape[1:])])
        out[name] = np.ascontiguousarray(x, dtype=np.float32)
    if family == "olmoe":  # OlmoeModel.modify_tensors: each layer's experts in one 3-D tensor
        for layer in range(c["num_hidden_layers"]):
            for w in ("gate_proj", "up_proj", "down_proj"):
                parts = [f"model.layers.{layer}.mlp.experts.{e}.{w}.weight"
                         for e in range(c["num_experts"])]
                if parts[0] in out:
                    out[f"model.layers.{layer}.mlp.experts.{w}.weight"] = \
                        np.stack([out.pop(p) for p in parts])
    if family == "stablelm":
        for which, n in (("q_layernorm", heads), ("k_layernorm", kv)):
            for layer in range(c["num_hidden_layers"]):
                parts = [f"model.layers.{layer}.self_attn.{which}.norms.{h}.weight" for h in range(n)]
                if parts[0] in out:
                    out[f"model.layers.{layer}.self_attn.{which}.weight"] = \
                        np.stack([out.pop(p) for p in parts])
    return out


def write(path: Path, family: str, config: dict, checkpoint: dict[str, np.ndarray],
          qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
          vocab: tuple[list[str], list[int]] | None = None) -> Path:
    """``checkpoint`` (HF names -> float32 arrays) of ``config`` as llama.cpp's converter
    writes it for ``family``, at ``path``; ``vocab``: BERT's tokens (tokenizer.json's, in
    id order) and their types, written in phantom-space form (``phantom``)."""
    arch = gguf.MODEL_ARCH[ARCH[family]]
    layers = config.get("num_hidden_layers", config.get("n_layer"))
    table = gguf.get_tensor_name_map(arch, layers)
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    extra: dict[str, np.ndarray] = {}
    metadata(family, w, config, extra)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if family == "bert":
        vocab, types = wordpieces(config["vocab_size"]) if vocab is None else phantom(*vocab)
        w.add_tokenizer_model("bert")
        w.add_tokenizer_pre("default")
        w.add_token_list(vocab)
        w.add_token_types(types)
        for add, token in ((w.add_bos_token_id, "[CLS]"), (w.add_sep_token_id, "[SEP]"),
                           (w.add_unk_token_id, "[UNK]"), (w.add_pad_token_id, "[PAD]"),
                           (w.add_mask_token_id, "[MASK]")):
            add(vocab.index(token))
    else:
        vocab = tokens(config["vocab_size"])
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(vocab)
        w.add_token_types([gguf.TokenType.NORMAL] * len(vocab))
        w.add_token_merges(["a b"])
    for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id)):
        if family != "bert" and isinstance(config.get(key), int) and 0 <= config[key] < len(vocab):
            add(config[key])
    for name, x in list(tensors(family, config, checkpoint).items()) + list(extra.items()):
        gname = name if name in extra else table.get_name(name, try_suffixes=(".weight", ".bias"))
        if gname is None:
            raise ValueError(f"{family}: llama.cpp names no tensor {name}")
        # Matrices (and stacks of them: a mixture's experts) only, as the converter's
        # quantization: norms (a stacked per-head one is 2-D) and a router stay float32.
        if x.ndim in (2, 3) and qtype != gguf.GGMLQuantizationType.F32 \
                and "token_embd" not in gname and "norm" not in gname \
                and "ffn_gate_inp" not in gname:
            w.add_tensor(gname, gguf.quants.quantize(x, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gname, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
