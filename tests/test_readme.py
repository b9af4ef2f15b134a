"""The README's library example, run as written on the real checkpoints."""

from __future__ import annotations

import contextlib
import io
import re

from tests.conftest import CHECKPOINTS, ROOT, checkpoint

# transformers 5.24's greedy generate on SmolLM2-135M-Instruct, float32
# (AutoModelForCausalLM.generate(do_sample=False), decoded with skip_special_tokens): the
# prompt "The capital of France is", 8 tokens; "Once upon a time", 12 tokens; the chat
# (system "You are a helpful assistant.", apply_chat_template with the generation prompt)
# ends at <|im_end|> after 8 tokens; the first two ids of the first continuation.
EXPECTED = (" Paris.\n\nThe answer is:\n"
            ", the city of Nova Haven was a thriving metropolis, with\n"
            "The capital of France is Paris.\n"
            "[7042, 30] length\n"
            "(2, 384)\n")  # all-MiniLM-L6-v2's 384-wide embeddings of the two texts


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "README.md has no ```python block"
    return blocks[0]


def test_the_readme_example_prints_transformers_greedy_text():
    checkpoint("smollm2-135m-instruct")
    checkpoint("all-minilm-l6-v2")
    code = readme_example()
    assert len(code.strip().splitlines()) <= 14  # a short example
    code = code.replace("~/.cache/iron-spec/checkpoints", str(CHECKPOINTS))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    assert out.getvalue() == EXPECTED
