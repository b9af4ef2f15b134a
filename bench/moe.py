"""A mixture of experts' decode against a dense model of the same active bytes, and against
llama.cpp on the same weights, at OLMoE-1B-7B's shape (drawn weights):

    python bench/moe.py make DIR [--layers 2]   # checkpoints and Q8_0 GGUFs under DIR
    python bench/moe.py run DIR [--runs 3] [--weights q8_0]   # iron-spec bench on each

``make`` draws two checkpoints of OLMoE-1B-7B's widths (hidden 2048, 16 heads, vocab
50304) and ``--layers`` layers (the 16-layer model's 28 GB of float32 do not fit beside
the rest of this machine: every layer is the same, so a layer's share of a token is what
fewer layers measure):

- ``olmoe``: OLMoE's own layer (``specs/olmoe.yaml``): 64 experts of width 1024, 8 a token;
- ``dense``: an OLMo 2 layer (``specs/olmo2.yaml``) whose MLP is 8 * 1024 = 8192 wide, so a
  token reads the same bytes of projections as the mixture's (its router's 64 rows apart);

as safetensors (float32, one shard per layer), and each as the GGUF llama.cpp's converter
writes (tests/specs/gguf/convert.py: the experts stacked into ``ffn_{gate,up,down}_exps``,
the router kept float32, matrices Q8_0). Weights are normal with standard deviation
1 / sqrt(in), drawn at seed 0 one tensor at a time, so the writing never holds a model.

``run`` times each with ``iron-spec bench``'s own measurements (decode after a 128-token
prompt, TTFT of 128 and 512 tokens; ``--weights q8_0``, the default: every projection and
expert stack held as Q8_0's blocks, read so by the decode step's GEMVs and the prompt
chunk's GEMMs, against llama.cpp on the Q8_0 file; ``--weights float32``: the float32
weights, the decode step's packed to Q8_0 (``--decode-weights int8``)), and each model's
memory after its load (resident, and the peak of the load, against the bytes its weights
are held in), transformers left out (its eager experts loop in float32 is
not the bar, and its model would double the memory), and prints the ratios side by side:
ours / llama.cpp on each model, and the mixture's decode / the dense one's on each engine.
Threads: ``OMP_NUM_THREADS`` or every core. Run it under ``nice -n 10``; on a machine whose
cores other jobs share, set ``OMP_NUM_THREADS=1``: at 2 threads on 2 cores under a load of
15, llama.cpp's decode of either model fell below 3 tokens/s (its threads wait at each
barrier for one descheduled) and our mixture's prompt chunk (numpy's per-expert GEMMs on
BLAS threads) to a tenth of its 1-thread speed, so neither side measured the code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPE = dict(vocab_size=50304, hidden_size=2048, num_attention_heads=16,
             num_key_value_heads=16, max_position_embeddings=4096, rms_norm_eps=1e-5,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
             tie_word_embeddings=False, hidden_act="silu", attention_bias=False,
             bos_token_id=None, eos_token_id=50279, pad_token_id=1)
EXPERTS, TOP_K, WIDTH = 64, 8, 1024


def configs(layers: int) -> dict[str, dict]:
    olmoe = dict(SHAPE, architectures=["OlmoeForCausalLM"], model_type="olmoe",
                 num_hidden_layers=layers, intermediate_size=WIDTH, num_experts=EXPERTS,
                 num_experts_per_tok=TOP_K, norm_topk_prob=False, clip_qkv=None,
                 output_router_logits=False, router_aux_loss_coef=0.01)
    dense = dict(SHAPE, architectures=["Olmo2ForCausalLM"], model_type="olmo2",
                 num_hidden_layers=layers, intermediate_size=TOP_K * WIDTH)
    return {"olmoe": olmoe, "dense": dense}


def tensors(kind: str, c: dict, layer: int | None, rng: np.random.Generator):
    """(name, float32 array) of one layer (or, ``layer`` None, the embedding, final norm and
    head), under transformers' names."""
    H, V = c["hidden_size"], c["vocab_size"]

    def matrix(rows: int, cols: int) -> np.ndarray:
        return rng.standard_normal((rows, cols), dtype=np.float32) / np.float32(np.sqrt(cols))

    def gain(n: int) -> np.ndarray:
        return 1 + np.float32(0.1) * rng.standard_normal(n, dtype=np.float32)

    if layer is None:
        yield "model.embed_tokens.weight", rng.standard_normal((V, H), dtype=np.float32)
        yield "model.norm.weight", gain(H)
        yield "lm_head.weight", matrix(V, H)
        return
    p = f"model.layers.{layer}"
    for n in "qkvo":
        yield f"{p}.self_attn.{n}_proj.weight", matrix(H, H)
    yield f"{p}.self_attn.q_norm.weight", gain(H)
    yield f"{p}.self_attn.k_norm.weight", gain(H)
    yield f"{p}.post_attention_layernorm.weight", gain(H)
    if kind == "olmoe":
        yield f"{p}.input_layernorm.weight", gain(H)
        yield f"{p}.mlp.gate.weight", matrix(EXPERTS, H)
        for e in range(EXPERTS):
            yield f"{p}.mlp.experts.{e}.gate_proj.weight", matrix(WIDTH, H)
            yield f"{p}.mlp.experts.{e}.up_proj.weight", matrix(WIDTH, H)
            yield f"{p}.mlp.experts.{e}.down_proj.weight", matrix(H, WIDTH)
    else:
        yield f"{p}.post_feedforward_layernorm.weight", gain(H)
        I = c["intermediate_size"]
        yield f"{p}.mlp.gate_proj.weight", matrix(I, H)
        yield f"{p}.mlp.up_proj.weight", matrix(I, H)
        yield f"{p}.mlp.down_proj.weight", matrix(H, I)


