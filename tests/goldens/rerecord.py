"""Re-record every golden with the transformers installed here and say what changed (needs
the golden extra; never run by the tests):

    python -m tests.goldens.rerecord [--write] [PATH ...]   # default: every golden here

Each golden's inputs are rebuilt as they were recorded, and must give its fingerprint:
``<spec>/toy-seed<N>.npz`` the spec's toy on weights drawn at seed N; ``<spec>/<name>-seed0.npz``
a corpus entry (tests/corpus) or a divergence case (tests/specs/divergences);
``<spec>/<checkpoint>.npz`` the real checkpoint of that name under
``~/.cache/iron-spec/checkpoints``. Inputs this script cannot rebuild (a GGUF-converted
golden's) are left as they are and listed.

transformers then records the golden again, on the old golden's own prompt and steps (a
causal model) or probes (an encoder), with its float64 rows and floor, as ``check
--record-golden`` does. Reported for each: the tokens it now draws (a different greedy
token is a changed model), the largest change of a recorded log-probability or hidden
state, and what changed in transformers' config class defaults (``config_defaults``) and in
the keys it reads (``config_keys``: a key a new release reads shows here, before any user
loads a checkpoint holding it). With ``--write`` the new goldens replace the old ones and
iron_spec/spec/keys.json is gathered again (tests/goldens/keys.py); without it nothing is
written. Then run the tests: a spec the new transformers disagrees with fails its golden, and
a key it now reads that a spec neither maps nor ignores fails tests/specs/test_real_configs.py
and tests/specs/test_default_configs.py.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from iron_spec.runtime.encoder_golden import EncoderGolden
from iron_spec.runtime.golden import Golden
from iron_spec.spec.loader import load_spec
from tests.goldens.add_float64 import CHECKPOINTS, HERE, ROOT
from tests.goldens.keys import meta_of, write

OTHER = [ROOT / "tests" / "specs" / "configs" / "llama3-rope-parameters" / "seed0.npz"]


def loaded_for(path: Path, tmp: Path):
    """The inputs ``path`` was recorded on, loaded as its spec loads them; None where this
    script cannot rebuild them."""
    from iron_spec.spec.build import load_model
    from iron_spec.spec.encoder import load_encoder
    from tests.corpus import record as corpus
    from tests.specs.divergences import cases

    if path in OTHER:  # tests/specs/test_config_spellings.py's own
        return load_model(ROOT / "specs" / "llama3.yaml", checkpoint=path.parent,
                          random_weights=0, prefill_chunk=16)
    spec_file = ROOT / "specs" / f"{path.parent.name}.yaml"
    encoder = load_spec(spec_file).get("model") == "encoder"
    load = load_encoder if encoder else load_model
    stem = path.stem
    corpus_names = {e["name"]: e for e in corpus.entries()}
    if stem.startswith("toy-seed"):
        return load(spec_file, random_weights=int(stem[len("toy-seed"):]), toy=True)
    if stem.endswith("-seed0") and stem[:-6] in corpus_names:
        return corpus.load(corpus_names[stem[:-6]])
    if stem.endswith("-seed0") and stem[:-6] in cases.names():
        directory = cases.materialize(stem[:-6], tmp / stem[:-6])
        return load(spec_file, checkpoint=directory)
    if (CHECKPOINTS / stem).is_dir():
        return load(spec_file, checkpoint=CHECKPOINTS / stem) if encoder else \
            load(spec_file, checkpoint=CHECKPOINTS / stem, max_seq_len=2048)
    return None


def _changes(old: dict, new: dict, what: str) -> list[str]:
    out = []
    for k in sorted(set(old) | set(new)):
        if old.get(k) != new.get(k):
            out.append(f"{what} {k}: {old.get(k)!r} -> {new.get(k)!r}")
    return out


def keys_changes(old: dict | None, new: dict) -> list[str]:
    """What transformers now reads of the model type that it did not, and the reverse."""
    if not old:
        return ["config_keys: none recorded before"]
    out = []
    for part in ("fields", "kwargs"):
        a, b = set(old.get(part, [])), set(new.get(part, []))
        out += [f"{part} + {k}" for k in sorted(b - a)] + [f"{part} - {k}" for k in sorted(a - b)]
    out += _changes(old.get("aliases", {}), new.get("aliases", {}), "alias")
    for part in ("modeling",):
        a, b = set(old.get(part, {})), set(new.get(part, {}))
        out += [f"read by the model + {k}" for k in sorted(b - a)] + \
            [f"read by the model - {k}" for k in sorted(a - b)]
    a = {k for v in (old.get("shared") or {}).values() for k in v}
    b = {k for v in (new.get("shared") or {}).values() for k in v}
    out += [f"read by shared code + {k}" for k in sorted(b - a)] + \
        [f"read by shared code - {k}" for k in sorted(a - b)]
    return out


def compare(old, new) -> str:
    """The numbers' change, in words."""
    if isinstance(old, Golden):
        drawn = "tokens the same" if np.array_equal(old.tokens, new.tokens) else \
            f"TOKENS CHANGED at {int(np.argmax(old.tokens != new.tokens))}"
        same = old.top_ids == new.top_ids
        diff = float(np.abs(old.top_logprobs - new.top_logprobs)[same].max()) if same.any() else float("inf")
        return f"{drawn}; top ids {same.mean():.0%} the same, max |log-prob change| {diff:.2e}"
    worst = max(float(np.abs(a - b).max()) for a, b in zip(old.hidden, new.hidden))
    return f"max |hidden-state change| {worst:.2e}"


