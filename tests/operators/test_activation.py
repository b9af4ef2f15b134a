"""Activations by hidden_act name, and the gated form ``act(gate) * up`` (LlamaMLP)."""

import math

import numpy as np
import pytest

from operators import Activation, GatedActivation
from operators.activation import ACTIVATIONS, act_reference

OP = Activation()
GATED = GatedActivation()

# Hand points: silu(x) = x / (1 + e^-x); gelu(x) = x * Phi(x) (Phi(1) = 0.8413447460685429);
# gelu_pytorch_tanh(x) = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
HAND = {
    "silu": [(0.0, 0.0), (1.0, 1.0 / (1.0 + math.exp(-1.0))), (-1.0, -1.0 / (1.0 + math.e)),
             (2.0, 2.0 / (1.0 + math.exp(-2.0)))],
    "gelu": [(0.0, 0.0), (1.0, 0.8413447460685429), (-1.0, -(1.0 - 0.8413447460685429)),
             (2.0, 2.0 * 0.9772498680518208)],  # Phi(2)
    "gelu_pytorch_tanh": [(0.0, 0.0), (1.0, 0.8411919906082768),
                          (-1.0, 0.8411919906082768 - 1.0)],
    "relu": [(0.0, 0.0), (1.0, 1.0), (-1.0, 0.0), (3.5, 3.5), (-2.0, 0.0)],
}
CASES = [(act, x, y) for act, points in HAND.items() for x, y in points]


@pytest.mark.parametrize("act,x,y", CASES)
def test_reference_hand_points(act, x, y):
    np.testing.assert_allclose(OP.reference(np.array([x]), act=act), [y], rtol=1e-13, atol=1e-300)


@pytest.mark.parametrize("act,x,y", CASES)
def test_kernel_hand_points(run_kernel, act, x, y):
    got = run_kernel(OP, np.array([[x]], np.float32), act=act)
    np.testing.assert_allclose(got, [[y]], rtol=2e-7, atol=1e-7)


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_odd_part_identity(act):
    # For all four, act(x) - act(-x) = x (x * sigmoid(x) + x * sigmoid(-x) = x, likewise Phi
    # and the tanh form, and max(x, 0) - max(-x, 0) = x).
    x = np.linspace(-6.0, 6.0, 49)
    np.testing.assert_allclose(act_reference(x, act) - act_reference(-x, act), x, atol=1e-14)


def test_gelu_tanh_approximates_gelu():
    x = np.linspace(-5.0, 5.0, 101)
    diff = act_reference(x, "gelu_pytorch_tanh") - act_reference(x, "gelu")
    assert np.abs(diff).max() < 1e-3 and np.abs(diff).max() > 1e-5


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_kernel_within_tolerance(check_kernel, act):
    x = np.linspace(-30.0, 30.0, 241, dtype=np.float32).reshape(1, 241)
    x = np.vstack([x, x / 17.0])
    check_kernel(OP, x, act=act)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # silu, x < -88
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_kernel_extreme_inputs(check_kernel, act):
    # Far tails: act(x) -> x for large x, -> 0 (no NaN from inf / inf) for large negative x.
    x = np.array([[-1e4, -100.0, -89.0, 89.0, 100.0, 1e4]], np.float32)
    got, _ = check_kernel(OP, x, act=act)
    np.testing.assert_allclose(got[0, 3:], x[0, 3:], rtol=1e-6)
    np.testing.assert_allclose(got[0, :3], 0.0, atol=1e-30)


def test_unknown_activation_raises():
    with pytest.raises(ValueError, match="silu"):
        OP.shape((2, 3), act="swish")
    with pytest.raises(ValueError):
        OP.reference(np.zeros((2, 3)), act="tanh")
    with pytest.raises(ValueError):
        OP.kernel(np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32),
                  scratch=np.zeros(6, np.float32), act="tanh")


def test_gated_hand_case(run_kernel):
    gate = np.array([[0.0, 1.0, -2.0]])
    up = np.array([[5.0, 2.0, 3.0]])
    expected = [[0.0, 2.0 / (1.0 + math.exp(-1.0)), 3.0 * -2.0 / (1.0 + math.exp(2.0))]]
    np.testing.assert_allclose(GATED.reference(gate, up), expected, rtol=1e-14)
    np.testing.assert_allclose(run_kernel(GATED, gate, up), expected, rtol=1e-6)
    # relu gate: negative gates close
    np.testing.assert_array_equal(GATED.reference(gate, up, act="relu"), [[0.0, 2.0, 0.0]])


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_gated_is_activation_times_up(act, randn):
    gate, up = randn(3, 40, scale=3.0), randn(3, 40)
    np.testing.assert_allclose(GATED.reference(gate, up, act=act),
                               OP.reference(gate, act=act) * up.astype(np.float64), rtol=1e-15)


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_gated_kernel_within_tolerance(check_kernel, randn, act):
    check_kernel(GATED, randn(4, 96, scale=4.0), randn(4, 96), act=act)


def test_gated_shape_mismatch():
    assert GATED.shape((2, 8), (2, 8)) == (2, 8)
    with pytest.raises(ValueError):
        GATED.shape((2, 8), (2, 4))
    with pytest.raises(ValueError):
        GATED.shape((2, 8), (2, 8), act="swiglu")
