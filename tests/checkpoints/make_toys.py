"""Make the toy checkpoints in this folder: published checkpoints' own config.json, every key
kept and only the sizes shrunk, built by transformers' own model class on random weights and
written by its ``save_pretrained`` (its own layout: transformers 5 writes a checkpoint as it
would load one, its legacy names restored), in the config's dtype.

Run where torch and transformers are installed (the golden extra; not in CI, which reads the
files):

    python -m tests.checkpoints.make_toys            # every toy, then its golden
    python -m tests.checkpoints.make_toys NAME ...

Each toy's golden is then recorded by ``iron-spec check SPEC --checkpoint DIR
--record-golden`` (``iron_spec.library.golden_record``: transformers' own class, the one config.json
names), into tests/goldens/<spec>/<toy>.npz.

The configs and where each was read (public copies of the hub's files; the search tool's
ids where the copy has no other address):

- bert-base-uncased: https://huggingface.co/bert-base-uncased/resolve/main/config.json
  (quoted whole in public notes, ids 24234169625 and 70148193425).
- roberta-base: https://huggingface.co/roberta-base/resolve/main/config.json (id 46524548078).
- xlm-roberta-base: https://huggingface.co/xlm-roberta-base/resolve/main/config.json; its
  keys as xlm-roberta-large's quoted whole in modelscope's docs (id 59834528463), the base
  model's sizes.
- ModernBERT-base: https://huggingface.co/answerdotai/ModernBERT-base/resolve/main/config.json
  (id 55656872776: the conversion script's target config for ModernBERT-base; ids 46602409351
  and 61323629527 hold the same keys).
- nomic-embed-text-v1.5: https://huggingface.co/nomic-ai/nomic-embed-text-v1.5/resolve/main/config.json:
  the GPT-2-style keys of contrastors' NomicBertConfig (github.com/nomic-ai/contrastors,
  src/contrastors/models/huggingface/configuration_hf_nomic_bert.py; candle's and TEI's
  parsers read the same), with the keys the hub's 2026 update added for transformers 5
  (vllm-project/vllm issue 40130 quotes them: max_position_embeddings, max_trained_positions,
  rope_parameters; hidden_act). transformers 5.25 reads only its own keys (hidden_size,
  num_hidden_layers, ...), so the toy holds both spellings at the shrunk sizes.
- gemma-3-4b-it: https://huggingface.co/google/gemma-3-4b-it/resolve/main/config.json (id
  70224130757, and google/gemma-3-27b-it's in id 926331895 with the same keys).
- Qwen3.5-0.8B: https://huggingface.co/Qwen/Qwen3.5-0.8B/resolve/main/config.json (quoted
  whole in a public session log, id 54505217749; every Qwen3.5 dense size is a
  Qwen3_5ForConditionalGeneration, id 57371183011).
- Mistral-Small-3.1-24B-Instruct-2503: its text_config as transformers' Mistral3Config holds it
  for its default (configuration_mistral3.py, sub_configs_defaults), the top-level keys as
  Mistral3Config writes them (no copy of the hub's whole file was found).
- Ministral-3-3B-Instruct-2512 (mistralai; Devstral 2 and every Ministral 3 size are the same
  composite): a Mistral3ForConditionalGeneration whose text_config is a ministral3 model, as
  transformers' Mistral3Config(text_config={"model_type": "ministral3"}) writes it (its yarn
  rope_parameters with llama_4_scaling_beta), the 3B's text sizes as a public evaluation
  script quotes them (search id 68507971559: hidden 3072, 26 layers, intermediate 9216, 32
  heads, 8 key-value heads); the rope_parameters' keys as public loaders quote the hub's
  (ids 71024905976, 63417845068). No copy of the hub's whole file was found.
- Llama-4-Scout-17B-16E: https://huggingface.co/meta-llama/Llama-4-Scout-17B-16E/resolve/main/config.json
  as transformers 4.51 prints it (Llama4Config, every key; search id 41112263523), its
  moe_layers printed "0..47": every layer. No copy of the hub's file itself was found. Its
  text_config's attn_temperature_tuning is 4, which transformers 5.25's strict
  Llama4TextConfig refuses (a bool field): the toy's is true, the one value changed.

The task-head toys (sequence and token classification) are bert-base-uncased's config with
the architecture and the labels a fine-tuned checkpoint's config.json adds (``id2label``,
``label2id``, as transformers writes them).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

BERT_BASE_UNCASED = {
    "architectures": ["BertForMaskedLM"], "attention_probs_dropout_prob": 0.1,
    "gradient_checkpointing": False, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
    "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert",
    "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 0,
    "position_embedding_type": "absolute", "transformers_version": "4.6.0.dev0",
    "type_vocab_size": 2, "use_cache": True, "vocab_size": 30522}

ROBERTA_BASE = {
    "architectures": ["RobertaForMaskedLM"], "attention_probs_dropout_prob": 0.1,
    "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
    "layer_norm_eps": 1e-05, "max_position_embeddings": 514, "model_type": "roberta",
    "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 1,
    "type_vocab_size": 1, "vocab_size": 50265}

XLM_ROBERTA_BASE = {
    "architectures": ["XLMRobertaForMaskedLM"], "attention_probs_dropout_prob": 0.1,
    "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
    "layer_norm_eps": 1e-05, "max_position_embeddings": 514, "model_type": "xlm-roberta",
    "num_attention_heads": 12, "num_hidden_layers": 12, "output_past": True,
    "pad_token_id": 1, "position_embedding_type": "absolute",
    "transformers_version": "4.17.0.dev0", "type_vocab_size": 1, "use_cache": True,
    "vocab_size": 250002}

MODERNBERT_BASE = {
    "_name_or_path": "ModernBERT-base", "architectures": ["ModernBertForMaskedLM"],
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 50281,
    "classifier_activation": "gelu", "classifier_bias": False, "classifier_dropout": 0.0,
    "classifier_pooling": "mean", "cls_token_id": 50281, "decoder_bias": True,
    "deterministic_flash_attn": False, "embedding_dropout": 0.0, "eos_token_id": 50282,
    "global_attn_every_n_layers": 3, "global_rope_theta": 160000.0,
    "gradient_checkpointing": False, "hidden_activation": "gelu", "hidden_size": 768,
    "initializer_cutoff_factor": 2.0, "initializer_range": 0.02, "intermediate_size": 1152,
    "layer_norm_eps": 1e-05, "local_attention": 128, "local_rope_theta": 10000.0,
    "max_position_embeddings": 8192, "mlp_bias": False, "mlp_dropout": 0.0,
    "model_type": "modernbert", "norm_bias": False, "norm_eps": 1e-05,
    "num_attention_heads": 12, "num_hidden_layers": 22, "pad_token_id": 50283,
    "position_embedding_type": "absolute", "sep_token_id": 50282, "tie_word_embeddings": True,
    "torch_dtype": "float32", "transformers_version": "4.48.0", "vocab_size": 50368}

NOMIC_EMBED_TEXT_V15 = {
    "_name_or_path": "nomic-ai/nomic-bert-2048", "activation_function": "swiglu",
    "architectures": ["NomicBertModel"], "attn_pdrop": 0.0,
    "auto_map": {
        "AutoConfig": "nomic-ai/nomic-bert-2048--configuration_hf_nomic_bert.NomicBertConfig",
        "AutoModel": "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertModel",
        "AutoModelForMaskedLM": "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertForPreTraining"},
    "bos_token_id": None, "causal": False, "dense_seq_output": True, "embd_pdrop": 0.0,
    "eos_token_id": None, "fused_bias_fc": True, "fused_dropout_add_ln": True,
    "hidden_act": "silu", "initializer_range": 0.02, "layer_norm_epsilon": 1e-12,
    "max_position_embeddings": 2048, "max_trained_positions": 2048, "mlp_fc1_bias": False,
    "mlp_fc2_bias": False, "model_type": "nomic_bert", "n_embd": 768, "n_head": 12,
    "n_inner": 3072, "n_layer": 12, "n_positions": 8192, "pad_vocab_size_multiple": 64,
    "parallel_block": False, "parallel_block_tied_norm": False, "prenorm": False,
    "qkv_proj_bias": False, "reorder_and_upcast_attn": False, "resid_pdrop": 0.0,
    "rope_parameters": {"rope_theta": 1000.0, "rope_type": "default"},
    "rotary_emb_base": 1000, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
    "rotary_emb_scale_base": None, "rotary_scaling_factor": None,
    "scale_attn_by_inverse_layer_idx": False, "scale_attn_weights": True,
    "summary_activation": None, "summary_first_dropout": 0.0, "summary_proj_to_labels": True,
    "summary_type": "cls_index", "summary_use_proj": True, "torch_dtype": "float32",
    "transformers_version": "4.37.2", "type_vocab_size": 2, "use_cache": True,
    "use_flash_attn": True, "use_rms_norm": False, "use_xentropy": True, "vocab_size": 30528}

GEMMA3_4B_IT = {
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
    "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
    "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
                    "model_type": "gemma3_text", "num_hidden_layers": 34,
                    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16,
                      "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False}}

# gemma-3-4b-it's preprocessor_config.json as published (every key kept, nulls too), its size
# shrunk to the toy tower's image_size and image_seq_length to its mm_tokens_per_image: without
# it Gemma3ImageProcessor's class default (224x224) meets a 28x28 tower and check fails.
GEMMA3_4B_IT_PREPROCESSOR = {
    "do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None, "do_rescale": True,
    "do_resize": True, "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Gemma3ImageProcessor", "image_seq_length": 256,
    "image_std": [0.5, 0.5, 0.5], "pan_and_scan_max_num_crops": None,
    "pan_and_scan_min_crop_size": None, "pan_and_scan_min_ratio_to_activate": None,
    "processor_class": "Gemma3Processor", "resample": 2,
    "rescale_factor": 0.00392156862745098, "size": {"height": 896, "width": 896}}

# The processor files a toy keeps beside its weights (preprocessor_config.json), by toy;
# Gemma 4's composite toy: Gemma4ImageProcessorPil(patch_size=4, max_soft_tokens=70) as
# save_pretrained writes it (its tower's 4-pixel patches; 70 the smallest budget).
PREPROCESSORS = {
    "gemma-3-4b-it-toy": {**GEMMA3_4B_IT_PREPROCESSOR, "image_seq_length": 4,
                          "size": {"height": 28, "width": 28}},
    "gemma4-composite-toy": {
        "do_convert_rgb": True, "do_normalize": False, "do_rescale": True, "do_resize": True,
        "image_mean": [0.0, 0.0, 0.0], "image_processor_type": "Gemma4ImageProcessor",
        "image_std": [1.0, 1.0, 1.0], "max_soft_tokens": 70, "patch_size": 4,
        "pooling_kernel_size": 3, "resample": 3, "rescale_factor": 0.00392156862745098}}

# Mistral-Small-3.1-24B-Instruct-2503's text_config, as transformers' own Mistral3Config
# holds it for its default (configuration_mistral3.py, sub_configs_defaults); the composite's
# top-level keys as Mistral3Config writes them.
MISTRAL_SMALL_31 = {
    "architectures": ["Mistral3ForConditionalGeneration"], "image_token_index": 10,
    "model_type": "mistral3", "multimodal_projector_bias": False,
    "projector_hidden_act": "gelu", "spatial_merge_size": 2,
    "text_config": {"attention_dropout": 0.0, "head_dim": 128, "hidden_act": "silu",
                    "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 32768,
                    "max_position_embeddings": 131072, "model_type": "mistral",
                    "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8,
                    "rms_norm_eps": 1e-05, "rope_theta": 1000000000.0, "sliding_window": None,
                    "use_cache": True, "vocab_size": 131072},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"head_dim": 64, "hidden_act": "gelu", "hidden_size": 1024,
                      "image_size": 1540, "intermediate_size": 4096, "model_type": "pixtral",
                      "num_attention_heads": 16, "num_hidden_layers": 24, "patch_size": 14,
                      "rope_theta": 10000.0},
    "vision_feature_layer": -1}

# Ministral-3-3B-Instruct-2512: the composite as Mistral3Config writes it around a ministral3
# text model (see the module's docstring for the sources of each key).
MINISTRAL_3_3B = {
    "architectures": ["Mistral3ForConditionalGeneration"], "dtype": "bfloat16",
    "image_token_index": 10, "model_type": "mistral3", "multimodal_projector_bias": False,
    "projector_hidden_act": "gelu", "spatial_merge_size": 2,
    "text_config": {"attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
                    "head_dim": 128, "hidden_act": "silu", "hidden_size": 3072,
                    "initializer_range": 0.02, "intermediate_size": 9216,
                    "max_position_embeddings": 262144, "model_type": "ministral3",
                    "num_attention_heads": 32, "num_hidden_layers": 26,
                    "num_key_value_heads": 8, "pad_token_id": 11, "rms_norm_eps": 1e-05,
                    "rope_parameters": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 16.0,
                                        "llama_4_scaling_beta": 0.1, "mscale": 1.0,
                                        "mscale_all_dim": 1.0,
                                        "original_max_position_embeddings": 16384,
                                        "rope_theta": 1000000.0, "rope_type": "yarn",
                                        "type": "yarn"},
                    "sliding_window": None, "tie_word_embeddings": True, "use_cache": True,
                    "vocab_size": 131072},
    "tie_word_embeddings": True, "transformers_version": "5.0.0",
    "vision_config": {"attention_dropout": 0.0, "head_dim": 64, "hidden_act": "silu",
                      "hidden_size": 1024, "image_size": 1540, "initializer_range": 0.02,
                      "intermediate_size": 4096, "model_type": "pixtral",
                      "num_attention_heads": 16, "num_channels": 3, "num_hidden_layers": 24,
                      "patch_size": 14,
                      "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}},
    "vision_feature_layer": -1}

# Qwen/Qwen3.5-0.8B's config.json, every key as published: every Qwen3.5 dense checkpoint is a
# Qwen3_5ForConditionalGeneration (the text model in text_config, a vision tower beside it,
# and multi-token-prediction tensors, mtp.*, transformers' own class leaves unread).
QWEN3_5_08B = {
    "architectures": ["Qwen3_5ForConditionalGeneration"], "image_token_id": 248056,
    "model_type": "qwen3_5",
    "text_config": {
        "attention_bias": False, "attention_dropout": 0.0, "attn_output_gate": True,
        "dtype": "bfloat16", "eos_token_id": 248044, "full_attention_interval": 4,
        "head_dim": 256, "hidden_act": "silu", "hidden_size": 1024, "initializer_range": 0.02,
        "intermediate_size": 3584,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"]
        + (["linear_attention"] * 3 + ["full_attention"]) * 5,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
        "linear_num_value_heads": 16, "linear_value_head_dim": 128,
        "max_position_embeddings": 262144, "mlp_only_layers": [], "model_type": "qwen3_5_text",
        "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": 8, "num_hidden_layers": 24, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06, "tie_word_embeddings": True, "use_cache": True,
        "vocab_size": 248320, "mamba_ssm_dtype": "float32",
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10],
                            "rope_type": "default", "rope_theta": 10000000,
                            "partial_rotary_factor": 0.25}},
    "tie_word_embeddings": True, "transformers_version": "4.57.0.dev0",
    "video_token_id": 248057,
    "vision_config": {"deepstack_visual_indexes": [], "depth": 12,
                      "hidden_act": "gelu_pytorch_tanh", "hidden_size": 768, "in_channels": 3,
                      "initializer_range": 0.02, "intermediate_size": 3072,
                      "model_type": "qwen3_5", "num_heads": 12, "num_position_embeddings": 2304,
                      "out_hidden_size": 1024, "patch_size": 16, "spatial_merge_size": 2,
                      "temporal_patch_size": 2},
    "vision_end_token_id": 248054, "vision_start_token_id": 248053}


# meta-llama/Llama-4-Scout-17B-16E's config, every key as printed (see the docstring).
LLAMA_4_SCOUT = {
    "architectures": ["Llama4ForConditionalGeneration"], "boi_token_index": 200080,
    "eoi_token_index": 200081, "image_token_index": 200092, "model_type": "llama4",
    "text_config": {
        "attention_bias": False, "attention_chunk_size": 8192, "attention_dropout": 0.0,
        "attn_scale": 0.1, "attn_temperature_tuning": 4, "bos_token_id": 200000,
        "eos_token_id": [200001, 200007, 200008], "floor_scale": 8192,
        "for_llm_compressor": False, "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
        "initializer_range": 0.02, "interleave_moe_layer_step": 1, "intermediate_size": 8192,
        "intermediate_size_mlp": 16384, "max_position_embeddings": 262144,
        "model_type": "llama4_text", "moe_layers": list(range(48)),
        "no_rope_layers": [1, 1, 1, 0] * 12, "num_attention_heads": 40,
        "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8,
        "num_local_experts": 16, "output_router_logits": False, "pad_token_id": 200018,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0,
        "torch_dtype": "bfloat16", "use_cache": True, "use_qk_norm": True,
        "vocab_size": 202048},
    "tie_word_embeddings": False, "transformers_version": "4.51.0",
    "vision_config": {
        "attention_dropout": 0.0, "hidden_act": "gelu", "hidden_size": 1408, "image_size": 336,
        "initializer_range": 0.02, "intermediate_size": 5632,
        "model_type": "llama4_vision_model", "multi_modal_projector_bias": False,
        "norm_eps": 1e-05, "num_attention_heads": 16, "num_channels": 3,
        "num_hidden_layers": 34, "patch_size": 14, "pixel_shuffle_ratio": 0.5,
        "projector_dropout": 0.0, "projector_input_dim": 4096, "projector_output_dim": 4096,
        "rope_theta": 10000, "vision_feature_layer": -1,
        "vision_feature_select_strategy": "default", "vision_output_dim": 4096}}


def gemma4_composite() -> dict:
    """No Gemma 4 composite config.json was found in a public copy: specs/gemma4.yaml's toy
    text config inside the config Gemma4Config writes around it (its own top-level keys and
    defaults, a tiny vision tower, no audio), in bfloat16."""
    import yaml

    text = yaml.safe_load((HERE.parents[1] / "specs" / "gemma4.yaml").read_text())["toy"]["config"]
    return {"architectures": ["Gemma4ForConditionalGeneration"], "audio_config": None,
            "audio_token_id": 258881, "boa_token_id": 256000, "boi_token_id": 255999,
            "eoa_token_index": 258883, "eoi_token_id": 258882, "image_token_id": 258880,
            "initializer_range": 0.02, "model_type": "gemma4",
            "text_config": {k: v for k, v in text.items() if k != "architectures"},
            "tie_word_embeddings": True, "torch_dtype": "bfloat16", "video_token_id": 258884,
            "vision_config": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                              "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8,
                              "patch_size": 4, "position_embedding_size": 32,
                              "model_type": "gemma4_vision"}}


# A tiny WordPiece vocabulary for the BERT toys' tokenizer (bert-base-uncased's special
# tokens at their places in order: [PAD] first, as pad_token_id 0 says).
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "is", "of", "and", "to",
         "in", "man", "woman", "girl", "baby", "food", "bread", "horse", "capital", "city",
         "paris", "france", "berlin", "germany", "eating", "riding", "carrying", "piece",
         "good", "bad", "movie", "was", "very", "not", "it", "this", "i", "like", "love",
         "hate", "##s", "##ing", "##ed", ".", ",", "!", "?"]

SENTENCE_LABELS = {"0": "negative", "1": "neutral", "2": "positive"}
TOKEN_LABELS = {"0": "O", "1": "B-PER", "2": "I-PER", "3": "B-LOC", "4": "I-LOC"}


def shrunk_bert(config: dict, vocab: int) -> dict:
    return {**config, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
            "num_hidden_layers": 2, "max_position_embeddings": 40, "vocab_size": vocab}


def labelled(config: dict, architecture: str, labels: dict) -> dict:
    return {**config, "architectures": [architecture], "id2label": labels,
            "label2id": {v: int(k) for k, v in labels.items()}}


def toys() -> dict[str, tuple[dict, str | None]]:
    """Each toy's config.json and its tokenizer's kind (None: none)."""
    bert = shrunk_bert(BERT_BASE_UNCASED, len(WORDS))
    roberta = {**ROBERTA_BASE, "hidden_size": 32, "intermediate_size": 64,
               "num_attention_heads": 4, "num_hidden_layers": 2,
               "max_position_embeddings": 42, "vocab_size": 96}
    return {
        "bert-base-uncased-toy": (bert, "wordpiece"),
        "bert-sequence-classification-toy": (
            labelled(bert, "BertForSequenceClassification", SENTENCE_LABELS), "wordpiece"),
        "bert-token-classification-toy": (
            labelled(bert, "BertForTokenClassification", TOKEN_LABELS), "wordpiece"),
        "roberta-base-toy": (roberta, None),
        "roberta-sequence-classification-toy": (
            labelled(roberta, "RobertaForSequenceClassification", SENTENCE_LABELS), None),
        "xlm-roberta-base-toy": ({**XLM_ROBERTA_BASE, "hidden_size": 32,
                                  "intermediate_size": 64, "num_attention_heads": 4,
                                  "num_hidden_layers": 2, "max_position_embeddings": 42,
                                  "vocab_size": 96}, None),
        "modernbert-base-toy": ({**MODERNBERT_BASE, "hidden_size": 32, "intermediate_size": 48,
                                 "num_attention_heads": 4, "num_hidden_layers": 4,
                                 "local_attention": 8, "max_position_embeddings": 64,
                                 "vocab_size": 96, "bos_token_id": 90, "cls_token_id": 90,
                                 "eos_token_id": 91, "sep_token_id": 91,
                                 "pad_token_id": 92}, None),
        "nomic-embed-text-v1.5-toy": ({**NOMIC_EMBED_TEXT_V15, "n_embd": 32, "hidden_size": 32,
                                       "n_head": 4, "num_attention_heads": 4, "n_inner": 64,
                                       "intermediate_size": 64, "n_layer": 2,
                                       "num_hidden_layers": 2, "vocab_size": 96,
                                       "max_position_embeddings": 32,
                                       "max_trained_positions": 32, "n_positions": 128}, None),
        "mistral-small-3.1-toy": ({**MISTRAL_SMALL_31,
                                   "text_config": {**MISTRAL_SMALL_31["text_config"],
                                                   "head_dim": 8, "hidden_size": 32,
                                                   "intermediate_size": 64,
                                                   "num_attention_heads": 4,
                                                   "num_hidden_layers": 2,
                                                   "num_key_value_heads": 2,
                                                   "vocab_size": 128},
                                   "vision_config": {**MISTRAL_SMALL_31["vision_config"],
                                                     "head_dim": 8, "hidden_size": 16,
                                                     "image_size": 28, "intermediate_size": 32,
                                                     "num_attention_heads": 2,
                                                     "num_hidden_layers": 1}}, None),
        # original_max_position_embeddings shrunk to 16 so that the query scale's
        # floor(position / 16) steps (1, 1 + 0.1 log 2, ...) within the golden's positions.
        "ministral-3-3b-toy": ({**MINISTRAL_3_3B,
                                "text_config": {**MINISTRAL_3_3B["text_config"],
                                                "head_dim": 8, "hidden_size": 32,
                                                "intermediate_size": 64,
                                                "num_attention_heads": 4,
                                                "num_hidden_layers": 2,
                                                "num_key_value_heads": 2,
                                                "max_position_embeddings": 256,
                                                "vocab_size": 128,
                                                "rope_parameters": {
                                                    **MINISTRAL_3_3B["text_config"][
                                                        "rope_parameters"],
                                                    "original_max_position_embeddings": 16}},
                                "vision_config": {**MINISTRAL_3_3B["vision_config"],
                                                  "head_dim": 8, "hidden_size": 16,
                                                  "image_size": 28, "intermediate_size": 32,
                                                  "num_attention_heads": 2,
                                                  "num_hidden_layers": 1}}, None),
        "gemma4-composite-toy": (gemma4_composite(), None),
        # Four layers (RoPE and chunked at 0-2, NoPE at 3), every one a mixture of four
        # experts; the ids the file names moved into 256 rows; chunks of 16 positions so the
        # golden crosses them; attn_temperature_tuning true (docstring).
        "llama-4-scout-toy": ({**LLAMA_4_SCOUT,
                               "boi_token_index": 250, "eoi_token_index": 251,
                               "image_token_index": 252,
                               "text_config": {**LLAMA_4_SCOUT["text_config"],
                                               "hidden_size": 64, "num_attention_heads": 4,
                                               "num_key_value_heads": 2, "head_dim": 16,
                                               "intermediate_size": 104,
                                               "intermediate_size_mlp": 208,
                                               "num_hidden_layers": 4,
                                               "moe_layers": [0, 1, 2, 3],
                                               "no_rope_layers": [1, 1, 1, 0],
                                               "num_local_experts": 4, "vocab_size": 256,
                                               "bos_token_id": 240,
                                               "eos_token_id": [241, 247, 248],
                                               "pad_token_id": 249,
                                               "attention_chunk_size": 16,
                                               "attn_temperature_tuning": True},
                               "vision_config": {**LLAMA_4_SCOUT["vision_config"],
                                                 "hidden_size": 16, "intermediate_size": 64,
                                                 "num_attention_heads": 2,
                                                 "num_hidden_layers": 1, "image_size": 28,
                                                 "projector_input_dim": 32,
                                                 "projector_output_dim": 32,
                                                 "vision_output_dim": 32}}, None),
        # Four layers, the delta rule at 0-2 (2 key heads over 4 value heads) and gated
        # attention at 3; a quarter of head_dim 32 turned, mrope_section halved twice to fit it.
        "qwen3.5-0.8b-toy": ({**QWEN3_5_08B,
                              "text_config": {**QWEN3_5_08B["text_config"], "head_dim": 32,
                                              "hidden_size": 32, "intermediate_size": 64,
                                              "layer_types": ["linear_attention"] * 3
                                              + ["full_attention"],
                                              "linear_key_head_dim": 8,
                                              "linear_num_key_heads": 2,
                                              "linear_num_value_heads": 4,
                                              "linear_value_head_dim": 8,
                                              "max_position_embeddings": 256,
                                              "num_attention_heads": 2,
                                              "num_hidden_layers": 4,
                                              "num_key_value_heads": 1, "vocab_size": 256,
                                              "eos_token_id": 255,
                                              "rope_parameters": {
                                                  **QWEN3_5_08B["text_config"]["rope_parameters"],
                                                  "mrope_section": [2, 1, 1]}},
                              "image_token_id": 250, "video_token_id": 251,
                              "vision_start_token_id": 252, "vision_end_token_id": 253,
                              "vision_config": {**QWEN3_5_08B["vision_config"], "depth": 1,
                                                "hidden_size": 16, "intermediate_size": 32,
                                                "num_heads": 2, "num_position_embeddings": 16,
                                                "out_hidden_size": 32}}, None),
        "gemma-3-4b-it-toy": ({**GEMMA3_4B_IT,
                               "boi_token_index": 253, "eoi_token_index": 254,
                               "image_token_index": 255, "eos_token_id": [1, 106],
                               "mm_tokens_per_image": 4,
                               "text_config": {**GEMMA3_4B_IT["text_config"], "hidden_size": 32,
                                               "intermediate_size": 64, "num_hidden_layers": 6,
                                               "sliding_window": 8, "vocab_size": 256,
                                               "num_attention_heads": 2,
                                               "num_key_value_heads": 1, "head_dim": 16},
                               "vision_config": {**GEMMA3_4B_IT["vision_config"],
                                                 "hidden_size": 16, "image_size": 28,
                                                 "intermediate_size": 32,
                                                 "num_attention_heads": 2,
                                                 "num_hidden_layers": 1}}, None),
    }


def wordpiece(directory: Path, max_length: int) -> None:
    """A BERT tokenizer over ``WORDS`` (lower-cased, [CLS] ... [SEP]), written as transformers'
    fast tokenizers save one (tokenizer.json, tokenizer_config.json)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.decoder = decoders.WordPiece()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
                                   model_max_length=max_length)
    fast.save_pretrained(directory)


