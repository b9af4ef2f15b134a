"""Every spec against transformers' own logits on the same weights, read from committed goldens.

The goldens (tests/goldens/<spec>/) were recorded from transformers' model in float32
(``iron-spec check ... --record-golden``), and the same model in float64 teacher-forced on
those tokens (``tests/goldens/add_float64.py``); reading them needs neither torch nor
transformers. The compiled float32 model is judged by the spec's float32 KL gate, our
float64 ``reference()`` by the float64 gate (``iron_spec.spec.gates.float64_gate``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from iron_spec.spec.build import load_model
from iron_spec.cli.check import golden_path
from iron_spec.spec.gates import BLOCK_FORMS, PREFILL_KL, float64_gate, kl_gate, tie
from iron_spec.spec.loader import load_spec
from iron_spec.operators import native
from iron_spec.operators.activation import ACTIVATION_PARAMS
from iron_spec.runtime import checks
from iron_spec.runtime.golden import Golden, GoldenError, kl_stats, teacher_forced
from iron_spec.runtime.session import Session
from tests.conftest import SPECS, checkpoint

CAUSAL = sorted(p for p in SPECS.glob("*.yaml") if load_spec(p).get("model") == "causal")
# The real checkpoints ../shared/data/make_checkpoints.sh builds, by the spec serving them.
REAL = {"llama3": ["smollm2-135m-instruct"], "gemma3": ["gemma-3-270m"]}


def judge(loaded, golden: Golden, float64_steps: int | None = None) -> dict:
    bounds = kl_gate(loaded, golden)  # check's own: validation.kl over the default
    stats = kl_stats(teacher_forced(golden, Session(loaded.lm).logits))
    for k, bound in bounds.items():
        assert stats[k] <= bound, f"{k} KL {stats[k]:.3g} > {bound}"
    assert stats["top1_mismatches"] == 0, stats
    # No top-1 mismatch teacher-forced means free-running greedy draws the golden's tokens.
    prompt = golden.tokens[: golden.prompt_len].tolist()
    drawn = list(Session(loaded.lm).generate(prompt, golden.steps - 1))
    assert drawn == golden.tokens[golden.prompt_len:].tolist()
    if golden.has_float64:
        # Our float64 reference() against transformers' float64 model, by the float64 gate.
        gate = float64_gate(golden, float64_steps, loaded.expanded.spec)
        float64 = checks.float64_against(loaded.lm, golden, gate, float64_steps)
        assert float64.passed, float64.figure
    if golden.routing:
        # A mixture of experts: every router chose as transformers' did (a tie within
        # float32's noise counts, a mismatch fails).
        routing = checks.routing_against(loaded.lm, golden)
        assert routing.passed, routing.figure
    return stats


@pytest.mark.parametrize("spec", CAUSAL, ids=lambda p: p.stem)
def test_toy_matches_transformers(spec: Path):
    loaded = load_model(spec, random_weights=0, toy=True)
    golden = Golden.read(golden_path(loaded), loaded.fingerprint())
    assert golden.has_float64, "the golden holds transformers' float64 rows"
    if any(lo.experts is not None for lo in loaded.lm.config.layers):
        assert golden.routing, "a mixture's golden holds transformers' routing"
    assert golden.meta["steps"] == golden.steps
    judge(loaded, golden)


@pytest.mark.parametrize("spec,name", [(s, c) for s, cs in REAL.items() for c in cs])
def test_real_checkpoint_matches_transformers(spec: str, name: str):
    directory = checkpoint(name)
    path = SPECS / f"{spec}.yaml"
    if not path.exists():
        pytest.skip(f"{path} is not written yet")
    loaded = load_model(path, checkpoint=directory, max_seq_len=2048)
    golden = Golden.read(golden_path(loaded), loaded.fingerprint())
    assert golden.steps >= 40
    # The float64 reference on a real checkpoint costs a GB read a step: 8 steps of it here
    # (iron-spec check judges all 40).
    judge(loaded, golden, float64_steps=8)


def test_a_stale_golden_is_refused(tmp_path):
    loaded = load_model(SPECS / "llama3.yaml", random_weights=0, toy=True)
    golden = Golden.read(golden_path(loaded), loaded.fingerprint())
    other = load_model(SPECS / "llama3.yaml", random_weights=1, toy=True)
    with pytest.raises(GoldenError, match="is a golden of this model .*recorded from other config.json or weights"):
        Golden.read(golden_path(loaded), other.fingerprint())
    with pytest.raises(GoldenError, match="is missing: record it"):
        Golden.read(tmp_path / "none.npz", golden.fingerprint)


@pytest.mark.skipif(not native.PROGRAM, reason="no native program here")
@pytest.mark.parametrize("spec", CAUSAL, ids=lambda p: p.stem)
@pytest.mark.parametrize("prompt", [False, True], ids=["decode", "prompt"])
def test_every_decode_step_and_prompt_chunk_is_one_native_call(spec: Path, prompt: bool):
    # The goldens above judge what it computes; here, that it runs: every step of the decode
    # step, and of the prompt chunk over the call's rows, in its native program, but an
    # activation with learned parameters (xielu, prelu), attention with sinks (a fourth
    # input, which the C pool's softmax has no term for) or with values of their own width
    # (latent attention's) or a bias per key (a dynamic mask, a fifth input), latent
    # attention's join_heads, differential attention (two softmax maps a pair, which the C
    # pool has no form of), the dynamic mask itself and, in a prompt chunk, its dt_proj (a
    # GEMM over the values' columns of the stacked q/k/v product, rows not contiguous), and
    # the gaussian top-k of an MLP's activation sparsity, AltUp's stream steps (its
    # operators.altup steps and the router's tanh), an embedding whose ids outside the
    # table read a row (per-layer inputs' outside_row) and the add of a learned initial
    # state's one row to every row (a recurrence's), a relative position bias (a sixth input,
    # its table, which the C pool has no term for), a prompt chunk whose rows see the whole
    # call (attention.sees call: the C pool's chunk is causal), chunked attention and a
    # query temperature (Llama 4's attention.chunk and attention.temperature: the C pool's
    # window is one width for every query), kv heads tiled over a mixture of attention heads'
    # slots (JetMoE's attention.experts: the C pool reads repeat_kv's grouping) and the
    # segment rows added by
    # position, a mixture's sparsemixer router, its experts with linear or per-slot forms
    # (JetMoE's attention experts) and its shared expert's gate (a (rows, 1) sigmoid times the rows), and a
    # prompt chunk's chunked SSD and gated delta rule (their segment sums and triangular
    # solves batched through numpy's BLAS; a decode step's row is native); where none is
    # left, one call.
    loaded = load_model(spec, random_weights=0, toy=True)
    plan = (loaded.lm.prompt_chunk if prompt else loaded.lm.decode_step).plan
    left = [(r.step.op.name, r.step.static, r.step.inputs) for r in plan.runs
            if r.index not in plan._native
            and not (prompt and r.step.op.name == "linear" and r.step.where.endswith(".dt_proj"))]
    assert all((op == "activation" and a.get("act") in ACTIVATION_PARAMS)
               or (op == "embedding" and a.get("outside") is not None)
               or op in ("join_heads", "differential_attention", "dynamic_mask",
                         "gaussian_topk", "stack_streams", "match_rms", "altup_predict",
                         "altup_correct", "add_to_streams", "tanh", "segment_rows")
               or (op == "attention" and (len(ins) in (4, 5, 6) or a.get("sees") == "call"
                                          or a.get("chunk") is not None
                                          or a.get("temperature") is not None
                                          or a.get("kv_tiled")
                                          or ins[0].shape[2] != ins[2].shape[2]))
               or (op == "add" and ins[0].shape != ins[1].shape)
               or (op in ("router", "experts") and (a.get("sparsemixer") is not None
                                                    or a.get("kind") == "linear"
                                                    or len(ins[0].shape) == 3))
               or (op == "mul" and ins[1] is not None and ins[1].shape[-1] == 1)
               or (prompt and op in ("ssd", "gated_delta_rule"))
               for op, a, ins in left), left
    if not left:
        assert len(plan._order) == 1 and isinstance(plan._order[0], tuple), plan._order


@pytest.mark.parametrize("spec,name", [(s, c) for s, cs in REAL.items() for c in cs])
def test_bfloat16_prefill_on_a_real_checkpoint_is_within_its_gate(spec: str, name: str):
    # The prompt chunk on bfloat16 tiles (weights and inputs rounded): transformers' float32
    # golden judges the rounding by the reduced gate (gates.PREFILL_KL), with no top-1 miss.
    loaded = load_model(SPECS / f"{spec}.yaml", checkpoint=checkpoint(name), max_seq_len=2048,
                        prefill_weights="bfloat16")
    golden = Golden.read(golden_path(loaded), loaded.fingerprint())
    stats = kl_stats(teacher_forced(golden, Session(loaded.lm).logits))
    for k in ("mean", "p90", "max"):
        assert stats[k] <= PREFILL_KL[k], f"{k} KL {stats[k]:.3g} > {PREFILL_KL[k]}"
    assert stats["top1_mismatches"] == 0, stats
    assert stats["mean"] > 0  # the rounding costs something: the tiles did run


@pytest.mark.parametrize("weights", BLOCK_FORMS)
@pytest.mark.parametrize("spec,name", [(s, c) for s, cs in REAL.items() for c in cs])
def test_a_real_checkpoint_converted_costs_at_most_twice_llama_cpps_own_file(spec, name, weights):
    # --weights at each block form (the bytes of llama.cpp's own file of that type) against
    # transformers' float32 golden, by check's KL gate: twice what llama.cpp's file costs on
    # this model, as the golden records it (tests/goldens/add_llama_cpp.py); check's own KL
    # line (a swap within gates.BLOCK_TIE a tie, not a mismatch).
    loaded = load_model(SPECS / f"{spec}.yaml", checkpoint=checkpoint(name), max_seq_len=2048,
                        weights=weights)
    golden = Golden.read(golden_path(loaded), loaded.fingerprint())
    theirs = golden.meta["llama_cpp"]["cost"][weights]
    gate = kl_gate(loaded, golden)
    assert gate["mean"] <= max(2 * theirs["mean"], PREFILL_KL["mean"])  # the model's own gate
    prompt = golden.tokens[: golden.prompt_len].tolist()
    line = checks.kl_against(loaded.lm, gate, golden, prompt, golden.steps, tie=tie(loaded.lm))
    assert line.passed, f"{line.figure} (llama.cpp's file: {theirs})"
