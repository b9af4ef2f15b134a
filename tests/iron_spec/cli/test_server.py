"""``iron-spec serve`` driven by the real ``openai`` client against the real server process on
127.0.0.1: completions, chat, streaming, embeddings, models, health, metrics and errors.

Each answer is judged by the library's own call on an independently loaded model (the same
weights): a served request is the generation the library gives (``Model.complete``, whose
tokens ``iron-spec check`` holds to transformers), and ``/v1/embeddings`` is ``embed``.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures as futures
import json
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

import iron_spec  # noqa: E402
from iron_spec.cli.server.app import Inbox  # noqa: E402
from iron_spec.operators import native  # noqa: E402
from tests.conftest import checkpoint  # noqa: E402
from tests.serving import serve  # noqa: E402


def ids_of(text: str) -> list[int]:
    """A toy's text (no tokenizer: each id shown as `` <id>``) as its ids."""
    return [int(t) for t in text.split()]


@pytest.fixture(scope="module")
def toy_url(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("toy-server")
    with serve(["llama3", "--random-weights", "0", "--toy", "--name", "toy", "--max-batch", "4"],
               tmp) as url:
        yield url


@pytest.fixture(scope="module")
def toy():
    return iron_spec.load("llama3", random_weights=0, toy=True)


@pytest.fixture(scope="module")
def client(toy_url):
    return openai.OpenAI(base_url=toy_url + "/v1", api_key="unused", max_retries=0)


def test_models_and_health(client, toy_url):
    assert [m.id for m in client.models.list()] == ["toy"]
    assert client.models.retrieve("toy").id == "toy"
    with urllib.request.urlopen(toy_url + "/health") as r:
        assert json.load(r) == {"status": "ok"}


def test_a_completion_is_the_librarys(client, toy):
    prompt = [5, 6, 7, 8, 9]
    want = toy.complete(prompt, max_new_tokens=12, temperature=0, logprobs=True)
    r = client.completions.create(model="toy", prompt=prompt, max_tokens=12, temperature=0,
                                  logprobs=3)
    c = r.choices[0]
    assert ids_of(c.text) == want.token_ids
    assert c.finish_reason == "length"
    assert r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 12
    assert np.allclose(c.logprobs.token_logprobs, want.logprobs, rtol=0, atol=1e-12)
    # top_logprobs: the 3 most likely, the drawn (greedy) one first
    assert all(len(t) == 3 and max(t.values()) == lp
               for t, lp in zip(c.logprobs.top_logprobs, c.logprobs.token_logprobs))


def test_seeded_sampling_is_the_librarys(client, toy):
    settings = dict(temperature=0.9, top_p=0.8, seed=11, presence_penalty=0.3,
                    frequency_penalty=0.2)
    want = toy.complete([3, 1, 4, 1, 5], max_new_tokens=10, **settings)
    r = client.completions.create(model="toy", prompt=[3, 1, 4, 1, 5], max_tokens=10,
                                  **settings, extra_body={"top_k": 0, "min_p": 0.0})
    assert ids_of(r.choices[0].text) == want.token_ids


def test_a_streamed_completion_joins_to_the_same_text(client):
    kw = dict(model="toy", prompt=[[2, 3, 4], [9, 8]], max_tokens=9, temperature=0)
    whole = client.completions.create(**kw)
    texts, finish, usage = {0: "", 1: ""}, {}, None
    for chunk in client.completions.create(**kw, stream=True,
                                           stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] += c.text
            if c.finish_reason is not None:
                finish[c.index] = c.finish_reason
    assert [texts[0], texts[1]] == [c.text for c in whole.choices]
    assert finish == {0: "length", 1: "length"}
    assert usage.completion_tokens == 18 and usage.prompt_tokens == 5


def test_concurrent_requests_each_equal_their_answer_alone(client, toy):
    prompts = [[i + 1, 2 * i + 3, 7] for i in range(8)]
    alone = [toy.complete(p, max_new_tokens=16, temperature=0).token_ids for p in prompts]

    def ask(p):
        return ids_of(client.completions.create(model="toy", prompt=p, max_tokens=16,
                                                temperature=0).choices[0].text)

    with futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(ask, prompts)) == alone


def metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics") as r:
        text = r.read().decode()
    return {line.split(" ")[0]: float(line.split(" ")[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def test_prompts_decoded_together_each_draw_what_they_draw_alone(client, toy, toy_url):
    # One request's prompts are in flight together, so its decode steps surely ran batched:
    # fewer steps than the tokens they drew (the server runs at most 4 rows a step).
    prompts = [[i + 2, 3 * i + 1, 9, 4] for i in range(8)]
    alone = [toy.complete(p, max_new_tokens=16, temperature=0).token_ids for p in prompts]
    key = 'iron_spec_decode_steps_total{model="toy"}'
    before = metrics(toy_url)[key]
    r = client.completions.create(model="toy", prompt=prompts, max_tokens=16, temperature=0)
    steps = metrics(toy_url)[key] - before
    assert [ids_of(c.text) for c in sorted(r.choices, key=lambda c: c.index)] == alone
    drawn_by_steps = 8 * 15  # each first token comes from its prompt's last chunk
    if native.PROGRAM:  # else the engine decodes one session at a time (docs/serving.md)
        assert 2 * 15 <= steps < drawn_by_steps, steps


@pytest.mark.parametrize("kwargs, param", [
    (dict(tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
    (dict(response_format={"type": "json_object"}), "response_format"),
    (dict(temperature=3), "temperature"),
    (dict(n=2), "n"),
    (dict(logit_bias={"5": 10}), "logit_bias"),
    (dict(extra_body={"temprature": 0.5}), "temprature"),
    (dict(top_logprobs=3), "top_logprobs"),
])
def test_what_the_server_cannot_honour_is_refused_naming_the_field(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="toy", messages=[{"role": "user",
                                                               "content": "hi"}], **kwargs)
    assert e.value.status_code == 400
    assert e.value.body["param"] == param


def test_refusals(client, toy):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="nope", prompt=[1, 2])
    assert "does not exist" in e.value.body["message"]
    L = toy.max_seq_len
    with pytest.raises(openai.BadRequestError) as e:  # never truncated silently
        client.completions.create(model="toy", prompt=[1] * L, max_tokens=4)
    assert e.value.body["code"] == "context_length_exceeded"
    assert f"do not fit max_seq_len {L}" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="toy", prompt=[1, 10**6])
    assert "outside the vocabulary" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:  # a toy has no tokenizer
        client.completions.create(model="toy", prompt="text")
    assert "tokenizer" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="toy", input="a text")
    assert e.value.body["code"] == "wrong_model_kind"


# Found by a new user's trial: a whole number of 2^64 or more in a numeric field was a 500
# (numpy's isfinite cannot take it). Past its range it is a 400 naming the field (max_tokens:
# more than the context holds, never cut silently); in range (top_k past the vocabulary keeps
# every token; a repetition penalty of any size) it is served.
@pytest.mark.parametrize("key,refused", [
    ("seed", "seed"), ("min_p", "min_p"), ("presence_penalty", "presence_penalty"),
    ("frequency_penalty", "frequency_penalty"), ("max_tokens", "context_length_exceeded"),
    ("top_k", None), ("repetition_penalty", None)])
def test_a_number_past_int64_is_refused_naming_its_field_or_served(client, key, refused):
    body = {"max_tokens": 2, key: 2**64 + 1}
    if refused is None:
        done = client.completions.create(model="toy", prompt=[1, 2], extra_body=body)
        assert done.choices[0].finish_reason in ("length", "stop")
        return
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="toy", prompt=[1, 2], extra_body=body)
    assert refused in (e.value.body["param"], e.value.body["code"]), e.value.body


def test_a_streamed_completions_text_offsets_count_from_its_first_token(client):
    # Each chunk's text_offset is where its token begins in the choice's text, as the
    # response not streamed gives them (a new user's trial: every chunk said [0]).
    whole = client.completions.create(model="toy", prompt=[3, 1, 4], max_tokens=6,
                                      temperature=0, logprobs=1).choices[0].logprobs
    tokens, offsets = [], []
    for chunk in client.completions.create(model="toy", prompt=[3, 1, 4], max_tokens=6,
                                           temperature=0, logprobs=1, stream=True):
        for c in chunk.choices:
            if c.logprobs is not None:
                tokens += c.logprobs.tokens
                offsets += c.logprobs.text_offset
    assert tokens == whole.tokens and len(tokens) == 6
    assert offsets == whole.text_offset == [sum(map(len, tokens[:k])) for k in range(6)]
    assert offsets[-1] > 0


def refusal(url: str, route: str, body: str) -> dict:
    """The error body of a 400 to ``body`` (JSON text as sent) posted to ``route``."""
    req = urllib.request.Request(url + route, data=body.encode(),
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 400
    return json.loads(e.value.read())["error"]


# Found by a new user's trial of serving: a NaN penalty was said "it must be <= None", a text
# part without text "is of type 'text': this server reads text parts only", and top_p's range
# differently at each end.
@pytest.mark.parametrize("body,param,said", [
    ('{"repetition_penalty": NaN}', "repetition_penalty",
     "'repetition_penalty' is NaN: it must be a finite number > 0 (1 is none)"),
    ('{"repetition_penalty": 0}', "repetition_penalty",
     "'repetition_penalty' is 0: it must be a finite number > 0 (1 is none)"),
    ('{"top_p": 1.5}', "top_p", "'top_p' is 1.5: it must be within (0, 1]"),
    ('{"top_p": 0}', "top_p", "'top_p' is 0: it must be within (0, 1]")])
def test_a_sampling_value_out_of_range_says_what_is_valid(toy_url, body, param, said):
    e = refusal(toy_url, "/v1/completions",
                '{"model": "toy", "prompt": [1, 2], ' + body[1:])
    assert e["param"] == param and e["message"] == said


@pytest.mark.parametrize("part,said", [
    ({"type": "text"}, "'messages[0].content[0].text' is null: a text part's text is a string"),
    ({"type": "text", "text": 5},
     "'messages[0].content[0].text' is 5: a text part's text is a string")])
def test_a_text_part_without_text_says_so(toy_url, part, said):
    e = refusal(toy_url, "/v1/chat/completions", json.dumps(
        {"model": "toy", "messages": [{"role": "user", "content": [part]}]}))
    assert e["message"] == said and e["param"] == "messages[0].content[0].text"


def test_a_wrong_type_is_said_in_jsons_words(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="toy", prompt=[1, 2], extra_body={"max_tokens": True})
    assert "'max_tokens' is true" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=5, prompt=[1, 2])
    assert e.value.body["code"] == "invalid_type" and "'model' is 5" in e.value.body["message"]


def test_metrics_count_what_ran(client, toy_url):
    client.completions.create(model="toy", prompt=[4, 4, 4], max_tokens=3, temperature=0)
    values = metrics(toy_url)
    assert values['iron_spec_generation_tokens_total{model="toy"}'] >= 3
    assert values['iron_spec_time_to_first_token_seconds_count{model="toy"}'] >= 1
    assert values['iron_spec_requests_running{model="toy"}'] == 0
    assert 'iron_spec_kv_cache_bytes{model="toy"}' in values
    assert values['iron_spec_http_requests_total{route="/v1/completions",status="200"}'] >= 1


def test_an_api_key_is_asked_for(tmp_path):
    with serve(["llama3", "--random-weights", "0", "--toy", "--name", "toy"], tmp_path,
               env={"IRON_SPEC_API_KEY": "sesame"}) as url:
        wrong = openai.OpenAI(base_url=url + "/v1", api_key="guess", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        right = openai.OpenAI(base_url=url + "/v1", api_key="sesame", max_retries=0)
        assert [m.id for m in right.models.list()] == ["toy"]
        with urllib.request.urlopen(url + "/health") as r:  # health asks no key
            assert r.status == 200


# -- real checkpoints: chat with a template and a tokenizer, embeddings --------------------

@pytest.fixture(scope="module")
def real(tmp_path_factory):
    smollm2, minilm = checkpoint("smollm2-135m-instruct"), checkpoint("all-minilm-l6-v2")
    tmp = tmp_path_factory.mktemp("real-server")
    config = tmp / "serve.yaml"
    config.write_text(f"max_batch: 4\nmodels:\n  smollm2:\n    checkpoint: {smollm2}\n"
                      f"    max_seq_len: 1024\n  minilm: {minilm}\n")
    with serve(["--config", str(config)], tmp) as url:
        yield (openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0),
               smollm2, minilm)


MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is the capital of France?"}]


def test_chat_on_smollm2_is_the_librarys(real):
    client, smollm2, _ = real
    model = iron_spec.load("llama3", smollm2, max_seq_len=1024)
    want = model.complete(MESSAGES, max_new_tokens=20, temperature=0)
    r = client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=20,
                                       temperature=0)
    assert r.choices[0].message.content == want.text
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == ("stop" if want.finish_reason == "eos" else "length")
    assert r.usage.prompt_tokens == len(model.encode(MESSAGES))
    assert r.usage.completion_tokens == len(want.token_ids)
    pieces = []
    for chunk in client.chat.completions.create(model="smollm2", messages=MESSAGES,
                                                max_tokens=20, temperature=0, stream=True):
        for c in chunk.choices:
            pieces.append(c.delta.content or "")
    assert "".join(pieces) == want.text and len(pieces) > 2
    # Text parts, stop strings and logprobs, as the API gives them
    r = client.chat.completions.create(
        model="smollm2", messages=[MESSAGES[0], {"role": "user", "content": [
            {"type": "text", "text": MESSAGES[1]["content"]}]}],
        max_tokens=20, temperature=0, logprobs=True, top_logprobs=2, stop=["."])
    assert r.choices[0].message.content == want.text.split(".")[0]
    assert r.choices[0].finish_reason == "stop"
    top = r.choices[0].logprobs.content[0].top_logprobs
    assert len(top) == 2 and top[0].logprob >= top[1].logprob


