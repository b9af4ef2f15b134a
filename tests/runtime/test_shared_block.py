"""A transformer block several layers share (``runtime.blocks.shared``, Zamba2's): each weight
set held once and reached under every use's names, each use with its own KV cache, the uses
counted in layer order over the sets in turn; untied, each use its own weights (transformers
ties nothing where ``tie_word_embeddings`` is false). The numbers are judged by the toy's
golden (tests/specs/test_goldens.py: transformers' Zamba2ForCausalLM on the same weights).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from iron_spec.runtime.causal import CausalLM, shared_use
from iron_spec.runtime.checkpoint import place
from iron_spec.spec.build import load_model
from tests.conftest import SPECS


@pytest.fixture(scope="module")
def loaded():
    return load_model(SPECS / "zamba2.yaml", random_weights=0, toy=True, prefill_chunk=32)


def _params(block) -> dict[str, object]:
    return {name[len(block.path) + 1:]: p for name, p in block.named_params()}


def test_the_uses_read_their_set_in_turn_and_hold_it_once(loaded):
    layers = loaded.lm.model.layers  # toy: hybrid at 1, 3, 5; two sets: uses 0, 2 and 1
    o = loaded.lm.config
    assert [shared_use(o, i) for i in (1, 3, 5)] == [(0, (0, 2)), (1, (1,)), (2, (0, 2))]
    first, second, third = (layers[i].shared_block for i in (1, 3, 5))
    a, c = _params(first), _params(third)
    assert a.keys() == c.keys() and all(a[k] is c[k] for k in a)
    assert not set(map(id, _params(second).values())) & set(map(id, a.values()))
    # Each use its own KV cache.
    caches = [b.self_attn.keys for b in (first, second, third)]
    assert len({id(s) for s in caches}) == 3


def test_a_checkpoint_holds_each_set_under_its_first_use_alone(loaded):
    names = set(loaded.checkpoint_tensors())
    assert "model.layers.1.shared_transformer.self_attn.q_proj.weight" in names
    assert "model.layers.3.shared_transformer.self_attn.q_proj.weight" in names
    assert not any(n.startswith("model.layers.5.shared_transformer.") for n in names)
    # Use 2's adapters are held by set 0's block, under its first use's names.
    assert "model.layers.1.shared_transformer.self_attn.linear_q_adapter_list.2.0.weight" in names
    # The third use's names are tied: a file that holds them too loads, they are not read.
    lm, renames = loaded.lm, loaded.expanded.renames
    shapes = {n: t.shape for n, t in loaded.checkpoint_tensors().items()}
    extra = {n.replace("layers.1.shared", "layers.5.shared"): s for n, s in shapes.items()
             if n.startswith("model.layers.1.shared_transformer.")}
    found = place(lm, {**shapes, **extra}, renames)
    assert found.fits and sorted(found.ignored) == sorted(extra)


def test_untied_each_use_holds_its_own_weights(loaded):
    o = loaded.lm.config
    untied = replace(o, layers=tuple(
        lo if lo.shared_block is None else
        replace(lo, shared_block=replace(lo.shared_block, tied=False)) for lo in o.layers))
    layers = CausalLM(untied).model.layers
    a, c = _params(layers[1].shared_block), _params(layers[5].shared_block)
    assert not set(map(id, a.values())) & set(map(id, c.values()))


def test_the_shared_weights_are_counted_once(loaded):
    lm = loaded.lm
    named = list(lm.named_params())
    held = {id(p): p for _, p in named}
    assert len(held) < len(named)
    block = sum(p.array.size for p in _params(lm.model.layers[1].shared_block).values())
    head = lm.lm_head.weight.array.size  # the toy's head is tied to the embeddings too
    total = sum(p.array.size for p in held.values())
    # Use 2's names reach set 0's params: no copy.
    assert total == sum(p.array.size for _, p in named) - block - head
