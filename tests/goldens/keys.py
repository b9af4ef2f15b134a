"""Record which config.json keys transformers reads beside every committed golden, and
gather them into iron_spec/keys.json (needs transformers; never run by the tests):

    python -m tests.goldens.keys            # add the record where a golden lacks it, then gather
    python -m tests.goldens.keys --gather   # gather only (no transformers needed)

A golden's meta names the model type and the transformers class it was recorded through;
its ``config_keys`` is ``iron_spec.transformers_keys.record`` of that model type's config
class and that model class, as ``--record-golden`` records it. No model runs; every array
but meta is compared with the old file's, byte for byte.

keys.json holds one entry per model type (the specs whose goldens recorded it), and once
the reads of the modules every model runs through (``shared``). Two goldens of one model
type that disagree (recorded by two transformers versions) are an error: re-record them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from iron_spec.spec.keys import STORE
from iron_spec.runtime.golden import add_arrays, load_arrays
from tests.goldens.add_float64 import HERE, same_but_added


def meta_of(path: Path) -> dict:
    arrays = load_arrays(path)
    return json.loads(str(arrays["meta"])) if "meta" in arrays else {}


def add(path: Path) -> str:
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from iron_spec.library.transformers_keys import record
    from iron_spec.spec.loader import load_spec
    from iron_spec.spec.parts import parts

    old = load_arrays(path)
    meta = json.loads(str(old["meta"])) if "meta" in old else {}
    model = getattr(transformers, meta.get("model") or "", None)
    model_type = meta.get("model_type")
    if model is None or model_type not in CONFIG_MAPPING:
        return f"left as it was: no transformers class or model type ({meta.get('model')!r}, {model_type!r})"
    config_class = CONFIG_MAPPING[model_type]
    # A part of a bigger checkpoint (Gemma3ForConditionalGeneration's text model): the keys
    # are the part's config class's (its text_config), as recorded_from records them.
    spec_file = HERE.parent.parent / "specs" / f"{meta.get('spec') or path.parent.name}.yaml"
    for part in parts(load_spec(spec_file)) if spec_file.exists() else []:
        if part.config and meta.get("model") in part.architectures:
            sub = config_class.sub_configs[part.config]
            if sub.__name__ == "AutoConfig":  # the text model's class by its model type
                sub = CONFIG_MAPPING[part.model_type] if part.model_type in CONFIG_MAPPING \
                    else type(getattr(config_class(), part.config))
            config_class = sub
    now = record(config_class, model)
    if meta.get("config_keys") == now:
        return "unchanged"
    add_arrays(path, {}, {"config_keys": now})
    bad = same_but_added(old, load_arrays(path), set())
    if bad:
        raise SystemExit(f"{path}: arrays changed: {bad}")
    return "recorded"




def gather(paths: list[Path]) -> dict:
    """keys.json's content from the goldens at ``paths``."""
    from iron_spec.library.transformers_keys import CONFIG_SHARED, SHARED

    entries: dict[str, dict] = {}
    shared: dict[str, set] = {}
    kwargs_all: list[set] = []
    versions = set()
    for path in paths:
        meta = meta_of(path)
        rec = meta.get("config_keys")
        if not rec:
            continue
        mt = rec["model_type"]  # the config class's: a part's (gemma3_text), not the whole file's
        versions.add(rec["transformers"])
        own = rec["modeling"]
        for module, read in rec["shared"].items():
            for k in read:
                shared.setdefault(k, set()).add(module)
        kwargs_all.append(set(rec["kwargs"]))
        entry = {"class": rec["class"], "fields": rec["fields"], "aliases": rec["aliases"],
                 "kwargs": rec["kwargs"]}
        spec = meta.get("spec") or path.parent.name
        modeling = {k: v for k, v in own.items() if v}
        if mt in entries:
            held = {k: entries[mt][k] for k in entry}
            if held != entry:
                raise SystemExit(f"{path}: transformers' keys for model type {mt} differ from "
                                 f"another golden's ({entries[mt]['specs']}): re-record both")
        else:
            entries[mt] = {**entry, "models": [], "modeling": {}, "specs": []}
        e = entries[mt]
        e["specs"] += [spec] if spec not in e["specs"] else []
        e["models"] += [rec["model"]] if rec["model"] not in e["models"] else []
        for k, v in modeling.items():  # two classes of one model type (DPR's): both read
            e["modeling"][k] = sorted(set(e["modeling"].get(k, [])) | set(v))
    if len(versions) > 1:
        raise SystemExit(f"goldens record keys of transformers {sorted(versions)}: re-record "
                         "them with one version")
    common = set.intersection(*kwargs_all) if kwargs_all else set()
    for e in entries.values():
        e["kwargs"] = sorted(set(e["kwargs"]) - common)
        e["specs"], e["models"] = sorted(e["specs"]), sorted(e["models"])
        e["modeling"] = dict(sorted(e["modeling"].items()))
    return {"transformers": next(iter(versions), None),
            "about": "config.json keys transformers reads, by model type: written by "
                     "python -m tests.goldens.keys from the goldens' meta (config_keys); "
                     "read by iron_spec.keys",
            "shared": {"kwargs": sorted(common),
                       "modeling": {k: sorted(v) for k, v in sorted(shared.items())},
                       "modules": sorted(SHARED), "config_modules": sorted(CONFIG_SHARED)},
            "model_types": dict(sorted(entries.items()))}


def write(paths: list[Path], store: Path = STORE) -> None:
    data = gather(paths)
    store.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    print(f"{store}: {len(data['model_types'])} model types, transformers {data['transformers']}")


def main(argv: list[str]) -> None:
    paths = sorted(HERE.glob("*/*.npz"))
    if "--gather" not in argv:
        for path in paths:
            print(f"{path.relative_to(HERE)}: {add(path)}", flush=True)
    write(paths)


if __name__ == "__main__":
    main(sys.argv[1:])
