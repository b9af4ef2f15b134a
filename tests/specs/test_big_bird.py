"""The BigBird toy (attention_type original_full) against transformers' own BigBirdModel (a
committed golden): full attention, word embeddings rescaled by sqrt(hidden_size), bias-free
projections and the pooler renamed onto pooler.dense; the rescale dropped fails against the
golden; block_sparse is refused naming its key."""

from __future__ import annotations

import numpy as np
import pytest

from iron_spec.cli.check import ENCODER_ATOL
from iron_spec.spec.encoder import load_encoder
from iron_spec.spec.errors import SpecError
from tests.conftest import SPECS, encoder_toy, hidden_errors, toy_config
from tests.specs.test_encoder_goldens import _fails_edited


def test_big_bird_toy_matches_the_golden():
    loaded, golden = encoder_toy("big_bird")
    o = loaded.model.config
    assert (o.embedding_scale, o.layers[0].bias, o.pooling.kind) == (32 ** 0.5, False, "pooler")
    assert max(hidden_errors(loaded.model, golden)) <= ENCODER_ATOL
    version = loaded.model.version()
    assert max(float(np.abs(version(ids, types) - want).max())
               for (ids, types), want in zip(golden.probes, golden.pooled)) <= ENCODER_ATOL


def test_big_bird_without_the_rescale_fails_against_the_golden(tmp_path):
    _fails_edited(tmp_path, "big_bird",
                  'scale: "hidden_size ** 0.5 if rescale_embeddings else 1.0"', "scale: 1.0")


def test_block_sparse_attention_is_refused_naming_its_key(tmp_path):
    with pytest.raises(SpecError, match="attention_type") as e:
        load_encoder(SPECS / "big_bird.yaml", random_weights=0,
                     checkpoint=toy_config(tmp_path, "big_bird", attention_type="block_sparse"))
    assert "block_sparse" in str(e.value)