def test_a_conversation_resent_with_the_servers_own_reply_goes_on(real):
    # The openai client resends the assistant message as the server gave it ("refusal":
    # null) and with its own null fields (tool_calls, audio, ...): a null is as if absent.
    client, smollm2, _ = real
    model = iron_spec.load("llama3", smollm2, max_seq_len=1024)
    first = client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=8,
                                           temperature=0)
    reply = first.choices[0].message
    assert reply.refusal is None and reply.tool_calls is None
    turns = MESSAGES + [reply, {"role": "user", "content": "And of Italy?"}]
    r = client.chat.completions.create(model="smollm2", messages=turns, max_tokens=8,
                                       temperature=0)
    want = model.complete(MESSAGES + [{"role": "assistant", "content": reply.content},
                                      {"role": "user", "content": "And of Italy?"}],
                          max_new_tokens=8, temperature=0)
    assert r.choices[0].message.content == want.text
    with pytest.raises(openai.BadRequestError) as e:  # a field given a value is still refused
        client.chat.completions.create(model="smollm2", max_tokens=2, messages=[
            {"role": "user", "content": "hi", "audio": {"id": "a1"}}])
    assert e.value.body["param"] == "messages[0].audio"


def test_a_client_gone_before_its_answer_not_streamed_ends_its_request(real):
    # A response not streamed whose client left (a timeout, a closed connection) ends its
    # request, as a streamed one's does: nothing draws on for nobody (it went on to its
    # max_tokens, and a shutdown waited on it).
    import socket
    import time
    client, _, _ = real
    url = str(client.base_url).rstrip("/").rsplit("/v1", 1)[0]
    port = int(url.rsplit(":", 1)[1])
    key_run, key_drawn = ('iron_spec_requests_running{model="smollm2"}',
                          'iron_spec_generation_tokens_total{model="smollm2"}')
    before = metrics(url)[key_drawn]
    body = json.dumps({"model": "smollm2", "prompt": "1, 2, 3, 4, 5,", "max_tokens": 900,
                       "temperature": 0}).encode()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  b"Content-Type: application/json\r\nContent-Length: "
                  + str(len(body)).encode() + b"\r\n\r\n" + body)
        end = time.monotonic() + 60
        while metrics(url)[key_drawn] < before + 20:  # drawing
            assert time.monotonic() < end, "the request did not start drawing"
            time.sleep(0.05)
    end = time.monotonic() + 10
    while metrics(url)[key_run] != 0:
        assert time.monotonic() < end, "the request went on after its client left"
        time.sleep(0.1)
    assert metrics(url)[key_drawn] - before < 900  # cut short, not run to its end