def rerecord(path: Path, tmp: Path, write_back: bool) -> tuple[str, list[str]]:
    from iron_spec.cli.check import _with_floor

    from iron_spec.library import golden_record as g

    loaded = loaded_for(path, tmp)
    if loaded is None:
        return "left as it was: its inputs are not rebuilt here", []
    fp = loaded.fingerprint()
    encoder = loaded.expanded.spec.get("model") == "encoder"
    old = (EncoderGolden if encoder else Golden).read(path, fp)  # refuses other inputs
    if encoder:
        new = g.record_encoder(loaded)
    else:
        prompt = [int(t) for t in old.tokens[:old.prompt_len]]
        new = g.record(loaded, prompt, old.steps)
    new, _ = _with_floor(loaded, new)
    before, after = meta_of(path), new.meta
    changes = _changes({k: before.get(k) for k in ("transformers", "torch")},
                       {k: after.get(k) for k in ("transformers", "torch")}, "version")
    changes += _changes((before.get("config_defaults") or {}).get("values", {}),
                        (after.get("config_defaults") or {}).get("values", {}), "default")
    changes += keys_changes(before.get("config_keys"), after["config_keys"])
    said = compare(old, new)
    if write_back:
        new.write(path)
    return said, changes


def main(argv: list[str]) -> None:
    write_back = "--write" in argv
    paths = [Path(a).resolve() for a in argv if not a.startswith("--")] or \
        sorted(HERE.glob("*/*.npz")) + OTHER
    changed, left = 0, []
    with tempfile.TemporaryDirectory() as tmp:
        for path in paths:
            try:
                said, changes = rerecord(path, Path(tmp), write_back)
            except Exception as e:  # say it and go on: one golden's inputs are no reason to stop
                said, changes = f"FAILED: {type(e).__name__}: {' '.join(str(e).split())[:300]}", []
            if said.startswith("left"):
                left.append(str(path.relative_to(ROOT)))
            changed += bool(changes) or "CHANGED" in said or said.startswith("FAILED")
            print(f"{path.relative_to(ROOT)}: {said}", flush=True)
            for c in changes:
                print(f"    {c}", flush=True)
    if write_back:
        write(sorted(HERE.glob("*/*.npz")))
    print(f"{len(paths)} goldens, {changed} with changes{'' if write_back else ' (nothing written: --write)'}"
          + (f"; not rebuilt: {', '.join(left)}" if left else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
