"""AltUp's stream operators against hand-computed values, their kernels against their float64
references, and the prediction and correction against transformers' Gemma3nTextAltUp."""

from __future__ import annotations

import numpy as np
import pytest

from iron_spec.operators import (AddToStreams, AltUpCorrect, AltUpPredict, MatchRMS,
                                 StackStreams)


def test_prediction_weighs_the_streams_by_rows_of_the_matrix():
    # One row, two streams [1, 2] and [10, 20]; matrix [[a, b], [c, d]] = [[1, 2], [3, 4]]:
    # prediction j = stream j + sum_i M[j, i] stream i.
    s = np.array([[[1.0, 2.0], [10.0, 20.0]]])
    c = np.array([[1.0, 2.0, 3.0, 4.0]])
    want = [[[1 + 1 * 1 + 2 * 10, 2 + 1 * 2 + 2 * 20], [10 + 3 * 1 + 4 * 10, 20 + 3 * 2 + 4 * 20]]]
    np.testing.assert_array_equal(AltUpPredict().reference(s, c), want)


def test_correction_adds_the_innovation_times_one_plus_its_weight():
    # Active stream 1 predicted [10, 20], the layer made [13, 16]: innovation [3, -4].
    p = np.array([[[1.0, 2.0], [10.0, 20.0]]])
    a = np.array([[13.0, 16.0]])
    # Weight 0 makes the active stream the layer's output itself.
    c = np.array([[0.5, 0.0]])
    want = [[[1 + 3 * 1.5, 2 - 4 * 1.5], [13.0, 16.0]]]
    np.testing.assert_array_equal(AltUpCorrect().reference(p, a, c, active=1), want)


def test_match_rms_rescales_to_the_targets_root_mean_square_with_a_floor():
    x = np.array([[3.0, 4.0], [1e-4, 0.0]])
    t = np.array([[1.0, 7.0], [2.0, 2.0]])
    got = MatchRMS().reference(x, t, floor=1e-5)
    # rms(x) = 5 / sqrt(2), rms(t) = 5: x * sqrt(2). Row 2's mean square 5e-9 is floored.
    np.testing.assert_allclose(got[0], [3 * 2 ** 0.5, 4 * 2 ** 0.5], rtol=1e-15)
    np.testing.assert_allclose(got[1], [1e-4 * 2 / 1e-5 ** 0.5, 0.0], rtol=1e-15)


def test_add_to_streams_leaves_the_streams_before_begin():
    s = np.arange(12.0).reshape(2, 3, 2)
    y = np.array([[100.0, 200.0], [300.0, 400.0]])
    got = AddToStreams().reference(s, y, begin=1)
    np.testing.assert_array_equal(got[:, 0], s[:, 0])
    np.testing.assert_array_equal(got[:, 1:], s[:, 1:] + y[:, None, :])


CASES = [
    (StackStreams(), [(5, 8), (5, 8), (5, 8)], {}),
    (MatchRMS(), [(5, 8), (5, 8)], {"floor": 1e-5}),
    (AltUpPredict(), [(5, 3, 8), (5, 9)], {}),
    (AltUpCorrect(), [(5, 3, 8), (5, 8), (5, 3)], {"active": 1}),
    (AddToStreams(), [(5, 3, 8), (5, 8)], {"begin": 1}),
]


@pytest.mark.parametrize("op,shapes,attrs", CASES, ids=lambda c: getattr(c, "name", ""))
def test_kernel_meets_its_reference_within_tolerance(op, shapes, attrs):
    rng = np.random.default_rng(1)
    xs = [rng.normal(0, 1.5, s).astype(np.float32) for s in shapes]
    out = np.empty(op.shape(*shapes, **attrs), np.float32)
    op.kernel(out, *xs, scratch=np.empty(op.scratch(*shapes, **attrs), np.float32), **attrs)
    ref = op.reference(*xs, **attrs)
    bound = op.tolerance(*shapes, **attrs).bound(op.scale(ref, *xs, **attrs))
    assert np.all(np.abs(out - ref) <= bound)
    assert not np.allclose(out, 0.0)


