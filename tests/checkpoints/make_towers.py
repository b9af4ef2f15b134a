"""Make the composite toys with towers (a text model and an image tower in one checkpoint) and
record their goldens: each published checkpoint's own config.json with every key kept and
only the sizes shrunk (and the token ids moved into a toy vocabulary), built by transformers'
own class on drawn weights (``make_toys.spread``), with a tokenizer, the published chat
template and the family's processor, each saved as transformers saves them.

Run where torch and transformers are installed (not in CI, which reads the files):

    python -m tests.checkpoints.make_towers            # every toy and its golden
    python -m tests.checkpoints.make_towers NAME ...

The golden (tests/goldens/towers/<spec>/<toy>.npz) holds what transformers' own processor and
model give for a chat with an image (``IMAGE``, drawn here, kept in the golden): the
messages, the ids, the pixel values, the tower's soft tokens and the logits at every
position of the prompt and of the greedy tokens after it (teacher-forced).

The configs and where each was read:

- gemma-3-4b-it: https://huggingface.co/google/gemma-3-4b-it/resolve/main/config.json (as
  ``make_toys.GEMMA3_4B_IT``); its chat template as the hub's tokenizer_config.json holds it
  (quoted whole in transformers' tests/models/gemma3/test_processing_gemma3.py).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np

from .make_toys import GEMMA3_4B_IT, spread

HERE = Path(__file__).resolve().parent
# Beside the text goldens (tests/goldens/<spec>/), whose form these are not.
GOLDENS = HERE.parent / "goldens" / "towers"

GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- set first_user_prefix"
    " = messages[0]['content'][0]['text'] + '\n\n' -%}\n    {%- set loop_messages = "
    "messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n    {%- set "
    "loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n    "
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n        {{ "
    "raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") "
    "}}\n    {%- endif -%}\n    {%- if (message['role'] == 'assistant') -%}\n        {%- set "
    "role = \"model\" -%}\n    {%- else -%}\n        {%- set role = message['role'] -%}\n    "
    "{%- endif -%}\n    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first "
    "else \"\") }}\n    {%- if message['content'] is string -%}\n        {{ message['content'] "
    "| trim }}\n    {%- elif message['content'] is iterable -%}\n        {%- for item in "
    "message['content'] -%}\n            {%- if item['type'] == 'image' -%}\n                "
    "{{ '<start_of_image>' }}\n            {%- elif item['type'] == 'text' -%}\n              "
    "  {{ item['text'] | trim }}\n            {%- endif -%}\n        {%- endfor -%}\n    {%- "
    "else -%}\n        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n    "
    "{{ '<end_of_turn>\n' }}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n    "
    "{{'<start_of_turn>model\n'}}\n{%- endif -%}\n")

# The toy vocabulary: Gemma's special tokens first, then the 256 bytes (byte-level BPE).
GEMMA3_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>",
                   "<start_of_image>", "<end_of_image>", "<image_soft_token>"]

GEMMA3_TOY = {
    **GEMMA3_4B_IT,
    "boi_token_index": 6, "eoi_token_index": 7, "image_token_index": 8, "eos_token_id": [1, 5],
    "mm_tokens_per_image": 4,
    "text_config": {**GEMMA3_4B_IT["text_config"], "hidden_size": 64, "intermediate_size": 128,
                    "num_hidden_layers": 6, "sliding_window": 8,
                    "vocab_size": len(GEMMA3_SPECIALS) + 256, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 16},
    "vision_config": {**GEMMA3_4B_IT["vision_config"], "hidden_size": 32, "image_size": 56,
                      "intermediate_size": 64, "num_attention_heads": 2,
                      "num_hidden_layers": 2}}

# A chat with an image between two texts: the golden's prompt (a sound in place of the
# image for an audio tower).
MESSAGES = [{"role": "user", "content": [
    {"type": "text", "text": "Look at this:"}, {"type": "image"},
    {"type": "text", "text": "What is in the picture?"}]}]
AUDIO_MESSAGES = [{"role": "user", "content": [
    {"type": "audio"}, {"type": "text", "text": "What is that sound?"}]}]


def image() -> np.ndarray:
    """The golden's image: 40x70 RGB, drawn at seed 0 (a size the processor must resize)."""
    return np.random.default_rng(0).integers(0, 256, (40, 70, 3), dtype=np.uint8)


