"""llama.cpp on the GGUF cases (needs the peer extra; never run by the tests): each case's
checkpoint written as ``convert.py`` lays it out, run by llama-cpp-python greedily from the
golden's prompt, its tokens against transformers' (the golden's). Says whether llama.cpp
reads the files as ``convert.py`` writes them: the layout the tests hold our reader to.
``python -m tests.specs.gguf.peer``."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from iron_spec.runtime.golden import Golden
from tests.specs.gguf import cases, convert


def greedy(path: Path, prompt: list[int], steps: int) -> list[int]:
    import llama_cpp
    model = llama_cpp.Llama(str(path), n_ctx=256, n_threads=1, verbose=False,
                            logits_all=True)
    model.eval(prompt)
    out = []
    for _ in range(steps):
        token = int(np.argmax(model.scores[model.n_tokens - 1]))
        out.append(token)
        model.eval([token])
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        for name in cases.names():
            c = cases.case(name)
            path = convert.write(Path(d) / f"{name}.gguf", cases.family(name), c["config"],
                                 cases.draw(c["tensors"]))
            with np.load(cases.golden_file(name)) as f:
                fingerprint = str(f["fingerprint"])
            golden = Golden.read(cases.golden_file(name), fingerprint)
            prompt = golden.tokens[:golden.prompt_len].tolist()
            want = golden.tokens[golden.prompt_len:].tolist()
            try:
                got = greedy(path, prompt, len(want))
            except Exception as e:  # llama.cpp refused the file
                print(f"{name}: llama.cpp refused it ({type(e).__name__}: {e})", flush=True)
                continue
            same = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(want))
            print(f"{name}: llama.cpp's greedy tokens equal transformers' for {same} of "
                  f"{len(want)}", flush=True)


if __name__ == "__main__":
    main()
