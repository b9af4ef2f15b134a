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

IMAGE_KEYS = ("image", "path")


def multimodal(loaded) -> Multimodal | None:
    """The text model of ``loaded`` with its towers (``loaded.towers``), None where it has
    none."""
    towers = getattr(loaded, "towers", None) or []
    if not towers:
        return None
    return Multimodal(loaded.lm, {t.placeholder: t.run() for t in towers})


def image_of(item: dict, where: str) -> Any:
    """The image a content item names.

    Raises:
        ValueError: an item naming none, or a URL (nothing is fetched).
    """
    for key in IMAGE_KEYS:
        if item.get(key) is not None:
            return item[key]
    if item.get("url") is not None:
        raise ValueError(f"{where}: an image by URL ({item['url']!r}) is not fetched; give "
                         "a file path, a PIL image or a uint8 array under 'image'")
    raise ValueError(f"{where}: an image item names no image: give its file, a PIL image or "
                     "a uint8 array under 'image'")


def message_images(messages: Sequence[dict]) -> tuple[list[dict], list]:
    """``messages`` with each image item's image left out (the template renders its marker
    alone), and the images in order.

    Raises:
        TypeError: a message or content item of the wrong form (named by its index).
        ValueError: an image item naming no image.
    """
    out, images = [], []
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
            if not isinstance(item, dict) or item.get("type") not in ("text", "image"):
                raise TypeError(f"message {i} item {j} is {item!r}: an item is "
                                "{'type': 'text', 'text': ...} or {'type': 'image', "
                                "'image': ...}")
            if item["type"] == "image":
                images.append(image_of(item, f"message {i} item {j}"))
                items.append({"type": "image"})
            else:
                if not isinstance(item.get("text"), str):
                    raise TypeError(f"message {i} item {j}: a text item's 'text' is text")
                items.append({"type": "text", "text": item["text"]})
        out.append({**m, "content": items})
    return out, images


def expand(text: str, towers, images: list) -> str:
    """``text`` with each tower's image marker replaced by its placeholders, as the
    processor's expansion does (Gemma3Processor's ``full_image_sequence``).

    Raises:
        ValueError: the text's markers and the images differ in number.
    """
    prompts = [t.prompt for t in towers if t.prompt is not None]
    if not prompts:
        return text
    marker, full = prompts[0]
    found = text.count(marker)
    if found != len(images):
        raise ValueError(f"the prompt holds {found} image marker{'s' * (found != 1)} "
                         f"{marker!r} for {len(images)} image{'s' * (len(images) != 1)}: "
                         "one each")
    return text.replace(marker, full)


def encode(model, prompt, images: Sequence | None = None) -> tuple[list[int], list]:
    """The ids of ``prompt`` (messages or text, module docstring) and its images in order.

    Raises:
        ValueError: no tokenizer, no chat template for messages, markers and images that
            differ in number, or images for a model without towers.
        TypeError: as ``message_images``.
    """
    towers = getattr(model.loaded, "towers", None) or []
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise ValueError("a prompt with images needs the checkpoint's tokenizer")
    images = list(images or [])
    if isinstance(prompt, str):
        text = prompt
    else:
        messages, inside = message_images(prompt)
        if inside and images:
            raise ValueError("images given both inside the messages and beside them: give "
                             "them one way")
        images = inside or images
        text = tokenizer.chat_text(messages)
    if images and not towers:
        raise ValueError("this model has no image tower (its checkpoint is a text model, or "
                         "its spec declares no towers:)")
    text = expand(text, towers, images)
    # As the processor tokenizes: the tokenizer's special tokens added, but where a chat
    # template's text begins with the BOS it wrote (ProcessorMixin.apply_chat_template).
    bos = tokenizer.special.get("bos_token")
    special = isinstance(prompt, str) or not (bos is not None and text.startswith(bos))
    return tokenizer.encode(text, add_special_tokens=special), images


def has_images(prompt) -> bool:
    """Whether ``prompt`` is messages whose content holds a list of items."""
    return isinstance(prompt, (list, tuple)) and any(
        isinstance(m, dict) and isinstance(m.get("content"), list) for m in prompt)
