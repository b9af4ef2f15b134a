"""The bad-input corpus counted by class (issue 13 asks for at least 150, each asserting its
refusal): the tables the tests of tests/bad/ run, and the bad specs of tests/specs/bad/."""

from __future__ import annotations

from tests.bad import (test_api_calls, test_cli_flags, test_config_json, test_lint_folder,
                       test_safetensors, test_specs_folder, test_tokenizer_files)
from tests.conftest import ROOT

# Cases a test holds inline (beside its table), counted by hand from the test.
INLINE = {"config.json": 0, "safetensors": 6, "tokenizer and chat template": 4,
          "CLI flags and arguments": 4, "API calls": 3, "specs": 0,
          # issue 30: test_threads (9), test_golden_store (14), test_inputs_bounded (30)
          "threads and the golden store": 9 + 14, "inputs bounded": 21 + 8 + 1}


def counts() -> dict[str, int]:
    """Bad inputs by class."""
    c, s, t, f, a = (test_config_json, test_safetensors, test_tokenizer_files,
                     test_cli_flags, test_api_calls)
    table = {
        "specs": len(list((ROOT / "tests" / "specs" / "bad").glob("*.yaml")))
        + len(test_lint_folder.BROKEN) + 2,  # + a folder named x.yaml, 100k nodes
        "config.json": len(c.CASES) + len(c.FILES) + len(c.ENCODER) + 8,  # + 6 windows, 2 budgets
        "safetensors": len(s.HEADERS) + len(s.RAW) + 5,  # + 5 integer dtypes
        "tokenizer and chat template": len(t.TOKENIZER_CONFIG) + len(t.FILE_CASES)
        + len(t.TEMPLATES),
        "generation_config.json": len(t.GENERATION_IDS) + len(t.GENERATION_SETTINGS),
        "CLI flags and arguments": len(f.FLAGS) + len(f.SPECS),
        "API calls": len(a.HISTORIES) + len(a.DRAWS) + len(a.DECODE) + len(a.SAMPLERS) + len(a.LIBRARY) + 4
        + 5,  # + 4 max_tokens, 5 prompt-chunk calls
        # each broken file listed, and named itself (5), and the lookups past them (1)
        "specs folder": len(test_specs_folder.BROKEN) + 5 + 1,
        "threads and the golden store": 0, "inputs bounded": 0,
    }
    return {k: v + INLINE.get(k, 0) for k, v in table.items()}


def test_the_corpus_holds_at_least_150_bad_inputs_beyond_the_specs():
    table = counts()
    print("\n".join(f"{k:30} {v}" for k, v in table.items()), f"\ntotal {sum(table.values())}")
    assert sum(v for k, v in table.items() if k != "specs") >= 150
    assert all(v >= 10 for v in table.values()), table
