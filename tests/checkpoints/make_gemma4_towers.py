"""Gemma 4's vision tower toy and its golden, as transformers 5.25 computes them.

    python tests/checkpoints/make_gemma4_towers.py        # writes gemma4-vision-toy and its golden
    python tests/checkpoints/make_gemma4_towers.py audio  # gemma4-audio-toy, its goldens

The toy is specs/gemma4.yaml's toy text model (experts beside every MLP, KV sharing, per-layer
inputs) inside Gemma4Config with a small Gemma4VisionConfig (2 layers, 32 wide, 2 heads of 16,
patches of 16 pixels pooled 3x3, a 64-row position table, axial RoPE theta 100), float32,
weights drawn as make_toys.spread draws them (Gemma 4's norms around 1),
its image processor saved as
Gemma4ImageProcessorPil writes it (max_soft_tokens 70: the smallest the processor takes).

The golden (tests/goldens/towers/gemma4/gemma4-vision-toy.npz) holds the image (40x70, seed 0:
resized by the processor to 288x528, 18x33 patches, 66 soft tokens), the processor's
``pixel_values`` and ``image_position_ids`` (its padding cut), the soft tokens
``get_image_features`` gives (after ``embed_vision``; the model in float64), ``ids`` (text ids around
``<boi> <image>*66 <eoi>``, as Gemma4Processor.replace_image_token expands a marker,
``prompt_ids``, then 6 tokens drawn greedily: ``ids``) and the logits of
Gemma4ForConditionalGeneration at every position of ``ids``, with the ``fingerprint`` of the
inputs (``multimodal_golden.inputs_fingerprint``). No tokenizer or chat template: the ids are
given (no ``messages``), so the golden judges the tower and the text model's placement alone.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

IMAGE_TOKEN, BOI, EOI, VIDEO, AUDIO, BOA, EOA = 250, 251, 252, 249, 253, 254, 255


def config() -> dict:
    import yaml

    text = yaml.safe_load((HERE.parents[1] / "specs" / "gemma4.yaml").read_text())["toy"]["config"]
    return {"architectures": ["Gemma4ForConditionalGeneration"], "audio_config": None,
            "audio_token_id": AUDIO, "boa_token_id": BOA, "boi_token_id": BOI,
            "eoa_token_index": EOA, "eoi_token_id": EOI, "image_token_id": IMAGE_TOKEN,
            "initializer_range": 0.02, "model_type": "gemma4",
            "text_config": {k: v for k, v in text.items() if k != "architectures"},
            "tie_word_embeddings": True, "torch_dtype": "float32", "video_token_id": VIDEO,
            "vision_config": {"hidden_size": 32, "intermediate_size": 64,
                              "num_hidden_layers": 2, "num_attention_heads": 2,
                              "num_key_value_heads": 2, "head_dim": 16, "patch_size": 16,
                              "pooling_kernel_size": 3, "position_embedding_size": 64,
                              "model_type": "gemma4_vision"}}


def image() -> np.ndarray:
    """40x70 RGB, drawn at seed 0 (make_towers.image's)."""
    return np.random.default_rng(0).integers(0, 256, (40, 70, 3), dtype=np.uint8)


def make(directory: Path) -> None:
    import shutil

    import torch
    import transformers
    from make_toys import spread

    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    torch.manual_seed(0)
    parsed = transformers.Gemma4Config(**{k: v for k, v in config().items()
                                          if k not in ("architectures", "model_type",
                                                       "torch_dtype")})
    model = transformers.Gemma4ForConditionalGeneration(parsed).eval()
    spread(model)
    # Gemma 4's norms multiply by their weight as it is (not 1 + w, as spread assumes of a
    # Gemma's): drawn around 1, so every layer and every mask counts in the logits (around
    # 0.1 the text's logits barely feel the image).
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.add_(1.0)
    model.save_pretrained(directory)
    (directory / "config.json").write_text(json.dumps(config(), indent=2) + "\n")
    transformers.Gemma4ImageProcessorPil(max_soft_tokens=70).save_pretrained(directory)


def record(directory: Path, golden: Path) -> None:
    import torch
    import transformers

    model = transformers.Gemma4ForConditionalGeneration.from_pretrained(
        directory, dtype=torch.float32).eval()
    processor = transformers.Gemma4ImageProcessorPil.from_pretrained(directory)
    picture = image()
    out = processor(picture, return_tensors="pt")
    n = int(out["num_soft_tokens_per_image"][0])
    real = (out["image_position_ids"][0] >= 0).all(-1)
    prompt = [2, 17, 40, 33, BOI] + [IMAGE_TOKEN] * n + [EOI, 60, 71, 9, 120]
    image_inputs = {"pixel_values": out["pixel_values"],
                    "image_position_ids": out["image_position_ids"]}
    with torch.no_grad():
        # The soft tokens in float64 (the float32 tower's own rounding reaches 1e-5 of
        # values near 3.5: the truth a float32 tower is judged by is float64's).
        exact = transformers.Gemma4ForConditionalGeneration.from_pretrained(
            directory, dtype=torch.float64).eval()
        soft = exact.model.get_image_features(
            image_inputs["pixel_values"].double(), image_inputs["image_position_ids"],
            return_dict=True).pooler_output[0]
        ids = model.generate(input_ids=torch.tensor([prompt]), **image_inputs,
                             max_new_tokens=6, do_sample=False)[0]
        logits = model(input_ids=ids[None], **image_inputs).logits[0]
    from iron_spec import load
    from iron_spec.library.multimodal_golden import inputs_fingerprint

    fp = inputs_fingerprint(load(HERE.parents[1] / "specs" / "gemma4.yaml", directory).loaded)
    golden.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        golden, image=picture, prompt_ids=np.array(prompt, np.int64), ids=ids.numpy(),
        pixel_values=out["pixel_values"][:, real].numpy().astype(np.float32),
        image_position_ids=out["image_position_ids"][0][real].numpy().astype(np.int64),
        soft_tokens=soft.numpy().astype(np.float32), logits=logits.numpy().astype(np.float32),
        fingerprint=fp, transformers=np.array(transformers.__version__),
        torch=np.array(torch.__version__))
    print(f"{golden}: {n} soft tokens, {len(ids)} ids, grid "
          f"{out['image_position_ids'][0][real].max(0).values.tolist()}")