def make(directory: Path, layers: int) -> None:
    import gguf
    from safetensors.numpy import save_file
    from tests.specs.gguf import convert

    for kind, c in configs(layers).items():
        out = directory / kind
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(c, indent=2))
        family = "olmoe" if kind == "olmoe" else "olmo2"
        arch = gguf.MODEL_ARCH[convert.ARCH[family]]
        table = gguf.get_tensor_name_map(arch, layers)
        w = gguf.GGUFWriter(str(directory / f"{kind}.q8_0.gguf"), gguf.MODEL_ARCH_NAMES[arch],
                            use_temp_file=True)
        convert.metadata(family, w, c, {})
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
        vocab = convert.tokens(c["vocab_size"])
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(vocab)
        w.add_token_types([gguf.TokenType.NORMAL] * len(vocab))
        w.add_token_merges(["a b"])
        rng = np.random.default_rng(0)
        index, parts = {}, [None] + list(range(layers))
        for i, layer in enumerate(parts):
            shard = {name: x for name, x in tensors(kind, c, layer, rng)}
            file = f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors"
            save_file(shard, str(out / file))
            index.update({name: file for name in shard})
            for name, x in convert.tensors(family, c, shard).items():
                gname = table.get_name(name, try_suffixes=(".weight", ".bias"))
                if gname is None:
                    raise ValueError(f"{family}: llama.cpp names no tensor {name}")
                if x.ndim >= 2 and "norm" not in gname and "token_embd" not in gname \
                        and "ffn_gate_inp" not in gname:
                    q = gguf.GGMLQuantizationType.Q8_0
                    w.add_tensor(gname, gguf.quants.quantize(x, q), raw_dtype=q)
                else:
                    w.add_tensor(gname, x)
            del shard
            print(f"{kind}: {file}", flush=True)
        (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


def _memory() -> dict:
    """This process's resident and peak resident bytes (Linux's /proc/self/status)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return {"rss_bytes": out.get("VmRSS"), "peak_rss_bytes": out.get("VmHWM")}


def _held_bytes(loaded) -> int:
    """The bytes the model's weights are held in: every param's array once, a mixture's
    expert stacks (whose per-expert params are views of them) once each."""
    from iron_spec.operators import held
    from iron_spec.runtime.blocks.experts import Experts
    stacks, views, todo = [], set(), [loaded.lm]
    while todo:
        m = todo.pop()
        if isinstance(m, Experts):
            stacks += [m.w_in, m.w_down]
            views |= {id(p) for p in m.stack_params()}
        todo += [child for _, child in m.children()]
    seen, total = set(), sum(s.nbytes for s in stacks)
    for _, p in loaded.lm.named_params():
        if p.array is None or id(p) in views or id(p.array) in seen:
            continue
        seen.add(id(p.array))
        total += held.nbytes(p.array)
    return total


def run(directory: Path, runs: int, weights: str = "q8_0") -> None:
    """Decode tokens/s after a 128-token prompt and TTFT of 128 and 512 tokens, ours (Q8_0's
    blocks held for the decode step: ``--decode-weights int8``) and llama.cpp's on the Q8_0
    file, each figure taken in turn, ours then llama.cpp's, within each of ``runs`` runs
    after a warm-up, by ``iron-spec bench``'s own measurements (``bench.ours``,
    ``bench.gguf_peer``; its 2000-token deep decode left out: that prompt alone takes
    minutes here); one model loaded at a time."""
    import statistics

    from iron_spec.cli import bench
    from iron_spec.operators.native import threads
    from iron_spec.spec.build import load_model

    keys = ("decode_short_tokens_per_s", "ttft128_s", "ttft512_s")
    results = {}
    for kind, spec in (("olmoe", "olmoe"), ("dense", "olmo2")):
        loaded = load_model(ROOT / "specs" / f"{spec}.yaml", checkpoint=str(directory / kind),
                            max_seq_len=1024, weights=weights,
                            decode_weights="int8" if weights == "float32" else "float32")
        memory = dict(_memory(), held_bytes=_held_bytes(loaded))
        print(json.dumps({kind: {"memory after load": memory}}), flush=True)
        sides = {"ours": bench.ours(loaded)}
        peer = bench.gguf_peer(loaded, directory / f"{kind}.q8_0.gguf", threads())
        if peer is None:
            raise SystemExit("llama-cpp-python is not installed (pip install --no-deps its wheel)")
        sides["llama.cpp"] = peer[0]
        taken = {side: {k: [] for k in keys} for side in sides}
        for i in range(runs + 1):  # the first a warm-up
            for k in keys:
                for side, figure in sides.items():
                    value = figure[k]()
                    if i:
                        taken[side][k].append(value)
        out = {side: {k: statistics.median(v) for k, v in t.items()} for side, t in taken.items()}
        # ours / llama.cpp for tokens/s, llama.cpp's / ours for seconds: above 1 is ours ahead.
        out["ratios"] = {k: statistics.median(
            o / p if k.startswith("decode") else p / o
            for o, p in zip(taken["ours"][k], taken["llama.cpp"][k])) for k in keys}
        out["memory"] = memory
        results[kind] = out
        del loaded, sides, peer
        print(json.dumps({kind: out}), flush=True)
    results["threads"], results["runs"], results["weights"] = threads(), runs, weights
    (directory / "moe.bench.json").write_text(json.dumps(results, indent=1))
    key = "decode_short_tokens_per_s"
    print(f"{threads()} threads, weights {weights}, median of {runs} runs after a warm-up; "
          "ours / llama.cpp (TTFT: llama.cpp's seconds / ours)")
    for kind in ("olmoe", "dense"):
        r = results[kind]
        print(f"  {kind:6} decode tok/s ours {r['ours'][key]:7.1f}, llama.cpp "
              f"{r['llama.cpp'][key]:7.1f}: {r['ratios'][key]:.2f}; TTFT128 "
              f"{r['ratios']['ttft128_s']:.2f}, TTFT512 {r['ratios']['ttft512_s']:.2f}; "
              f"held {r['memory']['held_bytes'] / 2**30:.2f} GiB, resident after load "
              f"{r['memory']['rss_bytes'] / 2**30:.2f} GiB (peak so far "
              f"{r['memory']['peak_rss_bytes'] / 2**30:.2f})")
    m, d = results["olmoe"], results["dense"]
    print(f"  mixture / dense decode tok/s: ours {m['ours'][key] / d['ours'][key]:.2f}, "
          f"llama.cpp {m['llama.cpp'][key] / d['llama.cpp'][key]:.2f}")


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("make", "run"))
    parser.add_argument("directory", type=Path)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--weights", default="q8_0", choices=("q8_0", "float32", "bfloat16"))
    a = parser.parse_args()
    make(a.directory, a.layers) if a.what == "make" else run(a.directory, a.runs, a.weights)
