"""Text to token ids and back, over a checkpoint's ``tokenizer.json`` (the ``tokenizers``
library, not transformers), with its chat template rendered by jinja2 and its EOS ids.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any, Iterable

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as _Tokenizer


def read_tokenizer_json(directory: str | Path) -> _Tokenizer:
    """The ``tokenizers`` Tokenizer of ``directory``'s ``tokenizer.json``.

    Raises:
        FileNotFoundError: there is none.
        ValueError: the library cannot read it (named, not its bare Exception).
    """
    path = Path(directory) / "tokenizer.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no tokenizer.json (a checkpoint directory holds one)")
    try:
        return _Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for a file it cannot parse
        raise ValueError(f"{path}: not a tokenizer the tokenizers library reads ({e})") from None


def utf8_text(text: str, what: str = "the text") -> str:
    """``text`` itself, when it is text UTF-8 can encode (what the tokenizers library takes).

    Python hands over bytes of a command line or stdin that are not UTF-8 as lone surrogates
    (its ``surrogateescape``), which the tokenizers library refuses with a bare TypeError.

    Raises:
        ValueError: ``what`` is not UTF-8 text, naming the first such byte (or lone
            surrogate) and its position in bytes from the start.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        code = ord(text[e.start])
        bad = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else \
            f"lone surrogate U+{code:04X}"
        raise ValueError(f"{what} is not UTF-8 text: {bad} at position "
                         f"{len(text[:e.start].encode('utf-8'))}") from None
    return text


def _token_text(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: text, an added-token record, or null."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _ids(value: Any) -> set[int]:
    if value is None:
        return set()
    return {int(v) for v in value} if isinstance(value, list) else {int(value)}


class Tokenizer:
    """A checkpoint directory's tokenizer.

    Args:
        directory: holds ``tokenizer.json``; optionally ``tokenizer_config.json`` (special
            tokens, ``chat_template``), ``chat_template.jinja`` (preferred over the config's,
            as transformers does), ``generation_config.json`` and ``config.json`` (EOS ids).

    Raises:
        FileNotFoundError: no ``tokenizer.json`` in ``directory``.
        ValueError: ``tokenizer.json`` is not one the tokenizers library can read, or one of
            the JSON files is not valid JSON (named).
    """

    def __init__(self, directory: str | Path):
        directory = Path(directory)
        self._tok = read_tokenizer_json(directory)
        settings = _read_json(directory / "tokenizer_config.json")
        jinja_file = directory / "chat_template.jinja"
        template = jinja_file.read_text() if jinja_file.exists() else settings.get("chat_template")
        if isinstance(template, list):  # several named templates: transformers' "default"
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default")
        self.chat_template: str | None = template
        self.special = {k: _token_text(settings.get(k)) for k in
                        ("bos_token", "eos_token", "unk_token", "pad_token")}
        eos = set()
        for source in (_read_json(directory / "generation_config.json"),
                       _read_json(directory / "config.json")):
            eos |= _ids(source.get("eos_token_id"))
        if self.special["eos_token"] is not None:
            tid = self._tok.token_to_id(self.special["eos_token"])
            if tid is not None:
                eos.add(tid)
        #: The ids generation stops at: generation_config.json's, config.json's and the
        #: tokenizer's eos_token, together.
        self.eos_ids: frozenset[int] = frozenset(eos)

    @classmethod
    def from_parts(cls, tokenizer: _Tokenizer, chat_template: str | None,
                   special: dict[str, str | None], eos_ids: Iterable[int]) -> "Tokenizer":
        """A tokenizer from its parts, where no checkpoint directory holds them (a GGUF
        file's metadata, ``runtime.gguf_vocab``): the ``tokenizers`` Tokenizer, the chat
        template, the special tokens' texts by ``tokenizer_config.json``'s names
        (``bos_token``, ``eos_token``, ``unk_token``, ``pad_token``) and the ids generation
        stops at."""
        self = cls.__new__(cls)
        self._tok, self.chat_template = tokenizer, chat_template
        self.special = {k: special.get(k) for k in ("bos_token", "eos_token", "unk_token",
                                                     "pad_token")}
        self.eos_ids = frozenset(eos_ids)
        return self

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """``text``'s ids. With ``add_special_tokens``, the special tokens the post-processor
        puts before a text (a BOS, or none), as transformers' ``tokenizer(text)`` begins;
        any it would put after the text are left off.

        Raises:
            ValueError: ``text`` is not UTF-8 text (``utf8_text``).
        """
        utf8_text(text)
        if not add_special_tokens:
            return self._tok.encode(text, add_special_tokens=False).ids
        encoded = self._tok.encode(text)
        words = encoded.sequence_ids
        if 0 not in words:  # no token of the text's own (""): the specials put before a text
            probe = self._tok.encode("a").sequence_ids
            words = probe if 0 in probe else [0]
        lead = words.index(0)
        return encoded.ids[:lead] + self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """The ids of ``messages`` (each ``{"role", "content"}``) as the checkpoint's chat
        template renders them, the assistant's turn opened after them.

        Rendered in jinja2's immutable sandbox, as transformers' ``apply_chat_template``
        (``trim_blocks``, ``lstrip_blocks``, ``raise_exception``, ``strftime_now``), then
        encoded with no added special tokens.

        Raises:
            ValueError: the checkpoint has no chat template, or a message is not UTF-8 text.
            jinja2.TemplateError: the template refuses the messages.
        """
        if self.chat_template is None:
            raise ValueError("this checkpoint has no chat template (tokenizer_config.json's "
                             "chat_template or chat_template.jinja); use a plain --prompt")
        text = _environment().from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            **{k: v for k, v in self.special.items() if v is not None})
        return self.encode(text, add_special_tokens=False)


def _read_json(path: Path) -> dict:
    """``path``'s JSON object; {} where there is no such file or it holds no object.

    Raises:
        ValueError: the file is not valid JSON (named: json's own error does not say which).
    """
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError as e:  # json.JSONDecodeError, or UnicodeDecodeError on bytes
        raise ValueError(f"{path}: not valid JSON: {e}") from None
    return data if isinstance(data, dict) else {}


def _raise(message: str):
    raise jinja2.TemplateError(message)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, \
        sort_keys=False: json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                                    separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


class TextStream:
    """Turns drawn ids into text pieces as they come, holding back an incomplete character.

    Each ``push(id)`` returns the new text the ids so far decode to beyond what was
    returned before (empty while a multi-byte character is split across tokens).
    """

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.sent = 0

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        piece, self.sent = text[self.sent:], len(text)
        return piece
