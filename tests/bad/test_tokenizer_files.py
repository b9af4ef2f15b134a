"""Bad tokenizer files, chat templates and generation_config.json refused, naming the file
and the key (issue 13): a chat_template that is not text (transformers' list of {name,
template} served as transformers serves it), templates that would run without end or build
gigabytes, end-of-text ids and tokens outside the vocabulary, sampling settings of the wrong
type or range."""

from __future__ import annotations

import json
import os
import time

import jinja2
import pytest
from typer.testing import CliRunner

from iron_spec.spec.build import load_model
from iron_spec.cli.app import app
from iron_spec.spec.errors import SpecError
from iron_spec.runtime.checkpoint import CheckpointError
from iron_spec.runtime.tokenizer import RENDER_SECONDS, TemplateBoundError, Tokenizer
from tests.bad.corpus import LLAMA, dump

EXPECTED = (SpecError, CheckpointError, FileNotFoundError, ValueError, jinja2.TemplateError)
HI = [{"role": "user", "content": "Hi"}]


def settings(toy_dir, **over):
    path = toy_dir / "tokenizer_config.json"
    data = json.loads(path.read_text())
    data.update(over)
    dump(path, data)
    return path


TOKENIZER_CONFIG = [
    ("template_number", {"chat_template": 5}, "chat_template is 5, not text"),
    ("template_mapping", {"chat_template": {"default": "x"}}, "chat_template is {'default'"),
    ("template_boolean", {"chat_template": True}, "chat_template is True, not text"),
    ("template_list_no_default", {"chat_template": [{"name": "tool_use", "template": "x"}]},
     "chat_template holds templates tool_use and none named default"),
    ("template_list_entry_text", {"chat_template": ["{{ x }}"]},
     "chat_template[0] is not a {name, template}"),
    ("template_list_entry_number", {"chat_template": [{"name": "default", "template": 3}]},
     "chat_template[0] is not a {name, template}"),
    ("eos_token_unknown", {"eos_token": "<|nowhere|>"}, "eos_token '<|nowhere|>' is not a token"),
    ("eos_token_record_unknown", {"eos_token": {"content": "<|end|>"}},
     "eos_token '<|end|>' is not a token"),
]


@pytest.mark.parametrize("case, over, says", TOKENIZER_CONFIG, ids=[c[0] for c in TOKENIZER_CONFIG])
def test_a_bad_tokenizer_config_is_refused_at_load_naming_file_and_key(toy_dir, case, over, says):
    path = settings(toy_dir, **over)
    with pytest.raises(EXPECTED) as e:
        load_model(LLAMA, checkpoint=toy_dir)
    assert str(e.value).startswith(f"{path}: ") and says in str(e.value), e.value


def test_named_templates_serve_the_default_as_transformers(toy_dir):
    settings(toy_dir, chat_template=[{"name": "tool_use", "template": "TOOLS"},
                                     {"name": "default", "template": "D:{{ messages[0].content }}"}])
    tok = Tokenizer(toy_dir)
    assert tok.decode(tok.chat(HI)) == "D:Hi"


FILES = {  # a tokenizer file that is not what its name says
    "tokenizer.json": [("directory", "is a directory"), ("fifo", "is a FIFO"),
                       ("garbage", "not a tokenizer the tokenizers library reads")],
    "tokenizer_config.json": [("directory", "is a directory"), ("fifo", "is a FIFO"),
                              ("not_utf8", "not UTF-8 text"), ("not_json", "not valid JSON"),
                              ("a_list", "holds a list, not a JSON object"),
                              ("deep", "nested too deeply")],
    "chat_template.jinja": [("directory", "is a directory"), ("fifo", "is a FIFO"),
                            ("not_utf8", "not UTF-8 text")],
}
UNREAD = [("directory", "is a directory"), ("fifo", "is a FIFO"), ("not_utf8", "not UTF-8 text"),
          ("not_json", "not valid JSON"), ("a_list", "holds a list"),
          ("deep", "nested too deeply")]
MAKE = {
    "directory": lambda p: p.mkdir(),
    "fifo": lambda p: os.mkfifo(p),
    "garbage": lambda p: p.write_text('{"version": "1.0", "model": 7}'),
    "not_utf8": lambda p: p.write_bytes(b'{"eos_token": "\xff\xfe"}'),
    "not_json": lambda p: p.write_text("{'eos_token': 1}"),
    "a_list": lambda p: p.write_text("[]"),
    "deep": lambda p: p.write_text("[" * 50_000 + "]" * 50_000),
}
FILE_CASES = [(name, kind, says) for name, kinds in FILES.items() for kind, says in kinds]