def test_embeddings_on_minilm_are_the_librarys(real):
    client, _, minilm = real
    texts = ["a text", "another text, longer"]
    want = iron_spec.load(checkpoint=minilm).embed(texts)
    r = client.embeddings.create(model="minilm", input=texts)  # base64 on the wire
    got = np.array([d.embedding for d in r.data], np.float32)
    assert np.array_equal(got, want)
    r = client.embeddings.create(model="minilm", input=texts[0], encoding_format="float")
    assert np.array_equal(np.array(r.data[0].embedding, np.float32), want[0])
    assert r.usage.prompt_tokens == 4  # [CLS] a text [SEP]
    raw = base64.b64encode(want[0].astype("<f4").tobytes()).decode()
    assert len(raw) > 0
    # Found by a new user's trial: a 5000-word input came back embedded from its first 256
    # tokens, said only in the server's log. Refused, as OpenAI's API refuses it.
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="minilm", input=["short", "word " * 5000])
    assert e.value.body["code"] == "context_length_exceeded"
    assert "input[1] holds more than this model's 256 tokens" in e.value.body["message"]


def test_a_serve_files_weights_hold_the_models_weights_so(tmp_path):
    from iron_spec.cli.server.config import load_models, read_config
    path = tmp_path / "serve.yaml"
    path.write_text("models:\n  toy: {spec: llama3, random_weights: 0, toy: true, "
                    "weights: q8_0}\n")
    served = load_models(read_config(path))["toy"]
    ids = [1, 2, 3, 4, 5]
    q8 = iron_spec.load("llama3", random_weights=0, toy=True, weights="q8_0")
    f32 = iron_spec.load("llama3", random_weights=0, toy=True, weights="float32")
    got = served.logits(ids)
    assert np.array_equal(got, q8.logits(ids)) and not np.array_equal(got, f32.logits(ids))


