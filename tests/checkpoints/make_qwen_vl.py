"""Make the Qwen2.5-VL composite toy and record its golden (as ``make_towers`` does for the
other towers; its own module because Qwen2.5-VL's processor gives an image's grid beside its
pixels and its model takes M-RoPE positions transformers computes from that grid).

Run where torch and transformers are installed (not in CI, which reads the files):

    python -m tests.checkpoints.make_qwen_vl               # the toy, its golden, the front ends
    python -m tests.checkpoints.make_qwen_vl front_ends    # transformers' pixels alone

The config: Qwen/Qwen2.5-VL-3B-Instruct's config.json
(https://huggingface.co/Qwen/Qwen2.5-VL-3B-Instruct/resolve/main/config.json), every key as
published (quoted whole in public code: the search tool's id 55701591320), the sizes shrunk
and the token ids moved into a toy vocabulary. Its chat template as the hub's
chat_template.json holds it (quoted whole in public code, ids 5779691352 and 51865850903).
The processor's settings are shrunk with the tower: patches of 4 pixels, windows of 16
pixels (2x2 merged rows), at most 2048 pixels an image, so the golden's 40x70 image is
resized by smart_resize's downscaling branch to 32x56, 8x14 patches, 4x7 soft tokens in 2x4
windows (the last column of windows one merged row wide).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np

from .make_toys import spread
from .make_towers import GOLDENS, HERE, MESSAGES, byte_level, image

QWEN2_5_VL_3B_INSTRUCT = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "vision_start_token_id": 151652,
    "vision_end_token_id": 151653, "vision_token_id": 151654, "image_token_id": 151655,
    "video_token_id": 151656, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 128000,
    "max_window_layers": 70, "model_type": "qwen2_5_vl", "num_attention_heads": 16,
    "num_hidden_layers": 36, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "transformers_version": "4.41.2", "use_cache": True,
    "use_sliding_window": False,
    "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280,
                      "intermediate_size": 3420, "num_heads": 16, "in_chans": 3,
                      "out_hidden_size": 2048, "patch_size": 14, "spatial_merge_size": 2,
                      "spatial_patch_size": 14, "window_size": 112,
                      "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2,
                      "temporal_patch_size": 2},
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vocab_size": 151936}

QWEN_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>"
    "{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == "
    "'image' or 'image' in content or 'image_url' in content %}{% set image_count.value = "
    "image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'video' or 'video' "
    "in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

QWEN_VL_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]

QWEN2_5_VL_TOY = {
    **QWEN2_5_VL_3B_INSTRUCT, "bos_token_id": 0, "eos_token_id": 2,
    "vision_start_token_id": 3, "vision_end_token_id": 4, "vision_token_id": 5,
    "image_token_id": 6, "video_token_id": 7, "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
    "max_window_layers": 2, "vocab_size": len(QWEN_VL_SPECIALS) + 256,
    "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
    "vision_config": {**QWEN2_5_VL_3B_INSTRUCT["vision_config"], "depth": 4, "hidden_size": 32,
                      "intermediate_size": 48, "num_heads": 2, "out_hidden_size": 64,
                      "patch_size": 4, "spatial_patch_size": 4, "window_size": 16,
                      "fullatt_block_indexes": [1, 3]}}

# Qwen2VLImageProcessor's settings as the 3B's preprocessor_config.json publishes them, the
# sizes shrunk with the tower's patches.
QWEN_VL_IMAGES = {"do_convert_rgb": True, "do_normalize": True, "do_rescale": True,
                  "do_resize": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
                  "image_std": [0.26862954, 0.26130258, 0.27577711], "max_pixels": 2048,
                  "merge_size": 2, "min_pixels": 256, "patch_size": 4, "resample": 3,
                  "rescale_factor": 0.00392156862745098, "temporal_patch_size": 2}


# Qwen2-VL: transformers' own Qwen2VLConfig keys (no published config.json was found in a
# public copy to cite; the class's fields, flat as Qwen2-VL's files publish them), small
# sizes. Its tower: LayerNorm blocks, fc1/quick_gelu/fc2, every block over the whole image.
QWEN2_VL_TOY = {
    "architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl",
    "bos_token_id": 0, "eos_token_id": 2, "vision_start_token_id": 3, "vision_end_token_id": 4,
    "vision_token_id": 5, "image_token_id": 6, "video_token_id": 7, "hidden_act": "silu",
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
    "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "max_position_embeddings": 32768, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "vocab_size": len(QWEN_VL_SPECIALS) + 256,
    "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
    "vision_config": {"depth": 3, "embed_dim": 32, "mlp_ratio": 2, "num_heads": 2,
                      "in_channels": 3, "hidden_size": 64, "patch_size": 4,
                      "spatial_merge_size": 2, "temporal_patch_size": 2,
                      "hidden_act": "quick_gelu"}}


def qwen_vl_processor(cls: str = "Qwen2_5_VLProcessor"):
    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import \
        Qwen2VLImageProcessorPil

    tokenizer = byte_level(QWEN_VL_SPECIALS, {"image_token": "<|image_pad|>",
                                              "video_token": "<|video_pad|>",
                                              "vision_bos_token": "<|vision_start|>",
                                              "vision_eos_token": "<|vision_end|>"},
                           bos=None, eos="<|im_end|>", pad="<|endoftext|>",
                           unk="<|endoftext|>")
    class ImagesOnly(getattr(transformers, cls)):
        """Qwen2_5_VLProcessor (or Qwen2VLProcessor) without its video processor (which needs torchvision, not
        usable beside this torch build); images and text are processed as by the class."""

        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            self.video_processor = None
            super().__init__(image_processor, tokenizer, chat_template=chat_template, **kwargs)

    ImagesOnly.__name__ = ImagesOnly.__qualname__ = cls
    return ImagesOnly(image_processor=Qwen2VLImageProcessorPil(**QWEN_VL_IMAGES),
                      tokenizer=tokenizer, chat_template=QWEN_VL_CHAT_TEMPLATE)


TOYS = {"qwen2.5-vl-toy": ("qwen2", QWEN2_5_VL_TOY, qwen_vl_processor),
        "qwen2-vl-toy": ("qwen2", QWEN2_VL_TOY, lambda: qwen_vl_processor("Qwen2VLProcessor"))}


def make(name: str, fingerprint: bool = True) -> Path:
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
    model = model.to(torch.bfloat16)
    model.save_pretrained(directory)
    raw.unlink()
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    processor().save_pretrained(directory)
    record(spec, directory, fingerprint=fingerprint)
    return directory


def record(spec: str, directory: Path, steps: int = 8, fingerprint: bool = True) -> Path:
    """The golden of the toy in ``directory``: transformers' processor on ``MESSAGES`` and
    ``image()`` (pixel values and the grid), its model's soft tokens and M-RoPE positions,
    and its logits (float32) at every position of the prompt and of ``steps`` greedy tokens
    after it (teacher-forced: one forward over them all, positions by get_rope_index)."""
    import torch
    import transformers
    from PIL import Image

    processor = TOYS[directory.name][2]()  # as saved (AutoProcessor wants torchvision)
    config = json.loads((directory / "config.json").read_text())
    model = getattr(transformers, config["architectures"][0]).from_pretrained(
        directory, dtype=torch.float32).eval()
    picture = image()
    messages = [{"role": m["role"], "content": [
        {**c, "image": Image.fromarray(picture)} if c["type"] == "image" else c
        for c in m["content"]]} for m in MESSAGES]
    inputs = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                           return_dict=True, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=steps, do_sample=False)
        ids = out[0]
        extra = len(ids) - inputs["input_ids"].shape[1]
        full = dict(inputs)
        full["input_ids"] = ids[None]
        full["attention_mask"] = torch.ones_like(ids)[None]
        types = inputs["mm_token_type_ids"]
        full["mm_token_type_ids"] = torch.cat([types, torch.zeros(1, extra, dtype=types.dtype)], 1)
        logits = model(**full).logits[0].float().numpy()
        positions, delta = model.model.get_rope_index(
            ids[None], full["mm_token_type_ids"], image_grid_thw=inputs["image_grid_thw"])
        soft = model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"],
                                        return_dict=True).pooler_output[0]
    path = GOLDENS / spec / f"{directory.name}.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    from iron_spec import load
    from iron_spec.library.multimodal_golden import inputs_fingerprint

    # Where the spec does not load the toy yet (while it is written), no fingerprint: the
    # golden judges nothing until recorded again.
    fp = inputs_fingerprint(load(spec, directory).loaded) if fingerprint else "none"
    np.savez_compressed(
        path, messages=json.dumps(MESSAGES), image=picture, fingerprint=fp,
        prompt_ids=inputs["input_ids"][0].numpy(), ids=ids.numpy(),
        pixel_values=inputs["pixel_values"].float().numpy()[None],
        image_grid_thw=inputs["image_grid_thw"].numpy(),
        rope_positions=positions[:, 0].numpy().T.astype(np.int32),
        rope_delta=int(delta[0, 0]), soft_tokens=soft.float().numpy(), logits=logits,
        transformers=transformers.__version__, torch=torch.__version__)
    return path


# Qwen2VLImageProcessor as Qwen2.5-VL-3B-Instruct's preprocessor_config.json sets it (its
# class defaults but min_pixels and max_pixels, which the published file names), and as the
# toy's: the golden holds a digest and every 1009th value of each.
FRONT_ENDS = {
    "qwen2.5-vl-3b": {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14,
                      "temporal_patch_size": 2, "merge_size": 2,
                      "image_mean": [0.48145466, 0.4578275, 0.40821073],
                      "image_std": [0.26862954, 0.26130258, 0.27577711]},
    "qwen2.5-vl-toy": QWEN_VL_IMAGES,
}


def record_front_ends() -> Path:
    """transformers' pixel values and grid for ``make_towers.photograph()`` through
    Qwen2VLImageProcessorPil with each of ``FRONT_ENDS``' settings."""
    import hashlib

    import transformers
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import \
        Qwen2VLImageProcessorPil

    from .make_towers import photograph

    out = {}
    with Image.open(photograph()) as im:
        for name, settings in FRONT_ENDS.items():
            got = Qwen2VLImageProcessorPil(**settings)(im, return_tensors="np")
            pixels = got["pixel_values"].astype(np.float32)
            out[f"{name}.settings"] = json.dumps(settings)
            out[f"{name}.grid"] = got["image_grid_thw"][0]
            out[f"{name}.shape"] = np.asarray(pixels.shape)
            out[f"{name}.sha256"] = hashlib.sha256(pixels.tobytes()).hexdigest()
            out[f"{name}.samples"] = pixels.reshape(-1)[::1009]
    path = GOLDENS / "front_ends" / "qwen2vl_grace_hopper.npz"
    np.savez_compressed(path, names=np.asarray(list(FRONT_ENDS)),
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
