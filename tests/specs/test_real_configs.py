"""The corpus: config.json files of published checkpoints (tests/corpus/manifest.json names
each checkpoint and the public copy it was taken from), every key kept and only the sizes
shrunk (tests/corpus/shrink.py), each loaded as a user loads a checkpoint: no spec named (the
one its architectures pick), no flag, weights drawn at seed 0; judged against transformers'
own model built from that very file (its golden, tests/goldens/<spec>/<name>-seed0.npz,
recorded by tests/corpus/record.py): a causal model by its spec's float32 KL gate with no
top-1 mismatch and our float64 reference by the float64 gate, an encoder by its hidden
states and embeddings within ENCODER_ATOL. Reading them needs neither torch nor transformers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from iron_spec.spec.build import load_model
from iron_spec.cli.check import golden_path
from iron_spec.spec.encoder import load_encoder
from iron_spec.spec.loader import load_spec
from iron_spec.spec.registry import for_checkpoint
from iron_spec.runtime.encoder_golden import EncoderGolden
from iron_spec.runtime.golden import Golden
from tests.conftest import ROOT
from tests.corpus.record import CONTEXT, PREFILL_CHUNK, STEPS, entries, toy_dir
from tests.corpus.shrink import shrink
from tests.specs.test_encoder_goldens import judge_encoder
from tests.specs.test_goldens import judge

CORPUS = ROOT / "tests" / "corpus"
ENTRIES = entries()
SERVED = [e for e in ENTRIES if not e.get("needs")]


@pytest.mark.parametrize("entry", SERVED, ids=lambda e: e["name"])
def test_a_real_config_loads_with_no_flag_and_matches_transformers(entry):
    d = toy_dir(entry["name"])
    spec = for_checkpoint(d)  # as `iron-spec run --checkpoint DIR` picks it
    if load_spec(spec).get("model") == "encoder":
        loaded = load_encoder(spec, checkpoint=d, random_weights=0)
        judge_encoder(loaded, EncoderGolden.read(golden_path(loaded), loaded.fingerprint()))
        return
    loaded = load_model(spec, checkpoint=d, random_weights=0, prefill_chunk=PREFILL_CHUNK,
                        max_seq_len=CONTEXT)
    golden = Golden.read(golden_path(loaded), loaded.fingerprint())
    assert golden.steps == STEPS
    judge(loaded, golden)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e["name"])
def test_each_toy_is_its_original_with_the_sizes_shrunk(entry):
    original = json.loads((CORPUS / "originals" / f"{entry['name']}.json").read_text())
    toy = json.loads((toy_dir(entry["name"]) / "config.json").read_text())
    assert toy == shrink(original)
    assert list(toy) == list(original)  # every key kept, in the file's order


def test_every_entry_names_its_checkpoint_and_source():
    names = [e["name"] for e in ENTRIES]
    assert len(names) == len(set(names))
    for e in ENTRIES:
        src = e["source"]
        assert "/" in e["checkpoint"], e
        assert src.get("path") and (src.get("repo") and len(src.get("commit", "")) == 40
                                    or src.get("package")), e
    originals = {p.stem for p in (CORPUS / "originals").glob("*.json")}
    assert originals == set(names)


def test_the_corpus_holds_sixty_configs_decoders_and_encoders():
    kinds = {load_spec(for_checkpoint(toy_dir(e["name"]))).get("model") for e in SERVED}
    assert len(ENTRIES) >= 60 and kinds == {"causal", "encoder"}
    said = re.search(r"tests/corpus/ holds (\d+) config.json files", (ROOT / "docs" / "cli.md").read_text())
    assert said and int(said.group(1)) == len(ENTRIES), "docs/cli.md's count of the corpus"


def test_the_shrink_keeps_what_is_no_size():
    original = {"architectures": ["X"], "model_type": "llama", "hidden_size": 4096,
                "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
                "intermediate_size": 14336, "vocab_size": 128256, "eos_token_id": [128001, 128009],
                "rope_theta": 500000.0, "max_position_embeddings": 131072,
                "layer_types": ["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 26}
    toy = shrink(original)
    assert (toy["hidden_size"], toy["num_attention_heads"], toy["num_key_value_heads"]) == (64, 4, 2)
    assert toy["vocab_size"] == 128010  # one past the largest token id: ids are values, kept
    assert toy["num_hidden_layers"] == 6 and toy["layer_types"][-1] == "full_attention"
    assert toy["intermediate_size"] == 224
    assert {k: toy[k] for k in ("rope_theta", "max_position_embeddings", "eos_token_id")} == \
        {k: original[k] for k in ("rope_theta", "max_position_embeddings", "eos_token_id")}
