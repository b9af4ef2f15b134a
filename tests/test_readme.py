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


def readme_example(n: int = 0) -> str:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) > n, f"README.md has no python block {n}"
    return blocks[n]


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


def test_the_readme_session_example_resumes_from_its_cache():
    import iron_spec

    model = iron_spec.load("llama3", checkpoint("smollm2-135m-instruct"), max_seq_len=256)
    scope = {"model": model}
    exec(compile(readme_example(1), "README.md", "exec"), scope)
    session, prompt, story = scope["session"], scope["prompt"], scope["story"]
    first = len(prompt) + len(story.token_ids) - 1  # ids the first call's caches hold
    later = session.calls[-(len(scope["more"].token_ids)):]
    # The second call's prompt ran from where the first left off (its last whole chunk),
    # not from position 0; what it drew is what a fresh history gives.
    assert all(start > 0 for _, start, _ in later), session.calls
    assert later[0][1] <= first
    fresh = model.complete(prompt + story.token_ids, max_new_tokens=8)
    assert fresh.token_ids == scope["more"].token_ids


def test_the_test_data_script_is_where_the_readme_says():
    # The first command runs ../shared/data/make_checkpoints.sh from the checkout's root, as
    # .ci/run does; the README says it lives in shared/ beside the checkout.
    text = (ROOT / "README.md").read_text()
    script = re.search(r"bash (\S*make_checkpoints\.sh)", text)[1]
    assert f"bash {script} " in (ROOT / ".ci" / "run").read_text()
    assert "in the `shared/` folder next to the\ncheckout" in text
    if (ROOT.parent / "shared").is_dir():
        assert (ROOT / script).resolve() == (ROOT.parent / "shared" / "data" /
                                             "make_checkpoints.sh").resolve()
        assert (ROOT / script).is_file()
