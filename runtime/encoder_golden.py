"""Encoder goldens: transformers' own encoder's outputs on a few probes, recorded once and read
without torch or transformers.

A golden is a small ``.npz`` keyed by the fingerprint of config.json and the checkpoint's
tensors (``runtime.golden.fingerprint``): for each probe ``i``, its ids ``ids{i}`` and token
types ``types{i}`` ``(rows,)`` int32, transformers' ``last_hidden_state`` ``hidden{i}``
``(rows, hidden)`` float32, and ``pooled{i}`` ``(hidden,)`` float32, the spec's pooling
(mean, first row, or BertPooler's ``pooler_output``; normalized where the spec says) applied
to transformers' outputs. Two older layouts of ``tests/goldens/bert/`` read too: per probe
``mean{i}`` (mean pooling, unnormalized) in place of ``pooled{i}``; or ``ids`` (JSON) with
``embeddings`` (mean pooling under the attention mask, unnormalized) and no hidden states.
Any layout may also hold transformers' encoder run in float64 on the same probes:
``hidden64_{i}`` ``(rows, hidden)`` and ``pooled64_{i}`` ``(hidden,)`` float64 (pooled as
``pooled{i}`` is), which our float64 ``reference()`` is judged against; and, for a model
whose attention reads global tokens, each probe's ``global_attention_mask`` ``global{i}``
``(rows,)`` int32 (LongformerModel's), fed to both sides; and for a checkpoint with a task
head (``runtime.encoder_heads``), transformers' ``logits`` of its ``*For<Task>`` class:
``logits{i}`` ``(rows, size)`` (fill-mask, token classification) or ``(size,)`` (a text's
classes) float32, and ``logits64_{i}`` float64 where its float64 run is held.

Not for: causal models (``runtime.golden``), recording (``iron_spec.library.golden_record``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .golden import GoldenError, Inputs, load_arrays, other_inputs, write_npz


@dataclass
class EncoderGolden:
    """``probes``: (ids, types) per probe, ``(rows,)`` int32 each (types None: zeros).
    ``hidden``: transformers' last hidden states per probe ``(rows, hidden)`` float32, or
    None (an older layout). ``pooled``: the pooled embedding per probe ``(hidden,)``
    float32. ``global_masks``: each probe's global attention mask ``(rows,)`` int32, or
    None (the model reads none). ``pooling``: how ``pooled`` was pooled: ``"spec"`` (the
    spec's own pooling) or ``"mean"`` (mean over the rows, unnormalized: the older
    layouts)."""

    fingerprint: str
    probes: list[tuple[np.ndarray, np.ndarray | None]]
    pooled: list[np.ndarray]
    hidden: list[np.ndarray] | None = None
    pooling: str = "spec"
    meta: dict = field(default_factory=dict)
    hidden64: list[np.ndarray] | None = None
    pooled64: list[np.ndarray] | None = None
    global_masks: list[np.ndarray] | None = None
    logits: list[np.ndarray] | None = None
    logits64: list[np.ndarray] | None = None

    def float64_arrays(self) -> dict[str, np.ndarray]:
        """The float64 arrays as the file holds them (none where there are none)."""
        out = {}
        for i in range(len(self.probes)):
            if self.hidden64 is not None:
                out[f"hidden64_{i}"] = np.asarray(self.hidden64[i], np.float64)
            if self.pooled64 is not None:
                out[f"pooled64_{i}"] = np.asarray(self.pooled64[i], np.float64)
            if self.logits64 is not None:
                out[f"logits64_{i}"] = np.asarray(self.logits64[i], np.float64)
        return out

    def write(self, path: Path, replace: bool = False) -> None:
        """Write to ``path`` through a temporary name in its folder (made if absent), never
        over a golden of other inputs unless ``replace`` (``runtime.golden.write_npz``).

        Raises:
            GoldenTaken, GoldenError: as ``write_npz``.
        """
        path = Path(path)
        arrays = {"fingerprint": self.fingerprint, "meta": json.dumps(self.meta, sort_keys=True),
                  "pooling": self.pooling}
        for i, (ids, types) in enumerate(self.probes):
            arrays[f"ids{i}"] = np.asarray(ids, np.int32)
            arrays[f"types{i}"] = np.zeros(len(ids), np.int32) if types is None else \
                np.asarray(types, np.int32)
            arrays[f"pooled{i}"] = np.asarray(self.pooled[i], np.float32)
            if self.hidden is not None:
                arrays[f"hidden{i}"] = np.asarray(self.hidden[i], np.float32)
            if self.global_masks is not None:
                arrays[f"global{i}"] = np.asarray(self.global_masks[i], np.int32)
            if self.logits is not None:
                arrays[f"logits{i}"] = np.asarray(self.logits[i], np.float32)
        arrays.update(self.float64_arrays())
        write_npz(path, arrays, self.fingerprint, replace=replace)

    @classmethod
    def read(cls, path: Path, fp: str | Inputs) -> "EncoderGolden":
        """The golden at ``path``, recorded from inputs ``fp`` (their fingerprint, or
        ``Inputs`` to say how other ones differ).

        Raises:
            GoldenError: no file at ``path``, no golden file or not one of these layouts, or
                recorded from other inputs (``runtime.golden.other_inputs``).
        """
        path = Path(path)
        data = load_arrays(path)
        these = Inputs(fp) if isinstance(fp, str) else fp
        fp = these.fingerprint
        theirs = str(data["fingerprint"])
        meta = json.loads(str(data["meta"])) if "meta" in data else {}
        if theirs != fp:
            raise other_inputs(path, meta, theirs, these)
        n = len(json.loads(str(data["ids"]))) if "embeddings" in data else \
            sum(1 for k in data if k.startswith("ids") and k[3:].isdigit())
        float64 = {}
        for name in ("hidden64", "pooled64", "logits64"):
            held = [data[f"{name}_{i}"] for i in range(n) if f"{name}_{i}" in data]
            if held and len(held) != n:
                raise GoldenError(f"{path}: not an encoder golden ({name}_{{i}} for "
                                  f"{len(held)} of {n} probes)")
            float64[name] = held or None
        if "embeddings" in data:
            ids = [np.asarray(i, np.int32) for i in json.loads(str(data["ids"]))]
            return cls(fp, [(i, None) for i in ids], list(data["embeddings"]), None, "mean", meta,
                       **float64)
        probes, pooled, hidden, i = [], [], [], 0
        while f"ids{i}" in data:
            probes.append((data[f"ids{i}"], data[f"types{i}"]))
            if f"pooled{i}" in data:
                pooled.append(data[f"pooled{i}"])
            elif f"mean{i}" in data:
                pooled.append(data[f"mean{i}"])
            if f"hidden{i}" in data:
                hidden.append(data[f"hidden{i}"])
            i += 1
        if not probes or len(pooled) != len(probes) or len(hidden) not in (0, len(probes)):
            raise GoldenError(f"{path}: not an encoder golden (ids{{i}}, types{{i}}, pooled{{i}} "
                              "per probe)")
        pooling = "spec" if "pooling" in data else "mean"
        masks = [data[f"global{i}"] for i in range(len(probes)) if f"global{i}" in data]
        if masks and len(masks) != len(probes):
            raise GoldenError(f"{path}: not an encoder golden (global{{i}} for {len(masks)} "
                              f"of {len(probes)} probes)")
        logits = [data[f"logits{i}"] for i in range(len(probes)) if f"logits{i}" in data]
        if logits and len(logits) != len(probes):
            raise GoldenError(f"{path}: not an encoder golden (logits{{i}} for {len(logits)} "
                              f"of {len(probes)} probes)")
        for name, rows in (("pooled", pooled), ("hidden", hidden), ("logits", logits),
                           *((n, r) for n, r in float64.items() if r)):
            if any(r.dtype.kind != "f" or not np.isfinite(r).all() for r in rows):
                raise GoldenError(
                    f"{path}: not an encoder golden: its {name} arrays hold values that are not "
                    "finite numbers (transformers' outputs were NaN or infinite where it was "
                    "recorded: the weights or transformers' model, not a spec, are at fault); "
                    "record it again from finite outputs")
        return cls(fp, probes, pooled, hidden or None, pooling, meta, **float64,
                   global_masks=masks or None, logits=logits or None)


def find_encoder_golden(folder: Path, fp: str) -> tuple[EncoderGolden | None, Path | None]:
    """The golden among ``folder``'s ``*.npz`` recorded from inputs of fingerprint ``fp``,
    whatever its file is called, and its path; (None, None) where none is."""
    for candidate in sorted(Path(folder).glob("*.npz")):
        try:
            return EncoderGolden.read(candidate, fp), candidate
        except GoldenError:
            continue
    return None, None
