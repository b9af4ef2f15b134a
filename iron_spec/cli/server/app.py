"""The OpenAI-compatible ASGI app (Starlette): ``build_app(models)``.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (each streamed as
server-sent events where ``stream`` is true), ``POST /v1/embeddings`` (encoder models),
``GET /v1/models`` and ``/v1/models/{id}``, ``GET /health``, ``GET /metrics`` (Prometheus'
text format). Every causal model's generations run on its ``runtime.engine.Engine``
(``Model.engine``): requests from every connection share its decode steps and its pool of
held sessions. Errors are the OpenAI API's ``{"error": {message, type, param, code}}`` with
its status codes (400 a refused request, naming the field; 401 a missing or wrong API key; 404
an unknown model or route; 500 a failure inside a model call).

Not for: reading the request fields (``protocol``), loading models and running uvicorn
(``iron_spec.cli.serve``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections import deque
from typing import Any, Mapping

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from iron_spec.library.api import ContextFull, EncoderModel, Model

from . import protocol
from .metrics import Counters, exposition
from .protocol import ApiError

log = logging.getLogger("iron_spec")


#: Bytes of a request body read at most: past it, 413 (a context of a million tokens is
#: ~4 MB of text, or ~8 MB of token ids as JSON).
MAX_BODY = 16 * 2**20
#: Seconds between looks, while a response that is not streamed waits for its tokens,
#: whether its client is still there.
DISCONNECT_POLL = 0.5


class Inbox:
    """Events from the engine's thread to the event loop (``put`` from any thread; ``get``
    on the loop): every event put since the last ``get``, the loop woken once for as many
    as arrive before it runs. Why: ``call_soon_threadsafe`` an event writes to the loop's
    wake-up pipe and runs a callback, for every token of every stream (8 streams: 8 a
    decode step), where one a step serves them all."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop, self._items, self._ready = loop, deque(), asyncio.Event()
        self._posted = False  # a wake-up is on its way to the loop

    def put(self, *event) -> None:
        self._items.append(event)
        if not self._posted:  # else the wake-up on its way is to come after this append
            self._posted = True
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        self._posted = False
        self._ready.set()

    async def get(self) -> list[tuple]:
        """The events put since the last call, in order; waits for one at least."""
        while not self._items:
            self._ready.clear()
            if not self._items:
                await self._ready.wait()
        items = self._items
        return [items.popleft() for _ in range(len(items))]


def too_large() -> ApiError:
    return ApiError(f"the request body is larger than this server reads ({MAX_BODY} bytes, "
                    f"{MAX_BODY // 2**20} MiB)", None, 413, "request_too_large")


