"""Record a GGUF case's golden from transformers (needs the golden extra; never run by the
tests): ``python -m tests.specs.gguf.record NAME [--list-tensors]``.

As a divergence case's (``tests/specs/divergences/record.py``): ``--list-tensors`` first
writes into the case the tensors transformers' ``save_pretrained`` writes for its config;
the golden is transformers' ``AutoModelForCausalLM`` on the checkpoint drawn by name
(``cases.draw``), through ``iron_spec.golden_record.record``, keyed by the checkpoint's
fingerprint. Our loader only gives ``record`` the model's call shape; no code of ours runs
the model whose numbers are recorded.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from iron_spec.spec.build import load_model
from iron_spec.library.golden_record import record

from tests.specs.divergences.cases import STEPS
from tests.specs.divergences.record import _refuse_partial_load, list_tensors
from tests.specs.gguf.cases import HERE, golden_file, materialize, prompt, spec_file


def main(name: str, tensors: bool) -> None:
    if tensors:
        list_tensors(name, HERE)
    with tempfile.TemporaryDirectory() as d:
        directory = materialize(name, Path(d) / name)
        _refuse_partial_load(directory)
        loaded = load_model(spec_file(name), checkpoint=directory, prefill_chunk=16)
        golden = record(loaded, prompt(name), STEPS)
    golden.write(golden_file(name))
    print(f"recorded {golden_file(name)} ({golden.fingerprint})")


if __name__ == "__main__":
    main(sys.argv[1], "--list-tensors" in sys.argv[2:])
