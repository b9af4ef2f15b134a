"""Record each committed golden's float64 floor in its meta, every array kept as it is
(never run by the tests; needs no torch):

    python -m tests.goldens.add_floor [PATH ...]   # default: every golden with float64 rows

The floor is what the spec serving the golden (``specs/<folder>.yaml``, verified against
it) measures: our float64 ``reference()`` against the golden's float64 rows, KL mean and
max over its steps (causal), or the larger max |error| of hidden states and pooled
embeddings (encoder). ``iron_spec.spec.gates.float64_gate`` then judges the golden by
``FLOOR_MARGIN`` x that floor, so a later edit too small for the shared gate (an epsilon
halved) fails. A golden whose spec does not pass its present gate gets no floor (an error).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from iron_spec.spec import gates
from iron_spec.spec.loader import load_spec
from iron_spec.runtime.encoder_golden import EncoderGolden
from iron_spec.runtime.golden import Golden, add_arrays
from tests.goldens.add_float64 import CHECKPOINTS, HERE, ROOT, _arrays, same_but_added
from tests.specs.divergences import cases


def _inputs(spec_file: Path, stem: str, tmp: Path) -> dict:
    """``load_model``/``load_encoder``'s arguments for the golden named ``stem``."""
    if stem.startswith("toy-seed"):
        return {"random_weights": int(stem[len("toy-seed"):]), "toy": True}
    if stem.endswith("-seed0") and stem[:-6] in cases.names():
        return {"checkpoint": cases.materialize(stem[:-6], tmp / stem[:-6])}
    return {"checkpoint": CHECKPOINTS / stem}


def floor(path: Path, tmp: Path) -> object:
    """The floor of the golden at ``path``, measured by its spec (``iron_spec.spec.gates.floor``,
    as ``check --record-golden`` measures one); raises SystemExit where the spec does not
    pass the golden's present float64 gate."""
    spec_file = ROOT / "specs" / f"{path.parent.name}.yaml"
    args = _inputs(spec_file, path.stem, tmp)
    if load_spec(spec_file).get("model") == "encoder":
        from iron_spec.spec.encoder import load_encoder
        loaded = load_encoder(spec_file, **args)
        golden = EncoderGolden.read(path, loaded.fingerprint())
    else:
        from iron_spec.spec.build import load_model
        # A real checkpoint's context cut to 2048 (its cache's memory), as add_float64.
        real = str(args.get("checkpoint", "")).startswith(str(CHECKPOINTS))
        size = {"max_seq_len": 2048} if real else {}
        loaded = load_model(spec_file, **size, **args)
        golden = Golden.read(path, loaded.fingerprint())
    result, value = gates.floor(loaded, golden)
    if not result.passed:
        raise SystemExit(f"{path}: {spec_file.name} fails its float64 gate: {result.figure}")
    return value, golden.meta


def main(paths: list[str]) -> None:
    targets = [Path(p).resolve() for p in paths] or sorted(HERE.glob("*/*.npz"))
    with tempfile.TemporaryDirectory() as tmp:
        for path in targets:
            if not any(k.startswith(("top_logprobs64", "hidden64_")) for k in _arrays(path)):
                print(f"{path}: no float64 rows, no floor")
                continue
            start = time.perf_counter()
            value, meta = floor(path, Path(tmp))
            old = _arrays(path)
            add_arrays(path, {}, {"float64": gates.with_floor(meta, value)["float64"]})
            bad = same_but_added(old, _arrays(path), set())
            if bad:
                raise SystemExit(f"{path}: arrays changed: {bad}")
            print(f"{path}: floor {value} ({time.perf_counter() - start:.1f} s)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
