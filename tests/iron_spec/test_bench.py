"""``iron-spec bench``'s figures and ratios, on the toy at a short context (the figures'
values are timings: never asserted, only that each is measured and each ratio is the
quotient of its own figures)."""

from __future__ import annotations

import sys

import pytest

from iron_spec import bench
from iron_spec.build import load_model, use_decode_weights
from iron_spec.operators import native
from tests.conftest import SPECS


@pytest.fixture
def short(monkeypatch):
    """The toy's 512 positions: the deep decode at 40, 4 tokens drawn, a small copy."""
    monkeypatch.setattr(bench, "SHORT", 8)
    monkeypatch.setattr(bench, "DEEP", 40)
    monkeypatch.setattr(bench, "DECODE", 4)
    monkeypatch.setattr(bench, "COPY_ELEMENTS", 2**16)


@pytest.mark.skipif(native.LIB is None, reason="reduced decode weights need the decode pool")
def test_each_decode_weights_is_measured_beside_the_first(short):
    loaded = load_model(SPECS / "llama3.yaml", random_weights=0, toy=True)
    use_decode_weights(loaded, "int8")
    assert loaded.lm.decode_weights == "float32"  # compiled, and back to the model's own
    r = bench.measure(loaded, runs=1, peer=False, also=("int8",))
    assert r["ours"]["decode_short_tokens_per_s"] > 0 and r["ours int8"]["decode_short_tokens_per_s"] > 0
    q = r["ratios"]
    want = r["ours int8"]["decode_short_tokens_per_s"] / r["ours"]["decode_short_tokens_per_s"]
    assert q["int8_decode_vs_float32"] == pytest.approx(want)
    assert q["int8_decode_vs_bandwidth_floor"] > 0 and q["decode_vs_llama_cpp"] is None
    assert loaded.lm.decode_weights == "float32"
    text = bench.report(r)
    assert "decode at 8, int8" in text and "llama.cpp" not in text.split("ratios:")[0]


def test_no_llama_cpp_installed_is_no_peer(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails
    loaded = load_model(SPECS / "llama3.yaml", random_weights=0, toy=True)
    assert bench.gguf_peer(loaded, tmp_path / "x.gguf", 1) is None
