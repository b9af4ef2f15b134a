"""Record a divergence case's golden from transformers (needs the golden extra; never run by
the tests): ``python -m tests.specs.divergences.record NAME [--list-tensors]``.

``--list-tensors`` first writes into the case the tensors transformers' ``save_pretrained``
writes for its config, plus the case's ``extra_tensors`` (a distinct ``lm_head.weight`` beside a
tied head, say) and less its ``drop_tensors``. The golden is then transformers' ``AutoModelForCausalLM`` on the drawn
checkpoint, through ``iron_spec.library.golden_record.record``, keyed by the checkpoint's fingerprint;
no code of ours runs the model.
"""

from __future__ import annotations

import copy
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

from iron_spec.library.golden_record import record
from iron_spec.runtime.checkpoint import Checkpoint
from iron_spec.runtime.golden import fingerprint

from .cases import HERE, STEPS, case, golden_file, materialize, prompt, write_case


def list_tensors(name: str, folder: Path = HERE) -> None:
    import torch
    import transformers

    c = case(name, folder)
    # A copy: transformers' config class standardizes the rope mappings given it in place.
    config = transformers.AutoConfig.for_model(**copy.deepcopy(c["config"]))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        ck = Checkpoint(d)
        tensors = {n: list(t.shape) for n, t in ck.tensors.items()}
        ck.close()
    tensors.update(c.get("extra_tensors", {}))
    for dropped in c.get("drop_tensors", []):
        del tensors[dropped]
    c["tensors"] = dict(sorted(tensors.items()))
    write_case(name, c, folder)


def _refuse_partial_load(directory: Path) -> None:
    """Raises ValueError where transformers would leave a weight as initialized, or drop one:
    the golden would judge other weights than the checkpoint's."""
    import transformers

    _, info = transformers.AutoModelForCausalLM.from_pretrained(directory, output_loading_info=True)
    bad = {k: v for k, v in info.items() if k != "error_msgs" and v}
    if bad:
        raise ValueError(f"transformers does not load {directory} whole: {bad}")


def main(name: str, tensors: bool) -> None:
    if tensors:
        list_tensors(name)
    with tempfile.TemporaryDirectory() as d:
        directory = materialize(name, Path(d) / name)
        ck = Checkpoint(directory)
        fp = fingerprint(case(name)["config"], ((n, ck.raw(n)) for n in ck.tensors))
        _refuse_partial_load(directory)
        loaded = SimpleNamespace(directory=directory, random_weights=None,
                                 fingerprint=lambda: fp)
        golden = record(loaded, prompt(name), STEPS)
        ck.close()
    golden.write(golden_file(name))
    print(f"recorded {golden_file(name)} ({fp})")


if __name__ == "__main__":
    main(sys.argv[1], "--list-tensors" in sys.argv[2:])
