"""One sequence's KV caches: the arrays a causal model's states hold while it runs them.

A ``CausalLM``'s attention layers each hold ``State`` objects (keys, values); their arrays
are what the compiled plans are bound to. A ``Caches`` is one set of those arrays and what
they hold: the model binds one set at a time (``CausalLM.bind``, under the model's lock),
so each ``runtime.session.Session`` keeps its own set from call to call and two sessions
never write each other's positions. A set that is not bound keeps its arrays here; the
bound set's arrays live in the states (they are replaced as the caches grow).

Not for: running anything (``runtime.causal``), which tokens a conversation needs
(``runtime.session``).
"""

from __future__ import annotations

import numpy as np


class Caches:
    """One set of KV caches and a record of what it holds.

    ``arrays``: each state's array, in ``CausalLM.named_states`` order, while the set is not
    bound (None: never bound, or bound now). ``reserved``: positions every cache holds now.
    ``reference``: the float64 reference's own caches, by ``id`` of the state. ``epoch``:
    the model's cache form the arrays are of (``CausalLM.use_kv_cache`` starts a new one:
    a set of an older one is emptied at its next bind). ``regime``: which RoPE tables the
    held keys were turned by (``CausalLM.rope_regime``; None: none yet). ``snapshots``: the
    copies of the set's recurrent states a run may restart from (``runtime.snapshots``;
    None: none made yet): a set's own, as its recurrent states are, so a session never
    restores states another session ran.

    What a session recorded: ``tokens`` (int64) the caches hold, from position 0 (a run
    resumes at any of them ``CausalLM.resume_at`` allows); ``last`` the logits after
    ``tokens`` where a prompt run computed them (bitwise a fresh run's), else None;
    ``starts`` the prompt chunks' first positions of the run that wrote them (a tower's
    placement keeps an image's rows in one chunk); ``stale`` the first position forgotten
    since (``Session.forget``: a tower's soft tokens changed there), else None.
    """

    def __init__(self):
        self.arrays: list[np.ndarray] | None = None
        self.reserved = 0
        self.reference: dict[int, np.ndarray] = {}
        self.epoch: int | None = None
        self.regime: tuple | None = None
        self.snapshots = None
        self.forget()

    def forget(self) -> None:
        """Hold no tokens anyone may resume from (the arrays are kept, their positions
        written again by whoever runs next): after a run stopped part-way, or a call that
        wrote the caches behind the session's back."""
        self.tokens = np.zeros(0, np.int64)
        self.last: np.ndarray | None = None
        self.starts: list[int] = []
        self.stale: int | None = None

    def empty(self, epoch: int) -> None:
        """Drop the arrays and the reference's caches (made afresh at the next bind) and
        what they held: the model's cache form changed to ``epoch``."""
        self.arrays, self.reserved, self.reference = None, 0, {}
        self.epoch, self.regime, self.snapshots = epoch, None, None
        self.forget()

    @property
    def nbytes(self) -> int:
        """Bytes the arrays hold while not bound (0 while bound: the states hold them)."""
        return sum(a.nbytes for a in self.arrays or ())
