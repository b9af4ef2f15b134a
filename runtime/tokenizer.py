"""Text to token ids and back, over a checkpoint's ``tokenizer.json`` (the ``tokenizers``
library, not transformers), with its chat template rendered by jinja2 and its EOS ids.

Text is bounded before it is tokenized whole (tokenizing takes ~165 bytes of memory per
byte of text): ``Tokenizer.most_bytes(n)`` is the most text ``n`` tokens can hold (the
vocabulary's longest token in bytes, times ``n``) where the tokenizer neither drops text nor
folds a run of unknown text into one token, and ``Tokenizer.surely_past(text, n)`` counts a
long text's tokens in pieces of ``PIECE`` characters, stopping once they pass ``n``.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterable

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as _Tokenizer

from . import values
from .files import FileError, read_object, read_text, regular

# A chat template's render is bounded, as a template is code from the checkpoint: a loop of
# 10**10 steps or a string doubled thirty times is refused, not run to the end.
RENDER_SECONDS = 5.0
RENDER_CHARS = 32 * 2**20  # characters of output (a 128k-token context is ~0.5M)
RENDER_BYTES = 512 * 2**20  # memory the render may grow the process by
#: Characters of text counted at a time by ``Tokenizer.surely_past`` (its memory: ~10 MB).
PIECE = 2**16
# Normalizers that never drop text (a run of text keeps at least one character per byte it
# had, give or take UTF-8's width): where a tokenizer.json holds only these, the longest
# token bounds the text a token holds.
_KEEPING = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Prepend", "Replace"}


def read_tokenizer_json(directory: str | Path) -> _Tokenizer:
    """The ``tokenizers`` Tokenizer of ``directory``'s ``tokenizer.json``.

    Raises:
        FileNotFoundError: there is none.
        ValueError: the library cannot read it (named, not its bare Exception).
    """
    path = Path(directory) / "tokenizer.json"
    if not path.exists() and not path.is_symlink():
        raise FileNotFoundError(f"{path}: no tokenizer.json (a checkpoint directory holds one)")
    regular(path, "tokenizer.json")
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


def _template(value: Any, source: str) -> str | None:
    """A checkpoint's chat template as transformers takes it: text, or a list of ``{name,
    template}`` (several named templates; ``PreTrainedTokenizerBase.get_chat_template`` uses
    ``default``, and with none refuses); null is none.

    Raises:
        FileError: anything else, or a list whose entries are not ``{name, template}`` text.
    """
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {}
        for i, t in enumerate(value):
            if not (isinstance(t, dict) and isinstance(t.get("name"), str)
                    and isinstance(t.get("template"), str)):
                raise FileError(f"{source}: chat_template[{i}] is not a {{name, template}} of "
                                "text, as transformers saves several templates")
            named[t["name"]] = t["template"]
        if "default" not in named:
            raise FileError(f"{source}: chat_template holds templates "
                            f"{', '.join(sorted(named))} and none named default (the one a "
                            "chat renders, as transformers')")
        return named["default"]
    raise FileError(f"{source}: chat_template is {values.shown(value)}, not text (a jinja "
                    "template) nor a list of {name, template}")


class Tokenizer:
    """A checkpoint directory's tokenizer.

    Args:
        directory: holds ``tokenizer.json``; optionally ``tokenizer_config.json`` (special
            tokens, ``chat_template``), ``chat_template.jinja`` (preferred over the config's,
            as transformers does), ``generation_config.json`` and ``config.json`` (EOS ids).

    Raises:
        FileNotFoundError: no ``tokenizer.json`` in ``directory``.
        ValueError: ``tokenizer.json`` is not one the tokenizers library can read, or one of
            the JSON files is not valid JSON (named); an unreadable generation_config.json
            is left out instead (no end-of-text ids come from it).
    """

    def __init__(self, directory: str | Path):
        directory = Path(directory)
        self._tok = read_tokenizer_json(directory)
        config = directory / "tokenizer_config.json"
        settings = _read_json(config)
        jinja_file = directory / "chat_template.jinja"
        if jinja_file.exists() or jinja_file.is_symlink():
            template = read_text(jinja_file, what="chat template")
            source = str(jinja_file)
        else:
            template = _template(settings.get("chat_template"), str(config))
            source = f"{config}: chat_template"
        self.chat_template: str | None = template
        #: Where ``chat_template`` was read (``FILE`` or ``FILE: KEY``), for its errors.
        self.chat_template_source = source
        self.special = {k: _token_text(settings.get(k)) for k in
                        ("bos_token", "eos_token", "unk_token", "pad_token")}
        V = self.vocab_size
        eos: dict[int, str] = {}
        for name in ("generation_config.json", "config.json"):
            path = directory / name
            try:
                data = _read_json(path)
            except FileError:
                if name == "config.json":
                    raise
                # As transformers, which goes on without a GenerationConfig it cannot load;
                # the loader warns (iron_spec.runtime.generation.read_generation_config).
                data = {}
            # config.json's bos and pad ids are the model's, checked where its config is
            # read (a composite checkpoint's whole file may hold one its text model never
            # reads: SmolVLM 2's top-level pad_token_id 128002 beside 49280 rows).
            keys = values.TOKEN_KEYS if name == "generation_config.json" else ("eos_token_id",)
            for key in keys:
                ids = values.token_ids(data.get(key), f"{path}: {key}", V)
                if key == "eos_token_id":
                    eos.update({i: f"{path}: {key}" for i in ids if i not in eos})
        if self.special["eos_token"] is not None:
            tid = self._tok.token_to_id(self.special["eos_token"])
            if tid is None:
                raise FileError(f"{config}: eos_token {self.special['eos_token']!r} is not a "
                                "token of tokenizer.json (generation could never stop at it)")
            eos.setdefault(tid, f"{config}: eos_token")
        #: The ids generation stops at: generation_config.json's, config.json's and the
        #: tokenizer's eos_token, together.
        self.eos_ids: frozenset[int] = frozenset(eos)
        #: Where each of ``eos_ids`` was read (``FILE: KEY``), for errors.
        self.eos_sources: dict[int, str] = eos

    @classmethod
    def from_parts(cls, tokenizer: _Tokenizer, chat_template: str | None,
                   special: dict[str, str | None], eos_sources: dict[int, str],
                   chat_template_source: str = "the chat template") -> "Tokenizer":
        """A tokenizer from its parts, where no checkpoint directory holds them (a GGUF
        file's metadata, ``runtime.gguf_vocab``): the ``tokenizers`` Tokenizer, the chat
        template and where it was read (``FILE: KEY``), the special tokens' texts by
        ``tokenizer_config.json``'s names (``bos_token``, ``eos_token``, ``unk_token``,
        ``pad_token``) and the ids generation stops at, each with where it was read."""
        self = cls.__new__(cls)
        self._tok, self.chat_template = tokenizer, chat_template
        self.chat_template_source = chat_template_source
        self.special = {k: special.get(k) for k in ("bos_token", "eos_token", "unk_token",
                                                     "pad_token")}
        self.eos_ids = frozenset(eos_sources)
        self.eos_sources = dict(eos_sources)
        return self

    @property
    def library(self) -> _Tokenizer:
        """The ``tokenizers`` library's Tokenizer this one wraps (an encoder's ``TextIds``
        reads a GGUF file's through it)."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @functools.cached_property
    def longest(self) -> int | None:
        """Bytes (UTF-8) of the vocabulary's longest token, its added tokens too: the most
        text one token holds where the model is BPE (or WordLevel) with no unknown token or
        with byte fallback, and every normalizer keeps its text (``_KEEPING``); None where a
        token may hold more (a WordPiece or Unigram unknown word, a fused unknown run, a
        normalizer that drops characters). Read once, where first asked (a vocabulary of
        262k tokens takes ~0.3 s)."""
        model = self._tok.model
        kind = type(model).__name__
        if kind not in ("BPE", "WordLevel") or (getattr(model, "unk_token", None) is not None
                                                and not getattr(model, "byte_fallback", False)):
            return None
        norm = self._tok.normalizer
        norm = None if norm is None else json.loads(norm.__getstate__())
        norms = [] if norm is None else norm.get("normalizers", [norm]) \
            if norm.get("type") == "Sequence" else [norm]
        for n in norms:
            if n.get("type") not in _KEEPING or (n.get("type") == "Replace" and
                                                 not n.get("content")):
                return None
        vocab = self._tok.get_vocab(with_added_tokens=True)
        return max((len(t.encode("utf-8", "surrogatepass")) for t in vocab), default=1)

    def most_bytes(self, tokens: int) -> int | None:
        """The most bytes of text ``tokens`` tokens can hold (``longest`` times
        ``tokens``); None where no such bound holds (``longest`` is None)."""
        return None if self.longest is None else self.longest * tokens

    def surely_past(self, text: str, tokens: int) -> bool:
        """Whether ``text`` encodes to more than ``tokens`` tokens, counted in pieces of
        about ``PIECE`` characters cut before a space (so a piece's memory, not the whole
        text's), stopping as soon as the count passes ``tokens`` and two more a piece (the
        most a cut may add); False where the whole may fit (it is then encoded whole)."""
        count, pieces, at, n = 0, 0, 0, len(text)
        while at < n:
            end = min(n, at + PIECE)
            if end < n:
                cut = text.rfind(" ", at + PIECE // 2, end)
                end = cut if cut > at else end
            count += len(self._tok.encode(text[at:end], add_special_tokens=False).ids)
            pieces += 1
            at = end
            if count > tokens + 2 * pieces:
                return True
        return False

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
            jinja2.TemplateError: the template refuses the messages (its ``raise_exception``)
                or fails; the message names where the template was read
                (``chat_template_source``) before the template's own.
        """
        return self.encode(self.chat_text(messages, add_generation_prompt),
                           add_special_tokens=False)

    def check_chat_template(self) -> None:
        """Parse the chat template without rendering it, so a conversation is refused when it
        starts rather than at its first turn (transformers compiles it at the first
        ``apply_chat_template``; a chat wants the error before anyone types).

        Raises:
            ValueError: the checkpoint has no chat template.
            jinja2.TemplateError: the template is not valid jinja, naming where it was read
                and the line.
        """
        if self.chat_template is None:
            raise ValueError("this checkpoint has no chat template (tokenizer_config.json's "
                             "chat_template or chat_template.jinja); use a plain --prompt")
        try:
            _environment().parse(self.chat_template)
        except jinja2.TemplateSyntaxError as e:
            raise jinja2.TemplateError(f"{self.chat_template_source}: line {e.lineno}: "
                                       f"{e.message}") from None

    def chat_text(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The text the chat template renders ``messages`` into (``chat`` encodes it);
        raises as ``chat``."""
        if self.chat_template is None:
            raise ValueError("this checkpoint has no chat template (tokenizer_config.json's "
                             "chat_template or chat_template.jinja); use a plain --prompt")
        where = self.chat_template_source
        try:
            text = render(self.chat_template, messages=messages,
                          add_generation_prompt=add_generation_prompt,
                          **{k: v for k, v in self.special.items() if v is not None})
        except TemplateRaised as e:
            raise TemplateRaised(f"{where}: the chat template refuses these messages "
                                 f"(raise_exception): {e}") from None
        except jinja2.TemplateSyntaxError as e:
            raise jinja2.TemplateError(f"{where}: line {e.lineno}: {e.message}") from None
        except jinja2.TemplateError as e:  # its own class kept (SecurityError, bounds)
            raise type(e)(f"{where}: {e}") from None
        except (TypeError, ValueError, ArithmeticError, LookupError, AttributeError) as e:
            # The template's own code failed on these messages (a string plus a number, a
            # content that is a list where it expects text): said as the template's failure.
            raise jinja2.TemplateError(f"{where}: the chat template fails on these messages: "
                                       f"{type(e).__name__}: {e}") from None
        return text


def render(template: str, **context: Any) -> str:
    """``template`` rendered over ``context`` in jinja2's immutable sandbox (as transformers'
    ``render_jinja_template``), bounded: at most ``RENDER_SECONDS`` seconds,
    ``RENDER_CHARS`` characters of output and ``RENDER_BYTES`` of memory grown; the
    template's own code is traced line by line to hold the bounds (a render takes
    milliseconds; the trace costs a few microseconds a line).

    Raises:
        jinja2.TemplateError: the template is not valid jinja, refuses the context
            (``raise_exception``), or passes a bound (``TemplateBoundError``, saying which).
    """
    compiled = _environment().from_string(template)
    deadline, base, steps = time.monotonic() + RENDER_SECONDS, _rss(), [0]

    def check() -> None:
        if time.monotonic() > deadline:
            raise TemplateBoundError(f"the chat template ran past {RENDER_SECONDS:g} s "
                                     "(a loop without end?)")
        if _rss() - base > RENDER_BYTES:
            raise TemplateBoundError(f"the chat template grew memory past "
                                     f"{RENDER_BYTES // 2**20} MiB (a string built without end?)")

    def line(frame, event, arg):
        steps[0] += 1
        check()
        return line

    def calls(frame, event, arg):
        return line if frame.f_code.co_filename == "<template>" else None

    out, n = [], 0
    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        for piece in compiled.generate(**context):
            n += len(piece)
            if n > RENDER_CHARS:
                raise TemplateBoundError(f"the chat template's output passed {RENDER_CHARS} "
                                         "characters")
            out.append(piece)
    except MemoryError:
        raise TemplateBoundError("the chat template ran out of memory") from None
    except (OverflowError, RecursionError) as e:
        raise TemplateBoundError(f"the chat template failed: {type(e).__name__}: {e}") from None
    finally:
        sys.settrace(previous)
    return "".join(out)


class TemplateBoundError(jinja2.TemplateError):
    """A chat template that passed a bound of its render (time, output, memory)."""


class TemplateRaised(jinja2.TemplateError):
    """A chat template's own refusal: its ``raise_exception(message)``, as transformers'
    ``raise_exception`` raises a TemplateError with the message."""


def _rss() -> int:
    """This process's resident memory in bytes (Linux's /proc; 0 where there is none)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _read_json(path: Path) -> dict:
    """``path``'s JSON object; {} where there is no such file.

    Raises:
        FileError: not a regular file, not UTF-8, not valid JSON or not an object (named).
    """
    if not path.exists() and not path.is_symlink():
        return {}
    return read_object(path)


def _raise(message: str):
    raise TemplateRaised(message)


class _Sandbox(ImmutableSandboxedEnvironment):
    """transformers' immutable sandbox, with ``*`` and ``**`` held to the render's bounds
    (one ``"x" * 10**10`` would allocate before any line is traced)."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context, operator, left, right):
        if operator == "*":
            size, times = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(size, (str, list, tuple)) and isinstance(times, int) \
                    and len(size) * times > RENDER_CHARS:
                raise TemplateBoundError(f"the chat template repeats {len(size)} items "
                                         f"{times} times, past {RENDER_CHARS}")
        if operator == "**" and isinstance(left, int) and isinstance(right, int) \
                and abs(left) > 1 and right > 4096:
            raise TemplateBoundError(f"the chat template raises {left} to the power {right}")
        return super().call_binop(context, operator, left, right)


class _Generation(jinja2.ext.Extension):
    """``{% generation %} ... {% endgeneration %}``: the body as it is, as transformers'
    ``AssistantTracker`` renders it (it marks the assistant's tokens for training masks;
    LLaVA's chat template wraps the assistant's text in it)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _environment() -> ImmutableSandboxedEnvironment:
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True,
                   extensions=["jinja2.ext.loopcontrols", _Generation])
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

    Only a window of the ids is decoded again at each push, not all of them (which cost a
    push time in proportion to the text so far: ~100 us at 1000 tokens on SmolLM2's
    tokenizer): the ids since the piece before the last, whose text then begins with that
    piece's (decoded alone, the way the window's first id decodes: a decoder that drops a
    leading space drops it from both), as vLLM's incremental detokenizer and the tokenizers
    library's ``DecodeStream`` do.
    """

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        # ids[start:read]: the window's ids already shown (prefix: their text alone)
        self._start = self._read = 0
        self._prefix = ""

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids[self._start:])
        if text.endswith("\ufffd"):
            return ""
        piece = text[len(self._prefix):]
        if piece:  # the window moves on: its ids from the last piece's
            self._start, self._read = self._read, len(self.ids)
            self._prefix = self.tokenizer.decode(self.ids[self._start:self._read])
        return piece
