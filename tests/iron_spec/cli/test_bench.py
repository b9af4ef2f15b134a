"""``iron-spec bench``'s figures and ratios, on the toy at a short context (the figures'
values are timings: never asserted, only that each is measured and each ratio is the
quotient of its own figures)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from iron_spec.cli import bench
from iron_spec.spec.build import load_model, use_decode_weights, use_prefill_weights
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


@pytest.mark.skipif(native.LIB is None, reason="reduced decode weights need the decode pool")
def test_each_kv_cache_is_measured_at_each_decode_weights(short):
    loaded = load_model(SPECS / "llama3.yaml", random_weights=0, toy=True)
    use_decode_weights(loaded, "int8")
    r = bench.measure(loaded, runs=1, peer=False, also=("int8",), also_kv=("bfloat16",))
    assert r["kv_cache"] == "float32" and r["also_kv_caches"] == ["bfloat16"]
    q, deep = r["ratios"], "decode_deep_tokens_per_s"
    for w in ("float32", "int8"):
        mine = r[bench.kv_side(w, "bfloat16")]
        base = r["ours" if w == "float32" else "ours int8"]
        assert q[f"{w}_bfloat16_cache_deep_vs_float32_cache"] == pytest.approx(
            mine[deep] / base[deep])
        assert q[f"{w}_bfloat16_cache_deep_vs_short_decode"] == pytest.approx(
            mine[deep] / mine["decode_short_tokens_per_s"])
    # The model is left as it was: its own cache, decode weights, compiled versions.
    assert loaded.lm.kv_cache == "float32" and loaded.lm.decode_weights == "float32"
    assert all(s.array.dtype == np.float32 for _, s in loaded.lm.named_states())
    assert "decode at 40, int8, bfloat16 KV" in bench.report(r)


def test_no_llama_cpp_installed_is_no_peer(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails
    loaded = load_model(SPECS / "llama3.yaml", random_weights=0, toy=True)
    assert bench.gguf_peer(loaded, tmp_path / "x.gguf", 1) is None


class _FakeLlama:
    """llama_cpp.Llama's surface bench uses, with the tensor type its file's name says."""

    def __init__(self, model_path, **kwargs):
        self.metadata = {"general.file_type": "7" if "q8_0" in model_path else "32"}

    def n_vocab(self):
        return 1 << 20

    def reset(self):
        pass

    def eval(self, ids):
        pass

    def generate(self, ids, **kwargs):
        while True:
            yield 1


@pytest.mark.skipif(native.LIB is None, reason="reduced decode weights need the decode pool")
def test_each_decode_weights_meets_the_gguf_of_its_bits(short, monkeypatch, tmp_path):
    import types
    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=_FakeLlama))
    files = [tmp_path / "m.q8_0.gguf", tmp_path / "m.bf16.gguf"]
    for f in files:
        f.write_bytes(b"")
    loaded = load_model(SPECS / "llama3.yaml", random_weights=0, toy=True)
    use_decode_weights(loaded, "int8")
    r = bench.measure(loaded, runs=1, peer=True, gguf=files, also=("int8",))
    assert set(r["llama.cpp_runs"]) == {"llama.cpp Q8_0", "llama.cpp BF16"}
    q = r["ratios"]
    assert q["int8_decode_vs_llama_cpp_Q8_0"] == pytest.approx(
        r["ours int8"]["decode_short_tokens_per_s"] / r["llama.cpp Q8_0"]["decode_short_tokens_per_s"])
    assert "int8_decode_vs_llama_cpp_BF16" not in q and "float32_decode_vs_llama_cpp_Q8_0" not in q
    assert q["decode_vs_llama_cpp"] == pytest.approx(  # the first file's
        r["ours"]["decode_short_tokens_per_s"] / r["llama.cpp Q8_0"]["decode_short_tokens_per_s"])
    assert q["float32_decode_vs_read_floor"] > 0
    text = bench.report(r)
    assert "m.q8_0.gguf (Q8_0)" in text and "m.bf16.gguf (BF16)" in text


def test_each_prefill_weights_is_measured_beside_the_first(short, monkeypatch, tmp_path):
    import types
    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=_FakeLlama))
    files = [tmp_path / "m.bf16.gguf"]
    files[0].write_bytes(b"")
    loaded = load_model(SPECS / "llama3.yaml", random_weights=0, toy=True)
    use_prefill_weights(loaded, "bfloat16")
    assert loaded.lm.prefill_weights == "float32"  # compiled, and back to the model's own
    r = bench.measure(loaded, runs=1, peer=True, gguf=files, also_prefill=("bfloat16",))
    mine, q = r["ours prefill bfloat16"], r["ratios"]
    assert set(mine) == {"ttft128_s", "ttft512_s", "prefill128_tokens_per_s",
                         "prefill512_tokens_per_s"}
    assert q["bfloat16_prefill512_vs_float32"] == pytest.approx(
        r["ours"]["ttft512_s"] / mine["ttft512_s"], rel=1e-12, abs=0)
    assert q["bfloat16_prefill128_vs_llama_cpp_BF16"] == pytest.approx(
        r["llama.cpp BF16"]["ttft128_s"] / mine["ttft128_s"], rel=1e-12, abs=0)
    assert loaded.lm.prefill_weights == "float32"
    assert any(a.ndim == 4 for a in loaded.lm.packed.values())  # the tiles, counted in weights
    assert "prefill 512 tokens, bfloat16" in bench.report(r)


def test_a_context_at_most_gives_way_to_a_shorter_model():
    toy = dict(random_weights=0, toy=True)  # the toy's own context: 512
    assert load_model(SPECS / "llama3.yaml", context_at_most=4096, **toy).lm.config.max_seq_len == 512
    assert load_model(SPECS / "llama3.yaml", context_at_most=300, **toy).lm.config.max_seq_len == 300
    # a max_seq_len asked for is the user's: the cap does not touch it
    assert load_model(SPECS / "llama3.yaml", context_at_most=300, max_seq_len=400,
                      **toy).lm.config.max_seq_len == 400


# Found by a new user's trial: with llama-cpp-python (or torch) absent, --gguf FILE ran for
# minutes and the report said nothing of the peer it could not measure.
@pytest.mark.skipif(native.LIB is None, reason="reduced decode weights need the decode pool")
def test_a_peer_not_installed_is_said_not_measured(short, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails
    monkeypatch.setattr(bench, "transformers_peer", lambda loaded, n: None)
    loaded = load_model(SPECS / "llama3.yaml", random_weights=0, toy=True)
    r = bench.measure(loaded, runs=1, peer=True, gguf=[tmp_path / "m.q8_0.gguf"])
    text = bench.report(r)
    assert ("llama.cpp: not measured: llama-cpp-python is not installed (pip install -e "
            "'.[peer]'; it builds from source, minutes), so m.q8_0.gguf went unread") in text
    assert "transformers: not measured: torch and transformers are not installed" in text
    assert r["not_measured"].keys() == {"llama.cpp", "transformers"}
    # --no-peer asks for none: nothing said missing
    assert bench.measure(loaded, runs=1, peer=False)["not_measured"] == {}


@pytest.mark.skipif(native.LIB is None, reason="reduced decode weights need the decode pool")
def test_the_memory_line_tells_decode_copies_from_prefill_tiles(short):
    # Found by a new user's trial: the prompt chunk's bfloat16 tiles were counted among the
    # decode steps' reduced copies.
    loaded = load_model(SPECS / "llama3.yaml", random_weights=0, toy=True)
    use_decode_weights(loaded, "int8")
    use_prefill_weights(loaded, "bfloat16")
    r = bench.measure(loaded, runs=1, peer=False, also=("int8",), also_prefill=("bfloat16",))
    # Told apart here by their dtypes, not as bench does (by the plan each was packed for):
    # with int8 decode weights the only bfloat16 bits are the tiles, the only int8 Q8_0's.
    tiles = sum(a.nbytes for a in loaded.lm.packed.values() if a.dtype == np.uint16)
    q8 = sum(a.nbytes for a in loaded.lm.packed.values() if a.dtype == np.uint8)
    assert tiles > 0 and q8 > 0
    assert r["reduced_prefill_weights_bytes"] == tiles
    assert r["reduced_decode_weights_bytes"] == q8
    text = bench.report(r)
    assert "MiB the decode steps' reduced copies: int8; " in text
    assert "MiB the prompt chunk's bfloat16 tiles)" in text


def test_the_lines_are_true_to_what_ran(short, monkeypatch):
    # Found by a new user's trial: "[loading transformers' model]" then "not installed";
    # bfloat16 tiles named on an all-float32 run; a peak RSS far below the process's own.
    monkeypatch.setattr(bench, "transformers_installed", lambda: False)
    loaded = load_model(SPECS / "llama3.yaml", random_weights=0, toy=True)
    stages = []
    r = bench.measure(loaded, runs=1, peer=True, stage=stages.append)
    assert not any("transformers" in s for s in stages), stages
    assert "transformers" in r["not_measured"]
    assert "bfloat16 tiles" not in r["decode_kernels"]
    assert r["process_peak_rss_bytes"] >= r["ours"]["peak_rss_bytes"]
    text = bench.report(r)
    assert "through iron-spec's own figures" in text and "peak RSS of the whole process" in text
    # No peer ran: none named (it said "and the peers' models").
    assert "MiB: the above and the floor's two 1 GiB copy arrays\n" in text, text
    assert "peers" not in text and "transformers' model" not in text
    r["transformers"] = r["ours"]
    assert "MiB: the above, the floor's two 1 GiB copy arrays and transformers' model\n" in \
        bench.report(r)
    if native.LIB is not None:
        use_prefill_weights(loaded, "bfloat16")
        tiles = bench.measure(loaded, runs=1, peer=False, also_prefill=("bfloat16",))
        assert "on bfloat16 tiles" in tiles["decode_kernels"]
        assert "held bfloat16 rows" not in tiles["decode_kernels"]


@pytest.mark.skipif(native.LIB is None, reason="bfloat16 prompt GEMMs need operators._cpu")
def test_a_bfloat16_prompt_on_held_bfloat16_rows_is_not_said_to_run_on_tiles(short):
    # Found by the lead: --prefill-weights bfloat16 on weights held as bfloat16 reads the
    # held rows in place (held.RoundingX, no tiles), and the header said "on bfloat16 tiles".
    from iron_spec.operators import held
    loaded = load_model(SPECS / "llama3.yaml", random_weights=0, toy=True, weights="bfloat16")
    r = bench.measure(loaded, runs=1, peer=False, also_prefill=("bfloat16",))
    assert not any(a.ndim == 4 for a in loaded.lm.packed.values())  # no tiles were made
    assert any(isinstance(a, held.RoundingX) for a in loaded.lm.packed.values())
    assert "bfloat16 tiles" not in r["decode_kernels"], r["decode_kernels"]
    assert "on the held bfloat16 rows in place" in r["decode_kernels"]


def test_max_seq_len_says_why_its_least_is_what_it_is(monkeypatch):
    import typer.rich_utils
    from typer.testing import CliRunner
    from iron_spec.cli.app import app
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", 400)  # each help on one line
    text = " ".join(CliRunner().invoke(app, ["bench", "-h"]).output.split())
    assert "at least 2065, as the deep decode draws 65 tokens after a 2000-token prompt" in text


def test_quick_measures_the_short_prompt_and_decode_alone(short, monkeypatch):
    # --quick: a large model's bench on a small machine (the 512-token prompt and the deep
    # decode take minutes each there), the figures and ratios left out said as such.
    monkeypatch.setattr(bench, "PROMPTS", bench.PROMPTS[:1])
    monkeypatch.setattr(bench, "DEEP_DECODE", False)
    loaded = load_model(SPECS / "llama3.yaml", random_weights=0, toy=True, weights="q8_0")
    r = bench.measure(loaded, runs=1, peer=False)
    assert set(r["ours"]) >= {"ttft128_s", "decode_short_tokens_per_s"}
    assert "ttft512_s" not in r["ours"] and "decode_deep_tokens_per_s" not in r["ours"]
    assert r["ratios"]["deep_vs_short_decode"] is None
    assert r["weights_held"].startswith("Q8_0")
    text = bench.report(r)
    assert "decode at 8" in text and "decode at 40" not in text and "as held (Q8_0" in text
    # The header names the weights the versions read, not the float32 of no reduced copy
    # (found on a bf16-held 1B run whose header said "float32 decode weights").
    assert "weights read as held (Q8_0" in text.splitlines()[0], text.splitlines()[0]
    assert "float32 decode weights" not in text


@pytest.mark.skipif(native.LIB is None, reason="reduced decode weights need the decode pool")
def test_a_gguf_checkpoint_has_no_transformers_peer(short, monkeypatch):
    # Found at this stop: bench on a GGUF checkpoint with transformers installed failed
    # building transformers' model from a config.json the file does not have.
    import dataclasses

    from iron_spec.runtime.gguf import GGUFCheckpoint

    def built(loaded, n):
        raise AssertionError("transformers' model built for a GGUF checkpoint")
    monkeypatch.setattr(bench, "transformers_installed", lambda: True)
    monkeypatch.setattr(bench, "transformers_peer", built)
    loaded = load_model(SPECS / "llama3.yaml", random_weights=0, toy=True)
    loaded = dataclasses.replace(loaded, checkpoint=object.__new__(GGUFCheckpoint))
    r = bench.measure(loaded, runs=1, peer=True)
    assert r["not_measured"] == {"transformers": "the checkpoint is a GGUF file, which "
                                                 "transformers' model is not built from here"}
