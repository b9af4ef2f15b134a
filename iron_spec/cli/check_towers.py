"""``iron-spec check`` on a composite checkpoint: its towers' lines after the text model's.

Each tower declared for the checkpoint's architecture (the spec's ``towers:``) is loaded as
``iron_spec.load`` loads it and judged twice: its compiled soft tokens against its own
float64 reference on a drawn input through its front end (a self-consistency check, as the
text model's ``compiled = reference``), and, where a golden of these very inputs is in a
store (``<store>/towers/<spec>/*.npz``, recorded by tests/checkpoints/make_towers.py), the
whole model against transformers over a prompt with the golden's image or sound
(``library.multimodal_golden.judge``: ids, pixels or features, soft tokens, KL).

Not for: the text model's checks (``check``), recording a towers golden (make_towers.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from iron_spec.library import goldens
from iron_spec.library.api import Model
from iron_spec.library.multimodal_golden import inputs_fingerprint, judge
from iron_spec.runtime import checks
from iron_spec.runtime.towers.axial import AxialTower
from iron_spec.runtime.towers.conformer import ConformerTower
from iron_spec.runtime.towers.images import patches
from iron_spec.spec.gates import kl_gate
from iron_spec.spec.options.axial_towers import check_front
from iron_spec.spec.towers import LoadedTower, load_towers

# The drawn image: neither square nor a whole number of any tile, so a front end's resize,
# tiles and padding all run. The drawn sound: two seconds of noise at the extractor's rate.
DRAWN_IMAGE = (56, 72)
DRAWN_SECONDS = 2
# Soft tokens of the compiled tower (float32) against its float64 reference, relative to
# the largest: the text model's operators hold rows to a few float32 epsilons each, and a
# tower is at most a few dozen layers of them.
TOWER_RTOL = 1e-4
# Against transformers' golden: pixel values equal where both resize with Pillow (its PIL
# backend), log-mel features and soft tokens within float32 rounding of a different order.
FRONT_ATOL = 1e-5
SOFT_ATOL = 1e-5  # of the largest soft token where it passes 1


def plan(loaded, spec_path: Path, self_only: bool, allow_unread_config: bool
         ) -> list[tuple[str, Callable[[], checks.Result]]]:
    """The towers' checks of ``loaded`` (a ``build.Loaded`` text model: none where its
    checkpoint has no towers the spec declares), in order, each a name and a call; the
    towers are loaded here (``loaded.towers``).

    Raises:
        SpecError, CheckpointError: a tower that does not load (as ``iron_spec.load``).
    """
    loaded.towers = load_towers(loaded, allow_unread_config)
    out: list[tuple[str, Callable[[], checks.Result]]] = [
        (f"{t.name} tower = reference", lambda t=t: compiled_vs_reference(t))
        for t in loaded.towers]
    if loaded.towers and not self_only:
        out.append(("towers KL vs golden", lambda: against_golden(loaded, spec_path)))
    return out


def compiled_vs_reference(tower: LoadedTower, seed: int = 0) -> checks.Result:
    """``tower``'s compiled soft tokens against its float64 reference on a drawn input (an
    image of ``DRAWN_IMAGE`` pixels or ``DRAWN_SECONDS`` of noise) through its front end,
    every run of the tower (each tile's) compared; failed where the front end's output does
    not meet the tower (a processor's size unlike the tower's image_size), as an image
    given to the model would."""
    try:
        return _compiled_vs_reference(tower, seed)
    except ValueError as e:
        return checks.Result(f"{tower.name} tower = reference", False,
                             f"the front end does not meet the tower: {e}; the processor's "
                             "settings (preprocessor_config.json, else its class defaults) "
                             "against the tower's config")


def _compiled_vs_reference(tower: LoadedTower, seed: int) -> checks.Result:
    rng = np.random.default_rng(seed)
    version = tower.tower.version
    if isinstance(tower.tower, ConformerTower):  # a version per sound's frames
        rate = tower.processor.sampling_rate
        features, frames = tower.processor(rng.uniform(-0.5, 0.5, DRAWN_SECONDS * rate))
        version = tower.tower.version(frames)
        pairs = [(version(features[:frames]), version.reference(features[:frames]))]
        drawn = f"{DRAWN_SECONDS} s of drawn noise ({frames} frames)"
    elif tower.modality == "audio":
        rate = tower.processor.sampling_rate
        features, frames = tower.processor(rng.uniform(-0.5, 0.5, DRAWN_SECONDS * rate))
        pairs = [(version(features, frames), version.reference(features, frames))]
        drawn = f"{DRAWN_SECONDS} s of drawn noise"
    elif tower.gridded:  # a grid of the image's own (Qwen2-VL's smart resize)
        rows, (h, w) = tower.processor(rng.integers(0, 256, (*DRAWN_IMAGE, 3), dtype=np.uint8))
        pairs = [(version(h, w)(rows), version(h, w).reference(rows))]
        drawn = f"a drawn {DRAWN_IMAGE[0]}x{DRAWN_IMAGE[1]} image ({h}x{w} patches)"
    elif isinstance(tower.tower, AxialTower):
        image = rng.integers(0, 256, (*DRAWN_IMAGE, 3), dtype=np.uint8)
        rows, grid = tower.processor(image)
        check_front(tower.processor, tower.tower.options)
        version = tower.tower.version(grid)
        pairs = [(version(rows), version.reference(rows))]
        drawn = f"a drawn {DRAWN_IMAGE[0]}x{DRAWN_IMAGE[1]} image ({grid[0]}x{grid[1]} patches)"
    else:
        image = rng.integers(0, 256, (*DRAWN_IMAGE, 3), dtype=np.uint8)
        pixels = tower.processor(image)
        frames = list(pixels) if tower.tiled else [pixels]
        p, want = tower.tower.options.patch, tuple(tower.tower.options.image)
        if tuple(frames[0].shape[-2:]) != want:
            raise ValueError(f"it gives {frames[0].shape[-2]}x{frames[0].shape[-1]} pixels, "
                             f"the tower takes {want[0]}x{want[1]} (image_size)")
        pairs = [(version(patches(f, p)), version.reference(patches(f, p))) for f in frames]
        drawn = f"a drawn {DRAWN_IMAGE[0]}x{DRAWN_IMAGE[1]} image" + \
            (f" ({len(frames)} tiles)" if tower.tiled else "")
    err = max(float(np.abs(got - want).max()) for got, want in pairs)
    scale = max(float(np.abs(want).max()) for _, want in pairs) or 1.0
    return checks.Result(
        f"{tower.name} tower = reference", err <= TOWER_RTOL * scale,
        f"max |compiled - reference| {err:.2g}, {err / scale:.2g} of the largest soft token "
        f"(at most {TOWER_RTOL:g}), on {drawn}",
        {"max_abs": err, "relative": err / scale, "runs": len(pairs)})


def find_golden(loaded, spec_file: Path) -> tuple[Path | None, list[Path]]:
    """The first towers golden recorded on ``loaded``'s inputs (``inputs_fingerprint``:
    config.json, every tensor, the tokenizer's and processor's files) in the stores'
    ``towers`` folders, the spec's own first; and the folders searched."""
    name = loaded.expanded.spec.get("name")
    searched = [s / "towers" for s in goldens.stores(spec_file)]
    own = [p for s in searched for p in sorted((s / name).glob("*.npz"))]
    rest = [p for s in searched for p in sorted(s.glob("*/*.npz")) if p.parent.name != name]
    want = inputs_fingerprint(loaded)
    for path in own + rest:
        with np.load(path) as golden:
            held = str(golden["fingerprint"]) if "fingerprint" in golden.files else None
        if held == want:
            return path, searched
    return None, searched


