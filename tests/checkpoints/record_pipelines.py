"""Record transformers' pipelines on the task-head toys (needs the golden extra; not in CI,
which reads the file): ``python -m tests.checkpoints.record_pipelines`` writes
pipelines.json beside this file, each toy's texts and ``pipeline(task, model=DIR)``'s result
(fill-mask top 5, text-classification top 1 and all, token-classification), scores as
floats."""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent

CASES = {
    "bert-base-uncased-toy": ("fill-mask", ["paris is the [MASK] of france.",
                                            "the girl is [MASK] a baby.",
                                            "a [MASK] is eating [MASK] ."], {"top_k": 5}),
    "bert-sequence-classification-toy": ("text-classification",
                                         ["i love this movie", "it was very bad !",
                                          "this is not good"], {}),
    "bert-token-classification-toy": ("token-classification",
                                      ["the man is riding a horse in paris",
                                       "a woman of berlin, germany"], {}),
}


def plain(value):
    """A pipeline's result with numpy scalars as Python numbers."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value.item() if hasattr(value, "item") else value


def main() -> None:
    import transformers

    out = {"transformers": transformers.__version__}
    for name, (task, texts, options) in CASES.items():
        pipe = transformers.pipeline(task, model=str(HERE / name))
        entry = {"task": task, "texts": texts,
                 "results": [plain(pipe(t, **options)) for t in texts]}
        if task == "text-classification":
            entry["all"] = [plain(pipe(t, top_k=None)) for t in texts]
        out[name] = entry
    (HERE / "pipelines.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
