"""runtime.host: checkpoint directories from paths or hub ids (offline: no network is ever
tried here), and fit's context arithmetic, checked against numbers worked out by hand."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from iron_spec.runtime.host import checkpoint_directory, fit

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def offline_hub(tmp_path, monkeypatch) -> Path:
    """HF_HUB_OFFLINE=1 and an empty HF_HOME; huggingface_hub reads both when imported, so
    its constants are set too in case another test imported it first."""
    import huggingface_hub.constants as constants
    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    return home / "hub"


# --- checkpoint_directory --------------------------------------------------------------------

def test_an_existing_directory_is_returned_unchanged(tmp_path):
    assert checkpoint_directory(tmp_path) == tmp_path
    assert checkpoint_directory(str(tmp_path)) == tmp_path
    sub = tmp_path / "org"
    (sub / "name").mkdir(parents=True)
    assert checkpoint_directory(sub / "name") == sub / "name"  # a directory, though it looks like an id


def test_a_relative_existing_directory_is_returned_unchanged(tmp_path, monkeypatch):
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert checkpoint_directory("org/name") == Path("org/name")  # the directory, not the hub


@pytest.mark.parametrize("text", ["./nope", "/tmp/none", "../nope/x", "~/nope", "a/b/c", "plain"])
def test_a_path_that_is_no_directory_is_file_not_found(text, offline_hub):
    with pytest.raises(FileNotFoundError, match="nothing is there; give a checkpoint directory"
                       ) as info:
        checkpoint_directory(text)
    assert text in str(info.value)
    assert not offline_hub.exists()  # the hub was not consulted


def test_an_existing_file_is_not_a_checkpoint(tmp_path):
    # Found by a new user's trial: nothing there, an empty file and a file of another kind
    # were all "not a checkpoint directory ..., a GGUF file, nor a hub id".
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="an empty file; give a checkpoint directory"):
        checkpoint_directory(f)
    f.write_bytes(b"not gguf")
    with pytest.raises(FileNotFoundError, match=r"a file that is not GGUF \(no GGUF magic\); give"):
        checkpoint_directory(f)
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    with pytest.raises(FileNotFoundError, match="a link to nothing; give a checkpoint"):
        checkpoint_directory(tmp_path / "link")


def test_an_uncached_hub_id_offline_is_file_not_found_naming_it(offline_hub):
    with pytest.raises(FileNotFoundError) as info:
        checkpoint_directory("org/name")
    assert "org/name" in str(info.value)
    assert "cached" in str(info.value)


def test_a_cached_hub_id_offline_is_its_snapshot(offline_hub):
    # the hub cache layout: models--org--name/refs/main holds the commit, snapshots/<commit>/ the files
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = offline_hub / "models--org--name"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    assert checkpoint_directory("org/name") == snapshot


def test_offline_environment_alone_is_enough(tmp_path):
    """In a fresh process, where huggingface_hub reads HF_HUB_OFFLINE and HF_HOME itself."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf_home"),
               PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    code = ("from runtime.host import checkpoint_directory\n"
            "try:\n    checkpoint_directory('org/name')\n"
            "except FileNotFoundError as e:\n    print('FNF', e)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("FNF") and "org/name" in out.stdout


# --- fit -------------------------------------------------------------------------------------

def test_fit_keeps_the_native_context_when_it_fits(caplog):
    with caplog.at_level(logging.INFO, logger="iron_spec"):
        assert fit(native=8192, chunk=256, fixed=1000, per_position=10, budget=1000 + 10 * 8192) == 8192
    assert "max_seq_len 8192" in caplog.text
    assert fit(8192, 256, 1000, 10, budget=10**12) == 8192


def test_fit_shrinks_to_whole_chunks(caplog):
    # budget 51_000: (51_000 - 1_000) / 10 = 5_000 positions; 19 chunks of 256 = 4_864 (20 = 5_120)
    with caplog.at_level(logging.WARNING, logger="iron_spec"):
        assert fit(native=8192, chunk=256, fixed=1000, per_position=10, budget=51_000) == 4864
    assert "max_seq_len 4864" in caplog.text and "8192" in caplog.text
    # one byte short of the native context
    assert fit(8192, 256, 1000, 10, budget=1000 + 10 * 8192 - 1) == 8192 - 256
    # exactly one chunk
    assert fit(8192, 512, 2**30, 3, budget=2**30 + 3 * 512) == 512
    # GiB-scale: 4 GiB budget, 1 GiB of weights, 96 KiB a position -> 32_768 positions exactly
    assert fit(131072, 2048, 2**30, 96 * 2**10, budget=4 * 2**30) == 32768


@pytest.mark.parametrize("budget", [1000 + 10 * 255, 1000, 999, 0, -5])
def test_fit_refuses_when_not_one_chunk_fits(budget):
    with pytest.raises(ValueError, match="256-token chunk"):
        fit(native=8192, chunk=256, fixed=1000, per_position=10, budget=budget)


def test_fit_with_nothing_per_position_fits_or_refuses():
    assert fit(native=4096, chunk=256, fixed=1000, per_position=0, budget=1000) == 4096
    with pytest.raises(ValueError):
        fit(native=4096, chunk=256, fixed=1000, per_position=0, budget=999)


def test_fit_defaults_to_this_host_budget():
    assert fit(native=16, chunk=16, fixed=0, per_position=1) == 16  # 16 bytes fit any host
