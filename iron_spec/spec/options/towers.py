"""A spec's ``towers:``: the vision (or audio) towers a composite checkpoint holds beside its
text model, each an encoder in the encoder vocabulary whose rows come from a front end.

An entry says, for the checkpoints of its ``architectures`` (a ``parts`` entry's):

- ``from``: the key of the whole config.json holding the tower's config (``vision_config``);
  ``config``, ``ignore`` and ``refuse`` map and account for its keys as a spec's own do
  (every key read, ignored or refused); ``outer``: keys of the whole file the tower reads
  (``mm_tokens_per_image``), each with the composite config class's default, as fields;
- ``layer`` (kind ``encoder``) and ``checkpoint`` (``renames``, ``unused``): the encoder
  layers and tensor names, read exactly as a ``model: encoder`` spec's (``encoder``);
- ``tensors``: checkpoint prefix -> tower prefix (``runtime.parts``), the tower's tensors;
- ``patches``: ``{size, channels, image}`` (the patch embedding's kernel, the image's
  channels and side in pixels); ``pool``: the average pooling window over the patch grid
  (1: none); ``shuffle``: the pixel-shuffle window (Idefics3's ``scale_factor``; 1: none);
  ``projector``: ``{norm, bias, transposed}`` (its norm's options, a bias, the
  weight stored ``(in, out)``);
- ``placeholder``: the token id the soft tokens replace; ``bidirectional``: whether one
  image's rows attend to each other both ways in the text model (Gemma 3's);
- ``front``: the front end and its settings (``runtime.towers.images.ImageProcessor``; kind
  ``tiles``: ``TileProcessor``, an image cut into tiles beside a global image; ``log_mel``:
  ``runtime.towers.audio.LogMel``; ``semicausal_log_mel``: Gemma 4's,
  ``runtime.towers.semicausal_log_mel``), read from the checkpoint's ``preprocessor_config.json``
  over ``defaults`` (the processor class's), its other keys ``ignore``d or ``refuse``d as
  config.json's are;
- ``prompt``: how the processor expands the text's image marker (``marker``) into the soft
  tokens' placeholders (``Expansion``): ``text`` with ``{soft}`` standing for ``soft``
  repeated once per soft token (Gemma3Processor's ``full_image_sequence``); for an image cut
  into tiles, ``tile`` per tile (``{row}``, ``{col}`` from 1), ``row_end`` after each row of
  tiles, and ``tiled`` around them (``{tiles}``), as Idefics3Processor's
  ``replace_image_token``.

Not for: building or loading a tower (``iron_spec.spec.towers``), the runtime
(``runtime.towers``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from iron_spec.runtime.towers.audio import LogMel
from iron_spec.runtime.towers.audio_tower import AudioTowerOptions
from iron_spec.runtime.towers.images import ImageProcessor, TileProcessor
from iron_spec.operators.activation import ACTIVATIONS
from iron_spec.runtime.towers.tower import PROJECTORS, ProjectorOptions, TowerOptions

from ..config import Resolved
from ..loader import Spec
from .norms import norm_options
from .reading import _flag_option, _option, _whole


FRONT_ENDS = ("image", "tiles", "log_mel", "grid", "aspect_patches", "semicausal_log_mel")


@dataclass(frozen=True)
class Expansion:
    """How a processor writes an input's placeholders where the text holds its ``marker``
    (module docstring: ``prompt``)."""

    marker: str
    text: str
    soft: str
    tile: str | None = None
    row_end: str = ""
    tiled: str | None = None

    def of(self, count: int, rows: int = 0, cols: int = 0) -> str:
        """The text one input's marker becomes: ``count`` soft tokens (each tile's, where
        the input is cut into ``rows`` x ``cols`` tiles)."""
        soft = self.soft * count
        if not rows or self.tiled is None:
            return self.text.replace("{soft}", soft)
        tiles = "".join("".join(self.tile.replace("{row}", str(r + 1))
                                .replace("{col}", str(c + 1)).replace("{soft}", soft)
                                for c in range(cols)) + self.row_end for r in range(rows))
        return self.tiled.replace("{tiles}", tiles).replace("{soft}", soft)


@dataclass(frozen=True)
class TowerEntry:
    """One ``towers`` entry (module docstring), at index ``index``: ``spec`` is it as an
    encoder spec of its own (``encoder_spec``), ``view`` its whole mapping (lines kept)."""

    index: int
    name: str
    architectures: tuple[str, ...]
    source_key: str
    outer: dict
    tensors: dict
    spec: Spec
    view: Spec

    @property
    def at(self) -> tuple:
        return ("towers", self.index)


def _rebased(spec: Spec, at: tuple, data: Any) -> Spec:
    """``data`` as a spec of its own whose every node keeps its place in ``spec``'s file
    (the nodes under ``at``)."""
    n = len(at)
    marks = {p[n:]: v for p, v in spec.marks.items() if p[:n] == at}
    values = {p[n:]: v for p, v in spec.values.items() if p[:n] == at}
    marks.setdefault((), spec.mark(at))
    return Spec(spec.file, data, marks, values)


def entries(spec: Spec) -> list[TowerEntry]:
    """The spec's ``towers`` entries (the schema has checked their form)."""
    out = []
    for i, e in enumerate(spec.get("towers", default=[]) or []):
        if not isinstance(e, dict) or "not_built" in e:
            continue
        at = ("towers", i)
        outer = dict(e.get("outer") or {})
        config = dict(e.get("config") or {})
        # The whole file's keys a tower reads, as fields of its own (filled in at load).
        config.update({k: {"value": v} for k, v in outer.items()})
        config["vocab_size"] = {"value": 1}  # a tower looks up no ids
        data = {
            "spec": 1, "name": f"{spec.get('name')}.towers.{e.get('name', i)}",
            "architectures": list(e.get("architectures") or []), "model": "encoder",
            "config": config, "ignore": list(e.get("ignore") or []),
            "layer": e.get("layer"), "pooling": {"kind": "none"},
            "embedding": {"norm": False},
            # A grid's rows follow the image (runtime.towers.qwen_vision), a conformer's the
            # sound (runtime.towers.conformer): no bound here.
            "runtime": {"max_tokens": e["rows"] if "rows" in e else 1 << 20
                        if (e.get("front") or {}).get("kind") == "grid"
                        or e.get("kind") == "conformer" else
                        f"({_expr(e, 'image')} // {_expr(e, 'size')}) ** 2"},
        }
        for key in ("refuse", "checkpoint"):
            if key in e:
                data[key] = e[key]
        out.append(TowerEntry(i, str(e.get("name", i)), tuple(e.get("architectures") or ()),
                              e.get("from"), outer, dict(e.get("tensors") or {}),
                              _rebased(spec, at, data), _rebased(spec, at, e)))
    return out


