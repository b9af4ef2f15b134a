"""Record the bert spec's goldens from transformers' own BertModel, in float32.

Run where torch and transformers are installed (not in CI; the tests read the .npz files):

    python tests/goldens/bert/record.py [CHECKPOINTS_DIR]

toy-seed0.npz: the toy shape on weights drawn at seed 0 (written with the toy config to a
temporary checkpoint that BertModel loads strictly): for each probe, its ids and token types,
``last_hidden_state``, the attention-mask mean pooling, and ``pooler_output``.
all-minilm-l6-v2.npz: sentence-transformers' recipe (tokenizer with padding, BertModel, mean
pooling under the attention mask) on the real checkpoint: the texts, their ids, embeddings and
cosine matrix. Each is keyed by the fingerprint of config.json and the checkpoint's tensors.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import save_file

from iron_spec.spec.encoder import load_encoder

HERE = Path(__file__).resolve().parent
SPEC = HERE.parents[2] / "specs" / "bert.yaml"
TEXTS = ["A man is eating food.", "A man is eating a piece of bread.",
         "The girl is carrying a baby.", "A man is riding a horse.",
         "Der Himmel ist BLAU, oder? 42 €"]


def _write(path: Path, **arrays) -> None:
    partial = path.with_name(f".{path.stem}.{os.getpid()}.npz")
    np.savez_compressed(partial, **arrays)
    os.replace(partial, path)


def _meta(model) -> str:
    return json.dumps({"transformers": transformers.__version__, "torch": torch.__version__,
                       "dtype": "float32", "model": type(model).__name__}, sort_keys=True)


def _mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # sentence-transformers' Pooling (pooling_mode_mean_tokens), as it computes it.
    m = mask.unsqueeze(-1).expand(hidden.size()).to(hidden.dtype)
    return torch.sum(hidden * m, 1) / torch.clamp(m.sum(1), min=1e-9)


def toy() -> None:
    loaded = load_encoder(SPEC, random_weights=0, toy=True)
    tensors = loaded.checkpoint_tensors()
    with tempfile.TemporaryDirectory() as d:
        Path(d, "config.json").write_text(json.dumps(loaded.config_json))
        save_file({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()},
                  str(Path(d, "model.safetensors")))
        model, info = transformers.BertModel.from_pretrained(d, dtype=torch.float32,
                                                             output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    model.eval()
    rng = np.random.default_rng(0)
    V, L = loaded.config_json["vocab_size"], loaded.model.config.max_tokens
    probes = [(rng.integers(0, V, 11), np.zeros(11, np.int64)),
              (rng.integers(0, V, L), (np.arange(L) >= L // 2).astype(np.int64)),
              (rng.integers(0, V, 1), np.zeros(1, np.int64))]
    out = {"fingerprint": loaded.fingerprint(), "meta": _meta(model)}
    with torch.no_grad():
        for i, (ids, types) in enumerate(probes):
            o = model(torch.tensor(ids[None]), token_type_ids=torch.tensor(types[None]))
            h = o.last_hidden_state
            out[f"ids{i}"], out[f"types{i}"] = ids.astype(np.int32), types.astype(np.int32)
            out[f"hidden{i}"] = h[0].numpy()
            out[f"mean{i}"] = _mean(h, torch.ones(h.shape[:2]))[0].numpy()
            out[f"pooler{i}"] = o.pooler_output[0].numpy()
    _write(HERE / "toy-seed0.npz", **out)


def real(checkpoints: Path) -> None:
    directory = checkpoints / "all-minilm-l6-v2"
    loaded = load_encoder(SPEC, checkpoint=directory)
    tok = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.BertModel.from_pretrained(directory, dtype=torch.float32).eval()
    batch = tok(TEXTS, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        h = model(**batch).last_hidden_state
    e = _mean(h, batch["attention_mask"]).numpy().astype(np.float64)
    unit = e / np.linalg.norm(e, axis=1, keepdims=True)
    ids = [row[m.bool()].tolist() for row, m in zip(batch["input_ids"], batch["attention_mask"])]
    _write(HERE / "all-minilm-l6-v2.npz", fingerprint=loaded.fingerprint(), meta=_meta(model),
           texts=json.dumps(TEXTS), ids=json.dumps(ids), embeddings=e.astype(np.float32),
           cosine=unit @ unit.T)


if __name__ == "__main__":
    toy()
    real(Path(sys.argv[1]) if len(sys.argv) > 1 else
         Path.home() / ".cache" / "iron-spec" / "checkpoints")
