"""The corpus of real config.json files: shrink each, record its golden from transformers,
and print the table (needs the golden extra, torch and transformers; never run by the tests):

    python -m tests.corpus.record [NAME ...]        # default: every entry of manifest.json
    python -m tests.corpus.record --table           # the table from the committed goldens alone

Each entry of tests/corpus/manifest.json names a published checkpoint and where a public
copy of its config.json was found (``source``: repository, path, commit);
``originals/<name>.json`` is that copy, every key as published. The toy is
``configs/<name>/config.json``: the original with its sizes shrunk (``shrink.py``, the rule
in its docstring) and nothing else changed. Its spec is the one ``iron-spec`` picks from the
config's ``architectures`` (``registry.for_checkpoint``), as a user's load with no spec
named does. Its golden is what ``iron-spec check --checkpoint configs/<name> --random-weights 0
--record-golden`` records (in this one process, for speed): weights drawn at seed 0 under
the checkpoint's own tensor names, saved with the config and loaded by transformers' own
model (its ``AutoModelForCausalLM``, or for an encoder the class config.json names), so
transformers builds the toy from that exact file; ``STEPS`` steps after a prompt of a
``PREFILL_CHUNK``-id chunk and 8. It lands in ``tests/goldens/<spec>/<name>-seed0.npz``,
where check and tests/specs/test_real_configs.py find it. Then iron_spec/keys.json is
gathered again (tests/goldens/keys.py), and each toy is loaded with no flag and judged as
the test judges it, for the table.

An entry with ``needs`` (what another piece of work must add first, in words) is shrunk
but not recorded, and said so; none has one today (the encoders published as
``*ForMaskedLM``, ``*ForSequenceClassification`` and ``*ForQuestionAnswering`` load since
the task-head checkpoints landed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.corpus.shrink import shrink

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MANIFEST = HERE / "manifest.json"
STEPS, PREFILL_CHUNK, CONTEXT = 16, 16, 128


def entries() -> list[dict]:
    return json.loads(MANIFEST.read_text(encoding="utf-8"))["entries"]


def toy_dir(name: str) -> Path:
    return HERE / "configs" / name


def write_toy(entry: dict) -> Path:
    """``configs/<name>/config.json``: the original shrunk (``shrink.shrink``)."""
    original = json.loads((HERE / "originals" / f"{entry['name']}.json").read_text(encoding="utf-8"))
    d = toy_dir(entry["name"])
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(shrink(original), indent=2) + "\n", encoding="utf-8")
    return d


def load(entry: dict, allow_unread_config: bool = False):
    """The toy of ``entry`` as a user loads it: the spec its config.json picks, weights drawn
    at seed 0; a causal model in prompt chunks of ``PREFILL_CHUNK`` within ``CONTEXT``."""
    from iron_spec.spec.build import load_model
    from iron_spec.spec.encoder import load_encoder
    from iron_spec.spec.loader import load_spec
    from iron_spec.spec.registry import for_checkpoint

    d = toy_dir(entry["name"])
    spec = for_checkpoint(d)
    if load_spec(spec).get("model") == "encoder":
        return load_encoder(spec, checkpoint=d, random_weights=0,
                            allow_unread_config=allow_unread_config)
    return load_model(spec, checkpoint=d, random_weights=0, prefill_chunk=PREFILL_CHUNK,
                      max_seq_len=CONTEXT, allow_unread_config=allow_unread_config)


def record(entry: dict) -> str:
    """Record ``entry``'s golden from transformers into the checkout's goldens, as
    ``iron-spec check --record-golden`` does (its float64 rows and floor); its path."""
    from iron_spec.cli.check import _record, check_prompt, golden_path

    # Recorded before keys.json knows the model type (the first golden of it is what
    # records it): loaded with the flag here; the table and the tests load with none.
    loaded = load(entry, allow_unread_config=True)
    path = golden_path(loaded)
    if loaded.expanded.spec.get("model") != "encoder":
        _record(loaded, path, lambda g: g.record(loaded, check_prompt(loaded), STEPS), True)
    else:
        _record(loaded, path, lambda g: g.record_encoder(loaded), True)
    return str(path.relative_to(ROOT))


def judged(entry: dict) -> tuple[str, str]:
    """``entry`` loaded with no flag and judged by its golden as tests/specs/test_real_configs.py
    judges it: its spec's name and the table's numbers (KL mean | max | top-1 mismatches,
    or an encoder's hidden-state error), or FAILED and why."""
    from iron_spec.cli.check import golden_path
    from iron_spec.runtime.encoder_golden import EncoderGolden
    from iron_spec.runtime.golden import Golden
    from tests.specs.test_encoder_goldens import judge_encoder
    from tests.specs.test_goldens import judge

    try:
        loaded = load(entry)
        spec = loaded.expanded.spec.get("name")
        if loaded.expanded.spec.get("model") != "encoder":
            stats = judge(loaded, Golden.read(golden_path(loaded), loaded.fingerprint()))
            return spec, f"{stats['mean']:.2e} | {stats['max']:.2e} | {stats['top1_mismatches']}"
        error = judge_encoder(loaded, EncoderGolden.read(golden_path(loaded), loaded.fingerprint()))
        return spec, f"hidden states max err {error:.1e} | | —"
    except Exception as e:  # the table says what failed, for every entry
        return "?", f"FAILED: {type(e).__name__}: {' '.join(str(e).split())[:200]}"


def main(argv: list[str]) -> None:
    from iron_spec.spec import keys
    from tests.goldens.keys import HERE as GOLDENS, write

    table_only = "--table" in argv
    names = [a for a in argv if not a.startswith("--")]
    chosen = [e for e in entries() if not names or e["name"] in names]
    if not table_only:
        for entry in chosen:
            write_toy(entry)
            if not entry.get("needs"):
                print(f"{entry['name']}: recorded {record(entry)}", flush=True)
        write(sorted(GOLDENS.glob("*/*.npz")))  # keys.json from every golden, these among them
        keys._load.cache_clear()  # read again: the table's loads account by the new file
    rows = ["| checkpoint | source | spec | KL mean | KL max | top-1 mismatches |",
            "|---|---|---|---|---|---|"]
    failed = 0
    for entry in chosen:
        src = entry["source"]
        where = f"{src.get('repo') or src.get('package')} `{src['path']}`" + \
            (f" @{src['commit'][:10]}" if src.get("commit") else "")
        if entry.get("needs"):
            rows.append(f"| {entry['checkpoint']} | {where} | — | needs {entry['needs']} | | |")
            continue
        spec, numbers = judged(entry)
        failed += numbers.startswith("FAILED")
        cells = numbers.split(" | ") if " | " in numbers else [numbers, "", ""]
        rows.append(f"| {entry['checkpoint']} | {where} | {spec} | {' | '.join(cells)} |")
        print(rows[-1], flush=True)
    print("\n".join(rows))
    if failed:
        raise SystemExit(f"{failed} entries failed")


if __name__ == "__main__":
    main(sys.argv[1:])
