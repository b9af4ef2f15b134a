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


def readme_example(n: int = 0, page: str = "README.md") -> str:
    text = (ROOT / page).read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) > n, f"{page} has no python block {n}"
    return blocks[n]


def example_with(needle: str, page: str) -> str:
    """The python block of ``page`` that holds ``needle``."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), re.S)
    found = [b for b in blocks if needle in b]
    assert len(found) == 1, f"{page} has {len(found)} python blocks holding {needle!r}"
    return found[0]


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


def test_the_library_pages_session_example_resumes_from_its_cache():
    import iron_spec

    model = iron_spec.load("llama3", checkpoint("smollm2-135m-instruct"), max_seq_len=256)
    scope = {"model": model}
    exec(compile(example_with("Session(model.loaded.lm)", "docs/library.md"), "library.md",
                 "exec"), scope)
    session, prompt, story = scope["session"], scope["prompt"], scope["story"]
    first = len(prompt) + len(story.token_ids) - 1  # ids the first call's caches hold
    later = session.calls[-(len(scope["more"].token_ids)):]
    # The second call ran the one token the first drew last and never read, a decode step
    # from where the first left off, and nothing before it; what it drew is what a fresh
    # history gives.
    assert later[0] == ("decode", first, 1), session.calls
    assert all(kind == "decode" for kind, _, _ in later)
    assert scope["more"].cached_tokens == first
    fresh = model.complete(prompt + story.token_ids, max_new_tokens=8)
    assert fresh.token_ids == scope["more"].token_ids


def test_the_readmes_tables_are_iron_spec_lists():
    from typer.testing import CliRunner
    from iron_spec.cli.app import app
    text = (ROOT / "README.md").read_text()
    begin, end = "<!-- the tables below: iron-spec list --markdown -->\n", \
        "<!-- end of iron-spec list --markdown -->"
    assert begin in text and end in text
    table = text.split(begin)[1].split(end)[0]
    listed = CliRunner().invoke(app, ["list", "--markdown"]).stdout
    assert table == listed, ("README.md's tables of specs are not current: put "
                             "`iron-spec list --markdown`'s output between its markers")


def test_the_readme_reads_in_five_minutes():
    # What is read, not skimmed: the prose, without the code, the commands and the tables.
    text = (ROOT / "README.md").read_text()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    prose = [l for l in text.splitlines() if l.strip() and not l.startswith(("    ", "|"))]
    words = sum(len(l.split()) for l in prose)
    assert words <= 1000, f"README.md's prose is {words} words: five minutes' reading is ~1000"


def test_every_link_of_the_readme_and_docs_is_there():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name} links {target}: not there"


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
