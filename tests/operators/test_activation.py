"""Activations by transformers' ACT2FN names, and the gated form ``act(gate) * up`` (LlamaMLP).

Expected values are transformers' formulas (``activations.py``) written out here with the
math module in float64, independently of operators.activation.
"""

import math

import numpy as np
import pytest

from iron_spec.operators import Activation, GatedActivation
from iron_spec.operators.activation import ACTIVATION_PARAMS, ACTIVATIONS, act_reference

OP = Activation()
GATED = GatedActivation()


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def softplus(x):  # torch's, threshold 20
    return x if x > 20 else math.log1p(math.exp(x))


def gelu_tanh(x):  # NewGELUActivation
    return 0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gelu_erf(x):  # GELUActivation (nn.functional.gelu)
    return 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))


HAND_FORMULAS = {
    "silu": lambda x: x * sigmoid(x),
    "swish": lambda x: x * sigmoid(x),
    "sigmoid": sigmoid,
    "tanh": math.tanh,
    "gelu": gelu_erf,
    "gelu_python": gelu_erf,
    "gelu_10": lambda x: min(10.0, max(-10.0, gelu_erf(x))),
    "gelu_new": gelu_tanh,
    "gelu_pytorch_tanh": gelu_tanh,
    "gelu_python_tanh": gelu_tanh,
    "gelu_accurate": gelu_tanh,
    "gelu_fast": lambda x: 0.5 * x * (1.0 + math.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x))),
    "quick_gelu": lambda x: x * sigmoid(1.702 * x),
    "relu": lambda x: max(x, 0.0),
    "relu2": lambda x: max(x, 0.0) ** 2,
    "relu6": lambda x: min(max(x, 0.0), 6.0),
    "leaky_relu": lambda x: x if x > 0 else 0.01 * x,
    "mish": lambda x: x * math.tanh(softplus(x)),
    "laplace": lambda x: 0.5 * (1.0 + math.erf((x - 0.707107) / (0.282095 * math.sqrt(2.0)))),
    "hardswish": lambda x: x * min(max(x + 3.0, 0.0), 6.0) / 6.0,
    "sqrtsoftplus": lambda x: math.sqrt(softplus(x)),
    "linear": lambda x: x,
}
POINTS = (-12.5, -3.0, -1.0, -0.25, 0.0, 0.5, 1.0, 2.0, 4.0, 7.5, 12.5)
# Exact by hand, beside the formulas: Phi(1) = 0.8413447460685429, Phi(2) = 0.9772498680518208.
HAND_POINTS = [("gelu", 1.0, 0.8413447460685429), ("gelu", -1.0, -(1.0 - 0.8413447460685429)),
               ("gelu", 2.0, 2.0 * 0.9772498680518208), ("gelu_new", 1.0, 0.8411919906082768),
               ("relu2", 3.0, 9.0), ("relu2", -3.0, 0.0), ("relu6", 7.0, 6.0),
               ("leaky_relu", -2.0, -0.02), ("hardswish", 1.0, 4.0 / 6.0),
               ("gelu_10", 12.0, 10.0), ("laplace", 0.707107, 0.5), ("linear", -3.25, -3.25)]

# XIELUActivation with its parameters as a checkpoint holds them: alpha_p and alpha_n
# before softplus (unsqueezed to (1,)), beta and eps 0-d.
XIELU = (np.array([0.25], np.float32), np.array([-0.75], np.float32),
         np.array(0.5, np.float32), np.array(-1e-6, np.float32))
PRELU = (np.array([0.25], np.float32),)
PARAMS = {"xielu": XIELU, "prelu": PRELU}


def xielu_hand(x, p=XIELU):
    a_p = softplus(float(p[0][0]))
    beta, eps = float(p[2]), float(p[3])
    a_n = beta + softplus(float(p[1][0]))
    if x > 0:
        return a_p * x * x + beta * x
    return (math.expm1(min(x, eps)) - x) * a_n + beta * x


