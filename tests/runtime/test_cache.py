"""KV caches that grow with the sequence, and sliding-window layers that hold only a ring.

Each test runs the same weights twice: once with the caches as they grow (or as rings),
once with every cache holding the whole context from the start (no growth, no ring), and
the two must give the same logits bit for bit; the float64 reference, which holds every
position, judges the compiled run where a long sequence is cheaper to check that way.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from iron_spec.spec.build import load_model
from iron_spec.runtime.blocks.attention import AttentionOptions
from iron_spec.runtime.blocks.mlp import MLPOptions
from iron_spec.runtime.blocks.norms import NormOptions
from iron_spec.runtime.blocks.rope import RopeOptions
from iron_spec.runtime.layers import LayerOptions
from iron_spec.runtime.causal import CausalLM, CausalOptions, Decoder
from iron_spec.runtime.checkpoint import fill
from iron_spec.runtime.session import Session
from iron_spec.runtime.weights import draw_weights
from tests.conftest import SPECS

GEMMA3 = SPECS / "gemma3.yaml"  # its toy: windows of 8 positions, prefill_chunk 16


def toy(whole: bool = False, monkeypatch=None) -> CausalLM:
    """Gemma 3's toy at seed 0; ``whole``: every cache holds the whole context up front."""
    if whole:
        monkeypatch.setattr(Decoder, "_hold_window", staticmethod(lambda *a: None))
    lm = load_model(GEMMA3, random_weights=0, toy=True).lm
    if whole:
        monkeypatch.undo()
        lm.reserve(lm.config.max_seq_len)
    return lm


def ids(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, 256, n).tolist()


def test_sliding_layers_hold_a_ring_and_full_layers_grow_in_blocks():
    lm = toy()
    C, L = lm.config.prefill_chunk, lm.config.max_seq_len
    attn = [layer.self_attn for layer in lm.model.layers]
    windows = [a.options.window for a in attn]
    assert windows == [8, None, 8, None]
    assert [a.keys.ring for a in attn] == [8 + C - 1, None, 8 + C - 1, None]
    assert [a.keys.shape[1] for a in attn] == [8 + C - 1, L, 8 + C - 1, L]
    assert lm.reserved == C and all(a.keys.capacity == C for a in attn)
    Session(lm).logits(ids(3 * C + 1))  # positions 0 .. 3C: four blocks
    assert lm.reserved == 4 * C
    # The RoPE tables hold the rows of the positions reserved, no more.
    assert all(t.array.shape[0] == 4 * C for ts in lm.rope_tables.values() for t in ts)
    assert [a.keys.capacity for a in attn] == [8 + C - 1, 4 * C, 8 + C - 1, 4 * C]
    now, most = lm.cache_bytes()
    G, D = attn[0].options.kv_heads, attn[0].options.head_dim
    per_position = 2 * G * D * 4  # keys and values, float32
    assert now == per_position * 2 * ((8 + C - 1) + 4 * C)
    assert most == per_position * 2 * ((8 + C - 1) + L)


@pytest.mark.parametrize("block", [None, 5])  # 5: block boundaries inside a prompt chunk
def test_a_prompt_past_the_window_and_across_blocks_gives_the_whole_cache_logits(monkeypatch,
                                                                                 block):
    whole, grown = toy(True, monkeypatch), toy()
    if block is not None:
        grown.block = block
        grown.reserved = 0
        for _, s in grown.named_states():
            s.array = s.array[:, :0].copy()
        grown.reserve(1)
    assert grown.reserved < 40
    prompt = ids(53)
    for n in (7, 24, 40, 53):  # inside the first window, past it, past several blocks
        want = Session(whole).logits(prompt[:n])
        got = Session(grown).logits(prompt[:n])
        assert got.tobytes() == want.tobytes(), n
    # The reference holds every position in float64: the ring's logits are its logits.
    ref = Session(grown, reference=True).logits(prompt)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4 * np.abs(ref).max())


def test_decoding_past_the_window_and_across_blocks_draws_the_whole_cache_tokens(monkeypatch):
    whole, grown = toy(True, monkeypatch), toy()
    C = grown.config.prefill_chunk
    prompt = ids(5, seed=3)
    a, b = Session(whole), Session(grown)
    history = list(prompt)
    for _ in range(3 * C):  # decode steps through blocks 1, 2 and 3, far past the window
        want, got = a.logits(history), b.logits(history)
        assert got.tobytes() == want.tobytes(), len(history)
        history.append(int(np.argmax(got)))
    assert b.calls[-1][0] == "decode" and grown.reserved >= 3 * C
    assert len(set(history[5:])) > 4, "a toy drawing one token over and over proves little"


