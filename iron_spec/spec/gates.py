"""The gates ``iron-spec check`` judges a spec by, and a golden's own float64 floor.

float32: KL(transformers || ours) against a golden's float32 rows (``kl_gate``). float64:
our float64 ``reference()`` against transformers' model run in float64 (``float64_gate``,
an encoder's ``encoder_float64_gate``), each bound tightened to ``FLOOR_MARGIN`` x the
golden's own floor where its meta records one. ``floor`` measures that floor, for
``check --record-golden`` and ``tests/goldens/add_floor.py`` alike.

A spec's ``validation`` section sets these gates, so they sit with the spec's reading: lint
(``rules``) refuses a ``validation.kl`` looser than ``DEFAULT_KL`` without a reason.

Not for: running the other checks (``runtime.checks``, ``iron_spec.cli.check``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from iron_spec.operators import held
from iron_spec.runtime import checks
from iron_spec.runtime.encoder_golden import EncoderGolden
from iron_spec.runtime.golden import Golden

if TYPE_CHECKING:
    from .build import Loaded

# The KL gates of reduced decode weights against the float32 reference (issue 14), in
# place of the spec's float32 gates: what rounding every weight may cost. bfloat16 that
# holds exactly is float32's products, judged by float32's gates. Measured on SmolLM2's
# golden, int8: mean 3.0e-4, p90 5.3e-4, max 2.5e-3, no top-1 mismatch in 40 steps.
REDUCED_KL = {
    "bfloat16-rounded": {"mean": 1e-3, "p90": 3e-3, "max": 3e-2, "top1_mismatches": 2},
    "int8": {"mean": 1e-3, "p90": 3e-3, "max": 3e-2, "top1_mismatches": 2},
}
# The KL gates of weights converted at load (--weights, runtime.holding), by conversion:
# bfloat16 and float16 round every weight as bfloat16-rounded does. A block form's gate is
# at most twice what llama.cpp's own quantization to that type costs (``twice``), measured
# against the same golden rows check judges by: where the golden records llama.cpp's cost on
# its model (meta ``llama_cpp``: tests/goldens/add_llama_cpp.py), that model's
# (``conversion_gate``); elsewhere SmolLM2-135M's. A conversion here is the bytes of
# llama.cpp's file of that type (runtime.holding; equal byte for byte on SmolLM2 and Gemma 3
# 270M), and our GEMV meets x at 8 bits as llama.cpp's does, so on the same file ours cost
# what llama.cpp's do (docs/checking.md has both models' table).
BLOCK_FORMS = ("q8_0", "q5_0", "q5_1", "q4_0", "q4_1")
# llama.cpp's cost where no golden records its model's: llama.cpp 0.3.36 on
# SmolLM2-135M-Instruct's file of each type (llama_model_quantize of its BF16 GGUF), KL
# against its golden's float32 rows over the 40 teacher-forced steps, as
# check's KL line (2026-12-05; docs/checking.md).
FALLBACK_COST = {
    "q8_0": {"mean": 0.00334, "p90": 0.00796, "max": 0.0172, "top1_mismatches": 0},
    "q5_0": {"mean": 0.0856, "p90": 0.163, "max": 0.303, "top1_mismatches": 5},
    "q5_1": {"mean": 0.0786, "p90": 0.178, "max": 0.248, "top1_mismatches": 4},
    "q4_0": {"mean": 0.184, "p90": 0.422, "max": 0.794, "top1_mismatches": 8},
    "q4_1": {"mean": 0.00191, "p90": 0.00401, "max": 0.00777, "top1_mismatches": 2},
}


def twice(cost: dict) -> dict:
    """The gate of a conversion whose llama.cpp cost (KL mean, p90, max, top-1 mismatches
    against the golden) is ``cost``: twice each bound, and at least 2 mismatches (a tie
    the 8-bit activations break, where llama.cpp's file broke none)."""
    return {"mean": 2 * cost["mean"], "p90": 2 * cost["p90"], "max": 2 * cost["max"],
            "top1_mismatches": max(2, 2 * int(cost["top1_mismatches"]))}


def _looser(*gates: dict) -> dict:
    return {k: max(g[k] for g in gates) for k in gates[0]}


# Where no golden records llama.cpp's cost on its model: one gate per bit width, the looser
# of twice SmolLM2's cost of its two forms. What a type costs swings with the weights'
# statistics: SmolLM2's weights are a Q4_1 file's values, so Q4_1 costs them a hundredth of
# what Q4_0 does; Gemma 3 270M's are a Q4_K_M file's (mostly Q5_0), so Q5_0 and Q5_1 cost it
# a tenth of what they cost SmolLM2, and Q4_0 twice as much (docs/checking.md).
_FALLBACK = {"q8_0": twice(FALLBACK_COST["q8_0"]),
             "q5_0": _looser(twice(FALLBACK_COST["q5_0"]), twice(FALLBACK_COST["q5_1"])),
             "q4_0": _looser(twice(FALLBACK_COST["q4_0"]), twice(FALLBACK_COST["q4_1"]))}
WEIGHTS_KL = {
    "bfloat16": REDUCED_KL["bfloat16-rounded"],
    "float16": REDUCED_KL["bfloat16-rounded"],
    "q8_0": _FALLBACK["q8_0"],
    "q5_0": _FALLBACK["q5_0"], "q5_1": _FALLBACK["q5_0"],
    "q4_0": _FALLBACK["q4_0"], "q4_1": _FALLBACK["q4_0"],
}


def conversion_gate(weights: str, golden=None) -> dict | None:
    """The KL gate of weights converted at load to ``weights`` (a ``WEIGHTS_KL`` key), judged
    against ``golden``: ``twice`` llama.cpp's cost of that type on the golden's own model
    where its meta records one (``llama_cpp.cost``, over ``llama_cpp.steps``; over fewer steps
    each bound is twice llama.cpp's max), else ``WEIGHTS_KL``'s; None for any other
    ``weights``."""
    measured = (getattr(golden, "meta", None) or {}).get("llama_cpp") or {}
    cost = (measured.get("cost") or {}).get(weights) if weights in BLOCK_FORMS else None
    if cost is None:
        return WEIGHTS_KL.get(weights)
    if golden.steps < int(measured.get("steps", golden.steps)):
        # Over fewer steps than measured: a part's mean (or p90) can exceed the whole's,
        # never its max.
        cost = {**cost, "mean": cost["max"], "p90": cost["max"]}
    return twice(cost)


# A bfloat16 prompt chunk rounds every projection's weights and input: bfloat16-rounded's
# gates. On the real goldens (float32 decode): SmolLM2 KL mean 1.5e-5, max 2.0e-4; Gemma 3
# 270M 8.9e-6, 3.2e-4; no top-1 mismatch (docs/speed.md).
PREFILL_KL = REDUCED_KL["bfloat16-rounded"]
# A bfloat16 KV cache rounds every key and value (relative error up to 2^-9): the same
# gates. docs/speed.md gives what it costs on SmolLM2 and Gemma 3.
KV_CACHE_KL = REDUCED_KL["bfloat16-rounded"]
# Under reduced precision, how far apart (nats, in the reference) two tokens may be and still
# swap in greedy order: a tie the rounding broke, not an error. On the toys the swaps seen
# were the reference's second choice 0.007-0.045 nats below its first (int8 decode weights,
# a bfloat16 KV cache, bfloat16 prefill); float32 keeps no such allowance.
REDUCED_TIE = 0.1
# A decode GEMV on a block form meets x rounded to 8 bits a value (formats.quantize_x8, as
# llama.cpp's), the prompt chunk and the float64 reference's own activations x as it is: a
# rounding step apart on a value flips choices further apart. Seen: SmolLM2's Q4_1 GGUF's
# greedy text leaves the float32-activation conversion's at a choice 0.26 nats apart (where
# it follows llama.cpp's on the same file, tests/runtime/test_gguf_checkpoints.py); Gemma 3
# 270M --weights q4_1's deep decode chose 0.18 nats below the reference's first.
BLOCK_TIE = 0.3
# The gate a block form held as stored (a GGUF file's) is judged by: its bit width's
# conversion gate. Against the float64 reference on the same blocks the 8-bit activations
# alone cost SmolLM2's Q4_0 file KL mean 0.0023, max 0.0069 (float32's gate: 1e-6).
HELD_GATES = {"Q8_0": "q8_0", "Q6_K": "q8_0", "Q5_0": "q5_0", "Q5_1": "q5_0", "Q5_K": "q5_0",
              "Q4_0": "q4_0", "Q4_1": "q4_0", "Q4_K": "q4_0"}


def held_blocks(lm) -> str | None:
    """The conversion gate (a ``WEIGHTS_KL`` key) of the fewest-bit block form ``lm`` holds
    as stored, or None where it holds none (or its weights were converted at load)."""
    if getattr(lm, "weights", "stored") != "stored" or not hasattr(lm, "named_params"):
        return None
    found = {HELD_GATES.get(held.form(p.array)) for _, p in lm.named_params()
             if p.array is not None and held.is_block(p.array)}
    for name in ("q4_0", "q5_0", "q8_0"):
        if name in found:
            return name
    return None


def tie(lm) -> float:
    """How far apart (nats) two tokens may swap in ``lm``'s greedy order and count as a tie:
    ``BLOCK_TIE`` where weights are held in a block form (converted or stored),
    ``REDUCED_TIE`` under any other reduced precision, 0 at float32."""
    weights = getattr(lm, "weights", "stored")
    if (weights in WEIGHTS_KL and weights.startswith("q")) or held_blocks(lm):
        return BLOCK_TIE
    return REDUCED_TIE if reduced(lm) else 0.0
# float32 against transformers' float32 gives KL mean 1e-10 .. 2e-8 on every shipped spec's
# toy and on SmolLM2 and Gemma 3; a wrong option usually 1e-2 or more: about 50x over the
# worst right spec (docs/writing-a-spec.md, step 8).
DEFAULT_KL = {"mean": 1e-6, "p90": 2e-6, "max": 1e-5}


# The float64 gate: KL mean and max over the golden's steps of our float64 reference()
# against transformers' model run in float64 on the golden's tokens. float32's own spread
# (1e-10 .. 2e-8) hides a semantic error as small as an RMSNorm epsilon 10x or 100x off, a
# gelu for gelu_new, a rope_theta 0.1% off (KL 3e-11 .. 3e-7 on the toys); float64's floor,
# set by transformers' float32 islands (RoPE's cos/sin, RMSNorm's and the eager softmax's
# float32), is at most 3.4e-13 mean and 1.3e-11 max over every causal golden (GPT-Neo's
# attention, which casts query and key to float32): docs/writing-a-spec.md, "What float64
# sees". Each bound is 30x the worst floor.
FLOAT64_KL = {"mean": 1e-11, "max": 4e-10}


# One gate for every family is loose for most: GPT-Neo's floor sets it, and a Llama toy's
# floor is 4e-15, so an RMSNorm epsilon halved (KL mean 7e-12) passed it (found by a new
# user's trial). A golden's own floor (``float64.floor``: our float64 reference against its
# float64 rows, measured when the spec serving it was verified, or when it was recorded)
# tightens each bound to FLOOR_MARGIN x that floor. Our float64 sums differ between BLAS
# kernels by ~1e-16 relative, KL ~1e-30: far inside FLOOR_LEAST, the least a bound falls to.
FLOOR_MARGIN = 30
FLOOR_LEAST = {"mean": 1e-16, "max": 1e-15}


def _spec_float64(spec) -> dict:
    """The spec's ``validation.float64`` (``{gate: {mean, max}, why}``), or {}."""
    given = spec.get("validation", "float64", default=None) if spec is not None else None
    return given if isinstance(given, dict) else {}


def float64_gate(golden: Golden, steps: int | None = None, spec=None) -> dict[str, float]:
    """The float64 KL bounds (mean, max) ``golden`` is judged by over its first ``steps``
    (default all): ``FLOAT64_KL``, or, bound by bound, what ``spec``'s
    ``validation.float64.gate`` gives (with its ``why``: a float32 island in transformers'
    float64 model that lifts the family's floor); each then at most ``FLOOR_MARGIN`` x the
    golden's own floor where its meta records one (``float64.floor``: mean, max), never
    below ``FLOOR_LEAST``. Over fewer steps than the golden holds, the mean is bounded by
    the floor's max (a part's mean can exceed the whole's; never its max)."""
    f64 = golden.meta.get("float64") or {}
    given = _spec_float64(spec).get("gate") or {}
    gate = {**FLOAT64_KL, **{k: float(v) for k, v in given.items() if k in FLOAT64_KL}}
    floor = {k: float(v) for k, v in (f64.get("floor") or {}).items() if k in gate}
    if steps is not None and steps < golden.steps and "max" in floor:
        floor["mean"] = floor["max"]
    return {k: min(b, max(FLOOR_MARGIN * floor[k], FLOOR_LEAST[k])) if k in floor else b
            for k, b in gate.items()}


def _prompt_rounds(lm) -> bool:
    """Whether ``lm``'s prompt chunk rounds x: to bfloat16 (``--prefill-weights bfloat16``:
    float32 weights' bfloat16 tiles, bfloat16 rows met as ``held.RoundingX``), or to 8 bits a
    block against weights held as Q8_0, as llama.cpp's GEMMs do (operators/_cpu_held_gemm.h)."""
    return lm.prefill_weights != "float32" or getattr(lm, "prompt_rounds", False)


def reduced(lm) -> bool:
    """Whether ``lm`` (a CausalLM) computes in reduced precision somewhere check judges by a
    reduced gate: decode weights that round, a prompt chunk that rounds x, a bfloat16 KV
    cache, weights converted at load, a block form held as stored (its decode GEMV rounds x to
    8 bits: ``held_blocks``)."""
    return lm.decode_weights in REDUCED_KL or _prompt_rounds(lm) or \
        lm.kv_cache != "float32" or getattr(lm, "weights", "stored") in WEIGHTS_KL or \
        held_blocks(lm) is not None


def kl_gate(loaded: Loaded, golden: Golden | None = None) -> dict[str, float]:
    """The KL bounds (mean, p90, max; top1_mismatches where some are allowed) check judges
    by: the reduced decode weights' own (``REDUCED_KL``), else that of a prompt chunk that
    rounds x (``PREFILL_KL``: ``_prompt_rounds``), else a bfloat16 KV cache's
    (``KV_CACHE_KL``), else the spec's ``validation.kl`` bound by bound over float32's
    default (``DEFAULT_KL``); weights converted at load (``conversion_gate``: against
    ``golden``, the one judging, twice llama.cpp's cost on its model where it records one),
    or the gate of the fewest-bit block form held as stored (``held_blocks``), first, bound
    by bound the looser of theirs and the others'."""
    converted = conversion_gate(getattr(loaded.lm, "weights", "stored"), golden) or \
        WEIGHTS_KL.get(held_blocks(loaded.lm))
    if converted is not None:
        others = [REDUCED_KL.get(loaded.lm.decode_weights)] + \
            [PREFILL_KL if _prompt_rounds(loaded.lm) else None] + \
            [KV_CACHE_KL if loaded.lm.kv_cache != "float32" else None]
        gate = dict(converted)
        for o in others:
            if o is not None:
                gate = {k: max(v, o.get(k, v)) for k, v in gate.items()}
        return gate
    if loaded.lm.decode_weights in REDUCED_KL:
        return dict(REDUCED_KL[loaded.lm.decode_weights])
    if _prompt_rounds(loaded.lm):
        return dict(PREFILL_KL)
    if loaded.lm.kv_cache != "float32":
        return dict(KV_CACHE_KL)
    given = loaded.expanded.spec.get("validation", "kl", default={}) or {}
    return {**DEFAULT_KL, **{k: float(v) for k, v in given.items() if k in DEFAULT_KL}}


def loosened(spec, which: str, encoder: bool = False) -> str | None:
    """What a check's line says where ``spec`` loosens a gate past its default: ``which``
    ``kl`` (``validation.kl`` over ``DEFAULT_KL``) or ``float64`` (``validation.float64``'s
    gate over ``FLOAT64_KL``, an encoder's ``max`` over ``ENCODER_FLOAT64_ATOL``), the
    bounds raised and the spec's ``why``; None where it loosens nothing."""
    given = spec.get("validation", which, default=None)
    if not isinstance(given, dict):
        return None
    bounds = given.get("gate") if which == "float64" else given
    default = ({"max": ENCODER_FLOAT64_ATOL} if encoder else FLOAT64_KL) \
        if which == "float64" else DEFAULT_KL
    raised = [f"{k} {float(v):.3g} over {default[k]:.3g}" for k, v in (bounds or {}).items()
              if k in default and isinstance(v, (int, float)) and v > default[k]]
    if not raised:
        return None
    return (f"gate loosened by {spec.file}'s validation.{which} ({', '.join(raised)}): "
            f"{given.get('why') or 'no reason given'}")


ENCODER_ATOL = 1e-5  # float32 against transformers' float32: a few ulps of order-one values
# Our float64 reference() against transformers' encoder in float64 (hidden states and pooled,
# max absolute error); docs/writing-a-spec.md ("What float64 sees") gives the floor.
ENCODER_FLOAT64_ATOL = 1e-12
ENCODER_FLOOR_LEAST = 1e-14  # float64 values of order one differ between BLAS kernels by ~1e-16


def encoder_float64_gate(golden, spec=None) -> float:
    """The max |error| bound an encoder golden's float64 outputs judge our float64
    reference() by: ``ENCODER_FLOAT64_ATOL`` (30x above 3.1e-15, the worst floor of an
    encoder golden whose transformers model is float64 throughout), or the bound ``spec``'s
    ``validation.float64.gate.max`` gives (with its ``why``: the float32 island in
    transformers' float64 model, RoPE's cos/sin, RMSNorm's or the softmax's float32, that
    lifts its floor to 3e-8 .. 8e-7); at most ``FLOOR_MARGIN`` x the golden's own floor
    where its meta records one (``float64.floor``: the larger max |error| of hidden states
    and pooled), never below ``ENCODER_FLOOR_LEAST``."""
    f64 = golden.meta.get("float64") or {}
    gate = float((_spec_float64(spec).get("gate") or {}).get("max") or ENCODER_FLOAT64_ATOL)
    if f64.get("floor") is not None:  # its own floor, as float64_gate's
        gate = min(gate, max(FLOOR_MARGIN * float(f64["floor"]), ENCODER_FLOOR_LEAST))
    return gate


def encoder_pooling(loaded: Loaded, golden: EncoderGolden | None):
    """The pooling ``golden`` is judged with: the spec's, or for bert's older goldens
    (``pooling == "mean"``) transformers' mean pooling, unnormalized, as they hold it."""
    pooling = loaded.model.config.pooling
    if golden is not None and golden.pooling == "mean":
        pooling = dataclasses.replace(pooling, kind="mean", normalize=False)
    return pooling


def encoder_float64(loaded: Loaded, golden: EncoderGolden) -> checks.Result:
    """An encoder's float64 check: its float64 ``reference()`` against ``golden``'s float64
    hidden states and pooled embeddings, within ``encoder_float64_gate``."""
    pooling = encoder_pooling(loaded, golden)
    states = loaded.model.version(dataclasses.replace(pooling, kind="none", normalize=False))
    result = checks.float64_encoder_against(states, loaded.model.version(pooling), golden.probes,
                                            golden.hidden64, golden.pooled64,
                                            encoder_float64_gate(golden, loaded.expanded.spec),
                                            golden.global_masks)
    return said(result, loosened(loaded.expanded.spec, "float64", encoder=True))


def said(result: checks.Result, note: str | None) -> checks.Result:
    """``result`` with ``note`` (a loosened gate, ``loosened``) added to its figure."""
    if note:
        result.figure += f"; {note}"
        result.numbers["loosened"] = note
    return result


def floor(loaded: Loaded, golden: Golden | EncoderGolden) -> tuple[checks.Result, Any]:
    """The float64 check of ``loaded`` against ``golden``'s float64 rows under its present
    gate, and the floor it measures: KL ``{"mean", "max"}`` over its steps (causal), or the
    larger max |error| of hidden states and pooled embeddings (encoder). A floor is worth
    recording (``with_floor``) only where the check passed: what the spec serving the golden
    measures, so ``FLOOR_MARGIN`` x it judges every later edit of that spec.

    Raises:
        GoldenError: ``golden`` holds no float64 rows.
    """
    if isinstance(golden, EncoderGolden):
        result = encoder_float64(loaded, golden)
        return result, max(result.numbers["hidden_max_error"], result.numbers["pooled_max_error"])
    result = checks.float64_against(loaded.lm, golden,
                                    float64_gate(golden, spec=loaded.expanded.spec))
    return result, {"mean": result.numbers["mean"], "max": result.numbers["max"]}


def with_floor(meta: dict, value: Any) -> dict:
    """``meta`` (a golden's) with ``value`` recorded as its float64 floor."""
    return {**meta, "float64": {**(meta.get("float64") or {}), "floor": value}}