def test_every_act2fn_name_a_dense_model_uses_is_served():
    # transformers' ACT2CLS keys (activations.py, 5.24); none is left out.
    act2cls = {"gelu", "gelu_10", "gelu_fast", "gelu_new", "gelu_python", "gelu_pytorch_tanh",
               "gelu_python_tanh", "gelu_accurate", "hardswish", "laplace", "leaky_relu",
               "linear", "mish", "quick_gelu", "relu", "relu2", "relu6", "sigmoid", "silu",
               "sqrtsoftplus", "swish", "tanh", "prelu", "xielu"}
    assert set(ACTIVATIONS) == act2cls


@pytest.mark.parametrize("act", sorted(HAND_FORMULAS))
def test_reference_matches_transformers_formula(act):
    want = [HAND_FORMULAS[act](x) for x in POINTS]
    np.testing.assert_allclose(OP.reference(np.array(POINTS), act=act), want, rtol=1e-13, atol=1e-300)


@pytest.mark.parametrize("act,x,y", HAND_POINTS)
def test_reference_hand_points(act, x, y):
    np.testing.assert_allclose(OP.reference(np.array([x]), act=act), [y], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("act", sorted(HAND_FORMULAS))
def test_kernel_matches_transformers_formula(run_kernel, act):
    x = np.array([POINTS], np.float32)
    want = [[HAND_FORMULAS[act](float(v)) for v in x[0]]]
    np.testing.assert_allclose(run_kernel(OP, x, act=act), want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_new", "gelu_fast", "quick_gelu",
                                 "relu", "gelu_python", "gelu_accurate", "hardswish"])
def test_odd_part_identity(act):
    # act(x) - act(-x) = x for x * F(x) with F(x) + F(-x) = 1 (sigmoid, Phi, the tanh
    # forms, max(x, 0), hardswish's relu6(x + 3) / 6).
    x = np.linspace(-2.9, 2.9, 49)
    np.testing.assert_allclose(act_reference(x, act) - act_reference(-x, act), x, atol=1e-14)


def test_gelu_tanh_approximates_gelu():
    x = np.linspace(-5.0, 5.0, 101)
    diff = act_reference(x, "gelu_new") - act_reference(x, "gelu")
    assert np.abs(diff).max() < 1e-3 and np.abs(diff).max() > 1e-5


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_kernel_within_tolerance(check_kernel, act):
    x = np.linspace(-30.0, 30.0, 241, dtype=np.float32).reshape(1, 241)
    x = np.vstack([x, x / 17.0, x / 1000.0])
    check_kernel(OP, x, *PARAMS.get(act, ()), act=act)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_kernel_extreme_inputs(check_kernel, act):
    # Far tails (|x| past exp's float32 range) stay finite and within the bound.
    x = np.array([[-1e4, -100.0, -89.0, 89.0, 100.0, 1e4]], np.float32)
    got, _ = check_kernel(OP, x, *PARAMS.get(act, ()), act=act)
    assert np.isfinite(got).all()


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize("act", ["silu", "swish", "gelu", "gelu_new", "gelu_fast", "quick_gelu",
                                 "mish", "gelu_pytorch_tanh"])
def test_gelu_like_tails(run_kernel, act):
    # act(x) -> x for large x, -> 0 for large negative x (no NaN from inf / inf).
    x = np.array([[-1e4, -100.0, -89.0, 89.0, 100.0, 1e4]], np.float32)
    got = run_kernel(OP, x, act=act)
    np.testing.assert_allclose(got[0, 3:], x[0, 3:], rtol=1e-6)
    np.testing.assert_allclose(got[0, :3], 0.0, atol=1e-30)


def test_xielu_reference_and_kernel_by_hand(run_kernel):
    x = np.array([[-6.0, -1.0, -1e-7, 0.0, 1e-3, 0.5, 3.0]], np.float32)
    want = [[xielu_hand(float(v)) for v in x[0]]]
    np.testing.assert_allclose(OP.reference(x, *XIELU, act="xielu"), want, rtol=1e-13, atol=1e-300)
    np.testing.assert_allclose(run_kernel(OP, x, *XIELU, act="xielu"), want, rtol=1e-6, atol=1e-9)
    # By hand at x = 3: softplus(0.25) = log(1 + e^0.25) = 0.82593941988; times 9, plus 1.5.
    assert abs(xielu_hand(3.0) - 8.93345477891) < 1e-10


