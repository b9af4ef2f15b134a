"""GGUF files of every family llama.cpp converts that a spec serves (issue 29, item 5): each
case's checkpoint (``tests/specs/gguf/``, drawn by name) written as llama.cpp's converter
lays it out (``tests/specs/gguf/convert.py``: its tensor names, permutations, fused and
stacked tensors, shifted norms and metadata), run from the GGUF file alone, judged against
transformers' own logits on the checkpoint (the committed golden): the float32 KL gate, no
top-1 mismatch, and transformers' greedy tokens."""

from __future__ import annotations

import pytest

from iron_spec.build import load_model
from iron_spec.registry import for_checkpoint
from iron_spec.runtime.golden import Golden
from tests.specs.gguf import cases, convert
from tests.specs.test_goldens import judge


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Each case's checkpoint directory and its GGUF file, written once."""
    root, out = tmp_path_factory.mktemp("gguf"), {}

    def get(name: str):
        if name not in out:
            directory = cases.materialize(name, root / name)
            c = cases.case(name)
            path = convert.write(root / f"{name}.gguf", cases.family(name), c["config"],
                                 cases.draw(c["tensors"]))
            out[name] = directory, path
        return out[name]
    return get


@pytest.mark.parametrize("name", cases.names())
def test_a_gguf_gives_transformers_greedy_tokens(name: str, written):
    directory, path = written(name)
    # The golden is of the checkpoint the file was converted from.
    theirs = load_model(cases.spec_file(name), checkpoint=directory, prefill_chunk=16)
    golden = Golden.read(cases.golden_file(name), theirs.fingerprint())
    ours = load_model(cases.spec_file(name), checkpoint=path, prefill_chunk=16)
    judge(ours, golden)
    # The file alone picks its spec, by general.architecture.
    assert for_checkpoint(path) == cases.spec_file(name)
