"""A load's progress as a user of the library sees it: a bar where someone watches (a
terminal's stderr, a Jupyter notebook), a caller's callback, or nothing.

A load reports its stages in turn, each as ``(stage, done, total)``: ``loading weights``
(0 of 1 as it starts, then tensors read of the checkpoint's; weights drawn at a seed, 1 of
1 once drawn), then ``compiling the decode step`` and ``compiling the
prompt chunk`` (a causal model) or ``compiling the encoder`` (0 of 1, then 1 of 1 when
compiled: a SmolLM2 load reads for seconds and compiles each version in about one).

Not for: the commands' own display (``iron_spec.cli.command.Stages``: a rich bar on a
terminal, a line a stage where piped), which takes these calls as any callback does.
"""

from __future__ import annotations

import sys
from typing import Callable, Union

#: ``progress(stage, done, total)``: the stage's name, units done of ``total``.
Callback = Callable[[str, int, int], None]
#: What ``iron_spec.load(progress=...)`` takes: None (a bar where someone watches), True (a
#: bar), False (nothing), or a ``Callback``.
Progress = Union[bool, None, Callback]

LOADING = "loading weights"
COMPILING = {False: "compiling the decode step", True: "compiling the prompt chunk"}
COMPILING_ENCODER = "compiling the encoder"


def watched() -> bool:
    """Whether someone watches this process's output: stderr is a terminal, or the code
    runs in a Jupyter kernel (whose stderr is a pipe to the notebook)."""
    stderr = sys.stderr
    if stderr is not None and hasattr(stderr, "isatty") and stderr.isatty():
        return True
    shell = sys.modules.get("IPython")
    get = getattr(shell, "get_ipython", None)
    return get is not None and type(get()).__name__ == "ZMQInteractiveShell"


def reporter(progress: Progress) -> Callback | None:
    """The callback a load reports to for ``progress`` (``Progress``), None for none.

    Raises:
        TypeError: ``progress`` is none of those (named, with what it may be).
    """
    if progress is None:
        progress = watched()
    if progress is False:
        return None
    if progress is True:
        return Bar()
    if isinstance(progress, (bool, int, float, str)) or not callable(progress):
        raise TypeError(f"progress is {progress!r}; give True (a progress bar), False "
                        "(none), None (a bar where someone watches: a terminal, a notebook) "
                        "or a callable progress(stage, done, total)")
    return progress


class Bar:
    """A tqdm bar per stage (``tqdm.auto``: a widget in a notebook, text on a terminal),
    each closed when its stage is done or the next begins."""

    def __init__(self):
        self._stage, self._bar = None, None

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage != self._stage:
            self.close()
            from tqdm.auto import tqdm
            self._stage = stage
            self._bar = tqdm(total=total, desc=stage, unit="tensor" if stage == LOADING
                             else "", leave=False, file=sys.stderr)
        self._bar.total = total
        self._bar.update(done - self._bar.n)
        if done >= total:
            self.close()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._stage, self._bar = None, None
