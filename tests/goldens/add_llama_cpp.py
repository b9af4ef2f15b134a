"""Record in a real checkpoint's golden what llama.cpp's own quantization costs on it, every
array kept as it is (needs the peer extra, llama-cpp-python 0.3.36; never run by the tests):

    python -m tests.goldens.add_llama_cpp PATH [--keep DIR]
    # PATH: tests/goldens/<spec>/<checkpoint>.npz, the checkpoint of that name under
    # ~/.cache/iron-spec/checkpoints

The checkpoint is written as llama.cpp's converter lays it out, matrices in float32
(``tests/specs/gguf/convert.py``: its names, permutations and shifted norms; a placeholder
vocabulary, which the token ids run here never read), then quantized by llama.cpp's own
``llama_model_quantize`` to each type ``--weights`` converts to (``COSTS``), and each file is
run by llama.cpp teacher-forced on the golden's tokens, as check's KL line runs ours: KL
(golden || llama.cpp) at each of the golden's steps, its mean, p90 and max, and the top-1
mismatches (``runtime.golden.kl_stats``). The golden's meta then holds them as
``llama_cpp: {version, steps, cost: {q8_0: {mean, p90, max, top1_mismatches}, ...}}``, from which
``iron_spec.spec.gates.kl_gate`` sets the conversion's gate (``gates.twice``).
"""

from __future__ import annotations

import ctypes
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from iron_spec.runtime.checkpoint import Checkpoint
from iron_spec.runtime.golden import Golden, add_arrays, kl_stats
from tests.goldens.add_float64 import CHECKPOINTS, _arrays, same_but_added
from tests.specs.gguf import convert

# config.json's model_type -> convert.py's family, for the real checkpoints' goldens.
FAMILIES = {"llama": "llama", "gemma3_text": "gemma3"}
# Each --weights block form and llama.cpp's file type of it (LLAMA_FTYPE_MOSTLY_*).
COSTS = {"q8_0": "Q8_0", "q5_0": "Q5_0", "q5_1": "Q5_1", "q4_0": "Q4_0", "q4_1": "Q4_1"}


def write_f32(path: Path, directory: Path) -> Path:
    """The checkpoint in ``directory`` as a float32 GGUF at ``path``."""
    config = json.loads((directory / "config.json").read_text())
    ck = Checkpoint(directory)
    tensors = {name: ck.read(name) for name in ck.tensors}
    return convert.write(path, FAMILIES[config["model_type"]], config, tensors)


def quantize(source: Path, out: Path, ftype: str) -> Path:
    """``source`` quantized by llama.cpp's ``llama_model_quantize`` to ``ftype``."""
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = 2
    if llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(),
                                      ctypes.byref(params)) != 0:
        raise SystemExit(f"llama.cpp could not quantize {source} to {ftype}")
    return out


def cost(path: Path, golden: Golden) -> dict:
    """llama.cpp's KL against ``golden`` running ``path`` teacher-forced on its tokens: the
    whole sequence in one batch (its logits at every position), each step's row the one
    after that step's history."""
    import llama_cpp
    tokens = golden.tokens.tolist()
    model = llama_cpp.Llama(model_path=str(path), n_ctx=len(tokens) + 8, n_batch=512,
                            n_threads=2, logits_all=True, verbose=False)
    model.eval(tokens)
    scores = np.array(model.scores[:len(tokens)], np.float64)
    del model
    results = [golden.divergence(i, scores[len(golden.history(i)) - 1])
               for i in range(golden.steps)]
    return {k: (int(v) if k == "top1_mismatches" else float(f"{v:.3g}"))
            for k, v in kl_stats(results).items() if k in ("mean", "p90", "max", "top1_mismatches")}


def main(argv: list[str]) -> None:
    import llama_cpp
    keep = Path(argv[argv.index("--keep") + 1]) if "--keep" in argv else None
    paths = [Path(p).resolve() for p in argv if p != "--keep" and (keep is None or Path(p) != keep)]
    for path in paths:
        directory = CHECKPOINTS / path.stem
        golden = Golden.read(path, None)
        with tempfile.TemporaryDirectory(dir=keep) as tmp:
            where = keep or Path(tmp)
            source = write_f32(where / f"{path.stem}.f32.gguf", directory)
            found = {}
            for weights, ftype in COSTS.items():
                start = time.perf_counter()
                file = quantize(source, where / f"{path.stem}.{weights}.gguf", ftype)
                found[weights] = cost(file, golden)
                print(f"{path}: llama.cpp {llama_cpp.__version__} {ftype}: {found[weights]} "
                      f"({time.perf_counter() - start:.0f} s)", flush=True)
                if keep is None:
                    file.unlink()
        old = _arrays(path)
        add_arrays(path, {}, {"llama_cpp": {"version": llama_cpp.__version__, "steps": golden.steps,
                                          "cost": found}})
        bad = same_but_added(old, _arrays(path), set())
        if bad:
            raise SystemExit(f"{path}: arrays changed: {bad}")


if __name__ == "__main__":
    main(sys.argv[1:])