@pytest.mark.parametrize("name, kind, says", FILE_CASES,
                         ids=[f"{n}-{k}" for n, k, _ in FILE_CASES])
def test_a_tokenizer_file_that_is_not_what_its_name_says_is_refused(toy_dir, name, kind, says):
    path = toy_dir / name
    if path.exists():
        path.unlink()
    MAKE[kind](path)
    with pytest.raises(EXPECTED) as e:
        load_model(LLAMA, checkpoint=toy_dir)
    assert str(path) in str(e.value) and says in str(e.value), e.value


@pytest.mark.parametrize("kind, says", UNREAD, ids=[k for k, _ in UNREAD])
def test_an_unreadable_generation_config_is_a_warning_as_in_transformers(toy_dir, kind, says,
                                                                       caplog):
    # transformers' from_pretrained logs a GenerationConfig it cannot load and goes on; a
    # greedy run needs nothing from the file (found by a new user's trial: refused outright).
    path = toy_dir / "generation_config.json"
    path.unlink()
    MAKE[kind](path)
    with caplog.at_level("WARNING", logger="iron_spec"):
        result = runner.invoke(app, ["run", LLAMA, "--checkpoint", str(toy_dir), "--prompt",
                                     "hi", "--num-tokens", "2", "--temperature", "0"])
    assert result.exit_code == 0, result.output
    warned = [r.getMessage() for r in caplog.records if str(path) in r.getMessage()]
    assert len(warned) == 1 and says in warned[0] and "it is not used" in warned[0], warned


GENERATION_IDS = [
    ("eos_outside", {"eos_token_id": 999}, "eos_token_id is 999"),
    ("eos_negative", {"eos_token_id": -1}, "eos_token_id is -1"),
    ("eos_fraction", {"eos_token_id": 2.7}, "eos_token_id is 2.7"),
    ("eos_text", {"eos_token_id": "</s>"}, "eos_token_id is '</s>'"),
    ("eos_list_boolean", {"eos_token_id": [257, False]}, "eos_token_id[1] is False"),
    ("bos_outside", {"bos_token_id": 258}, "bos_token_id is 258"),
    ("pad_text", {"pad_token_id": "0"}, "pad_token_id is '0'"),
]


@pytest.mark.parametrize("case, over, says", GENERATION_IDS, ids=[c[0] for c in GENERATION_IDS])
def test_bad_ids_in_generation_config_are_refused_at_load(toy_dir, case, over, says):
    path = toy_dir / "generation_config.json"
    dump(path, {**json.loads(path.read_text()), **over})
    with pytest.raises(EXPECTED) as e:
        load_model(LLAMA, checkpoint=toy_dir)
    assert str(e.value).startswith(f"{path}: ") and says in str(e.value), e.value


runner = CliRunner()

GENERATION_SETTINGS = [
    ("top_k_fraction", {"top_k": 1.5}, "top_k is 1.5"),
    ("top_k_negative", {"top_k": -1}, "top_k is -1"),
    ("top_k_text", {"top_k": "5"}, "top_k is '5'"),
    ("top_k_boolean", {"top_k": True}, "top_k is True"),
    ("top_p_zero", {"top_p": 0}, "top_p is 0"),
    ("top_p_past_one", {"top_p": 1.5}, "top_p is 1.5"),
    ("top_p_nan", {"top_p": float("nan")}, "top_p is nan"),
    ("temperature_negative", {"temperature": -1.0}, "temperature is -1.0"),
    ("temperature_nan", {"temperature": float("nan")}, "temperature is nan"),
    ("temperature_infinite", {"temperature": float("inf")}, "temperature is inf"),
    ("temperature_text", {"temperature": "hot"}, "temperature is 'hot'"),
    ("do_sample_text", {"do_sample": "yes"}, "do_sample is 'yes'"),
    ("do_sample_number", {"do_sample": 1}, "do_sample is 1"),
    ("repetition_penalty_zero", {"repetition_penalty": 0}, "repetition_penalty is 0"),
    ("min_p_past_one", {"min_p": 2}, "min_p is 2"),
]


@pytest.mark.parametrize("case, over, says", GENERATION_SETTINGS,
                         ids=[c[0] for c in GENERATION_SETTINGS])
def test_bad_sampling_settings_in_generation_config_are_refused(toy_dir, case, over, says):
    path = toy_dir / "generation_config.json"
    dump(path, json.dumps({**json.loads(path.read_text()), **over}))
    result = runner.invoke(app, ["run", LLAMA, "--checkpoint", str(toy_dir), "--prompt", "hi",
                                 "--num-tokens", "2"])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert f"{path}: {says}" in result.output, result.output