@pytest.mark.parametrize("shapes,attrs", [
    ([(5, 3, 8), (5, 8)], {}), ([(5, 8), (5, 8)], {}), ([(5, 3, 8), (5, 3)], {"active": 3}),
])
def test_shapes_that_do_not_fit_are_refused(shapes, attrs):
    op = AltUpPredict() if not attrs and len(shapes[0]) == 3 else \
        AltUpCorrect() if attrs else StackStreams()
    if isinstance(op, AltUpCorrect):
        shapes = [shapes[0], (5, 8), shapes[1]]
    if isinstance(op, StackStreams):
        shapes = [(5, 8), (4, 8)]
    with pytest.raises(ValueError):
        op.shape(*shapes, **attrs)


def _modalities(x, w, E):
    """tanh(modality_router(router_norm(x) / E)), Gemma3nTextAltUp.compute_router_modalities
    written out (RMSNorm times its weight, eps 1e-6)."""
    n = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w["router_norm.weight"]
    return np.tanh((n / E) @ w["modality_router.weight"].T)


def test_predict_and_correct_match_transformers_altup():
    torch = pytest.importorskip("torch")
    modeling = pytest.importorskip("transformers.models.gemma3n.modeling_gemma3n")
    from transformers import Gemma3nTextConfig
    K, E, n, active = 3, 16, 4, 1
    config = Gemma3nTextConfig(hidden_size=E, intermediate_size=32, num_hidden_layers=1,
                               altup_num_inputs=K, altup_active_idx=active, laurel_rank=2,
                               hidden_size_per_layer_input=2, vocab_size=16,
                               vocab_size_per_layer_input=16, num_kv_shared_layers=0,
                               activation_sparsity_pattern=[0.0], rms_norm_eps=1e-6)
    altup = modeling.Gemma3nTextAltUp(config).double().eval()
    rng = np.random.default_rng(2)
    w = {name: rng.normal(0, 0.5, p.shape) + (1.0 if name == "router_norm.weight" else 0.0)
         for name, p in altup.named_parameters()}
    altup.load_state_dict({k: torch.tensor(v) for k, v in w.items()}, strict=False)
    streams = rng.normal(0, 1, (K, 1, n, E))  # transformers' [K, batch, tokens, hidden]
    activated = rng.normal(0, 1, (1, n, E))
    with torch.no_grad():
        want_p = altup.predict(torch.tensor(streams)).numpy()
        want_c = altup.correct(torch.tensor(want_p), torch.tensor(activated)).numpy()
    ours = streams[:, 0].transpose(1, 0, 2)  # (n, K, E)
    coefs = _modalities(ours[:, active], w, E) @ w["prediction_coefs.weight"].T
    got_p = AltUpPredict().reference(ours, coefs)
    # Gemma3nRMSNorm computes in float32 even in a float64 model (its .float()): the router's
    # modalities carry float32's rounding, the rest float64's.
    np.testing.assert_allclose(got_p, want_p[:, 0].transpose(1, 0, 2), rtol=0, atol=1e-6)
    corr = _modalities(activated[0], w, E) @ w["correction_coefs.weight"].T
    got_c = AltUpCorrect().reference(want_p[:, 0].transpose(1, 0, 2), activated[0], corr,
                                     active=active)
    np.testing.assert_allclose(got_c, want_c[:, 0].transpose(1, 0, 2), rtol=0, atol=1e-6)
    # The matrix read the other way round (columns for rows) misses by far more.
    flipped = coefs.reshape(n, K, K).transpose(0, 2, 1).reshape(n, K * K)
    assert np.abs(AltUpPredict().reference(ours, flipped)
                  - want_p[:, 0].transpose(1, 0, 2)).max() > 1e-2