def vision_mode(directory: Path, into: Path) -> Path:
    """The toy with text_config.use_bidirectional_attention "vision", no final softcap and a
    window of 128 (the same weights), in ``into``: an image's rows see each other both ways in the sliding
    layers alone."""
    import shutil

    shutil.copytree(directory, into, dirs_exist_ok=True)
    config = json.loads((into / "config.json").read_text())
    config["text_config"]["use_bidirectional_attention"] = "vision"
    # Logits not soft-capped, so the image rows' other masks reach the text's logits by more
    # than the gate (capped at 3.0 the two masks' logits differ by 1e-3 at most).
    config["text_config"]["final_logit_softcapping"] = None
    # A window holding the whole image, so what the full layers let the image's rows see
    # reaches the text through the sliding layers.
    config["text_config"]["sliding_window"] = 128
    (into / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return into


def record_vision_mode(directory: Path, golden: Path, first: Path) -> None:
    """Gemma4ForConditionalGeneration's logits over ``first``'s golden ids (the image's
    tokens typed 1 in mm_token_type_ids, as Gemma4Processor gives them) on the toy under
    use_bidirectional_attention "vision" (``vision_mode``), with its fingerprint."""
    import tempfile

    import torch
    import transformers

    base = dict(np.load(first))
    with tempfile.TemporaryDirectory() as tmp:
        mode = vision_mode(directory, Path(tmp) / "toy")
        model = transformers.Gemma4ForConditionalGeneration.from_pretrained(
            mode, dtype=torch.float32).eval()
        processor = transformers.Gemma4ImageProcessorPil.from_pretrained(mode)
        out = processor(base["image"], return_tensors="pt")
        ids = torch.tensor(base["ids"])[None]
        with torch.no_grad():
            logits = model(input_ids=ids, pixel_values=out["pixel_values"],
                           image_position_ids=out["image_position_ids"],
                           mm_token_type_ids=(ids == IMAGE_TOKEN).long()).logits[0]
        from iron_spec import load
        from iron_spec.library.multimodal_golden import inputs_fingerprint

        fp = inputs_fingerprint(load(HERE.parents[1] / "specs" / "gemma4.yaml", mode).loaded)
    np.savez_compressed(golden, ids=base["ids"], prompt_ids=base["prompt_ids"],
                        logits=logits.numpy().astype(np.float32), fingerprint=fp,
                        transformers=np.array(transformers.__version__))
    print(golden)


#: Image sizes (height, width) whose resized size get_aspect_ratio_preserving_size gives, per
#: budget: tall, wide, square, tiny, a thin strip (its edge case) and a photograph's.
SIZES = [(40, 70), (70, 40), (512, 600), (600, 512), (224, 224), (17, 1000), (1000, 17),
         (3000, 4000), (48, 48), (100, 3)]


def record_front_end(golden: Path) -> None:
    """transformers' Gemma4ImageProcessorPil on a real photograph (make_towers.photograph:
    matplotlib's grace_hopper.jpg) at budgets 70 and 280 (the class default): the unpadded
    pixel rows' digest, every 1009th value and the grid; and the resized sizes of ``SIZES``."""
    import hashlib

    import matplotlib
    import transformers
    from PIL import Image
    from transformers.models.gemma4.image_processing_pil_gemma4 import \
        get_aspect_ratio_preserving_size

    out = {}
    photograph = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
    with Image.open(photograph) as im:
        for budget in (70, 280):
            processor = transformers.Gemma4ImageProcessorPil(max_soft_tokens=budget)
            got = processor(im, return_tensors="np")
            real = (got["image_position_ids"][0] >= 0).all(-1)
            pixels = got["pixel_values"][0][real].astype(np.float32)
            out[f"{budget}.sha256"] = hashlib.sha256(pixels.tobytes()).hexdigest()
            out[f"{budget}.samples"] = pixels.reshape(-1)[::1009]
            out[f"{budget}.grid"] = got["image_position_ids"][0][real].max(0)[::-1] + 1
            out[f"{budget}.soft"] = int(got["num_soft_tokens_per_image"][0])
    for budget in (70, 280, 1120):
        out[f"sizes.{budget}"] = np.array([
            get_aspect_ratio_preserving_size(h, w, 16, budget * 9, 3) for h, w in SIZES])
    np.savez_compressed(golden, sizes=np.array(SIZES), transformers=transformers.__version__,
                        pillow=__import__("PIL").__version__, **out)
    print(golden)


#: Feature extractors as recorded: the class defaults, and one with every optional step on
#: (HTK preemphasis, per-bin mean and deviation, an input scale), by name.
EXTRACTORS = {"default": {},
              "every-step": {"preemphasis": 0.97, "input_scale_factor": 0.5,
                             "per_bin_mean": [0.01 * i for i in range(128)],
                             "per_bin_stddev": [1.0 + 0.02 * i for i in range(128)]},
              "plain-preemphasis": {"preemphasis": 0.9, "preemphasis_htk_flavor": False}}
#: Recorded sounds shipped in pygame's wheel (examples/data), read at 16 kHz by
#: runtime.towers.audio.read_audio (soundfile and soxr).
SOUNDS = ("boom.wav", "punch.wav", "house_lo.wav")


def record_sounds(golden: Path) -> None:
    """transformers' Gemma4AudioFeatureExtractor on ``SOUNDS`` with each of ``EXTRACTORS``:
    the features (their digest and every 97th value), the mask's count, and the soft tokens
    Gemma4Processor.replace_audio_token counts from the mask."""
    import hashlib
    import importlib.util

    import transformers
    from iron_spec.runtime.towers.audio import read_audio

    data = Path(importlib.util.find_spec("pygame").origin).parent / "examples" / "data"
    out = {}
    for sound in SOUNDS:
        wave = read_audio(data / sound, 16000)
        out[f"{sound}.wave_sha256"] = hashlib.sha256(wave.tobytes()).hexdigest()
        for name, settings in EXTRACTORS.items():
            got = transformers.Gemma4AudioFeatureExtractor(**settings)([wave],
                                                                      return_tensors="np")
            features = got["input_features"][0].astype(np.float32)
            mask = got["input_features_mask"][0]
            t = len(mask)
            for _ in range(2):
                t = (t + 2 - 3) // 2 + 1
                mask = mask[::2][:t]
            key = f"{sound}.{name}"
            out[f"{key}.sha256"] = hashlib.sha256(features.tobytes()).hexdigest()
            out[f"{key}.samples"] = features.reshape(-1)[::97]
            out[f"{key}.shape"] = np.array(features.shape)
            out[f"{key}.frames"] = int(got["input_features_mask"][0].sum())
            out[f"{key}.soft"] = int(mask.sum())
    np.savez_compressed(golden, extractors=json.dumps(EXTRACTORS), sounds=np.array(SOUNDS),
                        transformers=transformers.__version__, **out)
    print(golden)


# ---- Gemma 4's audio tower ----

#: The audio toy's tower: Gemma4AudioConfig with every key shrunk but the mel width the
#: subsampling's flattening ties to 128 (subsampling_conv_channels[0] // 4 frequency rows
#: after two stride-2 convolutions of 128 mel bins), the attention's chunk and context as
#: published (12, 13, 0), and a logit cap and a clip of the gradients small enough to bite.
AUDIO_CONFIG = {"model_type": "gemma4_audio", "hidden_size": 32, "num_hidden_layers": 2,
                "num_attention_heads": 2, "hidden_act": "silu",
                "subsampling_conv_channels": [128, 8], "conv_kernel_size": 5,
                "residual_weight": 0.5, "attention_chunk_size": 12,
                "attention_context_left": 13, "attention_context_right": 0,
                "attention_logit_cap": 2.0, "attention_invalid_logits_value": -1.0e9,
                "use_clipped_linears": True, "rms_norm_eps": 1e-6,
                "gradient_clipping": 4.0, "output_proj_dims": 24}


def audio_config() -> dict:
    """The audio toy's config.json: the text toy inside Gemma4Config, an audio tower
    (``AUDIO_CONFIG``), no vision tower."""
    out = config()
    out["vision_config"] = None
    out["audio_config"] = dict(AUDIO_CONFIG)
    return out


def make_audio(directory: Path) -> None:
    """The audio toy: weights drawn as ``make``'s, each clipped linear's bounds drawn
    around the magnitudes it meets (so some inputs and outputs clip), the feature extractor
    saved with its class defaults."""
    import shutil

    import torch
    import transformers
    from make_toys import spread

    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    torch.manual_seed(0)
    settings = {k: v for k, v in audio_config().items()
                if k not in ("architectures", "model_type", "torch_dtype")}
    parsed = transformers.Gemma4Config(**settings)
    model = transformers.Gemma4ForConditionalGeneration(parsed).eval()
    spread(model)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.add_(1.0)
        for name, b in model.named_buffers():
            # Gemma4ClippableLinear's bounds: asymmetric, from 0.5 to 2.5 away from 0.
            if name.endswith(("input_min", "input_max", "output_min", "output_max")):
                size = 0.5 + 2.0 * torch.rand((), generator=gen)
                b.copy_(-size if name.endswith("min") else size)
    model.save_pretrained(directory)
    (directory / "config.json").write_text(json.dumps(audio_config(), indent=2) + "\n")
    transformers.Gemma4AudioFeatureExtractor().save_pretrained(directory)


def audio_sound() -> np.ndarray:
    """pygame's boom.wav (a recorded sound shipped in its wheel, 11025 Hz, 8-bit, 1.13 s),
    read at 16 kHz by runtime.towers.audio.read_audio (soundfile and soxr), as
    make_towers.sound reads Qwen2-Audio's golden's."""
    import importlib.util

    from iron_spec.runtime.towers.audio import read_audio

    data = Path(importlib.util.find_spec("pygame").origin).parent / "examples" / "data"
    return read_audio(data / "boom.wav", 16000)


def record_audio(directory: Path, golden: Path) -> None:
    """The audio toy's golden: the sound, the extractor's features (its valid frames), the
    soft tokens ``get_audio_features`` gives (after ``embed_audio``, its padding rows
    dropped; in float32), ids around ``<boa> <audio>*n <eoa>`` as
    Gemma4Processor.replace_audio_token writes a sound's, 6 tokens drawn greedily, the
    logits of Gemma4ForConditionalGeneration at every position of ``ids``, and the sound's
    soft tokens batched beside a longer sound (``soft_tokens_in_batch``: its frames padded
    and masked, ``padded_frames`` of them)."""
    import torch
    import transformers

    model = transformers.Gemma4ForConditionalGeneration.from_pretrained(
        directory, dtype=torch.float32).eval()
    extractor = transformers.Gemma4AudioFeatureExtractor.from_pretrained(directory)
    wave = audio_sound()
    out = extractor([wave], return_tensors="pt")
    mask = out["input_features_mask"]
    frames = int(mask[0].sum())
    t, m = mask.shape[1], mask[0].numpy()
    for _ in range(2):
        t = (t + 2 - 3) // 2 + 1
        m = m[::2][:t]
    n = int(m.sum())
    prompt = [2, 17, 40, 33, BOA] + [AUDIO] * n + [EOA, 60, 71, 9, 120]
    inputs = {"input_features": out["input_features"], "input_features_mask": mask}
    with torch.no_grad():
        # In float32: Gemma4AudioAttention computes in float32 whatever the model's dtype
        # (its .float()), so a float64 model does not run.
        got = model.model.get_audio_features(out["input_features"], mask, return_dict=True)
        soft = got.pooler_output[0][got.attention_mask[0]]
        assert len(soft) == n, (len(soft), n)
        # The same sound batched beside a longer one (itself then half a second more): its
        # frames padded past it and masked, as transformers runs a batch.
        batch = extractor([wave, np.concatenate([wave, wave[:8000]])], return_tensors="pt")
        both = model.model.get_audio_features(batch["input_features"],
                                              batch["input_features_mask"], return_dict=True)
        in_batch = both.pooler_output[0][both.attention_mask[0]]
        padded = int(batch["input_features_mask"][0].numel() - batch["input_features_mask"][0].sum())
        ids = model.generate(input_ids=torch.tensor([prompt]), **inputs, max_new_tokens=6,
                             do_sample=False)[0]
        logits = model(input_ids=ids[None], **inputs).logits[0]
    from iron_spec import load
    from iron_spec.library.multimodal_golden import inputs_fingerprint

    fp = inputs_fingerprint(load(HERE.parents[1] / "specs" / "gemma4.yaml", directory).loaded)
    golden.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        golden, audio=wave, prompt_ids=np.array(prompt, np.int64), ids=ids.numpy(),
        input_features=out["input_features"][:, :frames].numpy().astype(np.float32),
        soft_tokens=soft.numpy().astype(np.float32), logits=logits.numpy().astype(np.float32),
        soft_tokens_in_batch=in_batch.numpy().astype(np.float32), padded_frames=padded,
        fingerprint=fp, transformers=np.array(transformers.__version__),
        torch=np.array(torch.__version__))
    print(f"{golden}: {frames} frames of {mask.shape[1]}, {n} soft tokens, {len(ids)} ids; "
          f"in a batch {padded} frames of padding")


