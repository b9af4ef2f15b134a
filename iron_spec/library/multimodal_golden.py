"""Judging a model with towers against the golden transformers recorded on its checkpoint: the
prompt's ids (chat template and the processor's expansion), the pixel values, each image's
soft tokens, and the logits at every position from the last image's placeholders on,
teacher-forced over the tokens transformers drew (KL, top-1).

A golden (``tests/checkpoints/make_towers.py``) holds ``messages`` (JSON, the inputs left
out; absent where the golden gives its prompt's ids itself, make_axial_towers.py's), ``image`` (the one image, uint8) or ``audio`` (the one sound's samples), ``prompt_ids``,
``ids`` (the prompt and the greedy tokens), ``pixel_values`` or ``input_features`` (a
conformer's: the sound's own frames),
``soft_tokens`` and ``logits`` ``(len(ids), vocab)`` float32, and the ``fingerprint`` of the
inputs it was recorded on (``inputs_fingerprint``: config.json, the tensors, and the
tokenizer's and processor's files): a golden judges those inputs alone.

    python -m iron_spec.library.multimodal_golden CHECKPOINT GOLDEN [--prefill-chunk N]

prints the comparison and the KL table's row.

Not for: text-only goldens (``runtime.golden``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import dataclass

import numpy as np

from iron_spec.runtime.golden import kl_stats, log_softmax
from iron_spec.runtime.towers.conformer import ConformerTower
from iron_spec.runtime.session import Session


@dataclass
class Judged:
    """What ``judge`` found: ids equal, the largest pixel (or feature) and soft-token
    differences, the
    KL statistics (``runtime.golden.kl_stats``) over ``positions`` positions, and the
    session's calls."""

    ids_equal: bool
    pixels: float
    soft: float
    kl: dict
    positions: int
    calls: list


#: The files beside config.json and the weights that a golden's ids and pixels depend on.
PROCESSOR_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "chat_template.json", "processor_config.json", "preprocessor_config.json")


def inputs_fingerprint(loaded) -> str:
    """What a multimodal golden is keyed by: ``loaded``'s fingerprint (``build.Loaded``: the
    whole config.json and every tensor of the checkpoint, the towers' among them) and the
    bytes of its tokenizer's and processor's files."""
    h = hashlib.sha256(loaded.fingerprint().encode())
    for name in PROCESSOR_FILES:
        path = loaded.directory / name
        if path.is_file():
            h.update(name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def messages_with(golden) -> list[dict]:
    """The golden's messages, its image in the image item."""
    messages = json.loads(str(golden["messages"]))
    for m in messages:
        if isinstance(m["content"], list):
            for item in m["content"]:
                if item["type"] in ("image", "audio"):
                    item[item["type"]] = golden[item["type"]]
    return messages


def divergence(want: np.ndarray, got: np.ndarray) -> tuple[float, bool]:
    """KL(want || got) of two logit rows, and whether their top-1 agree."""
    p, q = log_softmax(want.astype(np.float64)), log_softmax(got.astype(np.float64))
    return float(np.sum(np.exp(p) * (p - q))), int(np.argmax(want)) == int(np.argmax(got))


class OtherInputs(ValueError):
    """A golden recorded on other inputs than the model's (config, tensors or processor)."""


def judge(model, golden, session: Session | None = None, other_inputs: bool = False
          ) -> Judged:
    """``model`` (``api.Model`` with towers) against ``golden`` (an ``np.load``'ed golden,
    or a dict of it).

    Raises:
        OtherInputs: the golden was recorded on other inputs (``inputs_fingerprint``),
            unless ``other_inputs`` (a flipped option judged by the right inputs' golden).
    """
    from . import multimodal

    keys = set(getattr(golden, "files", golden))  # an NpzFile, or the dict of one
    theirs = str(golden["fingerprint"]) if "fingerprint" in keys else "none"
    ours = inputs_fingerprint(model.loaded)
    if theirs != ours and not other_inputs:
        raise OtherInputs(f"the golden was recorded on other inputs ({theirs}) than "
                          f"{model.loaded.directory}'s ({ours}): config.json, the tensors or "
                          "the tokenizer's and processor's files differ")

    tower = model.loaded.towers[0]
    raw = golden["image"] if tower.modality == "image" else golden["audio"]
    if "messages" in keys:
        ids, inputs = multimodal.encode(model, messages_with(golden))
    else:  # a golden over given ids (no tokenizer): its placeholders as they are
        ids, inputs = golden["prompt_ids"].tolist(), {tower.placeholder: [raw]}
    front = tower.processor(raw)
    # An image's pixels, a sound's features (with its frames), or an image's patch rows
    # (with their grid: Gemma 4's).
    pixels = front[0] if isinstance(front, tuple) else front
    if isinstance(tower.tower, ConformerTower):  # the sound's own frames, as recorded
        pixels = pixels[: front[1]]
    soft = tower.soft_tokens(raw)
    session = session or Session(model.loaded.lm)
    every = golden["ids"].tolist()
    first = len(golden["prompt_ids"])
    results = []
    for k in range(first, len(every) + 1):
        history = every[:k]
        model.multimodal.place(session, history, inputs)
        logits = session.logits(model.multimodal.lookup(history))
        results.append(divergence(golden["logits"][k - 1], logits))
    want = golden["pixel_values"][0] if tower.modality == "image" else \
        golden["input_features"][0]
    return Judged(ids == golden["prompt_ids"].tolist(), float(np.abs(pixels - want).max()),
                  float(np.abs(soft - golden["soft_tokens"]).max()), kl_stats(results),
                  len(results), list(session.calls))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m iron_spec.library.multimodal_golden")
    parser.add_argument("checkpoint")
    parser.add_argument("golden")
    parser.add_argument("--spec", default=None)
    parser.add_argument("--prefill-chunk", type=int, default=None)
    args = parser.parse_args(argv)
    from .api import load

    model = load(args.spec, args.checkpoint, prefill_chunk=args.prefill_chunk)
    j = judge(model, np.load(args.golden))
    kl = j.kl
    print(f"ids equal: {j.ids_equal}; max pixel difference {j.pixels:.3g}; max soft-token "
          f"difference {j.soft:.3g}")
    print(f"KL over {j.positions} positions: mean {kl['mean']:.3g}, p90 {kl['p90']:.3g}, max "
          f"{kl['max']:.3g}, top-1 mismatches {kl['top1_mismatches']}")


if __name__ == "__main__":
    main()
