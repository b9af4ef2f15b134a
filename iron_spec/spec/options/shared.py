"""Reading ``layer.shared_block`` (the model's shared transformer block: its weight sets, its
attention, MLP and adapters) into ``runtime.blocks.shared.SharedBlockOptions``, for the layers
whose type says ``runs_shared_block``; each error at the option's own line.

Not for: which layers run it (``layer``'s per-type ``runs_shared_block``), or what the block
computes (``runtime.blocks.shared``).
"""

from __future__ import annotations

from iron_spec.runtime.blocks.norms import NormOptions
from iron_spec.runtime.blocks.shared import SharedBlockOptions

from ..config import Resolved
from ..loader import Spec
from .attention import attention_options
from .mlp import mlp_options
from .reading import LayerReader, _flag, _whole

SECTION = "shared_block"


class _SectionReader(LayerReader):
    """A reader of ``layer/shared_block/...``: the section's ``attention`` and ``mlp`` read
    as a layer's are, by the same option readers (one set for every layer: no types)."""

    def word(self, *path, default=None):
        return super().word(SECTION, *path, default=default)


def shared_block_options(spec: Spec, r: Resolved, norm: NormOptions) -> SharedBlockOptions:
    """``layer.shared_block`` evaluated: ``blocks`` (weight sets, 1 or more),
    ``attention`` and ``mlp`` (as a layer's, the layer's norm for both of the block's norms),
    ``adapters.attention`` and ``adapters.mlp`` (ranks, 0 for none), ``tied`` (the uses of a
    set share its weights; default true).

    Raises:
        SpecError: at the option, no section, a count of sets below 1, a negative rank, or
            what the attention and MLP readers refuse.
    """
    if spec.get("layer", SECTION) is None:
        raise spec.error(("layer", "pattern"), "a layer type runs_shared_block, but layer has "
                                               "no shared_block section")
    read = _SectionReader(spec, r, None)
    blocks, at = read.opt("blocks", default="num_mem_blocks", expects="a whole number")
    blocks = _whole(spec, at, blocks)
    if blocks is None or blocks < 1:
        raise spec.error(at, f"shared_block.blocks is {blocks}, not a whole number of weight "
                             "sets of 1 or more")
    ranks = []
    for name in ("attention", "mlp"):
        rank, at = read.opt("adapters", name, default=0, expects="a whole number")
        rank = _whole(spec, at, rank) or 0
        if rank < 0:
            raise spec.error(at, f"shared_block.adapters.{name} is {rank}, not a rank of 0 "
                                 "(none) or more")
        ranks.append(rank)
    tied, at = read.opt("tied", default=True, expects="true or false")
    return SharedBlockOptions(blocks=blocks, attention=attention_options(spec, r, read),
                              mlp=mlp_options(spec, read, norm), norm=norm,
                              attention_adapter=ranks[0], mlp_adapter=ranks[1],
                              tied=_flag(spec, at, tied))