def test_a_port_in_use_is_refused_before_anything_loads():
    # Found by a new user's trial: the weights loaded and "serving ... on" was printed, then
    # uvicorn failed to bind (exit 3).
    import socket

    from typer.testing import CliRunner

    from iron_spec.cli.app import app
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    try:
        result = CliRunner().invoke(app, ["serve", "llama3", "--toy", "--random-weights", "0",
                                          "--port", str(port)])
    finally:
        taken.close()
    assert result.exit_code == 1, result.output
    assert f"cannot listen on 127.0.0.1:{port}" in result.output
    assert "serving" not in result.output and "weights held" not in result.output


@pytest.mark.parametrize("line, says", [
    ("max_batch: 0", "max_batch is 0: a count >= 1"),
    ("max_batch: two", "max_batch is 'two': a count >= 1"),
    ("max_batch: 1000", "max_batch is 1000: at most 256 requests decode together"),
    ("held_sessions: -1", "held_sessions is -1: a count >= 0"),
    ("prefill_tokens: 0", "prefill_tokens is 0: a count >= 1"),
    ("held_bytes: 1.5", "held_bytes is 1.5: a count >= 0"),
    ("batched: 'no'", "batched is 'no': true or false"),
    ("threads: 0", "threads 0 is not a count >= 1"),
    ("api_key: 12345", "api_key is 12345: text"),  # was an AttributeError once loaded
    ("api_key: ''", "api_key is '': text")])
def test_a_serve_files_bad_engine_option_is_refused_naming_the_file_before_anything_loads(
        tmp_path, line, says):
    # Found by a new user's trial: max_batch 0 was refused only once the weights had loaded.
    from typer.testing import CliRunner

    from iron_spec.cli.app import app
    path = tmp_path / "serve.yaml"
    path.write_text(f"{line}\nmodels:\n  toy: {{spec: llama3, random_weights: 0, toy: true}}\n")
    result = CliRunner().invoke(app, ["serve", "--config", str(path), "--port", "0"],
                                env={"COLUMNS": "300"})
    assert result.exit_code == 1, result.output
    assert f"{path}: {says}" in " ".join(result.output.split())
    assert "weights held" not in result.output and "serving" not in result.output