def held(entry: TowerEntry, whole: Mapping[str, Any]) -> bool:
    """Whether a checkpoint whose whole config.json is ``whole`` holds ``entry``'s tower: its
    architectures the entry's and its ``from`` key not null (transformers builds no tower
    for a null sub-config: Gemma4Model's ``vision_tower`` is None without a
    ``vision_config``)."""
    return bool(set(entry.architectures) & set(whole.get("architectures") or [])) \
        and whole.get(entry.source_key) is not None


def not_built(spec: Spec, whole: Mapping[str, Any]) -> dict[str, str]:
    """The towers ``spec`` declares but does not build (``not_built``) that a checkpoint's
    whole config.json ``whole`` holds (its ``from`` key not null, its architectures the
    entry's): by the tower's name (image, audio), why, naming the key."""
    archs = set(whole.get("architectures") or [])
    out = {}
    for e in spec.get("towers", default=[]) or []:
        if isinstance(e, dict) and "not_built" in e and archs & set(e.get("architectures") or ()) \
                and whole.get(e.get("from")) is not None:
            out[str(e.get("name"))] = f"{e['from']}: {' '.join(str(e['not_built']).split())}"
    return out


def _expr(entry: Mapping, key: str) -> str:
    value = (entry.get("patches") or {}).get(key)
    return f"({value})"


