"""Fuzzing the loaders with hypothesis (issue 13): mutated specs, config.json files and
safetensors headers, a few hundred cases a run, seeded (``derandomize``: the same cases every
run, in CI too) and bounded in time. Each must load or be refused with one of the tool's own
errors (SpecError, CheckpointError, FileError, or the ValueError of a checked value): never
another exception, a hang or a blow-up. What loads must also be usable: its RoPE tables
finite (a NaN factor once loaded silently and made every logit NaN)."""

from __future__ import annotations

import copy
import json
import math
import os
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from iron_spec.spec.build import load_model
from iron_spec.spec.errors import SpecError
from iron_spec.spec.interpreter import expand
from iron_spec.spec.lint import lint_spec
from iron_spec.spec.loader import load_spec, parse_spec
from iron_spec.operators.rope import rope_inv_freq
from iron_spec.runtime.checkpoint import Checkpoint, CheckpointError, load
from tests.bad.corpus import LLAMA, pristine
from tests.conftest import SPECS

SCALE = int(os.environ.get("IRON_SPEC_FUZZ_SCALE", "1"))  # more cases, on a developer's ask
FUZZ = settings(derandomize=True, deadline=None, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
OURS = (SpecError, CheckpointError, ValueError, FileNotFoundError)
# A refusal of ours is a ValueError (SpecError, CheckpointError and FileError are); one from
# deep inside Python has no file in its message, so a ValueError must name one.
FUZZED = ["llama3", "mistral", "gemma3", "qwen2", "phi3", "gpt_neox"]

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.sampled_from(
        [0, 1, -1, 2, 3, 7, 2**31, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.0, 0.5, 1e-300, 1e300, float("nan"), float("inf")]),
    st.text(max_size=6), st.sampled_from(["silu", "gelu", "llama3", "yarn", "linear",
                                          "dynamic", "longrope", "default", "none"]))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=8)


def _paths(node, prefix=()):
    """Every path of keys and indices into ``node``, itself first."""
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


def _set(node, path, value):
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value


def _mutate(data, draw, values, n):
    """``data`` with ``n`` edits: a value replaced, a key dropped, or a key added."""
    data = copy.deepcopy(data)
    for _ in range(n):
        paths = [p for p in _paths(data) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["replace", "replace", "drop", "add"]))
        parent = data
        for k in path[:-1]:
            parent = parent[k]
        if action == "replace":
            parent[path[-1]] = copy.deepcopy(draw(values))
        elif action == "drop" and isinstance(parent, dict):
            del parent[path[-1]]
        elif isinstance(parent, dict):
            key = draw(st.sampled_from(["rope_scaling", "sliding_window", "head_dim",
                                        "eos_token_id", "rope_theta", "factor",
                                        "original_max_position_embeddings"]))
            parent[key] = copy.deepcopy(draw(values))
    return data


def _usable(loaded) -> None:
    """What loads is usable: every RoPE table's frequencies finite."""
    for name, r in loaded.expanded.options.ropes.items():
        inv, attention = rope_inv_freq(r.rotary_dim, r.theta, r.scaling)
        assert np.isfinite(inv).all() and math.isfinite(attention), (name, r)


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


# --- config.json ------------------------------------------------------------------------------

@settings(FUZZ, max_examples=300 * SCALE)
@given(data=st.data())
def test_fuzzed_config_json_loads_or_is_refused_cleanly(workdir, data):
    name = data.draw(st.sampled_from(FUZZED))
    spec = SPECS / f"{name}.yaml"
    config = _mutate(load_spec(spec).get("toy", "config"), data.draw, json_values,
                     data.draw(st.integers(1, 3)))
    (workdir / "config.json").write_text(json.dumps(config))
    try:
        loaded = load_model(spec, checkpoint=workdir, random_weights=0, max_seq_len=16,
                            allow_unread_config=True)
    except OURS as e:
        assert isinstance(e, (SpecError, CheckpointError)) or "config.json" in str(e) or \
            str(workdir) in str(e) or "--" in str(e) or "budget" in str(e), repr(e)
        event(f"refused: {type(e).__name__}")
        return
    event("loaded")
    _usable(loaded)


# --- specs ------------------------------------------------------------------------------------

spec_values = st.one_of(json_scalars, st.sampled_from(
    ["hidden_size", "head_dim // 0", "num_attention_heads * 2", "1 if true else 2",
     "min(hidden_size)", "__import__('os')", "rope_theta ** 1000", "sliding_window",
     "{json: x}", "null", "[1, 2]", "hidden_size // (head_dim - head_dim)"]),
    st.lists(st.integers(-3, 3), max_size=3))