# repetition_penalty applies greedy too (transformers' processors), so a greedy run reads it.
UNREAD_GREEDY = [c for c in GENERATION_SETTINGS if not c[0].startswith("repetition_penalty")]


@pytest.mark.parametrize("case, over, says", UNREAD_GREEDY, ids=[c[0] for c in UNREAD_GREEDY])
def test_a_bad_sampling_setting_is_not_read_by_a_greedy_run(toy_dir, case, over, says):
    # --temperature 0 reads no temperature, top_k, top_p, min_p or do_sample from the file
    # (found by a new user's trial: a broken one refused a greedy run).
    path = toy_dir / "generation_config.json"
    dump(path, json.dumps({**json.loads(path.read_text()), **over}))
    result = runner.invoke(app, ["run", LLAMA, "--checkpoint", str(toy_dir), "--prompt", "hi",
                                 "--num-tokens", "2", "--temperature", "0"])
    assert result.exit_code == 0, result.output


def test_a_bad_max_new_tokens_is_refused_where_it_is_read(toy_dir):
    path = toy_dir / "generation_config.json"
    dump(path, json.dumps({**json.loads(path.read_text()), "max_new_tokens": 0}))
    result = runner.invoke(app, ["run", LLAMA, "--checkpoint", str(toy_dir), "--prompt", "hi",
                                 "--temperature", "0"])
    assert result.exit_code == 1 and f"{path}: max_new_tokens is 0" in result.output, \
        result.output
    result = runner.invoke(app, ["run", LLAMA, "--checkpoint", str(toy_dir), "--prompt", "hi",
                                 "--temperature", "0", "--num-tokens", "2"])
    assert result.exit_code == 0, result.output


def _chat_with(toy_dir, template: str):
    settings(toy_dir, chat_template=template)
    return Tokenizer(toy_dir)


TEMPLATES = [
    ("loop_ten_billion", "{% for i in range(100000) %}{% for j in range(100000) %}"
                         "{% endfor %}{% endfor %}", f"ran past {RENDER_SECONDS:g} s"),
    # The memory bound counts what the render grows the process by: after earlier tests
    # freed gigabytes to the allocator, the string reuses them and the time bound trips
    # first (seen in the full suite under load). Either refuses it within seconds.
    ("string_doubled", "{% set ns = namespace(s='abcdefgh') %}{% for i in range(40) %}"
                       "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
     ("MiB", f"ran past {RENDER_SECONDS:g} s")),
    ("string_repeated", "{{ 'x' * 3000000000 }}", "repeats"),
    ("huge_power", "{{ 7 ** 100000000 }}", "to the power"),
    ("output_flood", "{% for i in range(100000) %}{% for j in range(100000) %}"
                     "0123456789abcdef{% endfor %}{% endfor %}", "the chat template"),
]


@pytest.mark.parametrize("case, template, says", TEMPLATES, ids=[t[0] for t in TEMPLATES])
def test_a_template_past_its_bounds_is_refused_within_seconds(toy_dir, case, template, says):
    tok = _chat_with(toy_dir, template)
    begin = time.monotonic()
    with pytest.raises(TemplateBoundError) as e:
        tok.chat(HI)
    assert time.monotonic() - begin < RENDER_SECONDS + 5
    assert any(said in str(e.value) for said in ((says,) if isinstance(says, str) else says)), \
        e.value


@pytest.mark.parametrize("case, template, says", [
    ("syntax", "{% for m in messages %}", "Unexpected end of template"),
    ("raise_exception", "{{ raise_exception('roles must alternate') }}", "roles must alternate"),
    ("unsafe_attribute", "{{ messages.__class__.__mro__ }}", "unsafe"),
    ("mutating_a_list", "{{ messages.append(1) }}", "unsafe"),
])
def test_a_template_refusing_or_refused_by_the_sandbox_is_a_template_error(
        toy_dir, case, template, says):
    tok = _chat_with(toy_dir, template)
    with pytest.raises(jinja2.TemplateError) as e:
        tok.chat(HI)
    assert says in str(e.value), e.value
    # where the template came from, beside its own words
    assert str(e.value).startswith(f"{toy_dir / 'tokenizer_config.json'}: chat_template: ")


def test_a_template_error_names_the_file_it_was_read_from(toy_dir):
    (toy_dir / "chat_template.jinja").write_text("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(jinja2.TemplateError) as e:
        Tokenizer(toy_dir).chat(HI)
    assert str(e.value) == (f"{toy_dir / 'chat_template.jinja'}: the chat template refuses "
                            "these messages (raise_exception): roles must alternate")
