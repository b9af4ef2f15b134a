"""A mixture of experts' decode against a dense model of the same active bytes, and against
llama.cpp on the same weights, at OLMoE-1B-7B's shape (drawn weights):

    python bench/moe.py make DIR [--layers 2]   # checkpoints and Q8_0 GGUFs under DIR
    python bench/moe.py run DIR [--runs 3]      # iron-spec bench on each, int8 decode weights

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

``run`` runs ``iron-spec bench`` on each (``--decode-weights int8``: Q8_0's blocks, against
llama.cpp on the Q8_0 file), with transformers left out (its eager experts loop in float32
is not the bar, and its model would double the memory), and prints the ratios side by
side: ours MoE / ours dense decode, ours / llama.cpp on each. Run it under ``nice -n 10``.
"""

from __future__ import annotations

import json
import subprocess
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


def run(directory: Path, runs: int) -> None:
    results = {}
    for kind, spec in (("olmoe", "olmoe"), ("dense", "olmo2")):
        out = subprocess.run(
            [sys.executable, "-c", _RUN, str(ROOT / "specs" / f"{spec}.yaml"),
             "--checkpoint", str(directory / kind), "--decode-weights", "int8",
             "--gguf", str(directory / f"{kind}.q8_0.gguf"), "--runs", str(runs), "--json"],
            check=True, capture_output=True, text=True)
        results[kind] = json.loads(out.stdout)
        (directory / f"{kind}.bench.json").write_text(out.stdout)
    m, d = results["olmoe"], results["dense"]
    key = "decode_short_tokens_per_s"
    print(f"decode tokens/s (int8 = Q8_0 blocks), {m['threads']} threads, median of {runs}:")
    for kind, r in results.items():
        engine = next((v for k, v in r.items() if k.startswith("llama.cpp")), None)
        print(f"  {kind:6} ours {r['ours'][key]:8.1f}   llama.cpp Q8_0 "
              f"{engine[key] if engine else float('nan'):8.1f}   ours / llama.cpp "
              f"{r['ratios'].get('int8_decode_vs_llama_cpp_Q8_0') or float('nan'):.2f}")
    print(f"  olmoe / dense (ours): {m['ours'][key] / d['ours'][key]:.2f}")


# The bench command with transformers' side left out (see the module docstring).
_RUN = """
import sys, typer
import iron_spec.cli.bench as bench
bench.transformers_peer = lambda loaded, n_threads: None
sys.argv = ["bench"] + sys.argv[1:]
typer.run(bench.command)
"""


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("make", "run"))
    parser.add_argument("directory", type=Path)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    a = parser.parse_args()
    make(a.directory, a.layers) if a.what == "make" else run(a.directory, a.runs)
