"""The OpenAI API's request bodies read into the library's calls, and its response bodies.

Each endpoint's fields are read here, each checked with the API's own name in the error
(``ApiError``: a 400 naming ``param``), as the OpenAI API and vLLM answer: a field the server
cannot honour (tools, a response format, ``n`` > 1, ``logit_bias``) is refused, never
ignored; a field it does not know is refused too (a misspelt ``temprature`` would otherwise
be a default silently kept). What the fields mean is the OpenAI API reference's
(``platform.openai.com/docs/api-reference``); the extras ``top_k``, ``min_p`` and
``repetition_penalty`` are vLLM's and llama-server's.

Not for: HTTP and streaming (``app``), the model calls (``iron_spec.library``).
"""

from __future__ import annotations

import base64
import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class ApiError(Exception):
    """A request refused: ``status`` (400 a bad request, 401, 404 an unknown model),
    ``message``, the field ``param`` it names, OpenAI's ``type`` and ``code``."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 code: str | None = None, type: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.code, self.type = \
            message, param, status, code, type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


# Fields every generation endpoint reads, by kind; the extras beside OpenAI's own.
SAMPLING = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "seed",
            "top_k", "min_p", "repetition_penalty")
# Fields the API defines that change nothing a server computes (kept by OpenAI for its
# dashboards, billing and caching): read and left alone.
INERT = ("user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier",
         "prompt_cache_retention")
# Fields the server cannot honour, with why: refused by name.
REFUSED = {
    "tools": "tool calls are not supported by this server",
    "tool_choice": "tool calls are not supported by this server",
    "parallel_tool_calls": "tool calls are not supported by this server",
    "functions": "function calls are not supported by this server",
    "function_call": "function calls are not supported by this server",
    "audio": "audio output is not supported by this server",
    "prediction": "predicted outputs are not supported by this server",
    "web_search_options": "web search is not supported by this server",
    "suffix": "a suffix (insertion) is not supported by this server",
    "reasoning_effort": "this server runs no reasoning budget",
    "verbosity": "this server has no verbosity setting",
}
CHAT_FIELDS = {"model", "messages", "stream", "stream_options", "max_tokens",
               "max_completion_tokens", "stop", "logprobs", "top_logprobs", "n",
               "response_format", "logit_bias", "modalities", *SAMPLING, *INERT, *REFUSED}
COMPLETION_FIELDS = {"model", "prompt", "stream", "stream_options", "max_tokens", "stop",
                     "logprobs", "n", "best_of", "echo", "logit_bias", *SAMPLING, *INERT,
                     *REFUSED}
EMBEDDING_FIELDS = {"model", "input", "encoding_format", "dimensions", "user"}
#: ``max_tokens`` of a completion where the request gives none (the OpenAI API's 16); a chat
#: completion draws up to the context's room.
COMPLETION_DEFAULT_TOKENS = 16


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _fields(body: Any, allowed: set[str]) -> dict:
    if not isinstance(body, dict):
        raise ApiError("the request body is not a JSON object")
    for key in body:
        if key in REFUSED and body[key] not in (None, [], {}, False):
            raise ApiError(f"'{key}': {REFUSED[key]}", key, code="unsupported_parameter")
        if key not in allowed:
            raise ApiError(f"Unrecognized request argument supplied: {key}", key,
                           code="unrecognized_argument")
    return body


def _number(body: dict, key: str, low: float | None = None, high: float | None = None,
            *, whole: bool = False, valid: str | None = None):
    """``body[key]`` as a finite number within [low, high] (None where absent or null);
    ``valid`` says what is valid where the bounds alone do not (an open bound)."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            whole and not (isinstance(value, int) or float(value).is_integer())):
        raise ApiError(f"'{key}' is {_json(value)}: {'an integer' if whole else 'a number'}",
                       key, code="invalid_type")
    # A JSON integer is a Python int of any size (never NaN): compared as it is, never
    # through numpy, whose int64 cannot hold 2^64.
    if (isinstance(value, float) and not math.isfinite(value)) or \
            (low is not None and value < low) or (high is not None and value > high):
        bounds = valid or (f"within [{low}, {high}]" if low is not None and high is not None
                           else f">= {low}" if low is not None else f"<= {high}"
                           if high is not None else "a finite number")
        raise ApiError(f"'{key}' is {_json(value)}: it must be {bounds}", key,
                       code="invalid_value")
    return int(value) if whole else float(value)


