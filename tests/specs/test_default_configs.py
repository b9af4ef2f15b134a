"""Every causal spec with a toy golden accounts for the whole config.json transformers writes
for its config classes at their defaults (a key such a file always holds, as Cohere2Config's
head_dim, refused would refuse every checkpoint saved by transformers).

The files are recorded by tests/specs/configs/defaults/record.py; where transformers is
installed they are checked against what it writes now."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from iron_spec.spec.accounting import split
from iron_spec.spec.loader import load_spec
from tests.conftest import ROOT, SPECS

DEFAULTS = Path(__file__).with_name("configs") / "defaults"
RECORDED_SPECS = [s for s in (load_spec(p) for p in sorted(SPECS.glob("*.yaml")))
                  if s.get("model") == "causal"
                  and (ROOT / "tests" / "goldens" / s.get("name") / "toy-seed0.npz").exists()]
IDS = [s.get("name") for s in RECORDED_SPECS]


def _recorded(spec) -> dict:
    path = DEFAULTS / f"{spec.get('name')}.json"
    assert path.exists(), (f"{path} is missing: run python tests/specs/configs/defaults/"
                           f"record.py {spec.get('name')} where transformers is installed")
    return json.loads(path.read_text())


@pytest.mark.parametrize("spec", RECORDED_SPECS, ids=IDS)
def test_a_default_config_json_has_no_unread_key(spec):
    recorded = _recorded(spec)
    assert sorted(recorded) == sorted(spec.get("architectures"))
    for architecture, config_json in recorded.items():
        # Every key transformers reads of it, the spec reads (split's refused keys: those
        # it would refuse); under the aliases transformers reads them by (ExaoneConfig writes
        # num_hidden_layers where EXAONE's files say num_layers).
        assert split(spec, config_json)[0] == [], architecture


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="comparing with transformers needs it (the golden extra)")
@pytest.mark.parametrize("spec", RECORDED_SPECS, ids=IDS)
def test_the_recorded_defaults_are_what_transformers_writes(spec):
    from tests.specs.configs.defaults.record import recorded

    assert _recorded(spec) == recorded(spec)