def with_outer(entry: TowerEntry, whole: Mapping[str, Any]) -> TowerEntry:
    """``entry`` with its ``outer`` fields' values from the ``whole`` config.json (their
    defaults where it lacks them)."""
    config = dict(entry.spec.data["config"])
    for k, default in entry.outer.items():
        config[k] = {"value": whole.get(k, default)}
    spec = Spec(entry.spec.file, {**entry.spec.data, "config": config}, entry.spec.marks,
                entry.spec.values)
    return TowerEntry(entry.index, entry.name, entry.architectures, entry.source_key,
                      entry.outer, entry.tensors, spec, entry.view)


def tower_options(entry: TowerEntry, r: Resolved, encoder, text_hidden: int) -> TowerOptions:
    """The tower's options over its resolved fields ``r`` and encoder options ``encoder``
    (``runtime.encoder_options.EncoderOptions``), projecting to ``text_hidden``.

    Raises:
        SpecError: at the option's line, a patch size, channel count, image side or
            pooling window that is no whole number from 1, or a projector norm the norms
            do not build.
    """
    v = entry.view
    p = ("patches",)
    size = _whole(v, p + ("size",), _option(v, r, p + ("size",), None))
    channels = _whole(v, p + ("channels",), _option(v, r, p + ("channels",), 3))
    side = _whole(v, p + ("image",), _option(v, r, p + ("image",), None))
    pool = _whole(v, ("pool",), _option(v, r, ("pool",), 1))
    shuffle = _whole(v, ("shuffle",), _option(v, r, ("shuffle",), 1))
    for name, value in (("patches.size", size), ("patches.channels", channels),
                        ("patches.image", side), ("pool", pool), ("shuffle", shuffle)):
        if value is None or value < 1:
            raise v.error(tuple(name.split(".")), f"{name} is {value!r}, not a whole number "
                                                  "from 1")
    projector = _projector(entry, r)
    cls = _flag_option(v, r, p + ("class",), False)
    layers, final, drop = _features(entry, r, len(encoder.layers), cls)
    return TowerOptions(encoder=encoder, channels=channels, patch=size, image=(side, side),
                        pool=pool, projector=projector, text_hidden=text_hidden,
                        patch_bias=_flag_option(v, r, p + ("bias",), True),
                        class_embedding=cls,
                        pre_norm=_flag_option(v, r, ("pre_norm",), False),
                        layers_run=layers, final_norm=final, drop=drop, shuffle=shuffle)


def _projector(entry: TowerEntry, r: Resolved) -> ProjectorOptions:
    """``projector``: its norm, kind, activation and bias.

    Raises:
        SpecError: a kind or activation not built.
    """
    v, j = entry.view, ("projector",)
    norm = norm_options(v, r, j + ("norm",)) if v.get(*j, "norm") is not None else None
    kind = v.get(*j, "kind", default="linear")
    if kind not in PROJECTORS:
        raise v.error(j + ("kind",), f"projector kind {kind!r} is not one of "
                                     f"{', '.join(PROJECTORS)}")
    act = _option(v, r, j + ("act",), "gelu") if kind == "mlp" else "gelu"
    if act not in ACTIVATIONS:
        raise v.error(j + ("act",), f"projector act {act!r} is not one of "
                                    f"{', '.join(ACTIVATIONS)}")
    return ProjectorOptions(norm=norm, bias=_flag_option(v, r, j + ("bias",), False),
                            kind=kind, act=act)