def _json(value: Any) -> str:
    """``value`` as the request spelled it (JSON's true, null, ...), short."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _flag(body: dict, key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(f"'{key}' is {_json(value)}: true or false", key, code="invalid_type")
    return value


@dataclass
class Generation:
    """A generation request read: the model's name, its prompts (one for a chat), whether
    to stream and report usage in the stream, and the library's keyword arguments
    (``Model.request``)."""

    model: str
    prompts: list
    stream: bool
    include_usage: bool
    options: dict = field(default_factory=dict)
    logprobs: int | None = None  # None: none; else the top tokens named beside each
    chat: bool = True


def _common(body: dict, chat: bool) -> tuple[dict, bool, bool]:
    """The sampling settings, stop strings, seed and max tokens of either endpoint, and
    whether to stream (with usage)."""
    options: dict = {}
    valid = {"top_p": "within (0, 1]", "repetition_penalty": "a finite number > 0 (1 is none)"}
    for key, low, high, whole in (("temperature", 0, 2, False), ("top_p", 0, 1, False),
                                  ("presence_penalty", -2, 2, False),
                                  ("frequency_penalty", -2, 2, False),
                                  ("seed", 0, 2**64 - 1, True), ("top_k", -1, None, True),
                                  ("min_p", 0, 1, False),
                                  ("repetition_penalty", None, None, False)):
        value = _number(body, key, low, high, whole=whole, valid=valid.get(key))
        if value is None:
            continue
        if key in ("top_p", "repetition_penalty") and value <= 0:
            raise ApiError(f"'{key}' is {_json(body[key])}: it must be {valid[key]}", key,
                           code="invalid_value")
        if key == "top_k" and value in (-1, 0):  # vLLM's -1 and llama-server's 0: every token
            continue
        options[key] = value
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) \
                or len(stops) > 4:
            raise ApiError("'stop' is a string or a list of at most 4 non-empty strings",
                           "stop", code="invalid_value")
        if stops:
            options["stop"] = stops
    most = None
    for key in ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",):
        value = _number(body, key, 1, None, whole=True)
        if value is not None:
            most = value if most is None else min(most, value)
    if most is not None:
        options["max_new_tokens"] = most
    n = _number(body, "n", 1, None, whole=True)
    if n not in (None, 1):
        raise ApiError(f"'n' is {n}: this server draws one choice a prompt (n = 1)", "n",
                       code="unsupported_value")
    bias = body.get("logit_bias")
    if bias not in (None, {}):
        raise ApiError("'logit_bias' is not supported by this server", "logit_bias",
                       code="unsupported_parameter")
    stream = _flag(body, "stream")
    usage = False
    so = body.get("stream_options")
    if so is not None:
        if not stream:
            raise ApiError("'stream_options' is only allowed when 'stream' is true",
                           "stream_options", code="invalid_value")
        if not isinstance(so, dict) or set(so) - {"include_usage", "include_obfuscation"}:
            raise ApiError("'stream_options' holds 'include_usage' (true or false)",
                           "stream_options", code="invalid_value")
        usage = _flag(so, "include_usage")
    return options, stream, usage


def _model(body: dict) -> str:
    model = body.get("model")
    if model is None or model == "":
        raise ApiError("'model' is required: the name of a served model (GET /v1/models)",
                       "model", code="missing_required_parameter")
    if not isinstance(model, str):
        raise ApiError(f"'model' is {_json(model)}: the name of a served model, a string "
                       "(GET /v1/models)", "model", code="invalid_type")
    return model


def chat_request(body: Any) -> Generation:
    """``POST /v1/chat/completions``'s body read.

    Raises:
        ApiError: a field missing, of the wrong type, out of range, unknown or refused.
    """
    body = _fields(body, CHAT_FIELDS)
    model = _model(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError("'messages' is a non-empty list of {role, content}", "messages",
                       code="missing_required_parameter" if messages is None else "invalid_type")
    read = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(f"'{where}' is an object with a 'role'", where, code="invalid_type")
        role = m["role"]
        if role not in ("system", "developer", "user", "assistant"):
            raise ApiError(f"'{where}.role' is {role!r}: this server takes system, developer, "
                           "user and assistant messages (no tool messages)", f"{where}.role",
                           code="invalid_value")
        for key, value in m.items():
            # A field that is null is as if absent: the openai client resends the assistant
            # message this server gave (its "refusal": null, and its own tool_calls, audio,
            # annotations, function_call: null) when a conversation goes on.
            if key not in ("role", "content", "name") and value is not None:
                raise ApiError(f"'{where}.{key}' is not supported by this server "
                               "(a message holds a role and its text content)",
                               f"{where}.{key}", code="unsupported_parameter")
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text":
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise ApiError(f"'{where}.content[{j}]' is of type {kind!r}: this server "
                                   "reads text parts only", f"{where}.content[{j}]",
                                   code="unsupported_value")
                if not isinstance(part.get("text"), str):
                    raise ApiError(f"'{where}.content[{j}].text' is "
                                   f"{_json(part.get('text'))}: a text part's text is a string",
                                   f"{where}.content[{j}].text", code="invalid_type")
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise ApiError(f"'{where}.content' is text (or a list of text parts)",
                           f"{where}.content", code="invalid_type")
        # The developer message is the system message of models older than its name.
        read.append({"role": "system" if role == "developer" else role, "content": content})
    fmt = body.get("response_format")
    if fmt not in (None, {"type": "text"}):
        raise ApiError("'response_format' other than {\"type\": \"text\"} is not supported by "
                       "this server (no JSON mode or schema)", "response_format",
                       code="unsupported_parameter")
    modalities = body.get("modalities")
    if modalities not in (None, ["text"]):
        raise ApiError("'modalities' other than [\"text\"] is not supported by this server",
                       "modalities", code="unsupported_value")
    options, stream, usage = _common(body, True)
    logprobs = None
    if _flag(body, "logprobs"):
        logprobs = _number(body, "top_logprobs", 0, 20, whole=True) or 0
    elif body.get("top_logprobs") is not None:
        raise ApiError("'top_logprobs' needs 'logprobs': true", "top_logprobs",
                       code="invalid_value")
    return Generation(model, [read], stream, usage, options, logprobs, chat=True)


def completion_request(body: Any) -> Generation:
    """``POST /v1/completions``'s body read: ``prompt`` a string, a list of strings, a list
    of token ids or a list of lists of them (each a choice of its own, ``index`` in order).

    Raises:
        ApiError: as ``chat_request``.
    """
    body = _fields(body, COMPLETION_FIELDS)
    model = _model(body)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = list(prompt)
    elif isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        prompts = [list(prompt)]
    elif isinstance(prompt, list) and prompt and all(
            isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool)
                                              for t in p) for p in prompt):
        prompts = [list(p) for p in prompt]
    else:
        raise ApiError("'prompt' is a string, a list of strings, a list of token ids, or a "
                       "list of lists of token ids (none empty)", "prompt",
                       code="missing_required_parameter" if prompt is None else "invalid_value")
    if any(p == "" for p in prompts):
        raise ApiError("'prompt' holds an empty string: give some text", "prompt",
                       code="invalid_value")
    if _flag(body, "echo"):
        raise ApiError("'echo' is not supported by this server", "echo",
                       code="unsupported_parameter")
    best = _number(body, "best_of", 1, None, whole=True)
    if best not in (None, 1):
        raise ApiError(f"'best_of' is {best}: this server draws one choice a prompt", "best_of",
                       code="unsupported_value")
    options, stream, usage = _common(body, False)
    options.setdefault("max_new_tokens", COMPLETION_DEFAULT_TOKENS)
    logprobs = _number(body, "logprobs", 0, 5, whole=True)
    return Generation(model, prompts, stream, usage, options, logprobs, chat=False)


@dataclass
class Embeddings:
    model: str
    texts: list[str]
    base64: bool
    dimensions: int | None


def embedding_request(body: Any) -> Embeddings:
    """``POST /v1/embeddings``'s body read: ``input`` a string or a list of strings (token
    ids are refused: an encoder here tokenizes its own text).

    Raises:
        ApiError: as ``chat_request``.
    """
    body = _fields(body, EMBEDDING_FIELDS)
    model = _model(body)
    text = body.get("input")
    if isinstance(text, str):
        texts = [text]
    elif isinstance(text, list) and text and all(isinstance(t, str) for t in text):
        texts = list(text)
    elif isinstance(text, list) and text and all(isinstance(t, (int, list)) for t in text):
        raise ApiError("'input' as token ids is not supported by this server: give text",
                       "input", code="unsupported_value")
    else:
        raise ApiError("'input' is a string or a non-empty list of strings", "input",
                       code="missing_required_parameter" if text is None else "invalid_value")
    if any(t == "" for t in texts):
        raise ApiError("'input' holds an empty string", "input", code="invalid_value")
    fmt = body.get("encoding_format", "float")
    if fmt not in (None, "float", "base64"):
        raise ApiError(f"'encoding_format' is {fmt!r}: 'float' or 'base64'", "encoding_format",
                       code="invalid_value")
    dims = _number(body, "dimensions", 1, None, whole=True)
    return Embeddings(model, texts, fmt == "base64", dims)


# -- responses ----------------------------------------------------------------------------

#: The API's finish reasons for the library's (``runtime.generation.FINISH_REASONS``): an
#: end-of-text token or a stop string is ``stop``, a count or the context reached ``length``.
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length",
          "interrupted": "length"}


def usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def token_text(tokenizer, token: int) -> str:
    if tokenizer is None:
        return f" {token}"
    return tokenizer.decode([token], skip_special_tokens=False)


def chat_logprobs(tokenizer, entries) -> dict:
    """The chat API's ``logprobs`` object of ``runtime.engine.TokenLogprob`` entries."""
    def one(token, logprob):
        text = token_text(tokenizer, token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}
    return {"content": [dict(one(e.token, e.logprob),
                             top_logprobs=[one(t, lp) for t, lp in e.top]) for e in entries],
            "refusal": None}


def completion_logprobs(tokenizer, entries, offset: int = 0) -> dict:
    """The completions API's ``logprobs`` object (tokens, token_logprobs, top_logprobs,
    text_offset) of ``TokenLogprob`` entries; ``offset``: characters before the first."""
    tokens, offsets = [], []
    for e in entries:
        offsets.append(offset)
        t = token_text(tokenizer, e.token)
        tokens.append(t)
        offset += len(t)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{token_text(tokenizer, t): lp for t, lp in e.top} for e in entries],
            "text_offset": offsets}


def embedding_body(model: str, vectors: np.ndarray, as_base64: bool, tokens: int) -> dict:
    data = []
    for i, v in enumerate(np.asarray(vectors, np.float32)):
        value = base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") if as_base64 \
            else [float(x) for x in v]
        data.append({"object": "embedding", "index": i, "embedding": value})
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def now() -> int:
    return int(time.time())