def test_xielu_clamps_at_eps():
    # For eps < x <= 0, expm1(min(x, eps)) is expm1(eps): x enters only through -x and beta x.
    a_n = 0.5 + softplus(-0.75)
    x = -1e-7
    want = (math.expm1(float(np.float32(-1e-6))) - x) * a_n + 0.5 * x
    np.testing.assert_allclose(OP.reference(np.array([x]), *XIELU, act="xielu"), [want], rtol=1e-12)


def test_prelu_by_hand(run_kernel):
    x = np.array([[-4.0, -1.0, 0.0, 2.0]], np.float32)
    want = [[-1.0, -0.25, 0.0, 2.0]]
    np.testing.assert_allclose(OP.reference(x, *PRELU, act="prelu"), want, rtol=1e-15)
    np.testing.assert_array_equal(run_kernel(OP, x, *PRELU, act="prelu"), want)


def test_parameter_shapes_are_checked():
    assert OP.shape((2, 3), (1,), (1,), (), (), act="xielu") == (2, 3)
    with pytest.raises(ValueError, match="alpha_p"):
        OP.shape((2, 3), act="xielu")
    with pytest.raises(ValueError, match="none"):
        OP.shape((2, 3), (1,), act="relu2")
    assert [n for n, _ in ACTIVATION_PARAMS["xielu"]] == ["alpha_p", "alpha_n", "beta", "eps"]


def test_unknown_activation_raises():
    with pytest.raises(ValueError, match="silu"):
        OP.shape((2, 3), act="swiglu")
    with pytest.raises(ValueError):
        OP.reference(np.zeros((2, 3)), act="gelu_tanh")
    with pytest.raises(ValueError):
        OP.kernel(np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32),
                  scratch=np.zeros(6, np.float32), act="softmax")


def test_gated_hand_case(run_kernel):
    gate = np.array([[0.0, 1.0, -2.0]])
    up = np.array([[5.0, 2.0, 3.0]])
    expected = [[0.0, 2.0 / (1.0 + math.exp(-1.0)), 3.0 * -2.0 / (1.0 + math.exp(2.0))]]
    np.testing.assert_allclose(GATED.reference(gate, up), expected, rtol=1e-14)
    np.testing.assert_allclose(run_kernel(GATED, gate, up), expected, rtol=1e-6)
    np.testing.assert_array_equal(GATED.reference(gate, up, act="relu"), [[0.0, 2.0, 0.0]])
    np.testing.assert_array_equal(GATED.reference(gate, up, act="relu2"), [[0.0, 2.0, 0.0]])


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_gated_is_activation_times_up(act, randn):
    gate, up = randn(3, 40, scale=3.0), randn(3, 40)
    p = PARAMS.get(act, ())
    np.testing.assert_allclose(GATED.reference(gate, up, *p, act=act),
                               OP.reference(gate, *p, act=act) * up.astype(np.float64), rtol=1e-15)


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_gated_kernel_within_tolerance(check_kernel, randn, act):
    check_kernel(GATED, randn(4, 96, scale=4.0), randn(4, 96), *PARAMS.get(act, ()), act=act)


def test_gated_fused_with_parameters(randn):
    fused = randn(3, 16, scale=3.0)
    assert GATED.shape(fused.shape, None, *[p.shape for p in XIELU], act="xielu") == (3, 8)
    want = OP.reference(fused[:, :8], *XIELU, act="xielu") * fused[:, 8:]
    np.testing.assert_allclose(GATED.reference(fused, None, *XIELU, act="xielu"), want, rtol=1e-15)
    out = np.full((3, 8), np.nan, np.float32)
    GATED.kernel(out, fused, None, *XIELU, scratch=np.full(48, np.nan, np.float32), act="xielu")
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_gated_shape_mismatch():
    assert GATED.shape((2, 8), (2, 8)) == (2, 8)
    with pytest.raises(ValueError):
        GATED.shape((2, 8), (2, 4))
    with pytest.raises(ValueError):
        GATED.shape((2, 8), (2, 8), act="swiglu")