def _features(entry: TowerEntry, r: Resolved, depth: int, cls: bool
              ) -> tuple[int | None, bool, int]:
    """``features``: the layers run (``layer``: transformers' hidden-state index, 0 the
    embeddings, -1 the last layer's, as LLaVA's ``vision_feature_layer``; absent: all), the
    final norm after them (``final_norm``, default true) and the rows dropped
    (``strategy``: ``default`` drops the class row, ``full`` keeps it, as
    ``vision_feature_select_strategy``).

    Raises:
        SpecError: a layer that is no whole number within the hidden states (a list of
            layers, concatenated, is not built), or a strategy other than those two.
    """
    v, f = entry.view, ("features",)
    layer = _option(v, r, f + ("layer",), None)
    if layer is not None:
        if isinstance(layer, bool) or not isinstance(layer, int) or not -depth - 1 <= layer <= depth:
            raise v.error(f + ("layer",), f"features.layer is {layer!r}: one hidden state's "
                          f"index within -{depth + 1}..{depth} (several, concatenated, are not "
                          "built)")
        layer = layer if layer >= 0 else depth + 1 + layer
    strategy = _option(v, r, f + ("strategy",), None) or "full"
    if strategy not in ("default", "full"):
        raise v.error(f + ("strategy",), f"features.strategy is {strategy!r}: default (the "
                                         "class row dropped) or full")
    return layer, _flag_option(v, r, f + ("final_norm",), True), \
        int(cls and strategy == "default")


def audio_options(entry: TowerEntry, r: Resolved, encoder, text_hidden: int,
                  front: LogMel) -> AudioTowerOptions:
    """An audio tower's options (``convs``, ``act``, ``pool``, ``projector``, ``mels``) over
    its resolved fields ``r``, its encoder options and its front end's window.

    Raises:
        SpecError: at the option's line, a convolution's kernel, stride or padding that is
            no whole number (kernel and stride from 1), a pool other than 1 or 2, mels other
            than the front end's, or rows that are not the window's after the convolutions.
    """
    v = entry.view
    convs = []
    for i, conv in enumerate(v.get("convs", default=[]) or []):
        at = ("convs", i)
        k, s, pad = (_whole(v, at + (key,), _option(v, r, at + (key,), default))
                     for key, default in (("kernel", None), ("stride", 1), ("padding", 0)))
        if k is None or k < 1 or s < 1 or pad < 0:
            raise v.error(at, f"convs[{i}] is kernel {k}, stride {s}, padding {pad}: kernel "
                              "and stride from 1, padding from 0")
        convs.append((k, s, pad))
    act = _option(v, r, ("act",), "gelu")
    if act not in ACTIVATIONS:
        raise v.error(("act",), f"act {act!r} is not one of {', '.join(ACTIVATIONS)}")
    pool = _whole(v, ("pool",), _option(v, r, ("pool",), 1))
    if pool not in (1, 2):
        raise v.error(("pool",), f"pool is {pool!r}: rows averaged in pairs (2) or not (1)")
    mels = _whole(v, ("mels",), _option(v, r, ("mels",), None))
    if mels != front.feature_size:
        raise v.error(("mels",), f"mels is {mels!r}, and the feature extractor gives "
                                 f"{front.feature_size} (feature_size)")
    o = AudioTowerOptions(encoder=encoder, mels=mels, frames=front.frames, convs=tuple(convs),
                          act=act, pool=pool, projector=_projector(entry, r),
                          text_hidden=text_hidden)
    rows = _whole(v, ("rows",), _option(v, r, ("rows",), None))
    if rows != o.rows:
        raise v.error(("rows",), f"rows is {rows!r}, and {front.frames} frames give {o.rows} "
                                 "after the convolutions")
    return o


def log_mel(entry: TowerEntry, settings: Mapping[str, Any], source: str) -> LogMel:
    """The ``log_mel`` front end on ``settings`` (preprocessor_config.json's) over the
    front end's ``defaults``, each key read, ignored or refused (as ``processor``).

    Raises:
        SpecError: at ``front``, as ``processor``.
    """
    known = {"feature_size", "sampling_rate", "hop_length", "chunk_length", "n_fft",
             "padding_value", "dither"}
    merged = _front_settings(entry, settings, source, known)
    try:
        return LogMel(**merged)
    except (TypeError, ValueError) as e:
        raise entry.view.error(("front",), f"{source}: {e}") from None


