"""The golden store under races and bad files (issue 30): two recordings into one path both
survive or the second is refused (found: both said "recorded", one golden was lost), a FIFO
named as a golden or lying in a store is refused rather than waited on forever, an archive
whose member inflates past the bound is refused before it is inflated, a golden of NaN
log-probabilities is refused as such (not blamed on the spec), and a --golden that cannot be
written is refused before anything is recorded.

The race needs no transformers: it drives the write path every recording takes
(``Golden.write``, and ``check._record`` with a stand-in recorder) from two processes and
from threads, each past the before-recording check before either writes. Run 20 times in a
row: ``for i in $(seq 20); do python -m pytest tests/bad/test_golden_store.py -q || break;
done``.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import threading
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from iron_spec.cli.app import app
from iron_spec.runtime.golden import (MAX_MEMBER, Golden, GoldenError, GoldenTaken, load_arrays,
                                      read_npz)
from tests.bad.corpus import LLAMA

runner = CliRunner()


def golden(fingerprint: str, seed: int = 0, vocab: int = 16) -> Golden:
    """A small golden of ``fingerprint``: 3 prompt ids and 2 steps drawn at ``seed``."""
    logits = np.random.default_rng(seed).standard_normal((2, vocab))
    return Golden.from_logits(fingerprint, [1, 2, 3, 4], 3, logits, {"steps": 2})


def within(seconds: float, fn, *args):
    """``fn(*args)`` on a daemon thread; its result or exception, failing the test where it
    is still running after ``seconds`` (a read blocked on a FIFO)."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - the test reads it
            out["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn.__name__} still running after {seconds} s: it hangs"
    if "error" in out:
        raise out["error"]
    return out.get("value")


# -- two writers, one path ---------------------------------------------------------------------

def _writer(path: str, fingerprint: str, seed: int, barrier, results) -> None:
    """One recording's write: past the before-recording check (nothing at ``path``), then,
    once the other writer is past it too, the golden written."""
    path = Path(path)
    assert not path.exists()  # check --record-golden's look before the seconds of recording
    barrier.wait()
    try:
        golden(fingerprint, seed).write(path)
        results.put(("wrote", fingerprint, None))
    except GoldenTaken as e:
        results.put(("refused", fingerprint, e.held))


def _one_survives_the_other_refused(path: Path, outcomes: list[tuple]) -> None:
    wrote = [fp for what, fp, _ in outcomes if what == "wrote"]
    refused = [(fp, held) for what, fp, held in outcomes if what == "refused"]
    assert len(wrote) == 1 and len(refused) == 1, outcomes
    # The one written is whole and is its writer's; the other was told whose it found.
    assert Golden.read(path, wrote[0]).fingerprint == wrote[0]
    assert refused[0][1] == wrote[0]
    assert [p.name for p in path.parent.iterdir()] == [path.name], "a temporary file is left"


def test_two_processes_writing_one_golden_path_never_lose_one(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    path = tmp_path / "store" / "llama3" / "toy.npz"
    procs = [ctx.Process(target=_writer, args=(str(path), f"seed{s}", s, barrier, results))
             for s in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    _one_survives_the_other_refused(path, [results.get(timeout=10) for _ in procs])


def test_threads_writing_one_golden_path_never_lose_one(tmp_path):
    import queue
    for round in range(10):
        barrier, results = threading.Barrier(2), queue.Queue()
        path = tmp_path / str(round) / "g.npz"
        threads = [threading.Thread(target=_writer, args=(str(path), f"seed{s}", s, barrier,
                                                           results)) for s in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        _one_survives_the_other_refused(path, [results.get(timeout=10) for _ in threads])


def test_the_same_inputs_recorded_twice_replace_each_other_and_overwrite_replaces(tmp_path):
    path = tmp_path / "g.npz"
    golden("a", seed=0).write(path)
    golden("a", seed=1).write(path)  # the same inputs again: its own golden, replaced
    assert np.array_equal(Golden.read(path, "a").top_logprobs, golden("a", 1).top_logprobs)
    with pytest.raises(GoldenTaken, match="holds a golden of other inputs .fingerprint a."):
        golden("b").write(path)
    golden("b").write(path, replace=True)  # --overwrite-golden
    assert Golden.read(path).fingerprint == "b"


def test_two_check_record_goldens_into_one_path_keep_both(tmp_path, monkeypatch):
    # check --record-golden's own write path (check._record) from two threads, the
    # recording a stand-in that waits until both are past the check made before it.
    from iron_spec.cli import check
    from iron_spec.spec.build import load_model
    real_find = check.importlib.util.find_spec
    monkeypatch.setattr(check.importlib.util, "find_spec",
                        lambda name, *a: object() if name in ("torch", "transformers")
                        else real_find(name, *a))
    monkeypatch.setattr(check, "_with_floor", lambda loaded, g: (g, "no floor (stand-in)"))
    toys = [load_model(LLAMA, random_weights=s, toy=True) for s in (0, 1)]
    path, barrier, out = tmp_path / "g.npz", threading.Barrier(2), {}

    def record(i):
        def stand_in(module):
            barrier.wait()  # both are past _record's look at the path now
            fp = toys[i].fingerprint()
            return golden(fp, seed=i, vocab=toys[i].lm.config.vocab_size)
        try:
            out[i] = check._record(toys[i], path, stand_in)
        except ValueError as e:
            out[i] = e
    threads = [threading.Thread(target=record, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    fps = [t.fingerprint() for t in toys]
    refused = [i for i in (0, 1) if isinstance(out[i], ValueError)]
    assert len(refused) == 1, out
    first, second = 1 - refused[0], refused[0]
    beside = tmp_path / f"g.{fps[second]}.npz"
    said = str(out[second])
    assert f"holds a golden of other inputs (fingerprint {fps[first]})" in said
    assert f"this golden is kept beside it, {beside}" in said
    assert Golden.read(path, fps[first]).fingerprint == fps[first]
    assert Golden.read(beside, fps[second]).fingerprint == fps[second]


# -- files that are no golden --------------------------------------------------------------------

def test_a_fifo_named_as_a_golden_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "g.npz"
    os.mkfifo(fifo)
    with pytest.raises(GoldenError, match="is a FIFO .named pipe."):
        within(20, load_arrays, fifo)
    result = within(120, runner.invoke, app, ["check", LLAMA, "--toy", "--random-weights", "0",
                                              "--golden", str(fifo)])
    assert result.exit_code == 1 and "is a FIFO (named pipe)" in result.output, result.output


def test_a_fifo_lying_in_a_golden_store_is_skipped_not_waited_on(tmp_path, monkeypatch):
    from iron_spec.library import goldens
    store = tmp_path / "store"
    (store / "llama3").mkdir(parents=True)
    os.mkfifo(store / "llama3" / "stuck.npz")
    os.mkfifo(store / "other.npz")
    golden("abc").write(store / "llama3" / "real.npz")
    monkeypatch.setenv("IRON_SPEC_GOLDENS", str(store))
    found, searched = within(20, goldens.find, "abc", "llama3", LLAMA)
    assert found == store / "llama3" / "real.npz" and store in searched
    assert within(20, goldens.find, "nothing", "llama3", LLAMA)[0] is None


def _npz(members: dict[str, bytes | tuple]) -> bytes:
    """An .npz whose members are given as bytes, or as (header bytes, zero bytes to follow)
    streamed in, deflated."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for name, data in members.items():
            if isinstance(data, bytes):
                z.writestr(name, data)
                continue
            header, zeros = data
            with z.open(name, "w", force_zip64=True) as m:
                m.write(header)
                block = bytes(2**23)
                for _ in range(zeros // len(block)):
                    m.write(block)
                m.write(bytes(zeros % len(block)))
    return out.getvalue()


def _npy(array) -> bytes:
    b = io.BytesIO()
    np.save(b, array, allow_pickle=True)
    return b.getvalue()


def _header(shape, dtype=np.float32) -> bytes:
    b = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        b, {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": shape})
    return b.getvalue()  # the magic string and the header


def test_a_member_inflating_past_the_bound_is_refused_before_it_is_inflated(tmp_path):
    # 300 MiB of zeros deflate to ~300 KB (the issue's: 8 MB inflating to 8 GiB).
    path = tmp_path / "bomb.npz"
    size, header = MAX_MEMBER + 2**25, _header(((MAX_MEMBER + 2**25) // 4,))
    path.write_bytes(_npz({"fingerprint.npy": _npy(np.asarray("x")),
                           "top_ids.npy": (header, size)}))
    assert path.stat().st_size < 2**21
    tracemalloc.start()
    try:
        with pytest.raises(GoldenError, match=f"its array top_ids.npy inflates to {size + len(header)}"
                                              " bytes, more than an array of a golden may"):
            load_arrays(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**24, f"{peak} bytes allocated reading it"


@pytest.mark.parametrize("member, says", [
    (_header((2**40,)) + bytes(16), r"claims \(1099511627776,\) of float32"),
    (_npy(np.array([{"a": 1}], dtype=object)), r"objects: a pickle"),
    (b"not an npy", r"cannot be read"),
], ids=["header_claims_4_TiB", "object_array", "not_npy"])
def test_a_member_that_is_no_array_of_numbers_is_refused(tmp_path, member, says):
    path = tmp_path / "g.npz"
    path.write_bytes(_npz({"fingerprint.npy": _npy(np.asarray("x")), "top_ids.npy": member}))
    with pytest.raises(GoldenError, match=says):
        read_npz(path)


def test_a_golden_of_nan_log_probabilities_is_refused_as_such_not_blamed_on_the_spec(tmp_path):
    from iron_spec.spec.build import load_model
    fp = load_model(LLAMA, random_weights=0, toy=True).fingerprint()
    g = golden(fp, vocab=256)
    g.top_logprobs[1, :3] = np.nan
    path = tmp_path / "nan.npz"
    g.write(path)
    with pytest.raises(GoldenError, match="hold NaN: transformers' logits were not finite "
                                          "where it was recorded .the weights or transformers' "
                                          "model, not a spec, are at fault"):
        Golden.read(path, fp)
    result = runner.invoke(app, ["check", LLAMA, "--toy", "--random-weights", "0", "--golden",
                                 str(path)])
    assert result.exit_code == 1 and "not a spec, are at fault" in result.output, result.output
    assert "FAIL" not in result.output


@pytest.mark.parametrize("where", ["file_as_folder", "etc_hostname"])
def test_a_golden_path_under_a_file_is_refused_before_anything_is_recorded(tmp_path, where):
    if where == "etc_hostname":
        if not Path("/etc/hostname").is_file():
            pytest.skip("no /etc/hostname here")
        parent = Path("/etc/hostname")
    else:
        parent = tmp_path / "a_file"
        parent.write_text("x")
    result = runner.invoke(app, ["check", LLAMA, "--toy", "--random-weights", "0",
                                 "--record-golden", "--golden", str(parent / "g.npz")])
    assert result.exit_code == 2, result.output
    # Compared without white space: rich's box breaks a long path at any character, where
    # the temporary folder's name makes it long enough.
    want = f"--golden {parent / 'g.npz'}: cannot be written, {parent} is not a folder"
    assert "".join(want.split()) in "".join(result.output.replace("│", " ").split())
    assert "recording" not in result.output and "loading" not in result.output


def test_an_encrypted_or_strangely_compressed_member_is_refused(tmp_path):
    raw = bytearray(_npz({"fingerprint.npy": _npy(np.asarray("x"))}))
    # The general-purpose flag's bit 0 (encrypted), in the local header and the central one.
    for at in (6, raw.rindex(b"PK\x01\x02") + 8):
        raw[at] |= 1
    path = tmp_path / "enc.npz"
    path.write_bytes(bytes(raw))
    with pytest.raises(GoldenError, match="its array fingerprint.npy cannot be read"):
        read_npz(path)
    raw = bytearray(_npz({"fingerprint.npy": _npy(np.asarray("x"))}))
    for at in (8, raw.rindex(b"PK\x01\x02") + 10):  # compression method 99 (AES)
        raw[at:at + 2] = (99).to_bytes(2, "little")
    path.write_bytes(bytes(raw))
    with pytest.raises(GoldenError, match="cannot be read"):
        read_npz(path)
