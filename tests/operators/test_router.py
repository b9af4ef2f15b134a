"""The router against transformers' own routers (``moe_golden/routers.npz``, recorded from
transformers 5.25 by ``moe_golden/record.py``: each family's router module on drawn float64
weights and inputs), its float32 kernel against its reference, and ties reconciled."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from iron_spec.operators import OPERATORS
from iron_spec.operators.router import tied_choice
from tests.operators.conftest import _check_kernel, _run_kernel

OP = OPERATORS["router"]
GOLDEN = np.load(Path(__file__).parent / "moe_golden" / "routers.npz")
CASES = sorted({k.split(".")[0] for k in GOLDEN.files if k.endswith(".attrs")})

# Each module's name for the router's linear weight, logit bias, selection bias and per-expert
# scale, where it has them.
WEIGHT = ("weight", "layer.weight", "proj.weight", "linear.weight")
BIAS = ("bias",)
SELECTION = ("e_score_correction_bias", "moe_statics.e_score_correction_bias")
SCALE = ("per_expert_scale",)
# The routers that stay in the model's dtype: GptOssTopKRouter, PhimoeTopKRouter's
# sparsemixer, DbrxFFN.route_tokens_to_experts (softmax in the logits' own dtype).
FLOAT64_ROUTERS = ("gpt_oss", "phimoe", "dbrx")


def _named(case: str, names) -> np.ndarray | None:
    for name in names:
        if f"{case}.{name}" in GOLDEN.files:
            return GOLDEN[f"{case}.{name}"].reshape(GOLDEN[f"{case}.{name}"].shape[-1:]) \
                if name in SELECTION else GOLDEN[f"{case}.{name}"]
    return None


def _inputs(case: str) -> list:
    return [GOLDEN[f"{case}.x"], _named(case, WEIGHT), _named(case, BIAS),
            _named(case, SELECTION), _named(case, SCALE)]


def _attrs(case: str) -> dict:
    a = json.loads(str(GOLDEN[f"{case}.attrs"]))
    if a.get("groups") is not None:
        a["groups"] = tuple(a["groups"])
    return a


def test_every_router_the_families_write_is_recorded():
    assert len(CASES) >= 15, CASES


@pytest.mark.parametrize("case", CASES)
def test_reference_is_transformers_router(case):
    ref = OP.reference(*_inputs(case), **_attrs(case))
    want = GOLDEN[f"{case}.weights"]
    np.testing.assert_array_equal(ref[:, 0], GOLDEN[f"{case}.indices"], err_msg=case)
    # Most routers compute in float32 whatever the model's dtype (softmax(dtype=float32),
    # .float(), hidden_states.type(torch.float32): transformers' float32 island): those are
    # judged to float32's precision, the rest (float64 throughout) to float64's.
    island = case not in FLOAT64_ROUTERS
    np.testing.assert_allclose(ref[:, 1], want, rtol=4e-6 if island else 1e-12,
                               atol=1e-7 if island else 1e-14, err_msg=case)


@pytest.mark.parametrize("case", CASES)
def test_float32_kernel_within_tolerance(case):
    inputs = [None if v is None else v.astype(np.float32) for v in _inputs(case)]
    got, _ = _check_kernel(OP, *inputs, **_attrs(case))
    np.testing.assert_array_equal(got[:, 0], GOLDEN[f"{case}.indices"], err_msg=case)


def test_by_hand_softmax_top2_normalized():
    # Logits 0, 1, 2, 3 (x = 1, W a column): the top two are 3 and 2, weights e^3 and e^2
    # over their sum.
    x = np.array([[1.0]], np.float32)
    w = np.array([[0.0], [1.0], [2.0], [3.0]], np.float32)
    ref = OP.reference(x, w, top_k=2, score="softmax", normalize="sum")
    e2, e3 = np.exp(2.0), np.exp(3.0)
    np.testing.assert_allclose(ref[0], [[2, 3], [e2 / (e2 + e3), e3 / (e2 + e3)]], rtol=1e-12)


def test_by_hand_groups_by_their_two_best():
    # Sigmoid of 0 is 1/2 everywhere; the selection bias decides. Groups {0,1} {2,3} {4,5}:
    # top-2 sums 0.5+0.5+b: group 1 holds the two largest biases' sum, group 0 the single
    # largest. One group kept: experts 2 and 3, though expert 0 alone is the best.
    x = np.zeros((1, 1), np.float32)
    w = np.zeros((6, 1), np.float32)
    bias = np.array([0.9, 0.0, 0.6, 0.5, 0.1, 0.1], np.float32)
    ref = OP.reference(x, w, None, bias, top_k=2, score="sigmoid", groups=(3, 1),
                       group_score="top2")
    np.testing.assert_array_equal(ref[0, 0], [2, 3])
    np.testing.assert_allclose(ref[0, 1], [0.5, 0.5])
    ref = OP.reference(x, w, None, bias, top_k=2, score="sigmoid", groups=(3, 1),
                       group_score="max")
    np.testing.assert_array_equal(ref[0, 0], [0, 1])


def test_a_tie_the_kernel_breaks_otherwise_is_reconciled():
    # Two experts of equal logits: the reference picks the lower index; a kernel that picked
    # the other is judged by the reference's weights for its own choice, not failed.
    x = np.ones((1, 2), np.float32)
    w = np.array([[1.0, 1.0], [0.5, 1.5], [0.0, 0.1]], np.float32)
    attrs = dict(top_k=1, score="softmax")
    expected = OP.reference(x, w, **attrs)
    assert expected[0, 0, 0] == 0
    got = expected.copy().astype(np.float32)
    got[0, 0, 0] = 1
    fixed = OP.reconcile(expected, got, [x, w, None, None, None], attrs)
    assert fixed[0, 0, 0] == 1 and fixed[0, 1, 0] == pytest.approx(expected[0, 1, 0])
    # Expert 2 is far below: choosing it is no tie, and stays a failure.
    got[0, 0, 0] = 2
    assert OP.reconcile(expected, got, [x, w, None, None, None], attrs)[0, 0, 0] == 0


def test_tied_choice_is_a_top_k_within_noise():
    m = np.array([3.0, 2.0, 2.0 + 1e-9, 0.0])
    noise = np.full(4, 1e-7)
    assert tied_choice(m, noise, [0, 1], 2)
    assert tied_choice(m, noise, [0, 2], 2)
    assert not tied_choice(m, noise, [0, 3], 2)
    assert not tied_choice(m, noise, [1, 2], 2)


@pytest.mark.parametrize("bad, match", [
    (dict(top_k=9), "top_k 9 is not within 1..8"),
    (dict(top_k=2, groups=(3, 1)), "do not split 8 experts"),
    (dict(top_k=5, groups=(4, 2)), "hold fewer than top_k 5"),
    (dict(top_k=3, sparsemixer=0.01), "sparsemixer chooses 2"),
    (dict(top_k=2, score="tanh"), "score 'tanh' is not one of"),
])
def test_refusals_name_the_attribute(bad, match):
    with pytest.raises(ValueError, match=match):
        OP.shape((3, 4), (8, 4), **bad)


def test_kernel_writes_indices_as_exact_integers():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 16)).astype(np.float32)
    w = rng.standard_normal((32, 16)).astype(np.float32)
    got = _run_kernel(OP, x, w, top_k=4, score="softmax")
    assert np.array_equal(got[:, 0], np.rint(got[:, 0]))
    assert (np.diff(got[:, 0], axis=-1) > 0).all()  # ascending, distinct
