"""runtime.tokenizer on the real SmolLM2 tokenizer (ids checked against transformers'
AutoTokenizer) and on a tiny byte-level tokenizer built here, whose ids are the UTF-8 bytes
themselves, so every expectation can be written by hand."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import jinja2
import jinja2.exceptions
import numpy as np
import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors

from iron_spec.runtime.tokenizer import TextStream, Tokenizer

SMOLLM2_CHAT_HI = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                   "Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
BOS, EOS = 256, 257  # the tiny tokenizer's special tokens, after its 256 byte tokens


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the ByteLevel alphabet), from its paper code."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def write_tiny(directory: Path, post_processor: bool = False) -> Path:
    """A byte-level tokenizer with no merges: byte b is id b; <s> is 256 and </s> 257."""
    table = bytes_to_unicode()
    assert sorted(table.values()) == sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = HFTokenizer(models.BPE(vocab={c: b for b, c in table.items()}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<s>", "</s>"])
    if post_processor:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", special_tokens=[("<s>", BOS), ("</s>", EOS)])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    return directory


def write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data))


@pytest.fixture
def tiny(tmp_path) -> Path:
    return write_tiny(tmp_path / "tiny")


def with_template(directory: Path, template) -> Tokenizer:
    write_json(directory / "tokenizer_config.json",
               {"chat_template": template, "bos_token": "<s>", "eos_token": "</s>"})
    return Tokenizer(directory)


HI = [{"role": "user", "content": "Hi"}]


# --- the real SmolLM2 tokenizer --------------------------------------------------------------

def test_smollm2_encode_matches_transformers(smollm2):
    tok = Tokenizer(smollm2)
    assert tok.encode("The capital of France is") == [504, 3575, 282, 4649, 314]
    assert tok.encode("The capital of France is", add_special_tokens=False) == [504, 3575, 282, 4649, 314]
    assert tok.decode([504, 3575, 282, 4649, 314]) == "The capital of France is"
    assert tok.vocab_size == 49152


def test_smollm2_eos_ids(smollm2):
    assert Tokenizer(smollm2).eos_ids == {2}


def test_smollm2_chat_renders_the_template_exactly(smollm2):
    tok = Tokenizer(smollm2)
    ids = tok.chat(HI)
    assert tok.decode(ids, skip_special_tokens=False) == SMOLLM2_CHAT_HI
    assert ids == tok.encode(SMOLLM2_CHAT_HI, add_special_tokens=False)
    # the markers are single special tokens: <|im_start|> is 1, <|im_end|> is 2 (config.json)
    assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2
    assert tok.decode(ids) == ("system\nYou are a helpful AI assistant named SmolLM, trained by "
                               "Hugging Face\nuser\nHi\nassistant\n")
    without = tok.chat(HI, add_generation_prompt=False)
    assert tok.decode(without, skip_special_tokens=False) == \
        SMOLLM2_CHAT_HI.removesuffix("<|im_start|>assistant\n")


def test_smollm2_chat_keeps_a_given_system_message(smollm2):
    tok = Tokenizer(smollm2)
    ids = tok.chat([{"role": "system", "content": "Be brief."}, *HI])
    assert tok.decode(ids, skip_special_tokens=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n")


def test_smollm2_without_a_template_chat_is_a_value_error(smollm2, tmp_path):
    shutil.copy(smollm2 / "tokenizer.json", tmp_path / "tokenizer.json")
    tok = Tokenizer(tmp_path)
    assert tok.chat_template is None
    assert tok.encode("The capital of France is") == [504, 3575, 282, 4649, 314]
    with pytest.raises(ValueError, match="no chat template"):
        tok.chat(HI)


@pytest.mark.parametrize("text", ["🙂", "日本語", "héllo 🎉 世界!"])
def test_smollm2_stream_holds_back_split_characters(smollm2, text):
    tok = Tokenizer(smollm2)
    ids = tok.encode(text, add_special_tokens=False)
    raw = HFTokenizer.from_file(str(smollm2 / "tokenizer.json"))
    # the premise, from the tokenizers library itself: some prefix splits a character
    assert any(raw.decode(ids[:i]).endswith("\ufffd") for i in range(1, len(ids)))
    stream = TextStream(tok)
    pieces = [stream.push(i) for i in ids]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    assert "" in pieces  # something was held back


def test_smollm2_stream_pieces_are_what_the_whole_text_adds(smollm2):
    # A push decodes a window of the ids, not all of them: each piece is still what the
    # whole text gains at that id (nothing while a character is split), on text and on
    # ids drawn at random (special tokens and split characters among them).
    tok = Tokenizer(smollm2)
    rng = np.random.default_rng(0)
    runs = [tok.encode("héllo 🎉 世界! don't .  , a\n\n  b 日本語 🙂🙂", add_special_tokens=False)]
    runs += [rng.integers(0, 49152, 200).tolist() for _ in range(5)]
    for ids in runs:
        stream, shown, want = TextStream(tok), 0, []
        for n in range(1, len(ids) + 1):
            text = tok.decode(ids[:n])
            want.append("" if text.endswith("\ufffd") else text[shown:])
            shown = shown if text.endswith("\ufffd") else len(text)
        assert [stream.push(i) for i in ids] == want


def test_smollm2_eos_union(smollm2, tmp_path):
    shutil.copy(smollm2 / "tokenizer.json", tmp_path / "tokenizer.json")
    write_json(tmp_path / "generation_config.json", {"eos_token_id": [5, 7]})
    write_json(tmp_path / "config.json", {"eos_token_id": 9})
    assert Tokenizer(tmp_path).eos_ids == {5, 7, 9}
    write_json(tmp_path / "tokenizer_config.json", {"eos_token": "<|im_end|>"})
    assert Tokenizer(tmp_path).eos_ids == {2, 5, 7, 9}


# --- the tiny tokenizer: ids are bytes -------------------------------------------------------

def test_tiny_tokenizer_ids_are_utf8_bytes(tiny):
    tok = Tokenizer(tiny)
    assert tok.encode("a€b") == [0x61, 0xE2, 0x82, 0xAC, 0x62]
    assert tok.decode([0x61, 0xE2, 0x82, 0xAC, 0x62]) == "a€b"
    assert tok.eos_ids == frozenset()
    assert tok.vocab_size == 258


def test_encode_keeps_the_leading_specials_only(tmp_path):
    tok = Tokenizer(write_tiny(tmp_path, post_processor=True))
    assert tok.encode("ab") == [BOS, 0x61, 0x62]  # "<s> $A </s>" without its </s>
    assert tok.encode("ab", add_special_tokens=False) == [0x61, 0x62]
    assert tok.encode("") == [BOS]
    assert tok.encode("", add_special_tokens=False) == []


def test_missing_tokenizer_json_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer(tmp_path)


def test_eos_union_of_generation_config_config_and_tokenizer(tiny):
    write_json(tiny / "generation_config.json", {"eos_token_id": [5, 7]})
    write_json(tiny / "config.json", {"eos_token_id": 9})
    assert Tokenizer(tiny).eos_ids == {5, 7, 9}
    write_json(tiny / "tokenizer_config.json", {"eos_token": "</s>"})
    assert Tokenizer(tiny).eos_ids == {5, 7, 9, EOS}
    # an added-token record names it as well; a null eos_token_id adds nothing
    write_json(tiny / "tokenizer_config.json", {"eos_token": {"content": "</s>", "special": True}})
    write_json(tiny / "config.json", {"eos_token_id": None})
    assert Tokenizer(tiny).eos_ids == {5, 7, EOS}


def test_an_eos_token_outside_the_vocabulary_is_refused_naming_it(tiny):
    # Generation could never stop at a token the tokenizer does not have (issue 13).
    write_json(tiny / "config.json", {"eos_token_id": 3})
    write_json(tiny / "tokenizer_config.json", {"eos_token": "<|nowhere|>"})
    with pytest.raises(ValueError, match=r"tokenizer_config.json: eos_token '<\|nowhere\|>' "
                                         "is not a token of tokenizer.json"):
        Tokenizer(tiny)


def test_chat_template_jinja_is_preferred_over_the_config(tiny):
    (tiny / "chat_template.jinja").write_text("JINJA:{{ messages[0]['content'] }}")
    tok = with_template(tiny, "CONFIG:{{ messages[0]['content'] }}")
    assert tok.decode(tok.chat(HI)) == "JINJA:Hi"
    (tiny / "chat_template.jinja").unlink()
    tok = Tokenizer(tiny)
    assert tok.decode(tok.chat(HI)) == "CONFIG:Hi"


def test_named_templates_use_the_default(tiny):
    tok = with_template(tiny, [{"name": "tool_use", "template": "TOOLS"},
                               {"name": "default", "template": "DEFAULT{{ messages|length }}"}])
    assert tok.decode(tok.chat(HI)) == "DEFAULT1"


def test_chat_is_rendered_as_transformers_renders_it(tiny):
    template = ("{{ bos_token }}{% for m in messages %}\n"
                "    {% if m['role'] == 'user' %}\n"
                "U:{{ m['content'] }};\n"
                "    {% endif %}\n"
                "{% endfor %}\n"
                "{% if add_generation_prompt %}A:{% endif %}")
    tok = with_template(tiny, template)
    ids = tok.chat(HI)
    # trim_blocks drops the newline after a tag, lstrip_blocks the spaces before one
    assert tok.decode(ids, skip_special_tokens=False) == "<s>U:Hi;\nA:"
    assert ids == [BOS] + list(b"U:Hi;\nA:")  # "<s>" is one special token, the rest bytes
    assert tok.decode(tok.chat(HI, add_generation_prompt=False), skip_special_tokens=False) == "<s>U:Hi;\n"


def test_tojson_keeps_non_ascii_as_transformers_does(tiny):
    tok = with_template(tiny, "{{ messages|tojson }}")
    assert tok.decode(tok.chat([{"role": "user", "content": "é"}])) == \
        '[{"role": "user", "content": "é"}]'


def test_loop_controls_and_strftime_are_there(tiny):
    tok = with_template(tiny, "{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}"
                              "{{ i }}{% endfor %}|{{ strftime_now('%Y') | length }}")
    assert tok.decode(tok.chat(HI)) == "012|4"


def test_raise_exception_is_a_template_error(tiny):
    tok = with_template(tiny, "{% if messages[0]['role'] != 'system' %}{{ raise_exception('no') }}{% endif %}")
    with pytest.raises(jinja2.TemplateError, match="no"):
        tok.chat(HI)


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__ }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{{ raise_exception.__globals__['json'] }}",
    "{% set x = [] %}{{ x.append(1) }}",  # the immutable sandbox: no mutation either
])
def test_the_sandbox_refuses_escapes(tiny, template):
    tok = with_template(tiny, template)
    with pytest.raises(jinja2.exceptions.SecurityError):
        tok.chat(HI)


def test_the_sandbox_renders_an_unsafe_attribute_as_nothing(tiny):
    tok = with_template(tiny, "[{{ ''.__class__ }}{{ raise_exception.__globals__ }}]")
    assert tok.decode(tok.chat(HI)) == "[]"


def test_stream_holds_back_a_split_character(tiny):
    tok = Tokenizer(tiny)
    stream = TextStream(tok)
    # '€' is E2 82 AC: nothing of it shows until its third byte
    assert [stream.push(i) for i in [0x61, 0xE2, 0x82, 0xAC, 0x62]] == ["a", "", "", "€", "b"]
    stream = TextStream(tok)
    emoji = list("🙂 ok".encode())  # F0 9F 99 82, then ascii
    assert [stream.push(i) for i in emoji] == ["", "", "", "🙂", " ", "o", "k"]


def test_stream_drops_special_tokens(tiny):
    stream = TextStream(Tokenizer(tiny))
    assert [stream.push(i) for i in [BOS, 0x68, 0x69, EOS]] == ["", "h", "i", ""]


@pytest.mark.parametrize("text,says", [
    ("caf\udce9", "byte 0xe9 at position 3"),  # b"caf\xe9" as Python hands it over
    ("€\udcff", "byte 0xff at position 3"),  # the position counts bytes: '€' is 3
    ("a\ud800", "lone surrogate U+D800 at position 1"),
])
def test_text_that_is_not_utf8_is_a_value_error_naming_the_byte(tiny, text, says):
    tok = with_template(tiny, "{{ messages[0]['content'] }}")
    for add in (True, False):
        with pytest.raises(ValueError, match=re.escape(f"the text is not UTF-8 text: {says}")):
            tok.encode(text, add_special_tokens=add)
    with pytest.raises(ValueError, match="not UTF-8 text"):
        tok.chat([{"role": "user", "content": text}])


@pytest.mark.parametrize("name", ["tokenizer_config.json", "config.json"])
def test_a_json_file_that_is_not_json_is_named(tiny, name):
    (tiny / name).write_text("{not json")
    with pytest.raises(ValueError, match=f"{name}: not valid JSON"):
        Tokenizer(tiny)


def test_a_generation_config_that_is_not_json_gives_no_end_of_text_ids(tiny):
    # As transformers, which goes on without a GenerationConfig it cannot load.
    (tiny / "generation_config.json").write_text('{"eos_token_id": [5, 7]')
    assert 5 not in Tokenizer(tiny).eos_ids


def test_a_gguf_template_error_names_its_metadata_key(tmp_path):
    import gguf

    from iron_spec.runtime import gguf_vocab
    from iron_spec.runtime.gguf import GGUFFile

    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(["a", "b", "ab"])
    w.add_token_merges(["a b"])
    w.add_chat_template("{{ raise_exception('no system role') }}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(jinja2.TemplateError) as e:
        gguf_vocab.tokenizer(GGUFFile(tmp_path / "m.gguf")).chat(HI)
    assert str(e.value) == (f"{tmp_path / 'm.gguf'}: tokenizer.chat_template: the chat "
                            "template refuses these messages (raise_exception): no system role")


def test_a_template_whose_own_code_fails_is_a_template_error_naming_it(tiny):
    # Found by a new user's trial: `{{ m.content + 1 }}` ended `run --chat` in a traceback
    # (TypeError), where the template's other failures are one line naming the file.
    tok = with_template(tiny, "{% for m in messages %}{{ m.content + 1 }}{% endfor %}")
    with pytest.raises(jinja2.TemplateError, match="the chat template fails on these messages: "
                                                   "TypeError"):
        tok.chat(HI)
