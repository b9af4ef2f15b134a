"""A tower's cost: ours against transformers', side by side, at published tower sizes.

    python bench/towers.py [--tower gemma3 gemma4 qwen2-audio gemma4-audio] [--side ours|torch]
                           [--layers 2] [--runs 3] [--threads 2]
                           [--images 224 448 896] [--budgets 70 280 1120] [--seconds 5 30]

Four towers, each at its published widths on drawn weights (both sides draw their own of
the same shapes: a GEMM's time does not depend on the values), ``--layers`` of their layers
(a tower's time is linear in its layers: multiply by the layer count over ``--layers``):

- ``gemma3``: Gemma 3's image tower (SigLIP so400m: hidden 1152, 16 heads, intermediate
  4304, patches of 14 pixels, 27 layers; the projector to Gemma 3 4B's 2560, pooled to 256
  soft tokens), per image side (``--images``): the processor's square image.
- ``gemma4``: Gemma 4's image tower (Gemma4VisionConfig's defaults, google/gemma-4-e2b-it's:
  hidden 768, 12 heads of 64, intermediate 3072, patches of 16 pooled 3x3, 16 layers; to a
  1536-wide text model), per soft-token budget (``--budgets``: max_soft_tokens) on a 4:3
  photograph-shaped image (960x1280): transformers runs the processor's padded rows
  (masked), ours the image's own.
- ``qwen2-audio``: Qwen2-Audio's Whisper-large-shaped encoder (hidden 1280, 20 heads,
  intermediate 5120, 128 mels, 32 layers; to Qwen2-7B's 4096), per length of sound
  (``--seconds``): transformers runs the whole 30 s window (its feature extractor pads to
  it), ours the rows that hold the sound (the rest reach no soft token).
- ``gemma4-audio``: Gemma 4's audio tower (Gemma4AudioConfig's defaults, the released
  audio_config's: hidden 1024, 8 heads, subsampling channels 128 and 32, chunks of 12 with a
  left context of 13, 12 layers; output 1536 to a 1536-wide text model), per length of sound
  (``--seconds``): both sides run the sound's own frames (Gemma4AudioFeatureExtractor pads to
  128 samples alone), 100 a second.

Per input: the seconds one input's soft tokens take (front end output in, soft tokens out;
median of ``--runs`` after a warm-up) and soft tokens per second. Without ``--side`` each
side runs in a process of its own, in turn (a BLAS pool left spinning slows the next side in
the same process); quote the ratio from one run of this script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HIDDEN, HEADS, INTERMEDIATE, PATCH, TEXT, TOKENS = 1152, 16, 4304, 14, 2560, 256
# Gemma4VisionConfig's defaults; a 4:3 image the processor resizes per budget.
G4_HIDDEN, G4_HEADS, G4_HEAD_DIM, G4_INTERMEDIATE, G4_TEXT, G4_IMAGE = 768, 12, 64, 3072, 1536, \
    (960, 1280)
# Qwen2AudioEncoderConfig's defaults (Whisper large's encoder), Qwen2-7B's width.
A_HIDDEN, A_HEADS, A_INTERMEDIATE, A_MELS, A_TEXT, A_FRAMES = 1280, 20, 5120, 128, 4096, 3000
# Gemma4AudioConfig's defaults (the released audio_config).
GA_HIDDEN, GA_HEADS, GA_CHANNELS, GA_OUT, GA_TEXT = 1024, 8, (128, 32), 1536, 1536
LAYERS = {"gemma3": 27, "gemma4": 16, "qwen2-audio": 32, "gemma4-audio": 12}


def _ours(layers: int, side: int):
    from iron_spec.runtime.blocks.norms import NormOptions
    from iron_spec.runtime.checkpoint import fill
    from iron_spec.runtime.encoder_options import EncoderLayerOptions, EncoderOptions
    from iron_spec.runtime.towers.tower import ProjectorOptions, Tower, TowerOptions
    from iron_spec.runtime.weights import draw_weights
    import numpy as np

    norm = NormOptions(kind="layer", eps=1e-6)
    layer = EncoderLayerOptions(heads=HEADS, head_dim=HIDDEN // HEADS, kv_heads=None,
                                intermediate_size=INTERMEDIATE, norm=norm,
                                act="gelu_pytorch_tanh", bias=True, o_bias=True, mlp_bias=True,
                                placement="pre")
    encoder = EncoderOptions(vocab_size=1, hidden_size=HIDDEN, layers=(layer,) * layers,
                             norm=norm, max_tokens=(side // PATCH) ** 2)
    grid = side // PATCH
    o = TowerOptions(encoder=encoder, channels=3, patch=PATCH, image=(side, side),
                     pool=grid // int(TOKENS ** 0.5),
                     projector=ProjectorOptions(norm=NormOptions(plus_one=True)),
                     text_hidden=TEXT)
    tower = Tower(o)
    fill(tower, draw_weights(tower, 0))
    rows = np.random.default_rng(0).standard_normal((o.patches, 3 * PATCH * PATCH)).astype(
        np.float32)
    version = tower.version
    return lambda: version(rows), o.soft


def _torch(layers: int, side: int):
    # bench/profile.py beside this script shadows the standard library's profile, which
    # transformers' imports reach (cProfile): the script's folder is left off the path.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    import torch
    import transformers

    config = transformers.Gemma3Config(
        vision_config={"hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
                       "num_attention_heads": HEADS, "num_hidden_layers": layers,
                       "image_size": side, "patch_size": PATCH, "vision_use_head": False},
        text_config={"hidden_size": TEXT, "num_hidden_layers": 1, "vocab_size": 16,
                     "intermediate_size": 16, "num_attention_heads": 1,
                     "num_key_value_heads": 1, "head_dim": 16},
        mm_tokens_per_image=TOKENS)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    pixels = torch.randn(1, 3, side, side)

    def run():
        with torch.no_grad():
            return model.get_image_features(pixels, return_dict=True).pooler_output

    return run, TOKENS


def _ours_gemma4(layers: int, budget: int):
    from iron_spec.runtime.checkpoint import fill
    from iron_spec.runtime.towers.aspect_images import aspect_preserving_size
    from iron_spec.runtime.towers.axial import AxialTowerOptions, AxialTower
    from iron_spec.runtime.weights import draw_weights
    import numpy as np

    o = AxialTowerOptions(hidden_size=G4_HIDDEN, layers=layers, heads=G4_HEADS,
                            kv_heads=G4_HEADS, head_dim=G4_HEAD_DIM,
                            intermediate_size=G4_INTERMEDIATE, eps=1e-6,
                            act="gelu_pytorch_tanh", patch=16, pool=3, positions=10240,
                            rope_theta=100.0, text_hidden=G4_TEXT)
    tower = AxialTower(o)
    fill(tower, draw_weights(tower, 0))
    h, w = aspect_preserving_size(*G4_IMAGE, 16, budget * 9, 3)
    grid = (h // 16, w // 16)
    pixels = np.random.default_rng(0).uniform(0, 1, (grid[0] * grid[1], 768)).astype(np.float32)
    version = tower.version(grid)
    return lambda: version(pixels), tower.soft(grid)


def _torch_gemma4(layers: int, budget: int):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    import numpy as np
    import torch
    import transformers

    config = transformers.Gemma4Config(
        vision_config={"hidden_size": G4_HIDDEN, "intermediate_size": G4_INTERMEDIATE,
                       "num_attention_heads": G4_HEADS, "num_key_value_heads": G4_HEADS,
                       "head_dim": G4_HEAD_DIM, "num_hidden_layers": layers},
        text_config={"hidden_size": G4_TEXT, "num_hidden_layers": 1, "vocab_size": 16,
                     "vocab_size_per_layer_input": 16, "intermediate_size": 16,
                     "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 16,
                     "global_head_dim": 16, "hidden_size_per_layer_input": 4,
                     "layer_types": ["full_attention"]},
        audio_config=None)
    model = transformers.Gemma4ForConditionalGeneration(config).eval()
    processor = transformers.Gemma4ImageProcessorPil(max_soft_tokens=budget)
    image = np.random.default_rng(0).integers(0, 256, (*G4_IMAGE, 3), dtype=np.uint8)
    inputs = processor(image, return_tensors="pt")

    def run():
        with torch.no_grad():
            return model.model.get_image_features(inputs["pixel_values"],
                                                  inputs["image_position_ids"],
                                                  return_dict=True).pooler_output

    return run, int(inputs["num_soft_tokens_per_image"][0])


def _audio_soft(seconds: int) -> tuple[int, int]:
    """Frames of ``seconds`` of sound and the soft tokens Qwen2-Audio gives them."""
    frames = seconds * 100
    rows = (frames - 1) // 2 + 1
    return frames, (rows - 2) // 2 + 1


def _ours_audio(layers: int, seconds: int):
    from iron_spec.runtime.blocks.norms import NormOptions
    from iron_spec.runtime.checkpoint import fill
    from iron_spec.runtime.encoder_options import EncoderLayerOptions, EncoderOptions
    from iron_spec.runtime.towers.audio_tower import AudioTower, AudioTowerOptions
    from iron_spec.runtime.towers.tower import ProjectorOptions
    from iron_spec.runtime.weights import draw_weights
    import numpy as np

    norm = NormOptions(kind="layer", eps=1e-5)
    layer = EncoderLayerOptions(heads=A_HEADS, head_dim=A_HIDDEN // A_HEADS, kv_heads=None,
                                intermediate_size=A_INTERMEDIATE, norm=norm, act="gelu",
                                bias=True, k_bias=False, o_bias=True, mlp_bias=True,
                                placement="pre")
    encoder = EncoderOptions(vocab_size=1, hidden_size=A_HIDDEN, layers=(layer,) * layers,
                             norm=norm, max_tokens=A_FRAMES // 2)
    o = AudioTowerOptions(encoder=encoder, mels=A_MELS, frames=A_FRAMES,
                          convs=((3, 1, 1), (3, 2, 1)), act="gelu", pool=2,
                          projector=ProjectorOptions(bias=True), text_hidden=A_TEXT)
    tower = AudioTower(o)
    fill(tower, draw_weights(tower, 0))
    features = np.random.default_rng(0).standard_normal((A_MELS, A_FRAMES)).astype(np.float32)
    frames, soft = _audio_soft(seconds)
    version = tower.version
    return lambda: version(features, frames), soft


def _torch_audio(layers: int, seconds: int):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    import torch
    import transformers

    config = transformers.Qwen2AudioConfig(
        audio_config={"d_model": A_HIDDEN, "encoder_attention_heads": A_HEADS,
                      "encoder_ffn_dim": A_INTERMEDIATE, "encoder_layers": layers,
                      "num_mel_bins": A_MELS},
        text_config={"hidden_size": A_TEXT, "num_hidden_layers": 1, "vocab_size": 16,
                     "intermediate_size": 16, "num_attention_heads": 1,
                     "num_key_value_heads": 1})
    model = transformers.Qwen2AudioForConditionalGeneration(config).eval()
    features = torch.randn(1, A_MELS, A_FRAMES)
    frames, soft = _audio_soft(seconds)
    mask = torch.zeros(1, A_FRAMES, dtype=torch.long)
    mask[0, :frames] = 1

    from transformers.masking_utils import create_bidirectional_mask

    inner = model.model if hasattr(model, "model") and hasattr(model.model, "audio_tower") \
        else model
    tower = inner.audio_tower
    lengths, out = tower._get_feat_extract_output_lengths(mask.sum(-1))
    rows = (A_FRAMES - 2) // 2 + 1
    mask2d = (torch.arange(rows)[None, :] < lengths[:, None]).long()

    def run():
        # Qwen2AudioForConditionalGeneration.forward's audio path (make_towers.py's
        # audio_soft_tokens): the whole window through the encoder, the keys past the sound
        # masked, the projector, the sound's rows kept.
        with torch.no_grad():
            attention = create_bidirectional_mask(config=tower.config,
                                                  inputs_embeds=torch.zeros(1, rows, 1),
                                                  attention_mask=mask2d)
            states = tower(features, attention_mask=attention).last_hidden_state
            return inner.multi_modal_projector(states)[0, : int(out[0])]

    return run, soft


def _gemma4_audio_frames(seconds: int) -> tuple[int, int]:
    """Frames of ``seconds`` of sound and the soft tokens Gemma 4's tower gives them."""
    frames = seconds * 100
    return frames, ((frames + 1) // 2 + 1) // 2


def _ours_gemma4_audio(layers: int, seconds: int):
    from iron_spec.runtime.checkpoint import fill
    from iron_spec.runtime.towers.conformer import ConformerOptions, ConformerTower
    from iron_spec.runtime.weights import draw_weights
    import numpy as np

    o = ConformerOptions(hidden_size=GA_HIDDEN, layers=layers, heads=GA_HEADS,
                         head_dim=GA_HIDDEN // GA_HEADS, act="silu", eps=1e-6,
                         channels=GA_CHANNELS, mels=128, conv_kernel=5, residual_weight=0.5,
                         chunk=12, left=13, right=0, logit_cap=50.0, clip=1e10, clipped=True,
                         output=GA_OUT, text_hidden=GA_TEXT)
    tower = ConformerTower(o)
    fill(tower, draw_weights(tower, 0))
    frames, soft = _gemma4_audio_frames(seconds)
    features = np.random.default_rng(0).standard_normal((frames, 128)).astype(np.float32)
    version = tower.version(frames)
    assert tower.soft(frames) == soft
    return lambda: version(features), soft


def _torch_gemma4_audio(layers: int, seconds: int):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    import torch
    import transformers

    config = transformers.Gemma4Config(
        audio_config={"hidden_size": GA_HIDDEN, "num_attention_heads": GA_HEADS,
                      "num_hidden_layers": layers, "subsampling_conv_channels": list(GA_CHANNELS),
                      "output_proj_dims": GA_OUT},
        text_config={"hidden_size": GA_TEXT, "num_hidden_layers": 1, "vocab_size": 16,
                     "vocab_size_per_layer_input": 16, "intermediate_size": 16,
                     "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 16,
                     "global_head_dim": 16, "hidden_size_per_layer_input": 4,
                     "layer_types": ["full_attention"]},
        vision_config=None)
    model = transformers.Gemma4ForConditionalGeneration(config).eval()
    frames, soft = _gemma4_audio_frames(seconds)
    features = torch.randn(1, frames, 128)
    mask = torch.ones(1, frames, dtype=torch.bool)

    def run():
        with torch.no_grad():
            out = model.model.get_audio_features(features, mask, return_dict=True)
            return out.pooler_output[0][out.attention_mask[0]]

    return run, soft


BUILDERS = {"gemma3": (_ours, _torch), "gemma4": (_ours_gemma4, _torch_gemma4),
            "qwen2-audio": (_ours_audio, _torch_audio),
            "gemma4-audio": (_ours_gemma4_audio, _torch_gemma4_audio)}


def _side(side: str, tower: str, layers: int, inputs: list[int], runs: int) -> dict:
    make = BUILDERS[tower][0 if side == "ours" else 1]
    out = {}
    for image in inputs:
        run, soft = make(layers, image)
        run()  # warm-up (and the compile, ours)
        times = []
        for _ in range(runs):
            begin = time.perf_counter()
            run()
            times.append(time.perf_counter() - begin)
        seconds = statistics.median(times)
        out[str(image)] = {"seconds": seconds, "soft_tokens_per_s": soft / seconds,
                           "soft": soft}
    return out


UNITS = {"gemma3": ("image", "pixels a side"), "gemma4": ("budget", "max_soft_tokens"),
         "qwen2-audio": ("sound", "seconds"), "gemma4-audio": ("sound", "seconds")}
TITLES = {"gemma3": "Gemma 3's SigLIP tower", "gemma4": "Gemma 4's image tower",
          "qwen2-audio": "Qwen2-Audio's Whisper-large encoder",
          "gemma4-audio": "Gemma 4's conformer audio tower"}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tower", nargs="+", choices=list(BUILDERS), default=list(BUILDERS))
    p.add_argument("--side", choices=("ours", "torch"))
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--images", type=int, nargs="+", default=[224, 448, 896])
    p.add_argument("--budgets", type=int, nargs="+", default=[70, 280, 1120])
    p.add_argument("--seconds", type=int, nargs="+", default=[5, 30])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    given = {"gemma3": a.images, "gemma4": a.budgets, "qwen2-audio": a.seconds,
             "gemma4-audio": a.seconds}
    if a.side is not None:
        if a.side == "torch":
            import torch
            torch.set_num_threads(a.threads)
        (tower,) = a.tower
        print(json.dumps(_side(a.side, tower, a.layers, given[tower], a.runs)))
        return
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
    for tower in a.tower:
        seen = {}
        for side in ("ours", "torch"):
            cmd = [sys.executable, __file__, "--side", side, "--tower", tower, "--layers",
                   str(a.layers), "--runs", str(a.runs), "--threads", str(a.threads),
                   "--images", *map(str, a.images), "--budgets", *map(str, a.budgets),
                   "--seconds", *map(str, a.seconds)]
            seen[side] = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True,
                                                   text=True).stdout.splitlines()[-1])
        unit, meaning = UNITS[tower]
        print(f"{TITLES[tower]}, {a.layers} of {LAYERS[tower]} layers, {a.threads} threads: "
              f"seconds per input (soft tokens/s); {unit}: {meaning}")
        print(f"{unit:>7} {'soft':>5} {'ours':>16} {'transformers':>16} {'speed, ours':>12}")
        for key in map(str, given[tower]):
            o, t = seen["ours"][key], seen["torch"][key]
            print(f"{key:>7} {o['soft']:5d} {o['seconds']:9.3f} ({o['soft_tokens_per_s']:5.0f}) "
                  f"{t['seconds']:9.3f} ({t['soft_tokens_per_s']:5.0f}) "
                  f"{t['seconds'] / o['seconds']:11.2f}x")
        print()


if __name__ == "__main__":
    main()