#: Gemma4AudioAttention's windows recorded beside the toy's: (chunk, context_left,
#: context_right, logit_cap, sound rows): as published, a right context (its relative rows
#: shifted past the row's own), a chunk longer than the left context, one chunk.
ATTENTION_CASES = [(12, 13, 0, 50.0, 40), (4, 3, 2, 1.0, 17), (5, 7, 3, 3.0, 31),
                   (8, 4, 1, 2.0, 12)]


def record_local_attention(golden: Path) -> None:
    """Gemma4AudioAttention (transformers 5.25) in a one-layer Gemma4AudioModel on drawn
    features, each of ``ATTENTION_CASES``, three frames of padding masked: its scaled queries
    and keys, values and relative keys as it forms them (``q``, ``k``, ``v``, ``rel``), and its
    output before ``post`` (``out``), the sound's rows alone."""
    import math

    import torch
    import transformers
    from transformers.models.gemma4 import modeling_gemma4 as mg

    torch.manual_seed(0)
    out = {}
    for case, (chunk, left, right, cap, n) in enumerate(ATTENTION_CASES):
        cfg = transformers.Gemma4AudioConfig(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
            attention_chunk_size=chunk, attention_context_left=left,
            attention_context_right=right, attention_logit_cap=cap, use_clipped_linears=False,
            subsampling_conv_channels=[128, 4])
        cfg._attn_implementation = "eager"
        model = mg.Gemma4AudioModel(cfg).eval()
        attn = model.layers[0].self_attn
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape) * (p.shape[-1] ** -0.5 if p.ndim >= 2 else 0.3))
            attn.post.linear.weight.copy_(torch.eye(32))  # its output is the attention's
        seen = {}

        def hook(module, args, kwargs, result):
            seen.update(x=kwargs["hidden_states"][0], pos=kwargs["position_embeddings"][0],
                        out=result[0][0])

        attn.register_forward_hook(hook, with_kwargs=True)
        frames = 4 * n
        with torch.no_grad():
            model(torch.randn(1, frames, 128), torch.arange(frames)[None] < frames - 3)
            x, H, D = seen["x"], 2, 16
            q = attn.q_proj(x).view(-1, H, D) * attn.q_scale * \
                torch.nn.functional.softplus(attn.per_dim_scale)
            k = attn.k_proj(x).view(-1, H, D) * attn.k_scale
            v = attn.v_proj(x).view(-1, H, D)
            rel = attn.relative_k_proj(seen["pos"]).view(-1, H, D)
        rows = -(-(frames - 3) // 4)
        for name, value in (("q", q[:rows]), ("k", k[:rows]), ("v", v[:rows]), ("rel", rel),
                            ("out", seen["out"][:rows])):
            out[f"{case}.{name}"] = value.numpy().astype(np.float32)
        assert math.isfinite(float(seen["out"].abs().max()))
    np.savez_compressed(golden, cases=np.array(ATTENTION_CASES),
                        transformers=transformers.__version__, **out)
    print(golden)


def main() -> None:
    goldens = HERE.parent / "goldens" / "towers"
    if sys.argv[1:] == ["audio"]:
        make_audio(HERE / "gemma4-audio-toy")
        record_audio(HERE / "gemma4-audio-toy", goldens / "gemma4" / "gemma4-audio-toy.npz")
        record_local_attention(goldens / "gemma4" / "gemma4-audio-attention.npz")
        return
    directory = HERE / "gemma4-vision-toy"
    make(directory)
    record(directory, goldens / "gemma4" / "gemma4-vision-toy.npz")
    record_vision_mode(directory, goldens / "gemma4" / "gemma4-vision-toy-vision-mode.npz",
                       goldens / "gemma4" / "gemma4-vision-toy.npz")
    record_front_end(goldens / "front_ends" / "gemma4_grace_hopper.npz")
    record_sounds(goldens / "front_ends" / "gemma4_sounds.npz")


if __name__ == "__main__":
    main()
