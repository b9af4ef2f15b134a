"""The divergences from transformers found on peers' faults (issue 11, item 7): each case a
tiny checkpoint of the very config that diverged, judged against transformers' own logits
on it (``tests/specs/divergences/``), as every spec's toy is judged in test_goldens."""

from __future__ import annotations

import pytest

from iron_spec.spec.build import load_model
from iron_spec.runtime.golden import Golden
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


def test_a_head_equal_to_the_embedding_stays_tied(tmp_path):
    # transformers' tie_weights ties a pair the checkpoint holds both of when they are equal
    # (torch.equal), as a .bin checkpoint stores a tied head.
    import json

    from safetensors.numpy import save_file
    c = cases.case("llama3-tied-distinct-head")
    tensors = cases.draw(c["tensors"])
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()
    (tmp_path / "config.json").write_text(json.dumps(c["config"]))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    loaded = load_model(cases.spec_file("llama3-tied-distinct-head"), checkpoint=tmp_path)
    assert loaded.report.tied == {"lm_head.weight": "model.embed_tokens.weight"}
    assert loaded.lm.lm_head.weight is loaded.lm.model.embed_tokens.weight
