"""Where a parameter's expected shape comes from, for a mis-shaped tensor's message.

A tensor of another shape than the spec's parameter is either the checkpoint's fault (a
config.json of another model) or the spec's (a shape built from the wrong field): the
message names both sides, the checkpoint's tensor with its file and the spec's expectation
with the config fields its dimensions equal (``576 = hidden_size``), as transformers'
mismatched-keys report names the checkpoint's shape and the model's.

Not for: placing tensors (``runtime.checkpoint``).
"""

from __future__ import annotations

from itertools import combinations
from typing import Any, Callable, Mapping

SHOWN = 3  # the fields named for one dimension at most


def fields_of(shape: tuple[int, ...], values: Mapping[str, Any]) -> str:
    """The config fields each dimension of ``shape`` equals (a field, else a product of
    two), as ``" from hidden_size=576, intermediate_size=1536"``; "" where none does.

    ``values``: the spec's resolved config fields (``config.Resolved.values``). A dimension
    several fields equal names them all (``64 = hidden_size or head_dim*num_attention_heads``):
    which one the spec multiplied is not recorded, and a guess would mislead.
    """
    ints = {k: v for k, v in values.items()
            if isinstance(v, int) and not isinstance(v, bool) and v > 1}
    said = []
    for d in shape:
        names = [k for k, v in ints.items() if v == d]
        if not names:
            names = [f"{a}*{b}" for a, b in combinations(sorted(ints), 2)
                     if ints[a] * ints[b] == d]
        if names:
            shown = " or ".join(names[:SHOWN]) + (" or ..." if len(names) > SHOWN else "")
            said.append(f"{d} = {shown}" if len(names) > 1 else f"{names[0]}={d}")
    return f" from {', '.join(said)}" if said else ""


def explainer(values: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]
              ) -> Callable[[str], str]:
    """``expects(param)`` for ``runtime.checkpoint.bind``: ``fields_of`` the stored shape
    ``shapes[param]``."""
    return lambda name: fields_of(tuple(shapes[name]), values) if name in shapes else ""
