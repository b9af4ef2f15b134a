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

from iron_spec.build import load_model
from iron_spec.golden_record import record

from tests.specs.divergences.cases import STEPS
from tests.specs.divergences.record import _refuse_partial_load
from tests.specs.gguf.cases import HERE, case, golden_file, materialize, prompt, spec_file


def main(name: str, tensors: bool) -> None:
    if tensors:
        _list_tensors(name)
    with tempfile.TemporaryDirectory() as d:
        directory = materialize(name, Path(d) / name)
        _refuse_partial_load(directory)
        loaded = load_model(spec_file(name), checkpoint=directory, prefill_chunk=16)
        golden = record(loaded, prompt(name), STEPS)
    golden.write(golden_file(name))
    print(f"recorded {golden_file(name)} ({golden.fingerprint})")


def _list_tensors(name: str) -> None:
    import copy

    import torch
    import transformers

    from iron_spec.runtime.checkpoint import Checkpoint
    from tests.specs.divergences.cases import write_case

    c = case(name)
    config = transformers.AutoConfig.for_model(**copy.deepcopy(c["config"]))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        ck = Checkpoint(d)
        c["tensors"] = dict(sorted((n, list(t.shape)) for n, t in ck.tensors.items()))
        ck.close()
    write_case(name, c, HERE)


if __name__ == "__main__":
    main(sys.argv[1], "--list-tensors" in sys.argv[2:])