def spread(model) -> None:
    """Weights of order-one effect, not transformers' initializer (normal, std 0.02), under
    which every score is near 0 and a wrong head can hide in the noise: a matrix's entries
    N(0, 1 / fan_in), a norm's weights 1 + N(0, 0.1) (a Gemma norm's, held as w in 1 + w,
    N(0, 0.1)), every other vector N(0, 0.1)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if p.ndim >= 2:
                value = noise / p.shape[-1] ** 0.5 if p.ndim == 2 else noise * 0.1
            elif "norm" in name.lower() and name.endswith("weight") and "gemma" not in \
                    type(model).__name__.lower():
                value = 1 + 0.1 * noise
            else:
                value = 0.1 * noise
            p.copy_(value.to(p.dtype))


def make(name: str, config: dict, tokenizer: str | None) -> Path:
    import torch
    import transformers

    directory = HERE / name
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    raw = directory / "raw-config.json"
    raw.write_text(json.dumps(config, indent=2))
    torch.manual_seed(0)
    parsed = transformers.AutoConfig.from_pretrained(directory / "raw-config.json")
    cls = getattr(transformers, config["architectures"][0])
    dtype = {"bfloat16": torch.bfloat16}.get(config.get("torch_dtype") or config.get("dtype"),
                                              torch.float32)
    model = cls(parsed).eval()
    spread(model)
    model = model.to(dtype)
    model.save_pretrained(directory)
    raw.unlink()
    # The published file, every key as it was (save_pretrained rewrites config.json in full).
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if tokenizer == "wordpiece":
        wordpiece(directory, config["max_position_embeddings"])
    if name in PREPROCESSORS:
        (directory / "preprocessor_config.json").write_text(
            json.dumps(PREPROCESSORS[name], indent=2) + "\n")
    return directory


def main(names: list[str]) -> None:
    known = toys()
    for name in names or list(known):
        config, tokenizer = known[name]
        print(make(name, config, tokenizer))


if __name__ == "__main__":
    main(sys.argv[1:])
