"""docs/families.md agrees with specs/ and with itself.

The survey's rows are a reading of transformers' modeling files; what this test can hold
them to is the part a machine can check: every spec's architectures are rows of the survey,
every row marked served names a spec in specs/ that lists one of the row's architectures,
every missing behaviour a row names is explained in the behaviour table, and the summary's
counts are the rows' counts.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "families.md"


def _section(text: str, title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"docs/families.md has no section {title!r}"
    return m.group(1)


def _table(section: str) -> list[list[str]]:
    lines = [l for l in section.splitlines() if l.startswith("|")]
    return [[c.strip() for c in l.strip("|").split("|")] for l in lines[2:]]


def _ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _rows() -> list[dict]:
    text = DOC.read_text(encoding="utf-8")
    rows = []
    for title in ("Causal decoders", "Text encoders", "Mixtures of experts"):
        for cells in _table(_section(text, title)):
            mt, archs, served, missing = cells[:4]
            rows.append({"model_type": mt, "archs": _ticked(archs), "served": _ticked(served),
                         "missing": _ticked(missing)})
    return rows


def _spec_architectures() -> dict[str, list[str]]:
    out = {}
    for path in sorted((ROOT / "specs").glob("*.yaml")):
        out[path.stem] = list(yaml.safe_load(path.read_text(encoding="utf-8")).get("architectures") or [])
    return out


def test_every_spec_architecture_is_a_row():
    rows = _rows()
    known = {a for r in rows for a in r["archs"]}
    missing = {f"{s}: {a}" for s, archs in _spec_architectures().items() for a in archs
               if a not in known}
    assert not missing, f"architectures served by specs/ but absent from docs/families.md: {sorted(missing)}"


def test_served_rows_name_a_spec_that_lists_them():
    specs = _spec_architectures()
    wrong = []
    for r in _rows():
        for s in r["served"]:
            if s not in specs:
                wrong.append(f"{r['model_type']}: no specs/{s}.yaml")
            elif not set(specs[s]) & set(r["archs"]):
                wrong.append(f"{r['model_type']}: specs/{s}.yaml lists none of {r['archs']}")
    assert not wrong, wrong


def test_every_missing_behaviour_is_explained():
    text = DOC.read_text(encoding="utf-8")
    explained = {_ticked(c[0])[0] for c in _table(_section(text, "Missing behaviours"))}
    used = {t for r in _rows() for t in r["missing"]}
    assert used == explained, (sorted(used - explained), sorted(explained - used))


def test_summary_counts_are_the_rows():
    text = DOC.read_text(encoding="utf-8")
    summary = _section(text, "Summary")
    rows = _rows()
    served = [r for r in rows if r["served"]]
    unserved = [r for r in rows if not r["served"]]
    ready = [r for r in unserved if not r["missing"]]

    def figure(label: str) -> int:
        m = re.search(rf"{label}\D*\*\*(\d+)\*\*", summary)
        assert m, f"the summary has no figure for {label!r}"
        return int(m.group(1))

    assert figure("surveyed") == len(rows)
    assert figure("served by a spec") == len(served)
    assert figure("not served") == len(unserved)
    assert figure("needing no behaviour") == len(ready)
    assert figure("needing at least one") == len(unserved) - len(ready)
    by = {_ticked(c[0])[0]: int(c[1]) for c in _table(summary)}
    assert by == dict(Counter(t for r in unserved for t in r["missing"]))


def test_every_served_row_is_picked_by_its_spec():
    # A config.json of the row's model type naming the row's architectures (the names its
    # checkpoints carry: ExaoneForCausalLM, InternLM3ForCausalLM) loads with no spec named:
    # iron-spec picks one the row says serves it (registry.for_architectures, by name, else
    # by model type).
    from iron_spec.spec.registry import for_architectures

    wrong = []
    for r in _rows():
        if not r["served"]:
            continue
        for arch in r["archs"]:
            try:
                picked = for_architectures([arch], r["model_type"],
                                           config={"model_type": r["model_type"]}).stem
            except ValueError as e:
                picked = str(e)
            if picked not in r["served"]:
                wrong.append(f"{r['model_type']} {arch}: {picked}, not one of {r['served']}")
    assert not wrong, wrong
