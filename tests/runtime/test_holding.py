"""Weights held as stored (runtime.holding): a bfloat16 safetensors file is read in place
(views of the mapped file, no float32 copy), conversions at load give llama.cpp's bytes, a
damaged held tensor is refused, and a run's memory is bounded by what it holds.
"""

from __future__ import annotations

import json
import mmap
import subprocess
import sys
import textwrap
from pathlib import Path

import gguf
import ml_dtypes
import numpy as np
import pytest

from iron_spec.spec.build import load_model
from iron_spec.operators import held
from iron_spec.runtime.checkpoint import CheckpointError
from iron_spec.runtime.session import Session
from tests.conftest import SPECS, toy_config

LLAMA = SPECS / "llama3.yaml"


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """``tensors`` (float32, float16 or ml_dtypes.bfloat16) as a safetensors file, written by
    hand as the format lays it out (safetensors' numpy writer takes no bfloat16)."""
    names = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
             np.dtype(ml_dtypes.bfloat16): "BF16"}
    header, at, blobs = {}, 0, []
    for name, t in tensors.items():
        blob = np.ascontiguousarray(t).tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [at, at + len(blob)]}
        at += len(blob)
        blobs.append(blob)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little") + head)
        for blob in blobs:
            f.write(blob)


def toy_checkpoint(folder: Path, dtype=ml_dtypes.bfloat16, **config) -> tuple[Path, dict]:
    """The llama3 spec's toy (with ``config`` changes) drawn at seed 0 and written as a
    checkpoint folder of ``dtype`` tensors; returns it and the float32 values it holds."""
    toy_config(folder, "llama3", **config)
    drawn = load_model(LLAMA, checkpoint=folder, random_weights=0, max_seq_len=64)
    stored = {n: t.astype(dtype) for n, t in drawn.checkpoint_tensors().items()}
    write_safetensors(folder / "model.safetensors", stored)
    return folder, {n: t.astype(np.float32) for n, t in stored.items()}


def test_bfloat16_safetensors_are_held_as_views_of_the_mapped_file(tmp_path):
    folder, values = toy_checkpoint(tmp_path)
    loaded = load_model(LLAMA, checkpoint=folder, max_seq_len=64)
    params = dict(loaded.lm.named_params())
    maps = set()
    for name, p in params.items():
        if p.holdable:
            assert p.array.dtype == ml_dtypes.bfloat16, name
            assert not p.array.flags.writeable, name  # the file's pages, read in place
            base = p.array
            while isinstance(base, np.ndarray):
                base = base.base
            maps.add(base.obj)  # a view of the buffer numpy was given: the mapping
        else:
            assert p.array.dtype == np.float32, name  # norms
        assert np.array_equal(held.widen_all(p.array), values[name]), name
    (mapping,) = maps
    assert isinstance(mapping, mmap.mmap)
    assert len(mapping) == (folder / "model.safetensors").stat().st_size


def test_held_bfloat16_runs_and_checks_as_float32_does(tmp_path):
    folder, _ = toy_checkpoint(tmp_path)
    stored = load_model(LLAMA, checkpoint=folder, max_seq_len=64)
    wide = load_model(LLAMA, checkpoint=folder, max_seq_len=64, weights="float32")
    assert all(p.array.dtype == np.float32 for _, p in wide.lm.named_params())
    ids = [1, 5, 9, 200, 3, 77, 12]
    a, b = Session(stored.lm).logits(ids), Session(wide.lm).logits(ids)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * np.abs(b).max())
    # Every compiled step (decode and prompt chunk) within its tolerance of its reference.
    for prompt in (True, False):
        version = stored.lm.version(prompt, check=True)
        if prompt:
            version(np.array(ids + [0] * (version.capacity - len(ids))), start=0, rows=len(ids))
        else:
            version(token=4, position=len(ids))
        assert version.plan.checked


@pytest.mark.parametrize("weights", ["q8_0", "q4_0", "q5_1"])
def test_a_conversion_at_load_holds_llama_cpps_bytes(tmp_path, weights):
    folder, values = toy_checkpoint(tmp_path, dtype=np.float32)
    loaded = load_model(LLAMA, checkpoint=folder, max_seq_len=64, weights=weights)
    params = list(loaded.lm.named_params())
    output = {id(p) for name, p in params if name == "lm_head.weight"}
    assert output
    for name, p in params:
        if p.holdable:
            # llama.cpp's quantizer keeps the output matrix (tied or not) at Q8_0 where its
            # rows are not whole 256-value blocks (Q6_K where they are; here Q8_0 always)
            form = "Q8_0" if id(p) in output and weights != "q8_0" else weights.upper()
            assert held.form(p.array) == form, name
            want = gguf.quants.quantize(values[name], gguf.GGMLQuantizationType[form])
            assert p.array.data.tobytes() == want.tobytes()
    ids = [1, 5, 9]
    assert np.isfinite(Session(loaded.lm).logits(ids)).all()