def test_a_chat_resumes_over_the_ring_bit_for_bit(monkeypatch):
    whole, grown = toy(True, monkeypatch), toy()
    C = grown.config.prefill_chunk
    first = ids(2 * C + 3, seed=4)
    session, other = Session(grown), Session(whole)
    reply = list(session.generate(first, 20))  # decoded past the ring's reach
    assert list(other.generate(first, 20)) == reply
    history = first + reply + ids(C + 2, seed=5)
    session.calls.clear()
    got = session.logits(history)
    # The ring still holds the window before the turn: the turn's tokens alone run (the
    # reply's last token, which no step read, and the new ones), as on the whole cache.
    assert session.calls == [("prompt", len(first) + 19, C), ("prompt", len(first) + 19 + C, 3)]
    assert got.tobytes() == other.logits(history).tobytes() and other.calls[-2:] == session.calls
    # The next turn right after a prompt: its own tokens.
    longer = history + ids(5, seed=6)
    session.calls.clear()
    assert session.logits(longer).tobytes() == other.logits(longer).tobytes()
    assert session.calls == [("prompt", len(history), 5)]
    # A shorter history (an edit of the last turn): the ring holds only later positions.
    session.calls.clear()
    edited = history[: 2 * C + 9]
    assert session.logits(edited).tobytes() == Session(whole).logits(edited).tobytes()
    assert session.calls[0][:2] == ("prompt", 0)


def test_a_refused_history_grows_nothing():
    lm = toy()
    session = Session(lm)
    session.logits(ids(10))
    before = (lm.reserved, [s.array for _, s in lm.named_states()])
    with pytest.raises(ValueError, match="do not fit max_seq_len"):
        session.logits(ids(lm.config.max_seq_len + 1))
    with pytest.raises(IndexError):
        session.logits(ids(100) + [10**6])
    assert lm.reserved == before[0]
    assert all(s.array is a for (_, s), a in zip(lm.named_states(), before[1]))
    assert session.held == 10


def test_a_decode_step_at_position_30000_on_a_toy_with_a_small_window(monkeypatch):
    # One layer of a 4-position window and one of full attention, a 32768-position context.
    # The caches grow to position 30000 through the runtime, hold the same 30000 positions
    # (random keys and values) as a model without a ring, and the decode step there gives
    # that model's logits bit for bit, and its float64 reference's within float32 rounding.
    attention = AttentionOptions(heads=4, kv_heads=2, head_dim=16)
    full = LayerOptions(attention, MLPOptions(32), NormOptions(eps=1e-6))
    window = dataclasses.replace(full, attention=dataclasses.replace(attention, window=4))
    o = CausalOptions(64, 32, (window, full), full.norm,
                      {"default": RopeOptions(10000.0, 16, max_position_embeddings=32768)},
                      max_seq_len=32768, prefill_chunk=64)
    lm = CausalLM(o)
    fill(lm, draw_weights(lm, 0))
    monkeypatch.setattr(Decoder, "_hold_window", staticmethod(lambda *a: None))
    plain = CausalLM(o)  # the same weights, every position at its own row
    for (_, p), (_, q) in zip(lm.named_params(), plain.named_params()):
        q.array = p.array
    position = 30000
    Session(lm).logits(list(range(40)))  # a prompt first: the caches as a session leaves them
    assert lm.reserved == 64
    rng = np.random.default_rng(7)
    for (_, ring), (_, whole) in zip(lm.named_states(), plain.named_states()):
        history = rng.standard_normal((2, position, 16)).astype(np.float32)
        plain.reserve(position)
        whole.array[:, :position] = history
        plain.reference_states[id(whole)] = np.zeros(whole.shape)
        plain.reference_states[id(whole)][:, :position] = history
        lm.reserve(position)
        lo = position - ring.ring if ring.ring is not None else 0
        ring.array[:, np.arange(lo, position) % (ring.ring or position)] = history[:, lo:]
    got = lm.decode_step(token=5, position=position)[0].copy()
    ring, grown = lm.model.layers[0].self_attn.keys, lm.model.layers[1].self_attn.keys
    assert ring.capacity == 4 + 64 - 1 and position + 1 <= grown.capacity <= 1.25 * position + 64
    assert got.tobytes() == plain.decode_step(token=5, position=position)[0].tobytes()
    want = plain.decode_step.reference(token=5, position=position)[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