def against_golden(loaded, spec_path: Path) -> checks.Result:
    """The model with its towers against transformers' golden of these inputs: the
    prompt's ids equal, pixel values (or features) and soft tokens within ``FRONT_ATOL``
    and ``SOFT_ATOL``, KL over the positions from the last placeholder on within the
    model's KL gate (``gates.kl_gate``, as the text model's); ``verified`` False where no
    golden of these inputs is found."""
    name = "towers KL vs golden"
    path, searched = find_golden(loaded, spec_path)
    if path is None:
        return checks.Result(name, True, "no golden of these inputs in "
                             f"{', '.join(str(s) for s in searched)} (tests/checkpoints/"
                             "make_towers.py records one): the towers are not verified against "
                             "transformers", verified=False)
    with np.load(path) as golden:
        j = judge(Model(loaded, spec_path), golden)
        front = "pixels" if "pixel_values" in golden.files else "features"
        # Soft tokens within SOFT_ATOL, of the largest where it passes 1 (float32 rounding
        # scales with the values: Gemma 4's reach 3.5 on its toy).
        soft_bound = SOFT_ATOL * max(1.0, float(np.abs(golden["soft_tokens"]).max()))
    bounds = kl_gate(loaded)
    kl = j.kl
    allowed = int(bounds.get("top1_mismatches", 0))
    passed = (j.ids_equal and j.pixels <= FRONT_ATOL and j.soft <= soft_bound
              and all(kl[k] <= bounds[k] for k in ("mean", "p90", "max"))
              and kl["top1_mismatches"] <= allowed)
    figure = (f"ids {'equal' if j.ids_equal else 'DIFFER'}, {front} within {j.pixels:.2g}, soft "
              f"tokens within {j.soft:.2g}; KL mean {kl['mean']:.2g}, p90 {kl['p90']:.2g}, max "
              f"{kl['max']:.2g} (at most {bounds['mean']:g}, {bounds['p90']:g}, "
              f"{bounds['max']:g}), {kl['top1_mismatches']} top-1 mismatches over "
              f"{j.positions} positions; golden {path}")
    return checks.Result(name, passed, figure, {"kl": kl, "pixels": j.pixels, "soft": j.soft,
                                                "ids_equal": j.ids_equal, "golden": str(path)})
