"""The divergences from transformers found on peers' faults (issue 11, item 7): each case a
tiny checkpoint of the very config that diverged, judged against transformers' own logits
on it (``tests/specs/divergences/``), as every spec's toy is judged in test_goldens."""

from __future__ import annotations

import pytest

from iron_spec.build import load_model
from runtime.golden import Golden
from tests.specs.divergences import cases
from tests.specs.test_goldens import judge


@pytest.mark.parametrize("name", cases.names())
def test_matches_transformers(name: str, tmp_path):
    c = cases.case(name)
    directory = cases.materialize(name, tmp_path / name)
    loaded = load_model(cases.spec_file(name), checkpoint=directory,
                        prefill_chunk=c.get("prefill_chunk", 16))
    golden = Golden.read(cases.golden_file(name), loaded.fingerprint())
    judge(loaded, golden)