def build_app(models: Mapping[str, Model | EncoderModel], *, api_key: str | None = None,
              engine: Mapping[str, Any] | None = None, replica: str | None = None):
    """The app serving ``models`` by name.

    Args:
        models: name -> a loaded ``Model`` (chat and completions) or ``EncoderModel``
            (embeddings), as ``iron_spec.load`` gives them.
        api_key: where given, every ``/v1`` route asks for ``Authorization: Bearer
            <api_key>`` (``/health`` and ``/metrics`` do not).
        engine: each causal model's engine options (``Model.engine``: ``max_batch``, ...).
        replica: where given, every response names it in an ``iron-spec-replica`` header
            (the Ray Serve deployment's replicas: ``ray_serve``).

    Returns:
        The ASGI app (a callable ``app(scope, receive, send)``).

    Raises:
        ValueError: no models, or a name that is empty.
    """
    if not models:
        raise ValueError("build_app needs at least one model to serve")
    for name in models:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a served model's name is a non-empty string, not {name!r}")
    served = dict(models)
    created = protocol.now()
    engines = {name: m.engine(**dict(engine or {})) for name, m in served.items()
               if isinstance(m, Model)}
    counters = Counters()

    def find(name: str, kind: type) -> Model | EncoderModel:
        m = served.get(name)
        if m is None:
            raise ApiError(f"The model '{name}' does not exist (served: "
                           f"{', '.join(sorted(served))})", "model", 404, "model_not_found")
        if not isinstance(m, kind):
            what = "a causal language model" if kind is Model else "an encoder (embeddings)"
            raise ApiError(f"The model '{name}' is not {what}: "
                           + ("it serves /v1/embeddings" if kind is Model else
                              "it serves /v1/chat/completions and /v1/completions"),
                           "model", 400, "wrong_model_kind")
        return m

    async def body_of(request: Request) -> Any:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY:
            raise too_large()
        chunks, size = [], 0
        try:
            async for chunk in request.stream():  # bounded as it arrives, never whole first
                size += len(chunk)
                if size > MAX_BODY:
                    raise too_large()
                chunks.append(chunk)
        except ClientDisconnect:  # gone before its body ended: answered (to no one), no trace
            raise ApiError("the client left before its request body ended", None, 499,
                           "client_closed_request") from None
        try:
            return json.loads(b"".join(chunks))
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(f"the request body is not JSON: {e}") from None
        except RecursionError:  # json's decoder recurses once per nested list or object
            raise ApiError("the request body is not JSON this server reads: nested past "
                           "Python's recursion limit") from None

    async def chat(request: Request) -> Response:
        gen = protocol.chat_request(await body_of(request))
        return await generate(request, find(gen.model, Model), gen)

    async def completions(request: Request) -> Response:
        gen = protocol.completion_request(await body_of(request))
        return await generate(request, find(gen.model, Model), gen)

    async def generate(request: Request, model: Model, gen: protocol.Generation) -> Response:
        events = Inbox(asyncio.get_running_loop())
        param = "messages" if gen.chat else "prompt"
        put = events.put
        # A piece matters to a response streamed, or one with log-probabilities; to the
        # others only the end does (no event a token).
        pieces_wanted = gen.stream or gen.logprobs is not None

        def build() -> list:
            out = []
            for i, prompt in enumerate(gen.prompts):
                options = dict(gen.options)
                ids = model.encode(prompt)
                bound = False
                if "max_new_tokens" not in options:  # a chat draws up to the context
                    options["max_new_tokens"] = max(1, model.max_seq_len - len(ids) + 1)
                    bound = True
                r = model.request(ids, top_logprobs=gen.logprobs,
                                  on_piece=(lambda p, i=i: put(i, "piece", p))
                                  if pieces_wanted else None,
                                  on_finish=lambda c, i=i: put(i, "end", c), **options)
                r.context_bound = bound
                out.append(r)
            return out

        try:
            requests = await run_in_threadpool(build)
        except ContextFull as e:
            raise ApiError(str(e), param, 400, "context_length_exceeded") from None
        except (ValueError, IndexError, TypeError) as e:
            raise ApiError(str(e), param, 400, "invalid_value") from None
        eng = engines[gen.model]
        tickets = [eng.submit(r) for r in requests]
        rid = protocol.new_id("chatcmpl" if gen.chat else "cmpl")
        if gen.stream:
            return StreamingResponse(sse(rid, model, gen, requests, tickets, events),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        waiting = None
        try:
            results: dict[int, Any] = {}
            pieces: dict[int, list] = {i: [] for i in range(len(requests))}
            while len(results) < len(requests):
                # A client that went away (a timeout, a closed connection) ends its requests
                # at once, as a streamed one's do: nothing draws on for nobody, and a shutdown
                # does not wait on them. Looked for while no event comes.
                waiting = waiting or asyncio.ensure_future(events.get())
                done, _ = await asyncio.wait({waiting}, timeout=DISCONNECT_POLL)
                if not done:
                    if await request.is_disconnected():
                        return Response(status_code=499)  # nginx's "client closed request"
                    continue
                events_now, waiting = waiting.result(), None
                for i, kind, data in events_now:
                    if kind == "piece":
                        if data.logprob is not None:
                            pieces[i].append(data.logprob)
                    else:
                        results[i] = data
        finally:
            if waiting is not None:
                waiting.cancel()
            for t in tickets:
                t.cancel()
        for i, t in enumerate(tickets):
            if t.error is not None:
                raise ApiError(f"the model call failed: {t.error}", None, 500, "internal_error",
                               "server_error")
        choices = []
        for i in range(len(requests)):
            c = results[i]
            choice: dict = {"index": i, "finish_reason": protocol.FINISH[c.finish_reason]}
            lp = None
            if gen.logprobs is not None:
                lp = (protocol.chat_logprobs if gen.chat else protocol.completion_logprobs)(
                    model.tokenizer, pieces[i])
            if gen.chat:
                choice["message"] = {"role": "assistant", "content": c.text, "refusal": None}
            else:
                choice["text"] = c.text
            choice["logprobs"] = lp
            choices.append(choice)
        prompt_tokens = sum(len(r.ids) for r in requests)
        drawn = sum(len(results[i].token_ids) for i in results)
        return JSONResponse({"id": rid, "object": "chat.completion" if gen.chat else
                             "text_completion", "created": protocol.now(), "model": gen.model,
                             "choices": choices, "usage": protocol.usage(prompt_tokens, drawn),
                             "system_fingerprint": None})

    async def sse(rid, model, gen, requests, tickets, events):
        """The server-sent events of a streamed generation: a chunk per piece of text (the
        chat's first says the role), each choice's last with its finish reason, the usage
        chunk where asked, then ``[DONE]``."""
        kind = "chat.completion.chunk" if gen.chat else "text_completion"
        created = protocol.now()

        def chunk(choices, usage=None) -> str:
            body = {"id": rid, "object": kind, "created": created, "model": gen.model,
                    "choices": choices, "system_fingerprint": None}
            if gen.include_usage:
                body["usage"] = usage
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        def delta(i, text=None, lp=None, finish=None, role=False) -> dict:
            if gen.chat:
                d = {"role": "assistant", "content": ""} if role else \
                    ({} if text is None else {"content": text})
                c = {"index": i, "delta": d, "logprobs": None, "finish_reason": finish}
                if lp is not None:
                    c["logprobs"] = protocol.chat_logprobs(model.tokenizer, [lp])
            else:
                c = {"index": i, "text": text or "", "logprobs": None, "finish_reason": finish}
                if lp is not None:  # text_offset counts from the choice's first token
                    c["logprobs"] = protocol.completion_logprobs(model.tokenizer, [lp],
                                                                 offsets[i])
                    offsets[i] += len(c["logprobs"]["tokens"][0])
            return c

        offsets = [0] * len(requests)

        ended, drawn = 0, 0
        try:
            if gen.chat:
                yield chunk([delta(i, role=True) for i in range(len(requests))])
            while ended < len(requests):
                out = []  # the events come a few at a time: one write for them
                for i, what, data in await events.get():
                    if what == "piece":
                        if data.text or data.logprob is not None:
                            out.append(chunk([delta(i, data.text, data.logprob)]))
                        continue
                    ended += 1
                    drawn += len(data.token_ids)
                    if tickets[i].error is not None:
                        err = ApiError(f"the model call failed: {tickets[i].error}", None, 500,
                                       "internal_error", "server_error")
                        out.append(f"data: {json.dumps(err.body())}\n\n")
                        continue
                    out.append(chunk([delta(i, None if gen.chat else "", None,
                                            protocol.FINISH[data.finish_reason])]))
                if out:
                    yield "".join(out)
            if gen.include_usage:
                body = {"id": rid, "object": kind, "created": created, "model": gen.model,
                        "choices": [], "system_fingerprint": None,
                        "usage": protocol.usage(sum(len(r.ids) for r in requests), drawn)}
                yield f"data: {json.dumps(body)}\n\n"
            yield "data: [DONE]\n\n"
        finally:  # the client went away, or the stream ended: nothing more runs for it
            for t in tickets:
                t.cancel()

    async def embeddings(request: Request) -> Response:
        e = protocol.embedding_request(await body_of(request))
        model = find(e.model, EncoderModel)

        def run():
            # Past the model's tokens a text would be cut (the library truncates as
            # sentence-transformers does); an API request is refused instead, as OpenAI's and
            # vLLM's are: a client never gets a vector of half its text unawares.
            encoded = [model.tokenizer.encode(t, f"input[{i}]") for i, t in enumerate(e.texts)]
            cut = [i for i, (_, _, truncated) in enumerate(encoded) if truncated]
            if cut:
                which = f"input[{cut[0]}]" if len(e.texts) > 1 else "the input"
                raise ApiError(f"{which} holds more than this model's {model.tokenizer.max_tokens} "
                               "tokens; give a shorter text (nothing is truncated)", "input", 400,
                               "context_length_exceeded")
            return model.embed(e.texts), sum(len(ids) for ids, _, _ in encoded)

        try:
            vectors, tokens = await run_in_threadpool(run)
        except (ValueError, TypeError) as err:
            raise ApiError(str(err), "input", 400, "invalid_value") from None
        if e.dimensions is not None and e.dimensions != vectors.shape[1]:
            raise ApiError(f"'dimensions' is {e.dimensions}: this model gives "
                           f"{vectors.shape[1]} (no shortened embeddings)", "dimensions", 400,
                           "unsupported_value")
        return JSONResponse(protocol.embedding_body(e.model, vectors, e.base64, tokens))

    def model_card(name: str) -> dict:
        return {"id": name, "object": "model", "created": created, "owned_by": "iron-spec"}

    async def list_models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [model_card(n) for n in served]})

    async def one_model(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in served:
            raise ApiError(f"The model '{name}' does not exist", "model", 404,
                           "model_not_found")
        return JSONResponse(model_card(name))

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(exposition(engines, counters),
                                 media_type="text/plain; version=0.0.4")

    async def api_error(request: Request, e: ApiError) -> Response:
        return JSONResponse(e.body(), status_code=e.status)

    async def http_error(request: Request, e: HTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        return JSONResponse(ApiError(f"{request.method} {request.url.path}: {e.detail}", None,
                                     e.status_code, code).body(), status_code=e.status_code)

    async def internal(request: Request, e: Exception) -> Response:
        log.exception("server: %s %s failed", request.method, request.url.path)
        return JSONResponse(ApiError(f"internal error: {type(e).__name__}: {e}", None, 500,
                                     "internal_error", "server_error").body(), status_code=500)

    routes = [Route("/v1/chat/completions", chat, methods=["POST"]),
              Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/embeddings", embeddings, methods=["POST"]),
              Route("/v1/models", list_models, methods=["GET"]),
              Route("/v1/models/{name:path}", one_model, methods=["GET"]),
              Route("/health", health, methods=["GET"]),
              Route("/metrics", metrics, methods=["GET"])]
    app = Starlette(routes=routes, exception_handlers={ApiError: api_error,
                                                       HTTPException: http_error,
                                                       Exception: internal})
    key = None if api_key is None else api_key.encode()
    name = None if replica is None else replica.encode()

    async def asgi(scope, receive, send):
        """The app behind the API key check and the request counters."""
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        path = scope.get("path", "")
        if key is not None and path.startswith("/v1"):
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not (given.startswith(b"Bearer ") and hmac.compare_digest(given[7:], key)):
                err = ApiError("Incorrect API key provided: give 'Authorization: Bearer KEY' "
                               "with the key the server was started with", None, 401,
                               "invalid_api_key")
                await JSONResponse(err.body(), status_code=401)(scope, receive, send)
                counters.count(path, 401)
                return
        status = {}

        async def counted(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                if name is not None:
                    message = {**message, "headers": list(message.get("headers", [])) +
                               [(b"iron-spec-replica", name)]}
            await send(message)

        begin = time.perf_counter()
        try:
            await app(scope, receive, counted)
        finally:
            counters.count(path, status.get("code", 500), time.perf_counter() - begin)

    asgi.app, asgi.models, asgi.engines = app, served, engines  # for tests and Ray
    return asgi
