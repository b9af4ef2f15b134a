"""The encoder runtime against transformers' BertModel on the bert spec's toy shape (the
committed golden, tests/goldens/bert/toy-seed0.npz), and its bounds, refusals and loading."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import save_file

from iron_spec.spec.encoder import load_encoder
from iron_spec.runtime.blocks.norms import NormOptions
from iron_spec.runtime.checkpoint import CheckpointError
from iron_spec.runtime.encoder import Encoder, EncoderLayerOptions, EncoderOptions, PoolingOptions
from iron_spec.runtime.checkpoint import fill
from iron_spec.runtime.weights import draw_weights
from tests.conftest import ROOT, SPECS

GOLDEN = ROOT / "tests" / "goldens" / "bert" / "toy-seed0.npz"
PROBES = 3  # the golden's probes: 11 ids, the full 24 with token types 0 then 1, one id
KINDS = {"hidden": "none", "mean": "mean", "pooler": "pooler"}
# float32 against transformers' float32: a few float32 ulps of order-one hidden states.
ATOL = 1e-5


@pytest.fixture(scope="module")
def toy():
    return load_encoder(SPECS / "bert.yaml", random_weights=0, toy=True)


@pytest.fixture(scope="module")
def golden(toy):
    with np.load(GOLDEN, allow_pickle=False) as f:
        g = {k: f[k] for k in f.files}
    assert str(g["fingerprint"]) == toy.fingerprint(), "stale golden: re-run record.py"
    return g


@pytest.mark.parametrize("key", KINDS)
@pytest.mark.parametrize("i", range(PROBES))
def test_toy_matches_transformers(toy, golden, key, i):
    version = toy.model.version(PoolingOptions(KINDS[key], False))
    ids, types = golden[f"ids{i}"], golden[f"types{i}"]
    want = golden[f"{key}{i}"]
    np.testing.assert_allclose(version(ids, types), want, atol=ATOL, rtol=0)
    np.testing.assert_allclose(version.reference(ids, types), want, atol=ATOL, rtol=0)


def test_every_compiled_step_meets_its_operator_reference(toy, golden):
    version = toy.model.version(PoolingOptions("pooler", True), check=True)
    version(golden["ids1"], golden["types1"])
    assert {"encoder.layer.1.attention.self", "pooler"} <= set(version.plan.checked)


def test_rows_past_a_call_are_never_read(toy, golden):
    # A full-length call, then a one-id call on the same compiled version: the short call
    # is transformers' one-id result, untouched by the rows the long call left behind.
    version = toy.model.version(PoolingOptions("mean", False))
    version(golden["ids1"], golden["types1"])
    np.testing.assert_allclose(version(golden["ids2"]), golden["mean2"], atol=ATOL, rtol=0)


def test_spec_pooling_is_mean_then_unit_length(toy, golden):
    got = toy.model.version()(golden["ids0"])
    want = golden["mean0"] / np.linalg.norm(golden["mean0"])
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


def test_calls_of_any_length_run_in_the_one_compiled_arena(toy, golden):
    version = toy.model.version(PoolingOptions("none", False))
    arena = version.plan.arena
    for i in (1, 0, 2):
        out = version(golden[f"ids{i}"])
        assert out.shape == (len(golden[f"ids{i}"]), 32)
        assert np.shares_memory(out, arena) and version.plan.arena is arena


@pytest.mark.parametrize("ids,match", [([], "1..24"), (list(range(25)), "1..24"),
                                       ([0, 128], "outside the vocabulary"),
                                       ([-1], "outside the vocabulary")])
def test_bad_ids_are_refused_before_any_work(toy, ids, match):
    with pytest.raises(ValueError, match=match):
        toy.model.version()(np.array(ids, np.int32))


def test_token_types_past_the_table_are_refused(toy):
    with pytest.raises(ValueError, match="token type 2"):
        toy.model.version()([1, 2], [0, 2])


def _pre_norm_by_hand(w, ids, heads, eps):
    """A one-layer pre-norm encoder written out in float64 numpy, from the definition."""
    def ln(x, p):
        c = x - x.mean(-1, keepdims=True)
        return c / np.sqrt((c * c).mean(-1, keepdims=True) + eps) * w[p + ".weight"] + w[p + ".bias"]

    def lin(x, p):
        return x @ w[p + ".weight"].T + w[p + ".bias"]

    n = len(ids)
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:n]
    L = "encoder.layer.0."
    h = ln(x, L + "attention.output.LayerNorm")
    q, k, v = (lin(h, L + f"attention.self.{t}").reshape(n, heads, -1).transpose(1, 0, 2)
               for t in ("query", "key", "value"))
    s = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    a = (p / p.sum(-1, keepdims=True)) @ v
    x = x + lin(a.transpose(1, 0, 2).reshape(n, -1), L + "attention.output.dense")
    from math import erf
    u = lin(ln(x, L + "output.LayerNorm"), L + "intermediate.dense")
    u = 0.5 * u * (1 + np.vectorize(erf)(u / np.sqrt(2)))
    x = x + lin(u, L + "output.dense")
    return ln(x, "encoder.LayerNorm")


def test_pre_norm_matches_a_hand_computation():
    norm = NormOptions("layer", 1e-5)
    layer = EncoderLayerOptions(heads=2, head_dim=8, intermediate_size=32, norm=norm,
                                placement="pre")
    model = Encoder(EncoderOptions(vocab_size=50, hidden_size=16, layers=(layer,), norm=norm,
                                   positions=10, embedding_norm=False,
                                   pooling=PoolingOptions("none"), max_tokens=10))
    weights = draw_weights(model, 3)
    fill(model, weights)
    assert "encoder.LayerNorm.weight" in weights and "embeddings.LayerNorm.weight" not in weights
    ids = np.array([4, 8, 15, 16, 23, 42])
    want = _pre_norm_by_hand({k: v.astype(np.float64) for k, v in weights.items()}, ids, 2, 1e-5)
    np.testing.assert_allclose(model.version()(ids), want, atol=1e-5, rtol=0)
    np.testing.assert_allclose(model.version().reference(ids), want, atol=1e-12, rtol=0)


def test_loading_is_strict_but_for_declared_unused_tensors(toy, tmp_path):
    tensors = dict(toy.checkpoint_tensors())
    tensors["embeddings.position_ids"] = np.arange(24, dtype=np.int64)[None]
    del tensors["pooler.dense.bias"]
    tensors["cls.predictions.bias"] = np.zeros(128, np.float32)
    (tmp_path / "config.json").write_text(__import__("json").dumps(toy.config_json))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    spec = SPECS / "bert.yaml"
    with pytest.raises(CheckpointError) as e:
        load_encoder(spec, checkpoint=tmp_path)
    message = str(e.value)
    assert "missing 1: pooler.dense.bias" in message
    assert "unexpected 1: cls.predictions.bias" in message
    assert "position_ids" not in message
    tensors["pooler.dense.bias"] = np.zeros(32, np.float32)
    del tensors["cls.predictions.bias"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    loaded = load_encoder(spec, checkpoint=tmp_path)
    assert loaded.report.ignored == ["embeddings.position_ids"]
    assert "pooler.dense.weight" in loaded.report.sources


def _options(**over) -> EncoderOptions:
    norm = NormOptions(kind="layer", eps=1e-12)
    layer = EncoderLayerOptions(heads=2, head_dim=4, intermediate_size=16, norm=norm)
    base = dict(vocab_size=16, hidden_size=8, layers=(layer,), norm=norm, positions=12,
                max_tokens=8)
    return EncoderOptions(**{**base, **over})


def _version(**over):
    model = Encoder(_options(**over))
    fill(model, draw_weights(model, 0))
    return model.version()


def test_positions_count_around_padding_as_roberta():
    # RobertaEmbeddings.create_position_ids_from_input_ids with padding_idx 1, by hand:
    # mask [1 1 0 1 0 1], cumsum [1 2 2 3 3 4], * mask [1 2 0 3 0 4], + 1 = [2 3 1 4 1 5].
    version = _version(position_offset=2, position_padding=1, max_tokens=10)
    assert version.positions(np.array([0, 5, 1, 7, 1, 9])).tolist() == [2, 3, 1, 4, 1, 5]
    assert version.positions(np.array([0, 5, 7])).tolist() == [2, 3, 4]  # no padding: offset
    offset_only = _version(position_offset=2, max_tokens=10)
    assert offset_only.positions(np.array([0, 5, 1, 7])).tolist() == [2, 3, 4, 5]
    assert _version().positions(np.array([3, 1, 4])).tolist() == [0, 1, 2]


def test_an_offset_shortens_what_a_call_holds():
    with pytest.raises(ValueError, match="max_tokens 11 is not within 1..10, the position "
                                         "table's 12 rows past offset 2"):
        Encoder(_options(position_offset=2, max_tokens=11))
    with pytest.raises(ValueError, match="with a padding id, the padding takes row offset - 1"):
        Encoder(_options(position_padding=1))
    with pytest.raises(ValueError, match="position offset -1 is below 0"):
        Encoder(_options(position_offset=-1))


def test_a_spec_offset_gives_max_tokens_and_its_errors_their_lines(tmp_path):
    from iron_spec.spec.encoder import expand_encoder
    from iron_spec.spec.errors import SpecError
    from iron_spec.spec.loader import load_spec, parse_spec
    spec = load_spec(SPECS / "roberta.yaml")
    o = expand_encoder(spec, spec.get("toy", "config")).options
    assert (o.positions, o.position_offset, o.position_padding, o.max_tokens) == (26, 2, 1, 24)
    assert o.token_types == 1
    text = (SPECS / "roberta.yaml").read_text()
    bad = parse_spec(text.replace('position_offset: "pad_token_id + 1"', "position_offset: 0"),
                     str(tmp_path / "r.yaml"))
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "position_padding:" in t)
    with pytest.raises(SpecError, match=rf"r.yaml:{line}:3: error: a padding id takes row "
                                        "position_offset - 1"):
        expand_encoder(bad, bad.get("toy", "config"))
    far = parse_spec(text.replace('position_offset: "pad_token_id + 1"', "position_offset: 30"),
                     str(tmp_path / "r.yaml"))
    with pytest.raises(SpecError, match="position offset 30 leaves no row of the position "
                                        "table's 26"):
        expand_encoder(far, far.get("toy", "config"))
