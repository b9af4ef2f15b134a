"""A prompt with images, as transformers' processors take it, for a model with towers.

A prompt is chat messages whose ``content`` is text or a list of items as transformers'
chat messages give them (``{"type": "text", "text": ...}``, ``{"type": "image", "image":
...}`` with a path, a PIL image or a uint8 array; ``"path"`` for a file too), or text holding
the chat template's image marker (``<start_of_image>``) once per image, with the images
given beside it. The chat template renders the messages (an image item as its marker), the
processor's expansion replaces each marker with the image's placeholders (the spec's
``towers[].prompt``), and the text is encoded as the processor's ``apply_chat_template``
does: the tokenizer's special tokens added (LLaVA's ``<s>``), unless the template's text
begins with the BOS itself (Gemma's).

Not for: running towers (``runtime.towers.multimodal``), loading them (``spec.towers``).
"""

from __future__ import annotations

from typing import Any, Sequence

from iron_spec.runtime.towers.multimodal import Multimodal

#: The content items a tower of each modality reads, and the keys that hold their input.
KEYS = {"image": ("image", "path"), "audio": ("audio", "path")}


def multimodal(loaded) -> Multimodal | None:
    """The text model of ``loaded`` with its towers (``loaded.towers``), None where it has
    none."""
    towers = getattr(loaded, "towers", None) or []
    if not towers:
        return None
    return Multimodal(loaded.lm, {t.placeholder: t.run() for t in towers})


def media_of(item: dict, where: str) -> Any:
    """The input a content item names (an image's or a sound's).

    Raises:
        ValueError: an item naming none, or a URL (nothing is fetched).
    """
    for key in KEYS[item["type"]]:
        if item.get(key) is not None:
            return item[key]
    for key in ("url", "image_url", "audio_url"):
        if item.get(key) is not None:
            raise ValueError(f"{where}: an input by URL ({item[key]!r}) is not fetched; give "
                             f"a file path or the {item['type']} itself under "
                             f"{item['type']!r}")
    raise ValueError(f"{where}: an {item['type']} item names no input: give its file under "
                     f"{item['type']!r}")


def message_media(messages: Sequence[dict]) -> tuple[list[dict], dict[str, list]]:
    """``messages`` with each image or audio item's input left out (the template renders
    its marker alone), and the inputs by modality, in order.

    Raises:
        TypeError: a message or content item of the wrong form (named by its index).
        ValueError: an item naming no input.
    """
    out, media = [], {kind: [] for kind in KEYS}
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not (
                isinstance(content, str) or isinstance(content, list)):
            raise TypeError(f"message {i} is {m!r}: each message is a mapping with a text "
                            "'role' and a 'content' of text or a list of items")
        if isinstance(content, str):
            out.append(dict(m))
            continue
        items = []
        for j, item in enumerate(content):
            if not isinstance(item, dict) or item.get("type") not in ("text", *KEYS):
                raise TypeError(f"message {i} item {j} is {item!r}: an item is "
                                "{'type': 'text', 'text': ...}, {'type': 'image', 'image': "
                                "...} or {'type': 'audio', 'audio': ...}")
            if item["type"] in KEYS:
                media[item["type"]].append(media_of(item, f"message {i} item {j}"))
                # The input's key kept (its value not: the template renders a marker).
                items.append({"type": item["type"], item["type"]: None})
            else:
                if not isinstance(item.get("text"), str):
                    raise TypeError(f"message {i} item {j}: a text item's 'text' is text")
                items.append({"type": "text", "text": item["text"]})
        out.append({**m, "content": items})
    return out, media


def expand(text: str, tower, inputs: list) -> str:
    """``text`` with each of ``tower``'s markers replaced, in order, by its input's
    placeholders, as the processor's expansion does (Gemma3Processor's
    ``full_image_sequence``, Qwen2AudioProcessor's ``num_audio_tokens``, Idefics3Processor's
    tiles).

    Raises:
        ValueError: the text's markers and the inputs differ in number.
    """
    if tower.prompt is None:
        return text
    marker = tower.prompt.marker
    pieces = text.split(marker)
    if len(pieces) - 1 != len(inputs):
        found = len(pieces) - 1
        raise ValueError(f"the prompt holds {found} {tower.modality} marker"
                         f"{'s' * (found != 1)} {marker!r} for {len(inputs)} "
                         f"{tower.modality}{'s' * (len(inputs) != 1)}: one each")
    out = [pieces[0]]
    for raw, piece in zip(inputs, pieces[1:]):
        out += [tower.prompt.of(*tower.layout(raw)), piece]
    return "".join(out)


def encode(model, prompt, media: dict | None = None) -> tuple[list[int], dict[int, list]]:
    """The ids of ``prompt`` (messages or text, module docstring) and the inputs of each
    tower, by its placeholder token, in order; ``media`` gives a text prompt's (or
    messages') inputs by modality (``{"image": [...], "audio": [...]}``).

    Raises:
        ValueError: no tokenizer, no chat template for messages, markers and inputs that
            differ in number, inputs given twice, or inputs for a model without the tower.
        TypeError: as ``message_media``.
    """
    towers = getattr(model.loaded, "towers", None) or []
    given = {kind: list(v or []) for kind, v in (media or {}).items() if v}
    refuse_missing(model, towers, given)
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise ValueError("a prompt with images or audio needs the checkpoint's tokenizer")
    if isinstance(prompt, str):
        text = prompt
    else:
        messages, inside = message_media(prompt)
        inside = {kind: v for kind, v in inside.items() if v}
        if inside and given:
            raise ValueError("inputs given both inside the messages and beside them: give "
                             "them one way")
        given = inside or given
        text = tokenizer.chat_text(messages)
    by_kind = {t.modality: t for t in towers}
    refuse_missing(model, towers, given)
    inputs = {}
    for kind, tower in by_kind.items():
        text = expand(text, tower, given.get(kind, []))
        inputs[tower.placeholder] = given.get(kind, [])
    # As the processor tokenizes: the tokenizer's special tokens added, but where a chat
    # template's text begins with the BOS it wrote (ProcessorMixin.apply_chat_template).
    bos = tokenizer.special.get("bos_token")
    special = isinstance(prompt, str) or not (bos is not None and text.startswith(bos))
    model._within_bound(text)  # bounded before it is tokenized, as a text prompt is
    return tokenizer.encode(text, add_special_tokens=special), inputs


def refuse_missing(model, towers, given: dict) -> None:
    """Inputs of a modality no loaded tower reads are refused: a tower the spec declares
    ``not_built`` says why."""
    have = {t.modality for t in towers}
    missing = [kind for kind in given if kind not in have]
    if missing:
        refused = not_built_towers(model.loaded).get(missing[0])
        if refused is not None:
            raise ValueError(f"this model's {missing[0]} tower is not built ({refused})")
        raise ValueError(f"this model has no {missing[0]} tower (its checkpoint is a text "
                         "model, or its spec declares no such towers:)")


def not_built_towers(loaded) -> dict[str, str]:
    """The towers ``loaded``'s checkpoint holds that its spec declares ``not_built``, by
    name, with why (``options.towers.not_built``); none for a text checkpoint."""
    from iron_spec.spec.options.towers import not_built

    part = getattr(loaded, "part", None)
    if part is None:
        return {}
    return not_built(loaded.expanded.spec, part.whole)


def has_images(prompt) -> bool:
    """Whether ``prompt`` is messages whose content holds a list of items."""
    return isinstance(prompt, (list, tuple)) and any(
        isinstance(m, dict) and isinstance(m.get("content"), list) for m in prompt)
