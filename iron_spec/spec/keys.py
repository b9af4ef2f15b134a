"""Which config.json keys transformers reads, by model type: what tells a key that changes
the model from one transformers stores and never reads.

``keys.json`` beside this module holds, for each model type a committed golden was
recorded on, what ``iron_spec.transformers_keys`` found in transformers' own code: the
config class's fields, its ``attribute_map`` aliases, the keywords the config classes keep
from ``**kwargs``, the attributes the model code reads (a static scan), and the specs whose
goldens recorded it. It is written from the goldens' meta (``config_keys``) by
``python -m tests.goldens.keys`` (no model runs) and by the re-recording script, so a
transformers release that reads a new key shows here when goldens are re-recorded, not at
a user's load.

Not for: accounting a config.json against a spec (``accounting.account``), recording
(``transformers_keys``).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

STORE = Path(__file__).with_name("keys.json")
#: Keys transformers' loading reads for every model, whatever its config class: outside the
#: modules the recorded reads come from (``transformers_keys.SHARED``), so named here.
#: ``quantization_config`` picks the quantizer (quantizers/auto.py, from from_pretrained)
#: that reads the checkpoint's tensors as stored quantized (GPTQ, AWQ, bitsandbytes, FP8).
LOADER = {"quantization_config": "read by from_pretrained's quantizer (quantizers/auto.py): "
                                 "the weights are stored quantized"}


@dataclass(frozen=True)
class Reads:
    """What transformers reads of a config.json of ``model_type`` (``config_class``, built as
    ``model``: its classes, comma-separated) in version ``transformers``; ``specs``: the specs whose goldens recorded it."""

    model_type: str
    config_class: str
    model: str
    transformers: str
    specs: tuple[str, ...]
    fields: frozenset[str]
    aliases: Mapping[str, str]
    kwargs: frozenset[str]
    modeling: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def why(self, key: str) -> str | None:
        """Why transformers reads ``key`` (a top-level config.json key), in a phrase; None
        where it never does."""
        if key.startswith("_"):
            return None
        if key in LOADER:
            return LOADER[key]
        if key in self.fields:
            return f"a field of {self.config_class}"
        if key in self.aliases:
            return f"{self.config_class}'s alias of {self.aliases[key]}"
        if key in self.kwargs:
            return f"read by {self.config_class} as it is built"
        if key in self.modeling:
            where = self.modeling[key]
            return f"read by {', '.join(where[:2])}{' ...' if len(where) > 2 else ''}"
        return None

    def names(self, key: str) -> set[str]:
        """``key`` and every name transformers reads it under: an alias and its field."""
        out = {key}
        if key in self.aliases:
            out.add(self.aliases[key])
        out |= {a for a, f in self.aliases.items() if f == key}
        return out


def _reads(model_type: str, entry: Mapping[str, Any], shared: Mapping[str, Any],
           version: str) -> Reads:
    modeling = {k: tuple(v) for k, v in (shared.get("modeling") or {}).items()}
    for k, v in (entry.get("modeling") or {}).items():
        modeling[k] = tuple(v) + modeling.get(k, ())
    return Reads(model_type, entry["class"], ", ".join(entry.get("models", ())), version, tuple(entry.get("specs", ())),
                 frozenset(entry.get("fields", ())), dict(entry.get("aliases") or {}),
                 frozenset(entry.get("kwargs", ())) | frozenset(shared.get("kwargs", ())),
                 modeling)


@functools.lru_cache(maxsize=4)
def _load(path: str) -> dict:
    p = Path(path)
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else {}


def recorded(model_type: Any, path: Path = STORE) -> Reads | None:
    """What transformers reads of a config.json of ``model_type``, as recorded in ``path``
    (default ``STORE``); None where that model type is not recorded (or is no string)."""
    if not isinstance(model_type, str):
        return None
    data = _load(str(path))
    entry = (data.get("model_types") or {}).get(model_type)
    if entry is None:
        return None
    return _reads(model_type, entry, data.get("shared") or {}, data.get("transformers", "?"))


def serves(spec_name: Any, model_type: Any, path: Path = STORE) -> bool:
    """Whether the spec named ``spec_name`` serves config.jsons of ``model_type``: a golden
    of it recorded one, which is what transformers builds such a file by, whatever its
    ``architectures`` say (AutoModelForCausalLM picks the class by model_type)."""
    reads = recorded(model_type, path)
    return reads is not None and spec_name in reads.specs


def for_spec(spec_name: Any, config_json: Mapping[str, Any], path: Path = STORE
             ) -> tuple[Reads | None, str]:
    """The record a load of ``config_json`` under the spec named ``spec_name`` is accounted
    by, and, where there is none, why (to say in a refusal): its ``model_type`` unrecorded,
    or recorded by other specs' goldens only (a spec is judged by a golden of its own)."""
    model_type = config_json.get("model_type")
    if not isinstance(model_type, str):
        return None, ("config.json names no model_type, so which keys transformers reads is "
                      "not known")
    reads = recorded(model_type, path)
    if reads is None:
        return None, (f"which keys transformers reads of a {model_type} config.json is not "
                      "recorded (no committed golden of that model type)")
    if spec_name not in reads.specs:
        return None, (f"which keys transformers reads of a {model_type} config.json is "
                      f"recorded by the goldens of {', '.join(reads.specs)}, not of spec "
                      f"{spec_name}")
    return reads, ""
