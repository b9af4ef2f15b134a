"""The position behaviours flipped one at a time against their specs' goldens (causal and
encoder): each flip keeps the model's tensors, so the golden (transformers' outputs on the
same weights) still judges it, and it must miss by far more than the gate."""

from __future__ import annotations

import pytest

from iron_spec.spec.build import load_model
from iron_spec.cli.check import golden_path
from iron_spec.runtime.golden import Golden, kl_stats, teacher_forced
from iron_spec.runtime.session import Session
from tests.conftest import SPECS
from tests.specs.divergences import cases
from tests.specs.test_encoder_goldens import _fails_edited


def flipped_kl(tmp_path, name: str, old: str, new: str) -> float:
    """The mean KL over the golden's steps of spec ``name`` with ``old`` replaced by
    ``new`` (its golden found beside the copy, as beside the shipped spec)."""
    text = (SPECS / f"{name}.yaml").read_text()
    assert old in text
    (tmp_path / "specs").mkdir()
    path = tmp_path / "specs" / f"{name}.yaml"
    path.write_text(text.replace(old, new, 1))
    goldens = tmp_path / "tests" / "goldens"
    goldens.mkdir(parents=True)
    (goldens / name).symlink_to(SPECS.parent / "tests" / "goldens" / name)
    loaded = load_model(path, random_weights=0, toy=True)
    golden = Golden.read(golden_path(loaded), loaded.fingerprint())
    return kl_stats(teacher_forced(golden, Session(loaded.lm).logits))["mean"]


@pytest.mark.parametrize("name,old,new", [
    # XGLM's rates are 10000 ** (-j / (h - 1)); CTRL's 10000 ** (-j / h).
    ("xglm", 'denominator: "hidden_size // 2 - 1"', "denominator: null"),
    ("ctrl", "sinusoidal: {}", 'sinusoidal: {denominator: "hidden_size // 2 - 1"}'),
    # The toy's pad_token_id 5 is the row of position 3, which XGLM zeroes.
    ("xglm", "zero_row: pad_token_id", "zero_row: null"),
    # Read from row 0 rather than XGLM's offset 2.
    ("xglm", "position_offset: 2", "position_offset: 0"),
    # MptModel builds its alibi tensor with alibi_bias_max's default 8 whatever the config.
    ("mpt", "    alibi: 8\n", "    alibi: 16\n"),
    ("mpt", "    alibi: 8\n", ""),
    ("bloom", "    alibi: 8\n", ""),
    # Bloom adds ALiBi to the scaled scores; Falcon's is scaled with them.
    ("bloom", "    alibi: 8\n", "    alibi: 8\n    alibi_scaled: true\n"),
], ids=["xglm-denominator", "ctrl-denominator", "xglm-zero-row", "xglm-offset", "mpt-max-bias",
        "mpt-no-alibi", "bloom-no-alibi", "bloom-alibi-scaled"])
def test_a_flipped_position_option_misses_the_golden(tmp_path, name, old, new):
    assert flipped_kl(tmp_path, name, old, new) > 1e-4


@pytest.mark.parametrize("old,new", [
    # MPNetEncoder.compute_position_bias passes 32 buckets, not the table's 40 rows.
    ("buckets: 32,", "buckets: 40,"),
    # Keys 16 or more apart share log-spaced buckets up to 128 (the toy's calls hold 64).
    ("max_distance: 128}", "max_distance: 32}"),
], ids=["mpnet-buckets", "mpnet-max-distance"])
def test_a_flipped_relative_bias_misses_the_encoder_golden(tmp_path, old, new):
    _fails_edited(tmp_path, "mpnet", old, new)


def test_falcons_alibi_unscaled_misses_its_golden(tmp_path):
    # FalconModel divides its alibi by sqrt(head_dim) with the scores (alibi_scaled); its
    # case (tests/specs/divergences) judged with the bias added unscaled, as Bloom's.
    name = "falcon-alibi-bfloat16"
    text = (SPECS / "falcon.yaml").read_text()
    assert "alibi_scaled: true, " in text
    path = tmp_path / "falcon.yaml"
    path.write_text(text.replace("alibi_scaled: true, ", ""))
    loaded = load_model(path, checkpoint=cases.materialize(name, tmp_path / name),
                        prefill_chunk=16)
    golden = Golden.read(cases.golden_file(name), loaded.fingerprint())
    assert kl_stats(teacher_forced(golden, Session(loaded.lm).logits))["mean"] > 1e-5
