"""Reading the files a model is built from (config.json, generation_config.json, the
tokenizer's JSON, a chat template, a safetensors header) safely: regular files only, bounded
in size, decoded strictly, every refusal naming the file.

A FIFO or a device named ``config.json`` would block ``open`` forever or stream without end,
and a directory of that name fails deep in a parser: each is refused before it is opened for
reading. JSON nested past Python's recursion limit is refused naming the file rather than
raising RecursionError.

Not for: what the values mean (``iron_spec.values``), the safetensors format
(``runtime.checkpoint``).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

MAX_JSON = 64 * 2**20  # bytes: a tokenizer.json is a few MB, a config.json a few KB


class FileError(ValueError):
    """A file that is not what its name says (not a regular file, too large, not UTF-8, not
    JSON, not the JSON object expected); the message starts with its path."""


def named(error: Exception, where: str) -> Exception:
    """``error`` of the same class (a caller's ``except`` still holds) with ``where`` (a
    file, a prompt's index) before its message; ``error`` itself where its class takes more
    than a message to build."""
    try:
        return type(error)(f"{where}: {error}")
    except Exception:
        return error


def regular(path: str | Path, what: str = "file") -> Path:
    """``path`` itself, when it is a regular file (a symlink to one counts).

    Raises:
        FileNotFoundError: nothing is there.
        FileError: a directory, a FIFO, a socket or a device is there.
    """
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such {what}") from None
    except OSError as e:
        raise FileError(f"{path}: cannot be read ({e.strerror})") from None
    if not stat.S_ISREG(mode):
        kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO (named pipe)"
                if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file")
        raise FileError(f"{path}: is {kind}, not a regular {what}")
    return path


def open_regular(path: str | Path, what: str = "file") -> BinaryIO:
    """``path`` opened for binary reading, refused unless it is a regular file. Opened
    non-blocking and checked again on the open descriptor, so a FIFO swapped in between the
    two looks is refused too rather than blocking the open.

    Raises:
        FileNotFoundError, FileError: as ``regular``.
    """
    path = regular(path, what)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise FileError(f"{path}: cannot be read ({e.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileError(f"{path}: is not a regular {what}")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bytes(path: str | Path, limit: int = MAX_JSON, what: str = "file") -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them.

    Raises:
        FileNotFoundError, FileError: as ``regular``; or larger than ``limit`` bytes.
    """
    with open_regular(path, what) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FileError(f"{path}: larger than {limit} bytes, more than a {what} holds")
    return data


def read_text(path: str | Path, limit: int = MAX_JSON, what: str = "file") -> str:
    """``read_bytes`` decoded as UTF-8 (a leading byte-order mark dropped, as json does).

    Raises:
        FileNotFoundError, FileError: as ``read_bytes``, or not UTF-8 (the byte named).
    """
    data = read_bytes(path, limit, what)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise FileError(f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                        f"{e.start}: {e.reason})") from None


class _Twice(Exception):
    """A key given twice in one JSON object (``_unique``), caught by ``parse_json``."""


def _unique(pairs: list[tuple[str, Any]]) -> dict:
    """A JSON object's pairs as a dict, refusing a key given twice: json (and so
    transformers) keeps the last silently, and which one the file meant is not for us to
    guess."""
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise _Twice(k, out[k], v)
        out[k] = v
    return out


def parse_json(text: str | bytes, source: str) -> Any:
    """``text`` parsed as JSON, refusals naming ``source``: invalid JSON at its line and
    column, a key given twice in one object, nesting past the recursion limit; the
    non-standard constants NaN and Infinity (transformers' json reads them, and a NaN factor
    then makes every logit NaN, so each is refused where it is read: here they stay floats
    for that check to name the key).

    Raises:
        FileError: not JSON, a duplicate key, or nested too deeply.
    """
    try:
        return json.loads(text, object_pairs_hook=_unique)
    except _Twice as e:
        key, first, last = e.args
        raise FileError(f"{source}: the key {key!r} is given twice in one object ({first!r}, "
                        f"then {last!r}); json would keep the last silently: give it once") \
            from None
    except json.JSONDecodeError as e:
        # json's "Unterminated string starting at" names its place itself: one "at".
        raise FileError(f"{source}: not valid JSON: {e.msg.removesuffix(' at')} at line "
                        f"{e.lineno} column {e.colno}") from None
    except UnicodeDecodeError as e:
        raise FileError(f"{source}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except RecursionError:
        raise FileError(f"{source}: JSON nested too deeply to read (thousands of levels; a "
                        "config nests a few)") from None


def read_json(path: str | Path, limit: int = MAX_JSON, what: str = "JSON file") -> Any:
    """The JSON value of the regular file ``path`` (``read_text``, ``parse_json``).

    Raises:
        FileNotFoundError, FileError: as ``read_text`` and ``parse_json``.
    """
    return parse_json(read_text(path, limit, what), str(path))


def read_object(path: str | Path, limit: int = MAX_JSON, what: str = "JSON file") -> dict:
    """``read_json`` where the file must hold a JSON object.

    Raises:
        FileNotFoundError, FileError: as ``read_json``, or the value is not an object.
    """
    data = read_json(path, limit, what)
    if not isinstance(data, dict):
        raise FileError(f"{path}: holds {json_kind(data)}, not a JSON object")
    return data


def json_kind(value: Any) -> str:
    """What a JSON value is, as a message says it (``a list``, ``text``, ``a number``)."""
    if isinstance(value, bool):
        return "a boolean"
    return {dict: "an object", list: "a list", str: "text", int: "a number", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)
