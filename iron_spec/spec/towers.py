"""Loading a composite checkpoint's towers beside its text model: each ``towers`` entry of the
spec (``options.towers``) whose architectures hold the checkpoint's, its config accounted,
its encoder expanded in the encoder vocabulary (``encoder.expand_encoder``), its tree built
(``runtime.towers.tower.Tower``) and filled from the checkpoint's tensors under its
prefixes (``runtime.parts``), and its front end read from the processor's files.

Not for: the text model (``build``), running towers (``runtime.towers.multimodal``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from iron_spec.runtime.checkpoint import Checkpoint, LoadReport, fill, load, mark_transposed
from iron_spec.runtime.files import read_object
from iron_spec.runtime.parts import moved, subtree
from iron_spec.runtime.towers.audio_tower import AudioTower
from iron_spec.runtime.towers.axial import AxialTower
from iron_spec.runtime.towers.conformer import ConformerTower
from iron_spec.runtime.towers.images import TileProcessor, patches
from iron_spec.runtime.towers.multimodal import TowerRun, naming
from iron_spec.runtime.towers.qwen_images import GridProcessor
from iron_spec.runtime.towers.qwen_vision import QwenVisionTower
from iron_spec.runtime.towers.tower import Tower
from iron_spec.runtime.weights import draw_weights

from .accounting import account
from .encoder import expand_encoder
from .options import axial_towers, conformer_towers
from .options import towers as options
from .options.qwen_vision import grid_processor, qwen_vision_options
from .shapes import explainer

log = logging.getLogger("iron_spec")


@dataclass
class LoadedTower:
    """A tower ready to run: its ``tower`` (weights filled: a vision ``Tower``,
    ``AxialTower`` or ``QwenVisionTower``, an ``AudioTower`` or ``ConformerTower``),
    ``processor`` (the front end: ``ImageProcessor``, ``TileProcessor``, ``GridProcessor``,
    ``AspectPatchProcessor``, ``LogMel`` or ``SemicausalLogMel``), its ``modality`` (``image`` or ``audio``: the content items it reads), the
    ``placeholder`` token its soft tokens replace, whether one input's rows see each other
    (``bidirectional``), the processor's expansion of the text's marker (``prompt``:
    ``options.towers.Expansion`` or None) and where each weight came from."""

    name: str
    tower: Any
    processor: Any
    placeholder: int
    bidirectional: bool
    prompt: Any
    report: LoadReport
    modality: str = "image"
    read_as: int | None = None

    @property
    def gridded(self) -> bool:
        """Whether the front end resizes an image to a grid of its own (Qwen2-VL's: soft
        tokens as many as the grid's merged blocks, M-RoPE positions by the grid)."""
        return isinstance(self.processor, GridProcessor)

    def grid(self, raw) -> tuple[int, int, int]:
        """The (time, height, width) grid of ``raw``'s soft tokens (merged blocks), the
        M-RoPE positions' axes (``runtime.towers.mrope``); gridded front ends alone."""
        with naming(raw):
            h, w = self.processor.grid(raw)
        m = self.tower.options.merge
        return 1, h // m, w // m

    @property
    def tiled(self) -> bool:
        """Whether the front end cuts an image into tiles (each a run of the tower)."""
        return isinstance(self.processor, TileProcessor)

    def soft_tokens(self, raw) -> "Any":
        """The soft tokens ``(soft, text_hidden)`` float32 of ``raw`` (an image: a path, a
        PIL image or a uint8 array; a sound: a path or samples at the extractor's rate): the
        front end, then the compiled tower (once per tile, in the processor's order, where
        the front end cuts tiles)."""
        with naming(raw):
            return self._soft_tokens(raw)

    def _soft_tokens(self, raw) -> "Any":
        if isinstance(self.tower, ConformerTower):
            features, frames = self.processor(raw)
            if frames == 0 or self.tower.soft(frames) == 0:
                return np.zeros((0, self.tower.options.text_hidden), np.float32)
            return self.tower.version(frames)(features[:frames])
        if self.modality == "audio":
            features, frames = self.processor(raw)
            return self.tower.version(features, frames)
        if self.gridded:
            rows, (h, w) = self.processor(raw)
            return self.tower.version(h, w)(rows)
        if isinstance(self.tower, AxialTower):
            pixels, grid = self.processor(raw)
            axial_towers.check_front(self.processor, self.tower.options)
            return self.tower.version(grid)(pixels)
        p = self.tower.options.patch
        if self.tiled:
            return np.concatenate([self.tower.version(patches(tile, p))
                                   for tile in self.processor(raw)])
        return self.tower.version(patches(self.processor(raw), p))

    def layout(self, raw) -> tuple[int, int, int]:
        """How the processor writes ``raw``'s placeholders: soft tokens per tile (per input
        where untiled), and the rows and columns of tiles (0, 0: none)."""
        with naming(raw):
            return self._layout(raw)

    def _layout(self, raw) -> tuple[int, int, int]:
        if isinstance(self.tower, ConformerTower):
            return self.tower.soft(self.processor(raw)[1]), 0, 0
        if self.modality == "audio":
            return self.tower.options.soft(self.processor(raw)[1]), 0, 0
        if self.gridded:
            return self.tower.soft(*self.processor.grid(raw)), 0, 0
        if isinstance(self.tower, AxialTower):
            return self.tower.soft(self.processor(raw)[1]), 0, 0
        if self.tiled:
            _, rows, cols = self.processor.tiles(raw)
            return self.tower.options.soft, rows, cols
        return self.tower.options.soft, 0, 0

    def count(self, raw) -> int:
        """How many soft tokens ``raw`` gives (the processor's expansion)."""
        per, rows, cols = self.layout(raw)
        return per * (rows * cols + 1 if rows else 1)

    def run(self) -> TowerRun:
        """The tower as ``runtime.towers.multimodal.Multimodal`` meets it."""
        return TowerRun(self.soft_tokens, self.count, self.bidirectional,
                        grid=self.grid if self.gridded else None,
                        read_as=self.read_as)


def processor_settings(directory: Path | None, key: str = "image_processor"
                       ) -> tuple[dict, str]:
    """The image processor's (or with ``key`` ``feature_extractor``, the feature
    extractor's) settings a checkpoint holds, and their file: its preprocessor_config.json
    (the hub's layout), else processor_config.json's ``key`` mapping (transformers 5's
    ``save_pretrained``); a null value is the class default (dropped here); ``{}`` where
    there is neither.

    Raises:
        FileError: a file that is not a JSON object.
    """
    if directory is None:
        return {}, "no preprocessor_config.json"
    for name, inner in (("preprocessor_config.json", None), ("processor_config.json", key)):
        path = directory / name
        if path.is_file():
            data = read_object(path, what=name)
            if inner is not None:
                data = data.get(inner)
                if not isinstance(data, dict):
                    continue
            return {k: v for k, v in data.items() if v is not None}, str(path)
    return {}, "no preprocessor_config.json"


def load_towers(loaded, allow_unread_config: bool = False) -> list[LoadedTower]:
    """Every tower ``loaded``'s spec declares for its checkpoint (``loaded``: a
    ``build.Loaded`` text model, a part of a composite checkpoint): none where the
    checkpoint is the text model alone or the weights are drawn on a toy, and none whose
    config key is null (``options.towers.held``: Gemma4Config's ``vision_config: null``).

    Raises:
        SpecError: a tower's config key missing, or its keys unaccounted (each named), or
            options the encoder vocabulary or the tower refuses.
        CheckpointError: the tower's tensors do not fit its tree (every tensor named).
    """
    if loaded.part is None:
        return []
    spec = loaded.expanded.spec
    whole = loaded.part.whole
    out = []
    for entry in options.entries(spec):
        if not options.held(entry, whole):
            continue
        out.append(_load(entry, loaded, whole, allow_unread_config))
    return out


@dataclass
class TowerTree:
    """A tower's tree before its weights: the ``entry`` (``options.towers``, the whole file's
    keys it reads merged in), its ``expanded`` encoder (config values and their sources,
    renames, unused), its ``options``, ``tree`` (a ``Tower`` or ``AudioTower``, params
    unfilled) and ``front`` (the front end, from the processor's files)."""

    entry: Any
    expanded: Any
    options: Any
    tree: Any
    front: Any


def tower_tree(spec, entry, whole: dict, directory: Path | None, text_hidden: int,
               allow_unread_config: bool = False) -> TowerTree:
    """The tree of ``entry``'s tower (an entry of ``spec``'s ``towers``) in ``whole`` (a
    composite's config.json, read from ``directory``), its soft tokens ``text_hidden``
    wide; no tensor read.

    Raises:
        SpecError: the tower's config not a mapping, a key missing or unaccounted, or
            options the encoder vocabulary or the tower refuses.
    """
    source = f"{(directory or Path('.')) / 'config.json'}: {entry.source_key}"
    config = whole.get(entry.source_key)
    if not isinstance(config, dict):
        raise spec.error(entry.at + ("from",), f"{source} is not a mapping: a "
                         f"{', '.join(entry.architectures)} config.json holds the tower's "
                         "config there")
    entry = options.with_outer(entry, whole)
    account(entry.spec, config, source, allow_unread_config)
    expanded = expand_encoder(entry.spec, config, source=source)
    audio = options.front_kind(entry) == "log_mel"
    kind = axial_towers.kind(entry)
    settings, where = processor_settings(
        directory, "feature_extractor" if audio or kind == "conformer" else "image_processor")
    axial = kind == "axial"
    if kind == "conformer":
        if options.front_kind(entry) != "semicausal_log_mel":
            raise spec.error(entry.at + ("front", "kind"), "a conformer tower reads "
                             "semicausal_log_mel frames")
        front = conformer_towers.audio_front(entry, settings, where, options._front_settings)
        o = conformer_towers.options(entry, expanded.resolved, expanded.options, text_hidden,
                                     front.feature_size)
    elif options.front_kind(entry) == "grid":
        o = qwen_vision_options(entry, expanded.resolved, text_hidden)
        front = grid_processor(entry, settings, where, o)
    elif audio:
        front = options.log_mel(entry, settings, where)
        o = options.audio_options(entry, expanded.resolved, expanded.options, text_hidden,
                                  front)
    elif axial:
        o = axial_towers.vision_options(entry, expanded.resolved, expanded.options,
                                         text_hidden)
        front = axial_towers.image_front(entry, settings, where, options._front_settings)
    else:
        o = options.tower_options(entry, expanded.resolved, expanded.options, text_hidden)
        if options.front_kind(entry) == "tiles":
            front = options.tiles(entry, settings, where, o.image[0])
        else:
            front = options.processor(entry, settings, where)
    try:
        tower = ConformerTower(o) if kind == "conformer" else AudioTower(o) if audio else \
            QwenVisionTower(o) if isinstance(front, GridProcessor) else \
            AxialTower(o) if axial else Tower(o)
    except ValueError as e:
        raise spec.error(entry.at, f"the tower does not build on {source}: {e}") from None
    mark_transposed(tower, expanded.transposed)
    return TowerTree(entry, expanded, o, tower, front)


def _load(entry, loaded, whole: dict, allow_unread_config: bool) -> LoadedTower:
    spec = loaded.expanded.spec
    text = loaded.lm.config
    built = tower_tree(spec, entry, whole, loaded.directory, text.hidden_size, allow_unread_config)
    entry, expanded, o, tower, front = (built.entry, built.expanded, built.options,
                                        built.tree, built.front)
    audio = options.front_kind(entry) in ("log_mel", "semicausal_log_mel")
    if loaded.random_weights is not None:
        report = fill(tower, draw_weights(tower, loaded.random_weights))
    else:
        whole_ckpt = Checkpoint(loaded.directory)
        others = [n for n in whole_ckpt.tensors if moved(n, entry.tensors) is None]
        part = subtree(whole_ckpt, entry.tensors, others)
        shapes = {n: p.stored_shape for n, p in tower.named_params()}
        report = load(tower, part, expanded.renames, None, expanded.unused,
                      explainer(expanded.resolved.values, shapes))
    token = options.placeholder(entry, expanded.resolved, text.vocab_size)
    prompt = options.with_token_texts(entry, options.prompt_text(entry), expanded.resolved,
                                      loaded.directory)
    if isinstance(tower, ConformerTower):
        log.info("tower %s: %d mel bins, sounds of any length, %d conformer layers, at "
                 "placeholder %d", entry.name, o.mels, o.layers, token)
    elif audio:
        log.info("tower %s: %d mel bins, %d frames a window, %d layers, at placeholder %d",
                 entry.name, o.mels, o.frames, len(o.encoder.layers), token)
    elif isinstance(front, GridProcessor):
        log.info("tower %s: patches of %d pixels, %d blocks, grids of any size, at placeholder "
                 "%d", entry.name, o.patch, o.depth, token)
    elif isinstance(tower, AxialTower):
        log.info("tower %s: patches of %d pixels at their places, %d layers, pooled %dx%d, "
                 "at placeholder %d", entry.name, o.patch, o.layers, o.pool, o.pool, token)
    else:
        log.info("tower %s: %d patches of %d pixels, %d layers, %d soft tokens per image at "
                 "placeholder %d", entry.name, o.patches, o.patch, len(o.encoder.layers),
                 o.soft, token)
    read_as = options.read_as(entry, expanded.resolved, text.vocab_size)
    return LoadedTower(entry.name, tower, front, token,
                       options.bidirectional(entry, expanded.resolved), prompt, report,
                       "audio" if audio else "image", read_as)