def test_bfloat16_at_load_rounds_to_nearest(tmp_path):
    folder, values = toy_checkpoint(tmp_path, dtype=np.float32)
    loaded = load_model(LLAMA, checkpoint=folder, max_seq_len=64, weights="bfloat16")
    w = dict(loaded.lm.named_params())["model.layers.1.self_attn.o_proj.weight"].array
    assert w.dtype == ml_dtypes.bfloat16
    want = values["model.layers.1.self_attn.o_proj.weight"].astype(ml_dtypes.bfloat16)
    assert w.tobytes() == want.tobytes()


def test_a_held_tensor_holding_nan_is_refused_naming_it(tmp_path):
    folder, values = toy_checkpoint(tmp_path)
    tensors = {n: v.astype(ml_dtypes.bfloat16) for n, v in values.items()}
    tensors["model.layers.1.mlp.up_proj.weight"][3, 5] = np.nan
    write_safetensors(folder / "model.safetensors", tensors)
    with pytest.raises(CheckpointError, match=r"model.layers.1.mlp.up_proj.weight holds 1 NaN"):
        load_model(LLAMA, checkpoint=folder, max_seq_len=64)


def test_an_unknown_weights_choice_is_refused(tmp_path):
    folder, _ = toy_checkpoint(tmp_path)
    with pytest.raises(ValueError, match="weights='q3_k' is not one of stored, float32"):
        load_model(LLAMA, checkpoint=folder, max_seq_len=64, weights="q3_k")


# A run in a process of its own, measuring itself: the peak resident memory over what it
# held before loading (Python, numpy, the package) is the weights as held, the KV cache, and
# a bounded rest (the compiled plans' arenas and tables; the tokenizer is absent here).
MEASURE = textwrap.dedent("""
    import sys, json
    import numpy as np
    from iron_spec.spec.build import load_model
    from iron_spec.operators import held
    from iron_spec.runtime.session import Session

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) * 1024

    base = status("VmRSS:")
    loaded = load_model(sys.argv[1], checkpoint=sys.argv[2], max_seq_len=256, weights=sys.argv[3])
    Session(loaded.lm).logits(list(range(1, 40)))
    weights = sum(held.nbytes(p.array) for _, p in loaded.lm.named_params() if p.array is not None)
    cache = loaded.lm.cache_bytes()[0]
    print(json.dumps({"peak": status("VmHWM:") - base, "weights": weights, "cache": cache}))
""")


def measured(folder: Path, weights: str) -> dict:
    run = subprocess.run([sys.executable, "-c", MEASURE, str(LLAMA), str(folder), weights],
                         capture_output=True, text=True, check=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="measures /proc/self/status")
def test_peak_memory_is_the_weights_as_held_and_the_cache(tmp_path):
    # 107 MB of bfloat16 weights (measured: peak 127 MB over the start); float32, 229 MB.
    folder, _ = toy_checkpoint(tmp_path, hidden_size=1024, intermediate_size=2816,
                               num_hidden_layers=4, num_attention_heads=16,
                               num_key_value_heads=4, head_dim=64, vocab_size=4096)
    stored = measured(folder, "stored")
    assert stored["weights"] > 50e6
    overhead = 40e6  # plans, arenas, RoPE tables, the prompt chunk's activations
    assert stored["peak"] <= 1.15 * (stored["weights"] + stored["cache"]) + overhead, stored
    wide = measured(folder, "float32")  # the bound tells the two apart
    assert wide["peak"] > 1.15 * (stored["weights"] + stored["cache"]) + overhead, wide


def test_rows_that_are_not_whole_blocks_say_which_forms_would_hold_them():
    # Found by a new user's trial: zamba2's rank-8 adapters under --weights q8_0 named the
    # tensor but not what would work.
    from iron_spec.runtime.holding import convert
    with pytest.raises(ValueError, match=r"^adapter: rows of 8 values are not whole Q8_0 blocks "
                                         r"of 32, so this model cannot be held as Q8_0; hold it "
                                         r"as stored, bfloat16 or float32"):
        convert(np.ones((4, 8), np.float32), "Q8_0", "adapter")