@settings(FUZZ, max_examples=250 * SCALE)
@given(data=st.data())
def test_fuzzed_specs_lint_and_expand_or_are_refused_cleanly(data):
    name = data.draw(st.sampled_from(FUZZED))
    spec = load_spec(SPECS / f"{name}.yaml")
    mutated = _mutate(spec.data, data.draw, spec_values, data.draw(st.integers(1, 4)))
    try:
        text = yaml.safe_dump(mutated, sort_keys=False)
    except yaml.YAMLError:
        return
    if data.draw(st.booleans()):  # a text-level cut or repeat too
        lines = text.splitlines(keepends=True)
        i = data.draw(st.integers(0, max(len(lines) - 1, 0)))
        j = data.draw(st.integers(i, len(lines)))
        text = "".join(lines[:i] + (lines[i:j] * 2 if data.draw(st.booleans()) else []) +
                       lines[j:])
    try:
        parsed = parse_spec(text, f"{name}-fuzzed.yaml")
    except SpecError:
        event("refused by the loader")
        return
    problems = lint_spec(parsed)  # lint's rules must not crash on anything
    assert all(isinstance(p, SpecError) for p in problems)
    event("lint: problems" if problems else "lint: clean")
    toy = parsed.get("toy", "config")
    if isinstance(toy, dict):
        try:
            expand(parsed, toy, max_seq_len=16, prefill_chunk=16, source="toy.config")
        except (SpecError, ValueError) as e:
            assert isinstance(e, SpecError) or "prefill_chunk" in str(e), repr(e)


# --- safetensors headers ----------------------------------------------------------------------

DTYPES = ["F64", "F32", "F16", "BF16", "I64", "I32", "U8", "BOOL", "F8_E4M3", "F33", "f32", ""]


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    path = pristine(tmp_path_factory.getbasetemp()) / "model.safetensors"
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


_TREE = {}


def _toy_tree():
    """The llama3 toy's module tree (built once: a load fills it again each case)."""
    if "lm" not in _TREE:
        _TREE["lm"] = load_model(LLAMA, random_weights=0, toy=True).lm
    return _TREE["lm"]


def _library_accepts(path: Path) -> bool:
    try:
        with safe_open(str(path), framework="numpy") as f:
            for k in f.keys():
                f.get_slice(k)
        return True
    except Exception:
        return False


@settings(FUZZ, max_examples=300 * SCALE)
@given(data=st.data())
def test_fuzzed_safetensors_headers_are_judged_as_the_library_judges_them(
        workdir, weights, data):
    header, body = copy.deepcopy(weights[0]), weights[1]
    names = [k for k in header if k != "__metadata__"]
    for _ in range(data.draw(st.integers(1, 3))):
        name = data.draw(st.sampled_from(names))
        e = header[name]
        if not (isinstance(e, dict) and isinstance(e.get("data_offsets"), list)
                and len(e["data_offsets"]) == 2):
            continue  # an entry an earlier edit replaced: mutated no further
        what = data.draw(st.sampled_from(["begin", "end", "both", "dtype", "shape", "drop",
                                          "copy", "tail", "cut", "value"]))
        shift = data.draw(st.sampled_from([-8, -4, -2, -1, 1, 2, 4, 8, 10**6]))
        if what == "begin":
            e["data_offsets"][0] += shift
        elif what == "end":
            e["data_offsets"][1] += shift
        elif what == "both":
            e["data_offsets"] = [x + shift for x in e["data_offsets"]]
        elif what == "dtype":
            e["dtype"] = data.draw(st.sampled_from(DTYPES))
        elif what == "shape":
            e["shape"] = data.draw(st.lists(st.integers(-2, 300), max_size=3))
        elif what == "drop" and len(header) > 1:
            del header[name]
            names.remove(name)
        elif what == "copy":
            other = data.draw(st.sampled_from(names))
            header[other] = dict(e)
        elif what == "tail":
            body = body + b"\0" * data.draw(st.integers(1, 16))
        elif what == "cut":
            body = body[:-data.draw(st.integers(1, 16))]
        else:
            header[name] = data.draw(json_values)
        if not names:
            break
    head = json.dumps(header).encode()
    path = workdir / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(head)) + head + body)
    try:
        checkpoint = Checkpoint(path)
    except CheckpointError as e:
        assert str(e).startswith(f"{path}: "), e
        # Never stricter than the library either, but for dtypes it reads that we do not
        # (F8_E4M3, ...: refused as such).
        assert not _library_accepts(path) or "has dtype" in str(e), (e, header)
        event("header refused")
        return
    event("header read")
    # Never looser than the library: what we read, it reads.
    assert _library_accepts(path), header
    try:
        load(_toy_tree(), checkpoint)
    except CheckpointError as e:
        assert str(path) in str(e) or "does not fit the model" in str(e), e


# --- tokenizer_config.json and generation_config.json -----------------------------------------

