"""Damaged GGUF files (issue 30): each refused before anything runs, naming the file and the
key or tensor, where gguf's own reader or llama.cpp's loader refuses it too or where it
would run another model than the file says. Each case is one edit of a valid file
(``tests/bad/gguf_corpus.py``)."""

from __future__ import annotations


import gguf
import pytest

from iron_spec.spec.build import load_model
from iron_spec.runtime.gguf import GGUFError, GGUFFile
from iron_spec.runtime.gguf_vocab import tokenizer
from tests.bad.corpus import LLAMA
from tests.bad.gguf_corpus import V, Entry, TensorEntry, base, write


@pytest.fixture()
def parts(tmp_path_factory):
    return base(tmp_path_factory.getbasetemp() / "gguf-base")[0]


def refused(parts, tmp_path, match: str, *, load: bool = True):
    path = write(parts, tmp_path / "bad.gguf")
    with pytest.raises(GGUFError, match=match) as e:
        if load:
            load_model(LLAMA, checkpoint=path, max_seq_len=16)
        else:
            GGUFFile(path)
    assert str(e.value).startswith(f"{path}: "), e.value
    return e.value


def gguf_refuses(path) -> bool:
    try:
        gguf.GGUFReader(str(path))
        return False
    except Exception:
        return True


def test_the_base_file_loads(parts, tmp_path):
    path = write(parts, tmp_path / "ok.gguf")
    assert load_model(LLAMA, checkpoint=path, max_seq_len=16).config_json["rope_theta"] == 500000.0


# --- the header ------------------------------------------------------------------------------

def test_a_key_given_twice(parts, tmp_path):
    # rope.freq_base 500000, then 10000: which one holds is not said (we took the last).
    parts.entries.append(Entry("llama.rope.freq_base", V.FLOAT32, 10000.0))
    refused(parts, tmp_path, "metadata key llama.rope.freq_base is given twice", load=False)
    assert gguf_refuses(tmp_path / "bad.gguf")


def test_a_tensor_listed_twice(parts, tmp_path):
    first = parts.tensors[0]
    parts.tensors.append(TensorEntry(first.name, list(first.dims), first.type, first.offset))
    refused(parts, tmp_path, f"tensor {first.name} is listed twice", load=False)
    assert gguf_refuses(tmp_path / "bad.gguf")


def test_a_tensor_whose_offset_points_at_another_tensors_bytes(parts, tmp_path):
    # output.weight's bytes read as another tensor's: it ran and printed other text.
    parts.tensors[2].offset = parts.tensors[1].offset
    refused(parts, tmp_path, f"tensor {parts.tensors[2].name}'s data begins at byte "
                             r"65536 of the data section, where GGUF puts it at byte 131072 .*"
                             "overlaps the bytes of the tensor before it", load=False)


def test_tensors_out_of_order(parts, tmp_path):
    parts.tensors[0], parts.tensors[1] = parts.tensors[1], parts.tensors[0]
    refused(parts, tmp_path, f"tensor {parts.tensors[0].name}'s data begins at byte 65536 .*"
                             "leaves a gap", load=False)


def test_a_misaligned_tensor(parts, tmp_path):
    parts.tensors[-1].offset += 4
    parts.data += b"\0" * 4
    refused(parts, tmp_path, "is not aligned to the file's alignment of 32 bytes", load=False)


@pytest.mark.parametrize("value", [48, 0, 3])
def test_an_alignment_that_is_not_a_power_of_two(parts, tmp_path, value):
    parts.entries.append(Entry("general.alignment", V.UINT32, value))
    refused(parts, tmp_path, f"general.alignment is {value}, not a power of two", load=False)
    assert gguf_refuses(tmp_path / "bad.gguf")


def test_an_alignment_of_another_type(parts, tmp_path):
    parts.entries.append(Entry("general.alignment", V.STRING, "32"))
    refused(parts, tmp_path, "general.alignment is string '32'; GGUF stores it as a uint32",
            load=False)
    assert gguf_refuses(tmp_path / "bad.gguf")


def test_a_big_endian_file_is_named_so(parts, tmp_path):
    parts.big_endian = True
    e = refused(parts, tmp_path, "a big-endian GGUF file .*reads little-endian", load=False)
    assert "50331648" not in str(e)


def test_a_header_that_counts_more_keys_than_the_file_holds(parts, tmp_path):
    parts.n_kv = 2**60
    refused(parts, tmp_path, "the header says 1152921504606846976 keys, more than the file's",
            load=False)


def test_a_tensor_of_five_dimensions(parts, tmp_path):
    parts.tensors[0].dims = [64, 256, 1, 1, 1]
    refused(parts, tmp_path, "tensor output.weight has 5 dimensions; GGUF tensors have at most 4",
            load=False)


# --- metadata of the wrong type or range -----------------------------------------------------

@pytest.mark.parametrize("key,kind,value,says", [
    ("llama.attention.head_count", V.UINT32, 0, "is 0; it must be at least 1"),
    ("llama.attention.head_count", V.STRING, "4", "is string '4'; it must be a whole number"),
    ("llama.block_count", V.FLOAT32, 2.0, "is float32 2.0; it must be a whole number"),
    ("llama.embedding_length", V.INT32, -64, "is -64; it must be at least 1"),
    ("llama.attention.head_count_kv", V.UINT32, 0, "is 0; it must be at least 1"),
    ("llama.rope.freq_base", V.FLOAT32, 0.0, "is 0.0; it must be a finite number above 0"),
    ("llama.attention.layer_norm_rms_epsilon", V.FLOAT32, float("nan"), "is nan; it must be a "
                                                                         "finite number above 0"),
    ("llama.context_length", V.UINT64, 0, "is 0; it must be at least 1"),
    ("general.architecture", V.UINT32, 7, "is uint32 7; it must be a string"),
])
def test_metadata_of_the_wrong_type_or_range(parts, tmp_path, key, kind, value, says):
    parts.entries = [Entry(key, kind, value) if e.key == key else e for e in parts.entries]
    refused(parts, tmp_path, f"metadata key {key} {says}")