def placeholder(entry: TowerEntry, r: Resolved, vocab: int) -> int:
    """The token id the tower's soft tokens replace (``placeholder``): within the text
    model's vocabulary, or past it, where the tokenizer adds it beside the embedding's rows
    (Gemma 3 270M-1B's ``<image_soft_token>`` 262144 beside 262144 rows: read as id 0,
    ``runtime.towers.multimodal.Multimodal.lookup``).

    Raises:
        SpecError: not a whole number from 0.
    """
    v = entry.view
    token = _whole(v, ("placeholder",), _option(v, r, ("placeholder",), None))
    if token is None or token < 0:
        raise v.error(("placeholder",), f"placeholder is {token!r}, not a token id from 0")
    return token


def read_as(entry: TowerEntry, r: Resolved, vocab: int) -> int | None:
    """The id the text model's embeddings read at a placeholder (``read_as``; None: absent).

    Raises:
        SpecError: not a whole number within the vocabulary.
    """
    v = entry.view
    value = _whole(v, ("read_as",), _option(v, r, ("read_as",), None))
    if value is not None and not 0 <= value < vocab:
        raise v.error(("read_as",), f"read_as is {value}: an id within the text model's "
                                    f"{vocab} rows")
    return value


def bidirectional(entry: TowerEntry, r: Resolved) -> bool:
    """Whether one image's placeholder rows attend to each other both ways."""
    return _flag_option(entry.view, r, ("bidirectional",), False)


def processor(entry: TowerEntry, settings: Mapping[str, Any], source: str) -> ImageProcessor:
    """The front end ``front`` names on ``settings`` (preprocessor_config.json's mapping,
    empty where the checkpoint has none) over the front end's ``defaults``: every key of
    ``settings`` is one the front end reads, or one ``front.ignore`` lists; a value
    ``front.refuse`` names is refused.

    Raises:
        SpecError: at ``front``, an unread or refused key (each named with ``source``), a
            front end other than ``image``, or settings ``ImageProcessor`` refuses.
    """
    known = {"size", "resample", "do_resize", "do_center_crop", "crop_size", "do_rescale",
             "rescale_factor", "do_normalize", "image_mean", "image_std", "do_convert_rgb"}
    merged = _front_settings(entry, settings, source, known)
    try:
        return ImageProcessor(**{k: tuple(x) if isinstance(x, list) else x
                                 for k, x in merged.items()})
    except (TypeError, ValueError) as e:
        raise entry.view.error(("front",), f"{source}: {e}") from None


def tiles(entry: TowerEntry, settings: Mapping[str, Any], source: str,
          side: int) -> TileProcessor:
    """The ``tiles`` front end (``TileProcessor``) on ``settings`` over the front end's
    ``defaults``, each key read, ignored or refused (as ``processor``), its tiles the
    tower's image of ``side`` pixels.

    Raises:
        SpecError: at ``front``, as ``processor``, or tiles of another side than the
            tower's image.
    """
    known = {"size", "resample", "do_resize", "do_image_splitting", "max_image_size",
             "do_rescale", "rescale_factor", "do_normalize", "image_mean", "image_std",
             "do_convert_rgb", "do_pad"}
    merged = _front_settings(entry, settings, source, known)
    try:
        front = TileProcessor(**{k: tuple(x) if isinstance(x, list) else x
                                 for k, x in merged.items()})
    except (TypeError, ValueError) as e:
        raise entry.view.error(("front",), f"{source}: {e}") from None
    if front.tile != side:
        raise entry.view.error(("front",), f"{source}: tiles of {front.tile} pixels "
                               f"(max_image_size) for a tower taking {side}-pixel images "
                               "(image_size): every tile is one image of the tower")
    return front


def front_kind(entry: TowerEntry) -> str:
    """The front end's kind (``FRONT_ENDS``).

    Raises:
        SpecError: another.
    """
    kind = entry.view.get("front", "kind", default="image")
    if kind not in FRONT_ENDS:
        raise entry.view.error(("front", "kind"), f"front end {kind!r} is not one of "
                                                  f"{', '.join(FRONT_ENDS)}")
    return kind