def _post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_body_nested_past_the_recursion_limit_or_past_the_size_bound_is_refused(toy_url):
    # Found by a new user's trial: 100000 nested lists were a 500 with a traceback in the log
    # (json's decoder recurses), and a 50 MB body was read whole before anything was said.
    from iron_spec.cli.server.app import MAX_BODY
    status, body = _post(toy_url, b"[" * 100000 + b"]" * 100000)
    assert status == 400 and "nested past Python's recursion limit" in body["error"]["message"]
    # A body declared past the bound is refused before a byte of it is read: the headers alone.
    import http.client
    host, port = toy_url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    connection.putrequest("POST", "/v1/completions")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(MAX_BODY + 1))
    connection.endheaders()
    answer = connection.getresponse()
    assert answer.status == 413
    assert json.loads(answer.read())["error"]["code"] == "request_too_large"
    connection.close()
    with urllib.request.urlopen(toy_url + "/health") as r:
        assert r.status == 200  # and the server goes on


def test_port_0_serves_on_the_port_the_system_gave_and_says_which(tmp_path):
    # Found by a new user's trial: `serve --port 0` said "on http://127.0.0.1:0/v1".
    import re
    import subprocess
    import sys

    from tests.serving import stop

    proc = subprocess.Popen([sys.executable, "-c", "from iron_spec.cli.app import app; app()",
                             "serve", "llama3", "--toy", "--random-weights", "0", "--port", "0"],
                            stderr=subprocess.PIPE, text=True)
    try:
        said = ""
        for line in proc.stderr:
            if line.startswith("serving"):
                said = line
                break
        port = re.search(r"http://127\.0\.0\.1:(\d+)/v1", said)
        assert port and port.group(1) != "0", said
        with urllib.request.urlopen(f"http://127.0.0.1:{port.group(1)}/health") as r:
            assert r.status == 200
    finally:
        stop(proc)


def test_max_seq_len_is_each_causal_models_and_an_encoder_beside_them_keeps_its_own():
    # Found by a new user's trial: `serve ... --model minilm=DIR --max-seq-len 512` loaded the
    # causal model, then refused everything: an encoder has no context to set.
    from iron_spec.cli.server.config import ModelEntry, ServeConfig, load_models
    served = load_models(ServeConfig([
        ModelEntry("toy", "llama3", None, {"random_weights": 0, "toy": True}, {"max_seq_len": 48}),
        ModelEntry("enc", "bert", None, {"random_weights": 0, "toy": True}, {"max_seq_len": 48})]))
    assert served["toy"].max_seq_len == 48
    assert type(served["enc"]).__name__ != "Model"  # the encoder loaded, its own context


def test_a_serve_file_that_is_not_yaml_is_said_at_its_line_and_column(tmp_path):
    # Found by a new user's trial: PyYAML's own dump of several lines, not FILE:LINE:COL.
    from iron_spec.cli.server.config import ConfigError, read_config
    path = tmp_path / "serve.yaml"
    path.write_text("port: 8000\nmodels:\n  toy: {spec: llama3\n")
    with pytest.raises(ConfigError) as raised:
        read_config(path)
    said = str(raised.value)
    assert said.startswith(f"{path}:4:1: not YAML: ") and "\n" not in said, said


def test_the_inbox_gives_every_event_in_order_with_fewer_wake_ups():
    # The engine's thread puts a streamed request's events (a token each); the event loop
    # takes them a few at a time, woken once for as many as arrive before it runs.
    async def main():
        loop = asyncio.get_running_loop()
        inbox, wakes = Inbox(loop), []
        calls = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a: (wakes.append(1), calls(*a))[1]
        n = 5000
        thread = threading.Thread(target=lambda: [inbox.put(k, "piece") for k in range(n)])
        thread.start()
        got = []
        while len(got) < n:
            got += await inbox.get()
        thread.join()
        return got, len(wakes)

    got, wakes = asyncio.run(main())
    assert got == [(k, "piece") for k in range(5000)]
    assert wakes < 5000
