"""Reading a norm's options (``layer/norm``) into ``runtime.blocks.norms.NormOptions``.

Not for: where a layer places its norms (``layer``).
"""

from __future__ import annotations

from iron_spec.runtime.blocks.norms import NORM_KINDS, NormOptions

from ..config import Resolved
from ..loader import Spec
from .reading import _flag_option, _option, _positive


def norm_options(spec: Spec, r: Resolved, path: tuple) -> NormOptions:
    """The norm at ``path`` (``layer/norm``): its ``kind``, ``eps``, ``plus_one``, ``weight``
    and ``bias`` evaluated, each error naming the option's own line.

    Raises:
        SpecError: a kind other than ``rms``, ``layer`` or ``no_norm``, an eps not above 0,
            a flag that is not a boolean.
    """
    kind = spec.get(*path, "kind", default="rms")
    if kind not in NORM_KINDS:
        raise spec.error(path + ("kind",), f"norm kind {kind!r} is not one of "
                                           f"{', '.join(NORM_KINDS)}")
    return NormOptions(
        kind=kind, eps=_positive(spec, path + ("eps",), _option(spec, r, path + ("eps",), 1e-6)),
        plus_one=_flag_option(spec, r, path + ("plus_one",), False),
        weight=_flag_option(spec, r, path + ("weight",), True),
        bias=_flag_option(spec, r, path + ("bias",), True))
