"""The error a spec gets: where in which file, and what would be valid."""

from __future__ import annotations


class SpecError(ValueError):
    """A problem in a spec, at ``file:line:col`` (1-based; 0 where no place is known).

    ``str()`` is ``FILE:LINE:COL: error: MESSAGE``, the form editors and CI annotations read.
    """

    def __init__(self, file: str, line: int, col: int, message: str):
        super().__init__(f"{file}:{line}:{col}: error: {message}")
        self.file, self.line, self.col, self.message = str(file), line, col, message
        self.path: tuple | None = None  # the spec node it is at, where Spec.error made it


class FlagError(ValueError):
    """The arguments a call was given cannot make a run: one is missing, or two do not go
    together (``--toy`` with a checkpoint). The CLI exits 2 on it, a usage error, as click
    does on its own checks; the library raises it as the ValueError it is."""


class NoWeights(FlagError):
    """No checkpoint was given and none can be found (the spec names no example): the
    FlagError a command that needs real weights (``bench``) tells its user apart."""


#: Characters a command prints of one message at most: a value quoted whole into an error
#: (a 7 MB config value, a 5000-character hub id) would bury the line in it.
MOST = 2000


def shorten(text: str, most: int = MOST) -> str:
    """``text`` where it holds at most ``most`` characters; else its start and its end (where
    a message names the file and the key, and where it says what would be valid), the cut
    said with its count."""
    if len(text) <= most:
        return text
    head, tail = most * 3 // 4, most // 5
    return f"{text[:head]} [... {len(text) - head - tail} characters cut ...] {text[-tail:]}"


def message(e: Exception) -> str:
    """The line a command prints for ``e``: a SpecError says ``FILE:LINE:COL: error:`` itself,
    anything else gets ``error:`` before it; an OSError of a path says the path (cut to 80
    characters, its length said) and the system's reason; at most ``MOST`` characters
    (``shorten``)."""
    if isinstance(e, SpecError):
        return shorten(str(e))
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        name = str(e.filename)
        if len(name) > 80:
            name = f"{name[:60]}... ({len(name)} characters)"
        return f"error: {name}: {e.strerror}"
    return shorten(f"error: {e}")