@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    import shutil
    into = tmp_path_factory.mktemp("tok") / "ckpt"
    shutil.copytree(pristine(tmp_path_factory.getbasetemp()), into)
    return into


@settings(FUZZ, max_examples=200 * SCALE)
@given(data=st.data())
def test_fuzzed_tokenizer_and_generation_configs_load_or_are_refused_cleanly(
        tokenizer_dir, data):
    from iron_spec.runtime.tokenizer import Tokenizer
    import jinja2
    name = data.draw(st.sampled_from(["tokenizer_config.json", "generation_config.json"]))
    path = tokenizer_dir / name
    original = path.read_text()
    edited = _mutate(json.loads(original), data.draw, st.one_of(json_values, st.sampled_from(
        ["{{ messages }}", "{% for m in messages %}{{ m.content }}{% endfor %}", "{{",
         "<s>", "</s>", "<unk>", [{"name": "default", "template": "x"}]])),
        data.draw(st.integers(1, 3)))
    path.write_text(json.dumps(edited))
    try:
        tok = Tokenizer(tokenizer_dir)
        if tok.chat_template is not None:
            tok.chat([{"role": "user", "content": "Hi"}])
        event("read")
    except (ValueError, jinja2.TemplateError) as e:
        assert str(path) in str(e) or isinstance(e, jinja2.TemplateError), repr(e)
        event(f"refused: {type(e).__name__}")
    finally:
        path.write_text(original)


# --- GGUF headers -----------------------------------------------------------------------------

GGUF_VALUES = st.one_of(
    st.sampled_from([0, 1, 2, 3, 4, 7, 16, 32, 48, 64, 255, 256, 2**31, 2**32 - 1]),
    st.integers(-2**31, 2**31 - 1), st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.text(max_size=6), st.booleans())


def _gguf_value(draw, value):
    """A GGUF (type, value, item) for ``value`` as drawn: the type a value of that kind
    takes, or another of the same family."""
    from tests.bad.gguf_corpus import V
    if isinstance(value, bool):
        return V.BOOL, value, None
    if isinstance(value, int):
        kinds = [k for k, lo, hi in ((V.UINT32, 0, 2**32 - 1), (V.INT32, -2**31, 2**31 - 1),
                                     (V.UINT64, 0, 2**64 - 1), (V.INT8, -128, 127),
                                     (V.UINT8, 0, 255)) if lo <= value <= hi]
        return draw(st.sampled_from(kinds)), value, None
    if isinstance(value, float):
        return draw(st.sampled_from([V.FLOAT32, V.FLOAT64])), value, None
    return V.STRING, value, None


