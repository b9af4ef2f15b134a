"""A vision tower's cost per image: ours against transformers', side by side.

    python bench/towers.py [--side ours|torch] [--layers 4] [--images 224 448 896]
                           [--runs 3] [--threads 2]

Gemma 3's image tower at its published widths (SigLIP so400m: hidden 1152, 16 heads,
intermediate 4304, patches of 14 pixels; the projector to Gemma 3 4B's 2560, pooled to 256
soft tokens), on drawn weights, ``--layers`` of its 27 layers (a tower's time is linear in
its layers: multiply by 27 / layers for the whole). Per image side: the seconds one image's
soft tokens take (the front end's patch rows in, soft tokens out; median of ``--runs`` after
a warm-up) and soft tokens per second. Without ``--side`` each side runs in a process of its
own, in turn (a BLAS pool left spinning slows the next side in the same process); quote the
ratio from one run of this script.
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


def _side(side: str, layers: int, images: list[int], runs: int) -> dict:
    make = _ours if side == "ours" else _torch
    out = {}
    for image in images:
        run, soft = make(layers, image)
        run()  # warm-up (and the compile, ours)
        times = []
        for _ in range(runs):
            begin = time.perf_counter()
            run()
            times.append(time.perf_counter() - begin)
        seconds = statistics.median(times)
        out[str(image)] = {"seconds": seconds, "soft_tokens_per_s": soft / seconds}
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--side", choices=("ours", "torch"))
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--images", type=int, nargs="+", default=[224, 448, 896])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    if a.side is not None:
        if a.side == "torch":
            import torch
            torch.set_num_threads(a.threads)
        print(json.dumps(_side(a.side, a.layers, a.images, a.runs)))
        return
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
    seen = {}
    for side in ("ours", "torch"):
        cmd = [sys.executable, __file__, "--side", side, "--layers", str(a.layers), "--runs",
               str(a.runs), "--threads", str(a.threads), "--images", *map(str, a.images)]
        seen[side] = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True,
                                               text=True).stdout.splitlines()[-1])
    print(f"Gemma 3's SigLIP tower, {a.layers} of 27 layers, {a.threads} threads: seconds per "
          "image (soft tokens/s)")
    print(f"{'image':>6} {'ours':>16} {'transformers':>16} {'speed, ours':>18}")
    for image in map(str, a.images):
        o, t = seen["ours"][image], seen["torch"][image]
        print(f"{image:>6} {o['seconds']:9.3f} ({o['soft_tokens_per_s']:5.0f}) "
              f"{t['seconds']:9.3f} ({t['soft_tokens_per_s']:5.0f}) "
              f"{t['seconds'] / o['seconds']:17.2f}x")


if __name__ == "__main__":
    main()
