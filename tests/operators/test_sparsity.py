"""The gaussian top-k cut (activation sparsity) against hand-computed values and against
transformers' Gemma3nTextMLP._gaussian_topk and torch's Normal(0, 1).icdf."""

from __future__ import annotations

import numpy as np
import pytest

from iron_spec.operators import GaussianTopK, std_multiplier


def test_a_half_cuts_at_the_row_mean():
    # The standard normal's median is 0: the cutoff is each row's mean (2.5 and -1).
    assert std_multiplier(0.5) == 0.0
    got = GaussianTopK().reference(np.array([[1.0, 2.0, 3.0, 4.0], [-3.0, 1.0, -2.0, 0.0]]),
                                   std_multiplier=0.0)
    np.testing.assert_array_equal(got, [[0.0, 0.0, 0.5, 1.5], [0.0, 2.0, 0.0, 1.0]])


def test_the_multiplier_is_the_normal_quantile_in_float32():
    # Phi^-1(0.95) = 1.6448536269514722 (tables); float32 holds it to 1 ulp.
    assert std_multiplier(0.95) == pytest.approx(1.6448536269514722, rel=2e-7)
    assert np.float32(std_multiplier(0.95)) == std_multiplier(0.95)
    # The cutoff one std above the mean of [0, 0, 0, 4]: mean 1, std sqrt(3).
    q = std_multiplier(0.8)
    x = np.array([[0.0, 0.0, 0.0, 4.0]])
    np.testing.assert_allclose(GaussianTopK().reference(x, std_multiplier=q),
                               [[0.0, 0.0, 0.0, 3.0 - 3.0 ** 0.5 * q]], rtol=1e-15)


def test_the_multiplier_is_torchs_to_a_float32_ulp_on_every_three_decimal_sparsity():
    # torch's erfinv differs by CPU: equal to ours on all 999 on an AMD EPYC (AVX-512, no
    # AMX), 1 ulp apart on 3 of them (0.267 among them) on an Intel Xeon with AMX, whose
    # torch build takes another path (2026-12-02). A multiplier 1 ulp off moves the cut by
    # ~1e-7 of a std; a wrong formula misses by far more.
    torch = pytest.importorskip("torch")
    normal = torch.distributions.normal.Normal(0, 1)
    apart = []
    for s in np.arange(1, 1000) / 1000:
        want = np.float32(normal.icdf(torch.tensor(float(s), dtype=torch.float32)).item())
        ours = np.float32(std_multiplier(float(s)))
        apart.append(abs(int(ours.view(np.int32)) - int(want.view(np.int32))))
    assert max(apart) <= 1, max(apart)
    assert sum(a > 0 for a in apart) <= 10, sum(a > 0 for a in apart)


@pytest.mark.parametrize("sparsity", [0.0, 1.0, -0.1, 1.5])
def test_a_sparsity_outside_the_open_unit_interval_is_refused(sparsity):
    with pytest.raises(ValueError, match=r"not within \(0, 1\)"):
        std_multiplier(sparsity)


def test_reference_and_kernel_match_transformers_gaussian_topk():
    torch = pytest.importorskip("torch")
    modeling = pytest.importorskip("transformers.models.gemma3n.modeling_gemma3n")
    from transformers import Gemma3nTextConfig
    config = Gemma3nTextConfig(hidden_size=8, intermediate_size=96, num_hidden_layers=1,
                               activation_sparsity_pattern=[0.95], laurel_rank=2,
                               hidden_size_per_layer_input=2, vocab_size=16,
                               vocab_size_per_layer_input=16, num_kv_shared_layers=0)
    mlp = modeling.Gemma3nTextMLP(config, layer_idx=0)
    x = np.random.default_rng(0).normal(0, 2, (5, 96))
    q = std_multiplier(0.95)
    op = GaussianTopK()
    want64 = mlp.double()._gaussian_topk(torch.tensor(x)).numpy()
    ref = op.reference(x, std_multiplier=q)
    np.testing.assert_allclose(ref, want64, rtol=0, atol=1e-14)
    assert 0 < np.count_nonzero(ref) < ref.size // 10  # about 5% of each row kept
    x32 = x.astype(np.float32)
    out, scratch = np.empty_like(x32), np.empty(op.scratch(x32.shape), np.float32)
    op.kernel(out, x32, scratch=scratch, std_multiplier=q)
    bound = op.tolerance(x32.shape, std_multiplier=q).bound(op.scale(ref, x32, std_multiplier=q))
    ref32 = op.reference(x32, std_multiplier=q)
    assert np.all(np.abs(out - ref32) <= bound)
    want32 = mlp.float()._gaussian_topk(torch.tensor(x32)).numpy()
    assert np.all(np.abs(out - want32) <= bound)