def _mutate_gguf(parts, draw):
    """``parts`` with one to three edits of its metadata, tensor table, counts or data."""
    from tests.bad.gguf_corpus import V, Entry, TensorEntry
    for _ in range(draw(st.integers(1, 3))):
        what = draw(st.sampled_from(
            ["value", "value", "type", "drop", "twice", "align", "array", "tokens", "merges",
             "offset", "offset", "dims", "ttype", "tensor_twice", "tensor_drop", "rename",
             "swap", "counts", "cut", "tail", "version", "endian"]))
        entries, tensors = parts.entries, parts.tensors
        if what in ("value", "type", "drop", "twice") and entries:
            i = draw(st.integers(0, len(entries) - 1))
            e = entries[i]
            if what == "value" and e.type != V.ARRAY:
                entries[i] = Entry(e.key, *_gguf_value(draw, draw(GGUF_VALUES)))
            elif what == "type" and e.type != V.ARRAY:
                entries[i] = Entry(e.key, draw(st.sampled_from([V.STRING, V.UINT32, V.FLOAT32,
                                                                  V.BOOL, V.INT64])),
                                   e.value if not isinstance(e.value, str) else 3)
                if entries[i].type == V.STRING:
                    entries[i].value = str(e.value)
                elif entries[i].type == V.BOOL:
                    entries[i].value = bool(e.value)
                elif entries[i].type == V.FLOAT32:
                    entries[i].value = float(e.value) if not isinstance(e.value, str) else 1.0
                else:
                    try:
                        entries[i].value = max(0, int(e.value))
                    except (TypeError, ValueError, OverflowError):
                        entries[i].value = 1
            elif what == "drop":
                del entries[i]
            elif what == "twice":
                entries.append(Entry(e.key, e.type, copy.deepcopy(e.value), e.item))
        elif what == "align":
            kind, value, _ = _gguf_value(draw, draw(st.sampled_from([0, 1, 3, 16, 32, 48, 64,
                                                                     100, "32", 32.0])))
            entries.append(Entry("general.alignment", kind, value))
        elif what == "array" and entries:
            e = draw(st.sampled_from([e for e in entries if e.type == V.ARRAY] or entries))
            if e.type == V.ARRAY and e.value:
                n = draw(st.integers(0, len(e.value)))
                e.value = e.value[:n] if draw(st.booleans()) else e.value + e.value[:n]
        elif what == "tokens":
            e = next((e for e in entries if e.key == "tokenizer.ggml.tokens"), None)
            if e is not None and e.value:
                how = draw(st.sampled_from(["int", "dup", "empty", "short"]))
                if how == "empty" and e.item != V.STRING:  # an earlier edit made them integers
                    how = "short"
                if how == "int":
                    e.item, e.value = V.INT32, list(range(len(e.value)))
                elif how == "dup":
                    e.value[draw(st.integers(0, len(e.value) - 1))] = e.value[0]
                elif how == "empty":
                    e.value[draw(st.integers(0, len(e.value) - 1))] = ""
                else:
                    e.value = e.value[:draw(st.integers(0, len(e.value)))]
        elif what == "merges":
            e = next((e for e in entries if e.key == "tokenizer.ggml.merges"), None)
            if e is not None:
                e.value = draw(st.lists(st.sampled_from(["a b", "a", "a b c", "zz q", " ", "",
                                                         "ab b", "b a"]), max_size=4))
        elif what in ("offset", "dims", "ttype", "tensor_twice", "tensor_drop", "rename",
                      "swap") and tensors:
            i = draw(st.integers(0, len(tensors) - 1))
            t = tensors[i]
            if what == "offset":
                t.offset = max(0, t.offset + draw(st.sampled_from([-64, -32, -4, -1, 1, 4, 32,
                                                                   64, 10**6])))
            elif what == "dims":
                t.dims = draw(st.lists(st.sampled_from([0, 1, 2, 31, 32, 64, 256, 2**40]),
                                       min_size=0, max_size=5))
            elif what == "ttype":
                t.type = draw(st.sampled_from([0, 1, 2, 8, 12, 30, 39, 99, 2**31]))
            elif what == "tensor_twice":
                tensors.append(TensorEntry(t.name, list(t.dims), t.type, t.offset))
            elif what == "tensor_drop":
                del tensors[i]
            elif what == "rename":
                t.name = draw(st.sampled_from([tensors[0].name, "x" * 70, "", "blk.9.attn_q.weight",
                                               "rope_freqs.weight"]))
            else:
                j = draw(st.integers(0, len(tensors) - 1))
                tensors[i], tensors[j] = tensors[j], tensors[i]
        elif what == "counts":
            if draw(st.booleans()):
                parts.n_kv = len(entries) + draw(st.sampled_from([-1, 1, 2**62]))
            else:
                parts.n_tensors = max(0, len(tensors) + draw(st.sampled_from([-1, 1, 2**62])))
        elif what == "cut":
            parts.data = parts.data[:-draw(st.integers(1, 4096))]
        elif what == "tail":
            parts.data += b"\0" * draw(st.integers(1, 64))
        elif what == "version":
            parts.version = draw(st.sampled_from([1, 2, 4, 7, 2**24]))
        else:
            parts.big_endian = True
    return parts


def _gguf_accepts(path: Path) -> bool:
    """Whether gguf's own reader reads the file, every tensor's data included."""
    import gguf
    try:
        r = gguf.GGUFReader(str(path))
        for t in r.tensors:
            np.asarray(t.data)
        return True
    except Exception:
        return False


@pytest.fixture(scope="module")
def gguf_base(tmp_path_factory):
    from tests.bad.gguf_corpus import base
    return base(tmp_path_factory.getbasetemp() / "gguf-fuzz-base")[0]


@settings(FUZZ, max_examples=300 * SCALE)
@given(data=st.data())
def test_fuzzed_gguf_headers_are_judged_as_gguf_judges_them(workdir, gguf_base, data):
    from iron_spec.runtime.gguf import GGUFError, GGUFFile
    from tests.bad.gguf_corpus import write
    path = write(_mutate_gguf(gguf_base.copy(), data.draw), workdir / "fuzzed.gguf")
    try:
        GGUFFile(path)
    except GGUFError as e:
        assert str(e).startswith(f"{path}: "), e
        event("header refused")
        return
    # Never looser than gguf's reader: what we read, it reads.
    assert _gguf_accepts(path), "read a file gguf's reader refuses"
    try:
        loaded = load_model(LLAMA, checkpoint=path, max_seq_len=16)
    except OURS as e:
        # A context the file says is shorter than the one asked for is the flag's refusal.
        from iron_spec.spec.errors import FlagError
        assert isinstance(e, (SpecError, CheckpointError, FlagError)) or str(path) in str(e), \
            repr(e)
        event(f"load refused: {type(e).__name__}")
        return
    event("loaded")
    loaded.tokenizer.encode("ab 12 c")
