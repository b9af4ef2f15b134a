"""Record the config.json transformers writes for each causal spec's config classes at their
defaults (``ConfigClass().save_pretrained``), one file per spec, ``<spec name>.json``: an
object from each architecture the spec serves to that config.json. The tests read these
files (tests/specs/test_default_configs.py), so CI needs no transformers.

Run where transformers is installed (the golden extra), after adding a spec:

    python tests/specs/configs/defaults/record.py [SPEC_NAME ...]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]


def config_class(architecture: str):
    """The config class transformers reads a config.json naming ``architecture`` with: the
    class's own, or for a name checkpoints carry that transformers has no class of (built
    by model type: ``ExaoneForCausalLM`` is model_type exaone, built as LlamaForCausalLM),
    the config class of the model type the name spells (``InternLM3ForCausalLM``:
    internlm3)."""
    import re

    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = getattr(transformers, architecture, None)
    if cls is not None:
        return cls.config_class
    stem = re.sub(r"(For\w+|Model|LMHeadModel)$", "", architecture).lower()
    if stem not in CONFIG_MAPPING:
        raise SystemExit(f"{architecture}: transformers has no class of that name and no model "
                         f"type {stem!r}")
    return CONFIG_MAPPING[stem]


def saved(architecture: str, model_type: str | None = None) -> dict:
    """The config.json ``architecture``'s config class writes at its defaults, less
    ``transformers_version`` (which changes with the install, not the class); the config
    class of ``model_type`` where given (transformers builds one class for two model types
    of other defaults)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type] if model_type else \
        globals()["config_class"](architecture)
    with tempfile.TemporaryDirectory() as d:
        config_class().save_pretrained(d)
        data = json.loads((Path(d) / "config.json").read_text())
    data.pop("transformers_version", None)
    return data


def recorded(spec) -> dict:
    """``{architecture: saved(architecture)}`` for every architecture ``spec`` serves."""
    # A spec named as its toy's model type (specs serving one architecture told apart by
    # it) records that model type's config class.
    toy_type = spec.get("toy", "config", "model_type", default=None)
    model_type = toy_type if toy_type == spec.get("name") else None
    return {a: saved(a, model_type) for a in spec.get("architectures")}


def main(names: list[str]) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.specs.test_default_configs import RECORDED_SPECS

    for spec in RECORDED_SPECS:
        if names and spec.get("name") not in names:
            continue
        path = HERE / f"{spec.get('name')}.json"
        path.write_text(json.dumps(recorded(spec), indent=1, sort_keys=True) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