def _front_settings(entry: TowerEntry, settings: Mapping[str, Any], source: str,
                    known: set) -> dict:
    """``settings`` over ``front.defaults``, the keys the front end reads (``known``);
    every other key of ``settings`` ignored on purpose or refused."""
    v = entry.view
    f = ("front",)
    defaults = dict(v.get(*f, "defaults", default={}) or {})
    ignore = set(v.get(*f, "ignore", default=[]) or [])
    for rule in v.get(*f, "refuse", default=[]) or []:
        key = rule.get("key")
        if key in settings and settings[key] == rule.get("value"):
            raise v.error(f + ("refuse",), f"{source}: {key} = {settings[key]!r} is not "
                                           f"served: {rule.get('why', '')}")
    refused = {rule.get("key") for rule in v.get(*f, "refuse", default=[]) or []}
    unread = [k for k in settings if k not in known and k not in ignore and k not in refused]
    if unread:
        raise v.error(f + ("ignore",), f"{source}: keys {', '.join(unread)} are neither read "
                                       "by the front end nor listed in front.ignore")
    merged = {**defaults, **{k: settings[k] for k in settings if k in known}}
    unknown = [k for k in merged if k not in known]
    if unknown:
        raise v.error(f + ("defaults",), f"front.defaults names {', '.join(unknown)}, which "
                                         f"the front end does not read ({', '.join(sorted(known))})")
    return merged


def with_token_texts(entry: TowerEntry, prompt: Expansion | None, r: Resolved,
                     directory) -> Expansion | None:
    """``prompt`` with each ``{id:FIELD}`` replaced by the text of the token whose id the
    tower's field ``FIELD`` holds (Gemma 4's ``{id:boi_token_id}``), read from the
    checkpoint's tokenizer.json: the processor writes its tokenizer's ``boi_token``,
    ``image_token`` and ``eoi_token``, whose texts the spec need not know. Left as it is
    where the checkpoint has no tokenizer (a prompt then needs one anyway).

    Raises:
        SpecError: at ``prompt``, a field that is no id, or an id the tokenizer lacks.
    """
    import re

    if prompt is None or directory is None or not (directory / "tokenizer.json").is_file():
        return prompt
    fields = {f for text in (prompt.marker, prompt.text, prompt.soft, prompt.tile or "",
                             prompt.tiled or "", prompt.row_end)
              for f in re.findall(r"\{id:([A-Za-z_][A-Za-z0-9_]*)\}", text)}
    if not fields:
        return prompt
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    texts = {}
    for f in sorted(fields):
        value = r.values.get(f)
        token = tokenizer.id_to_token(value) if isinstance(value, int) else None
        if token is None:
            raise entry.view.error(("prompt",), f"{{id:{f}}}: {f} is {value!r}, not an id "
                                   f"of {directory / 'tokenizer.json'}")
        texts[f"{{id:{f}}}"] = token
        r.read.add(f)

    def sub(text):
        for k, v in texts.items():
            text = text.replace(k, v)
        return text

    return Expansion(sub(prompt.marker), sub(prompt.text), sub(prompt.soft),
                     None if prompt.tile is None else sub(prompt.tile), sub(prompt.row_end),
                     None if prompt.tiled is None else sub(prompt.tiled))


def prompt_text(entry: TowerEntry) -> Expansion | None:
    """The processor's expansion of the text's marker (``Expansion``); None where the spec
    says none.

    Raises:
        SpecError: ``tile`` and ``tiled`` not given together.
    """
    p = entry.view.get("prompt")
    if not isinstance(p, dict):
        return None
    if ("tile" in p) != ("tiled" in p):
        raise entry.view.error(("prompt",), "prompt.tile and prompt.tiled come together: "
                                            "each tile's text and the text around them")
    return Expansion(p["marker"], p["text"], p["soft"], p.get("tile"), p.get("row_end", ""),
                     p.get("tiled"))