def byte_level(specials: list[str], extra: dict, bos: str = "<bos>", eos: str = "<eos>",
               pad: str = "<pad>", unk: str = "<unk>"):
    """A byte-level BPE tokenizer: ``specials`` at ids 0.., then the 256 bytes, no merges;
    as transformers' fast tokenizer with ``extra`` special tokens named."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {t: i for i, t in enumerate(specials)}
    for b in sorted(alphabet):
        vocab[b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, [], unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos,
                                   pad_token=pad, unk_token=unk,
                                   extra_special_tokens=extra)


def gemma3_processor():
    from transformers import Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    tokenizer = byte_level(GEMMA3_SPECIALS, {"boi_token": "<start_of_image>",
                                             "eoi_token": "<end_of_image>",
                                             "image_token": "<image_soft_token>"})
    side = GEMMA3_TOY["vision_config"]["image_size"]
    images = Gemma3ImageProcessorPil(size={"height": side, "width": side},
                                     image_mean=[0.5] * 3, image_std=[0.5] * 3)
    return Gemma3Processor(image_processor=images, tokenizer=tokenizer,
                           chat_template=GEMMA3_CHAT_TEMPLATE,
                           image_seq_length=GEMMA3_TOY["mm_tokens_per_image"])


# llava-hf/llava-1.5-7b-hf's config.json, every key as published (quoted whole in public
# code: the search tool's ids 34455599379 and 70732340604).
LLAVA_15_7B = {
    "architectures": ["LlavaForConditionalGeneration"], "ignore_index": -100,
    "image_token_index": 32000, "model_type": "llava", "pad_token_id": 32001,
    "projector_hidden_act": "gelu",
    "text_config": {"_name_or_path": "lmsys/vicuna-7b-v1.5", "architectures": ["LlamaForCausalLM"],
                    "max_position_embeddings": 4096, "model_type": "llama",
                    "rms_norm_eps": 1e-05, "torch_dtype": "float16", "vocab_size": 32064},
    "tie_word_embeddings": False, "torch_dtype": "float16",
    "transformers_version": "4.36.0.dev0",
    "vision_config": {"hidden_size": 1024, "image_size": 336, "intermediate_size": 4096,
                      "model_type": "clip_vision_model", "num_attention_heads": 16,
                      "num_hidden_layers": 24, "patch_size": 14, "projection_dim": 768,
                      "vocab_size": 32000},
    "vision_feature_layer": -2, "vision_feature_select_strategy": "default",
    "vocab_size": 32064}

# Its chat template as the hub's chat_template.json holds it (quoted whole in transformers'
# tests/models/llava_next/test_processing_llava_next.py and public code, id 6586307686).
LLAVA_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper()"
    " + ': '}}{% endif %}{# Render all images first #}{% for content in message['content'] | "
    "selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}{# Render all text "
    "next #}{% if message['role'] != 'assistant' %}{% for content in message['content'] | "
    "selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}{% endfor %}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}")

LLAVA_SPECIALS = ["<unk>", "<s>", "</s>", "<image>", "<pad>"]

LLAVA_TOY = {
    **LLAVA_15_7B, "image_token_index": 3, "pad_token_id": 4,
    "vocab_size": len(LLAVA_SPECIALS) + 256,
    "text_config": {**LLAVA_15_7B["text_config"], "hidden_size": 64, "intermediate_size": 128,
                    "num_hidden_layers": 2, "num_attention_heads": 4,
                    "vocab_size": len(LLAVA_SPECIALS) + 256},
    "vision_config": {**LLAVA_15_7B["vision_config"], "hidden_size": 32, "image_size": 56,
                      "intermediate_size": 64, "num_attention_heads": 2,
                      "num_hidden_layers": 3, "projection_dim": 16}}


def llava_processor():
    from tokenizers import processors
    from transformers import LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    tokenizer = byte_level(LLAVA_SPECIALS, {"image_token": "<image>"}, bos="<s>", eos="</s>",
                           pad="<pad>")
    # LlamaTokenizer's BOS before every text, as the published tokenizer adds it.
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    side = LLAVA_TOY["vision_config"]["image_size"]
    images = CLIPImageProcessorPil(size={"shortest_edge": side},
                                   crop_size={"height": side, "width": side})
    return LlavaProcessor(image_processor=images, tokenizer=tokenizer,
                          chat_template=LLAVA_CHAT_TEMPLATE, patch_size=14,
                          vision_feature_select_strategy="default",
                          num_additional_image_tokens=1)


# Qwen/Qwen2-Audio-7B's config.json as public code quotes it (the search tool's ids
# 55608441559 and 62468705986: the keys a loader reads, kept as quoted).
QWEN2_AUDIO_7B = {
    "architectures": ["Qwen2AudioForConditionalGeneration"], "model_type": "qwen2_audio",
    "_name_or_path": "Qwen/Qwen2-Audio-7B", "audio_token_index": 151646, "vocab_size": 156032,
    "audio_config": {"model_type": "qwen2_audio_encoder", "num_mel_bins": 128,
                     "encoder_layers": 32, "encoder_attention_heads": 20,
                     "encoder_ffn_dim": 5120, "d_model": 1280, "activation_function": "gelu",
                     "scale_embedding": False, "max_source_positions": 1500},
    "text_config": {"bos_token_id": 151643, "eos_token_id": 151645, "intermediate_size": 11008,
                    "max_position_embeddings": 8192, "model_type": "qwen2", "rope_theta": 10000,
                    "rms_norm_eps": 1e-5, "sliding_window": 32768, "torch_dtype": "bfloat16",
                    "use_mrope": False, "vocab_size": 156032}}

QWEN2_AUDIO_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|AUDIO|>",
                        "<|audio_bos|>", "<|audio_eos|>"]

QWEN2_AUDIO_TOY = {
    **QWEN2_AUDIO_7B, "audio_token_index": 3, "vocab_size": len(QWEN2_AUDIO_SPECIALS) + 256,
    "audio_config": {**QWEN2_AUDIO_7B["audio_config"], "encoder_layers": 2,
                     "encoder_attention_heads": 2, "encoder_ffn_dim": 64, "d_model": 32},
    "text_config": {**QWEN2_AUDIO_7B["text_config"], "bos_token_id": 0, "eos_token_id": 2,
                    "intermediate_size": 128, "hidden_size": 64, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 2,
                    "vocab_size": len(QWEN2_AUDIO_SPECIALS) + 256}}


def qwen2_audio_processor():
    from transformers import Qwen2AudioProcessor, WhisperFeatureExtractor

    tokenizer = byte_level(QWEN2_AUDIO_SPECIALS, {"audio_token": "<|AUDIO|>",
                                                  "audio_bos_token": "<|audio_bos|>",
                                                  "audio_eos_token": "<|audio_eos|>"},
                           bos=None, eos="<|im_end|>", pad="<|endoftext|>")
    features = WhisperFeatureExtractor(feature_size=128, return_attention_mask=True)
    return Qwen2AudioProcessor(feature_extractor=features, tokenizer=tokenizer)


def sound() -> np.ndarray:
    """The audio golden's sound: pygame's boom.wav (a recorded sound shipped in its wheel,
    11025 Hz, 8-bit), resampled to 16 kHz (runtime.towers.audio.read_audio: soundfile and
    soxr)."""
    import importlib.util

    from iron_spec.runtime.towers.audio import read_audio

    data = Path(importlib.util.find_spec("pygame").origin).parent / "examples" / "data"
    return read_audio(data / "boom.wav", 16000)


# HuggingFaceTB/SmolVLM2-500M-Video-Instruct's config.json, every key as published (quoted
# whole, "verbatim from the model card", in public code: the search tool's id 68306089702).
SMOLVLM2_500M = {
    "architectures": ["SmolVLMForConditionalGeneration"], "image_token_id": 49190,
    "model_type": "smolvlm", "pad_token_id": 128002, "scale_factor": 4,
    "text_config": {
        "architectures": ["VLlama3ForCausalLM"], "head_dim": 64, "hidden_size": 960,
        "intermediate_size": 2560, "is_llama_config": True, "max_position_embeddings": 8192,
        "model_type": "llama", "neftune_noise_alpha": 0.0, "num_attention_heads": 15,
        "num_hidden_layers": 32, "num_key_value_heads": 5, "pad_token_id": 2,
        "pixel_shuffle_factor": 4, "qk_layer_norms": False, "rms_norm_eps": 1e-05,
        "rope_interleaved": False, "rope_theta": 100000, "torch_dtype": "bfloat16",
        "use_resampler": False, "vocab_size": 49280},
    "tie_word_embeddings": False, "torch_dtype": "float32", "transformers_version": "4.47.1",
    "use_cache": False, "use_reentrant_checkpointing": False,
    "vision_config": {
        "hidden_size": 768, "image_size": 512, "max_image_size": {"longest_edge": 512},
        "model_type": "smolvlm_vision", "num_attention_heads": 12, "patch_size": 16,
        "size": {"longest_edge": 2048}, "tie_word_embeddings": False,
        "use_base_siglip": False},
    "vocab_size": 49280}

# Its preprocessor settings as published (the same source), sizes shrunk with the tower's.
SMOLVLM2_IMAGES = {"do_convert_rgb": True, "do_image_splitting": True, "do_normalize": True,
                   "do_pad": True, "do_rescale": True, "do_resize": True,
                   "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                   "max_image_size": {"longest_edge": 32}, "resample": 1,
                   "rescale_factor": 0.00392156862745098, "size": {"longest_edge": 64}}

SMOLVLM_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<end_of_utterance>",
                    "<fake_token_around_image>", "<image>", "<global-img>"] + [
    f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]

SMOLVLM2_TOY = {
    **SMOLVLM2_500M, "image_token_id": SMOLVLM_SPECIALS.index("<image>"),
    "vocab_size": len(SMOLVLM_SPECIALS) + 256,
    "text_config": {**SMOLVLM2_500M["text_config"], "head_dim": 8, "hidden_size": 32,
                    "intermediate_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
                    "num_key_value_heads": 2, "vocab_size": len(SMOLVLM_SPECIALS) + 256},
    # 8x8 patches of 4 pixels a tile: the published scale_factor 4 leaves 2x2 soft tokens.
    "vision_config": {**SMOLVLM2_500M["vision_config"], "hidden_size": 32, "image_size": 32,
                      "intermediate_size": 64, "num_attention_heads": 2,
                      "num_hidden_layers": 2, "patch_size": 4,
                      "max_image_size": {"longest_edge": 32}, "size": {"longest_edge": 64}}}


def smolvlm_processor():
    """SmolVLM 2's processor as Idefics3Processor: SmolVLMProcessor needs a video processor,
    which needs torchvision (not usable beside this torch build); its image expansion
    (``get_image_prompt_string``) writes what Idefics3Processor's ``replace_image_token``
    does, and SmolVLMImageProcessorPil is Idefics3ImageProcessorPil (modular_smolvlm.py)."""
    from transformers import Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import \
        Idefics3ImageProcessorPil
    from transformers.models.smolvlm.processing_smolvlm import DEFAULT_CHAT_TEMPLATE

    tokenizer = byte_level(SMOLVLM_SPECIALS, {"fake_image_token": "<fake_token_around_image>",
                                              "image_token": "<image>",
                                              "global_image_token": "<global-img>",
                                              "end_of_utterance_token": "<end_of_utterance>"},
                           bos="<|im_start|>", eos="<end_of_utterance>", pad="<|im_end|>",
                           unk="<|endoftext|>")
    images = Idefics3ImageProcessorPil(**SMOLVLM2_IMAGES)
    vision = SMOLVLM2_TOY["vision_config"]
    seq = (vision["image_size"] // vision["patch_size"]) ** 2 // SMOLVLM2_TOY["scale_factor"] ** 2
    return Idefics3Processor(image_processor=images, tokenizer=tokenizer, image_seq_len=seq,
                             chat_template=DEFAULT_CHAT_TEMPLATE)


TOYS = {"gemma3-vision-toy": ("gemma3", GEMMA3_TOY, gemma3_processor),
        "smolvlm2-toy": ("llama3", SMOLVLM2_TOY, smolvlm_processor),
        "llava-1.5-toy": ("llama3", LLAVA_TOY, llava_processor),
        "qwen2-audio-toy": ("qwen2", QWEN2_AUDIO_TOY, qwen2_audio_processor)}


def make(name: str) -> Path:
    import torch
    import transformers

    spec, config, processor = TOYS[name]
    directory = HERE / name
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    raw = directory / "raw-config.json"
    raw.write_text(json.dumps(config, indent=2))
    torch.manual_seed(0)
    parsed = transformers.AutoConfig.from_pretrained(raw)
    model = getattr(transformers, config["architectures"][0])(parsed).eval()
    spread(model)
    model = model.to({"float16": torch.float16}.get(config.get("torch_dtype"), torch.bfloat16))
    model.save_pretrained(directory)
    raw.unlink()
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    processor().save_pretrained(directory)
    record(spec, directory)
    return directory


def record(spec: str, directory: Path, steps: int = 8, picture: np.ndarray | None = None,
           path: Path | None = None) -> Path:
    """The golden of the toy in ``directory``: transformers' processor on ``MESSAGES`` and
    ``image()``, its model's logits (float32) at every position of the prompt and of
    ``steps`` greedy tokens after it."""
    import torch
    import transformers
    from PIL import Image

    processor = transformers.AutoProcessor.from_pretrained(directory)
    # The class config.json names (Qwen2-Audio's is no image-text-to-text model).
    config = json.loads((directory / "config.json").read_text())
    model = getattr(transformers, config["architectures"][0]).from_pretrained(
        directory, dtype=torch.float32).eval()
    audio = hasattr(processor, "feature_extractor")
    picture = (sound() if audio else image()) if picture is None else picture
    kind, plain = ("audio", AUDIO_MESSAGES) if audio else ("image", MESSAGES)
    given = picture if audio else Image.fromarray(picture)
    messages = [{"role": m["role"], "content": [
        {**c, kind: given} if c["type"] == kind else c
        for c in m["content"]]} for m in plain]
    inputs = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                           return_dict=True, return_tensors="pt",
                                           processor_kwargs={"sampling_rate": 16000}
                                           if audio else None)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=steps, do_sample=False)
        ids = out[0]
        full = {k: v for k, v in inputs.items()}
        full["input_ids"] = ids[None]
        full["attention_mask"] = torch.ones_like(ids)[None]
        types = inputs.get("token_type_ids")
        if types is not None:
            full["token_type_ids"] = torch.cat(
                [types, torch.zeros(1, len(ids) - types.shape[1], dtype=types.dtype)], 1)
        logits = model(**full).logits[0].float().numpy()
        if audio:
            soft = audio_soft_tokens(model, inputs)
        else:
            pooled = model.get_image_features(inputs["pixel_values"],
                                              return_dict=True).pooler_output
            # One image: its soft tokens (soft, hidden), whether held as a batch or a list.
            soft = pooled[0] if isinstance(pooled, (list, tuple)) else pooled
            soft = soft.reshape(-1, soft.shape[-1])
    path = path or GOLDENS / spec / f"{directory.name}.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    front = {"input_features": inputs["input_features"].float().numpy(),
             "feature_frames": int(inputs["feature_attention_mask"].sum())} if audio else \
        {"pixel_values": inputs["pixel_values"].float().numpy()}
    from iron_spec import load
    from iron_spec.library.multimodal_golden import inputs_fingerprint

    fp = inputs_fingerprint(load(spec, directory).loaded)
    np.savez_compressed(
        path, messages=json.dumps(plain), **{kind: picture}, fingerprint=fp,
        prompt_ids=inputs["input_ids"][0].numpy(), ids=ids.numpy(), **front,
        soft_tokens=soft.float().numpy(), logits=logits,
        transformers=transformers.__version__, torch=torch.__version__)
    return path


def audio_soft_tokens(model, inputs):
    """Qwen2AudioForConditionalGeneration's soft tokens for one sound, as its forward
    computes them (its audio tower on the features, the keys past the sound masked, the
    projector, the rows past num_audio_tokens dropped)."""
    import torch
    from transformers.masking_utils import create_bidirectional_mask

    inner = model.model if hasattr(model, "model") and hasattr(model.model, "audio_tower") \
        else model
    tower = inner.audio_tower
    lengths, out = tower._get_feat_extract_output_lengths(inputs["feature_attention_mask"].sum(-1))
    rows = (inputs["input_features"].shape[-1] - 2) // 2 + 1
    mask2d = (torch.arange(rows)[None, :] < lengths[:, None]).long()
    mask = create_bidirectional_mask(config=tower.config,
                                     inputs_embeds=torch.zeros(1, rows, 1), attention_mask=mask2d)
    states = tower(inputs["input_features"], attention_mask=mask).last_hidden_state
    return inner.multi_modal_projector(states)[0, : int(out[0])]


def photograph() -> Path:
    """A real photograph shipped inside a registry package: matplotlib's sample
    grace_hopper.jpg (512x600, JPEG), read from the installed package, never fetched."""
    import matplotlib

    return Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"


# Image processors as checkpoints configure them (transformers' PIL backends), by name: the
# class and its preprocessor_config.json settings. Small sizes keep every pixel in the
# golden; the published sizes keep a digest and every 1009th value.
FRONT_ENDS = {
    "gemma3-896": ("Gemma3ImageProcessorPil", {"size": {"height": 896, "width": 896},
                                               "image_mean": [0.5] * 3, "image_std": [0.5] * 3}),
    "gemma3-64": ("Gemma3ImageProcessorPil", {"size": {"height": 64, "width": 64},
                                              "image_mean": [0.5] * 3, "image_std": [0.5] * 3}),
    "clip-336": ("CLIPImageProcessorPil", {"size": {"shortest_edge": 336},
                                           "crop_size": {"height": 336, "width": 336}}),
    "clip-60": ("CLIPImageProcessorPil", {"size": {"shortest_edge": 64},
                                          "crop_size": {"height": 60, "width": 60}}),
}


def record_front_ends() -> Path:
    """transformers' pixel values for ``photograph()`` through each of ``FRONT_ENDS``, with
    the class's own settings (``settings``: its to_dict, what our front end is given)."""
    import hashlib

    import transformers
    from PIL import Image

    out = {}
    with Image.open(photograph()) as im:
        decoded = np.asarray(im.convert("RGB"))
        for name, (cls, settings) in FRONT_ENDS.items():
            processor = getattr(transformers, cls)(**settings)
            pixels = processor(im, return_tensors="np")["pixel_values"][0]
            own = {k: v for k, v in processor.to_dict().items()
                   if k in ("size", "resample", "do_resize", "do_center_crop", "crop_size",
                            "do_rescale", "rescale_factor", "do_normalize", "image_mean",
                            "image_std", "do_convert_rgb")}
            out[f"{name}.settings"] = json.dumps(own)
            out[f"{name}.shape"] = np.asarray(pixels.shape)
            out[f"{name}.sha256"] = hashlib.sha256(pixels.astype(np.float32).tobytes()).hexdigest()
            if pixels.size <= 3 * 64 * 64:
                out[f"{name}.pixels"] = pixels
            else:
                out[f"{name}.samples"] = pixels.reshape(-1)[::1009]
    path = GOLDENS / "front_ends" / "grace_hopper.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, names=np.asarray(list(FRONT_ENDS)),
                        decoded_sha256=hashlib.sha256(decoded.tobytes()).hexdigest(),
                        transformers=transformers.__version__,
                        pillow=__import__("PIL").__version__, **out)
    return path


def main(names: list[str]) -> None:
    if not names or "front_ends" in names:
        print(record_front_ends())
    for name in [n for n in names if n != "front_ends"] if names else list(TOYS):
        print(make(name))


if __name__ == "__main__":
    main(sys.argv[1:])
