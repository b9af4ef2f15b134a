"""Add transformers' float64 rows to committed goldens, keeping every float32 array as it is
(needs the golden extra; never run by the tests):

    python -m tests.goldens.add_float64 [PATH ...]   # default: every golden in tests/goldens
    python -m tests.goldens.add_float64 --compare OLD_DIR   # a copy of tests/goldens from before

Each golden's inputs are rebuilt as they were recorded: ``<spec>/toy-seed0.npz`` the spec's toy
on weights drawn at seed 0; ``<spec>/<case>-seed0.npz`` a divergence case
(tests/specs/divergences); ``<spec>/<checkpoint>.npz`` the real checkpoint of that name under
``~/.cache/iron-spec/checkpoints``. Their fingerprint must be the golden's. transformers' model
in float64 then runs teacher-forced on the golden's own tokens (causal) or probes (encoder)
(``iron_spec.library.golden_record.add_float64``), and the file is rewritten with those arrays added
(``runtime.golden.add_arrays``). Afterwards every array the file held is compared with the
old file's, byte for byte; a difference is an error.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from iron_spec.library.golden_record import add_encoder_float64, add_float64, float64_arrays
from iron_spec.spec.loader import load_spec
from iron_spec.runtime.checkpoint import Checkpoint
from iron_spec.runtime.encoder_golden import EncoderGolden
from iron_spec.runtime.golden import Golden, add_arrays, fingerprint
from tests.specs.divergences import cases

ROOT = Path(__file__).resolve().parents[2]
# A family whose transformers model, loaded in float64, still computes in float32 somewhere
# (a float32 island) has its float64 gate in its spec (validation.float64: gate and why),
# which check and the golden tests read (``iron_spec.spec.gates``); nothing of it is written here.
HERE = ROOT / "tests" / "goldens"
CHECKPOINTS = Path.home() / ".cache" / "iron-spec" / "checkpoints"


def _arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def same_but_added(old: dict, new: dict, added: set) -> list[str]:
    """Names of ``old``'s arrays (but meta and the ``added`` ones, re-added) that ``new`` lacks or holds other bytes, dtype or
    shape of; and of ``new``'s arrays neither in ``old`` nor ``added``."""
    bad = [k for k, v in old.items() if k != "meta" and k not in added and
           (k not in new or new[k].dtype != v.dtype or new[k].shape != v.shape
            or new[k].tobytes() != v.tobytes())]
    return bad + [k for k in new if k not in old and k not in added and k != "meta"]


def add(path: Path, tmp: Path) -> str:
    spec = path.parent.name
    spec_file = ROOT / "specs" / f"{spec}.yaml"
    encoder = load_spec(spec_file).get("model") == "encoder"
    stem = path.stem
    with tempfile.TemporaryDirectory(dir=tmp) as d:
        if stem == "toy-seed0":
            if encoder:
                from iron_spec.spec.encoder import load_encoder
                loaded = load_encoder(spec_file, random_weights=0, toy=True)
            else:
                from iron_spec.spec.build import load_model
                loaded = load_model(spec_file, random_weights=0, toy=True)
            fp = loaded.fingerprint()
        elif stem.endswith("-seed0") and stem[:-6] in cases.names():
            directory = cases.materialize(stem[:-6], Path(d) / stem[:-6])
            ck = Checkpoint(directory)
            fp = fingerprint(cases.case(stem[:-6])["config"], ((n, ck.raw(n)) for n in ck.tensors))
            ck.close()
            loaded = SimpleNamespace(directory=directory, random_weights=None, fingerprint=lambda: fp)
        else:
            directory = CHECKPOINTS / stem
            if encoder:
                from iron_spec.spec.encoder import load_encoder
                loaded = load_encoder(spec_file, checkpoint=directory)
                fp = loaded.fingerprint()
            else:
                from iron_spec.spec.build import load_model
                fp = load_model(spec_file, checkpoint=directory, max_seq_len=2048).fingerprint()
                loaded = SimpleNamespace(directory=directory, random_weights=None,
                                         fingerprint=lambda: fp)
        if encoder:
            golden = EncoderGolden.read(path, fp)
            golden = add_encoder_float64(loaded, golden)
        else:
            golden = add_float64(loaded, Golden.read(path, fp))
    arrays = float64_arrays(golden)
    old = _arrays(path)
    meta = {k: golden.meta[k] for k in ("steps", "float64") if k in golden.meta}
    add_arrays(path, arrays, meta)
    bad = same_but_added(old, _arrays(path), set(arrays))
    if bad:
        raise SystemExit(f"{path}: float32 arrays changed: {bad}")
    return fp


def compare(old_dir: Path) -> None:
    """Every golden under ``old_dir`` (a copy of tests/goldens from before) against the one
    here: every array but meta and the float64 ones byte-identical."""
    float64 = ("top_logprobs64", "tail64", "hidden64_", "pooled64_")
    bad = 0
    for old in sorted(old_dir.glob("*/*.npz")):
        new = HERE / old.relative_to(old_dir)
        theirs = _arrays(new)
        differ = same_but_added(_arrays(old), theirs, {k for k in theirs if k.startswith(float64)})
        if differ:
            bad += 1
            print(f"{new}: {differ} differ")
    print(f"{len(list(old_dir.glob('*/*.npz')))} goldens compared, {bad} differ")
    if bad:
        raise SystemExit(1)


def main(paths: list[str]) -> None:
    targets = [Path(p) for p in paths] or sorted(HERE.glob("*/*.npz"))
    with tempfile.TemporaryDirectory() as tmp:
        for path in targets:
            start = time.perf_counter()
            fp = add(path.resolve(), Path(tmp))
            print(f"{path}: float64 added ({fp}), every other array unchanged "
                  f"({time.perf_counter() - start:.1f} s)", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--compare"]:
        compare(Path(sys.argv[2]))
    else:
        main(sys.argv[1:])