def test_a_per_layer_list_where_one_value_is_read(parts, tmp_path):
    parts.entries = [Entry(e.key, V.ARRAY, [4, 4], V.UINT32) if e.key ==
                     "llama.attention.head_count" else e for e in parts.entries]
    refused(parts, tmp_path, "llama.attention.head_count is a list of 2 values")


# --- the vocabulary --------------------------------------------------------------------------

def _tokens(parts) -> Entry:
    return parts.entry("tokenizer.ggml.tokens")


def test_a_vocabulary_shorter_than_the_embedding(parts, tmp_path):
    tokens = _tokens(parts)
    tokens.value = tokens.value[:200]
    parts.entry("tokenizer.ggml.token_type").value = [1] * 200
    parts.entries = [e for e in parts.entries if e.key != "llama.vocab_size"]
    refused(parts, tmp_path, "tokenizer.ggml.tokens holds 200 tokens and token_embd.weight has "
                             "256 rows .*ids past the vocabulary would have no text")


def test_tokens_stored_as_integers(parts, tmp_path):
    tokens = _tokens(parts)
    tokens.item, tokens.value = V.INT32, list(range(len(tokens.value)))
    refused(parts, tmp_path, "metadata key tokenizer.ggml.tokens is array of int32 .*; it must "
                             "be an array of strings")


def test_a_merge_naming_a_missing_token(parts, tmp_path):
    parts.entry("tokenizer.ggml.merges").value = ["a b", "zz q"]
    refused(parts, tmp_path, r"tokenizer.ggml.merges\[1\] \('zz q'\) names 'zz', which is not in "
                             "tokenizer.ggml.tokens")


def test_a_merge_that_is_not_a_pair(parts, tmp_path):
    parts.entry("tokenizer.ggml.merges").value = ["a b c"]
    refused(parts, tmp_path, r"tokenizer.ggml.merges\[0\] is 'a b c', not two tokens")


def test_a_token_listed_twice(parts, tmp_path):
    tokens = _tokens(parts)
    tokens.value = tokens.value[:-1] + [tokens.value[5]]
    refused(parts, tmp_path, r"tokenizer.ggml.tokens lists .* twice \(ids 5 and 255\)")


def test_a_special_id_past_the_vocabulary(parts, tmp_path):
    parts.entries.append(Entry("tokenizer.ggml.eos_token_id", V.UINT32, 256))
    refused(parts, tmp_path, "metadata key tokenizer.ggml.eos_token_id is 256, not an id of the "
                             "256 tokens")


def test_token_types_of_another_length(parts, tmp_path):
    parts.entry("tokenizer.ggml.token_type").value = [1] * 10
    refused(parts, tmp_path, "tokenizer.ggml.token_type has 10 entries for 256 tokens")


def test_an_unknown_pre_tokenizer_says_the_known_ones(parts, tmp_path):
    parts.entry("tokenizer.ggml.pre").value = "no-such-pre"
    e = refused(parts, tmp_path, "tokenizer.ggml.pre is 'no-such-pre'; this reader splits text "
                                 "as GGUF's loader does for")
    assert "qwen2" in str(e) and "llama-bpe" in str(e)


def test_the_tokenizers_librarys_own_refusals_are_ours(parts, tmp_path, monkeypatch):
    # Whatever the library still refuses (its bare Exception), under the file's name.
    from iron_spec.runtime import gguf_vocab

    def broken(*args, **kwargs):
        raise Exception("Error while initializing BPE: something")
    monkeypatch.setattr(gguf_vocab, "BPE", broken)
    path = write(parts, tmp_path / "bad.gguf")
    with pytest.raises(GGUFError, match=r"bad.gguf: the tokenizer.ggml metadata does not build a "
                                        r"tokenizer: Exception: Error while initializing BPE"):
        tokenizer(GGUFFile(path))


# --- refusals say what would work ------------------------------------------------------------

def test_a_spec_with_no_gguf_section_names_the_spec_that_reads_it(parts, tmp_path):
    from iron_spec.spec.errors import SpecError
    from tests.conftest import SPECS
    path = write(parts, tmp_path / "llama.gguf")
    with pytest.raises(SpecError, match="this spec has no gguf section to read one: the spec "
                                        "llama3 reads it"):
        load_model(SPECS / "mistral.yaml", checkpoint=path, max_seq_len=16)
    with pytest.raises(SpecError, match="this spec reads GGUF files of qwen2; .* is llama: the "
                                        "spec llama3 reads it"):
        load_model(SPECS / "qwen2.yaml", checkpoint=path, max_seq_len=16)


def test_an_architecture_no_spec_reads(parts, tmp_path):
    from iron_spec.spec.registry import for_checkpoint
    parts.entry("general.architecture").value = "mamba"
    path = write(parts, tmp_path / "mamba.gguf")
    with pytest.raises(ValueError, match="no spec reads GGUF files of mamba .*its safetensors "
                                         "checkpoint loads with the spec of its architectures"):
        for_checkpoint(path)
