"""Contract fakes of DeepSpeed-MII v0.3.3: its REST gateway and its OpenAI-compatible server.

Text comes from ``TinyEngine``; these apps only reproduce MII's wire behaviour, read from
``mii/grpc_related/restful_gateway.py``, ``mii/entrypoints/openai_api_server.py``,
``mii/batching/ragged_batching.py`` and ``mii/config.py`` (GenerateParamsConfig) at v0.3.3.

REST gateway (``create_rest_app``; Flask + flask-restful in MII):
  ``POST /mii/{deployment}``: ``{"prompts": str | [str], **generate_kwargs}`` → a JSON list (Flask
  ``jsonify``: keys sorted, compact, trailing newline) of ``{generated_text, prompt_length,
  generated_length, finish_reason}``. Kwargs cross gRPC as scalars, so a list or null value (even
  ``"stop": ["x"]``) fails; ``stop`` works only as one string. Unknown kwargs, ``temperature <= 0``,
  ``top_p`` outside (0, 1], ``top_k <= 0`` and ``max_length <= prompt_length`` fail too. Every failure
  is flask-restful's ``500 {"message": "Internal Server Error"}``. Without ``max_length`` MII uses the
  model's max length (``engine.context_length``), not GenerateParamsConfig's 1024.
  ``"stream": true`` returns only the first token with finish_reason ``"none"``.
  ``GET /healthz`` → ``ok``; ``GET /terminate`` answers MII's text but does not stop the server.
  Unknown paths: Flask's HTML 404 page. Other methods on the resource: flask-restful JSON 405.
Generation rules (MII's ragged batching): ``do_sample`` defaults to true (greedy only when it is
  false); EOS ends generation but is not in non-stream text; ``generated_length`` counts the EOS;
  ``stop`` matches a *vocabulary piece* (``"▁ugly."``, not ``" ugly."``) and, when set, replaces the
  EOS check (EOS no longer stops generation); EOS is ignored while ``prompt_length + n - 1 <
  min_new_tokens``; the ``max_length`` check lets one token more through than ``max_new_tokens``
  would. ``return_full_text`` prepends the prompt minus its first token (MII's BOS strip).
OpenAI server (``create_openai_app``; FastAPI in MII):
  ``/v1/chat/completions``, ``/v1/completions``, ``GET /v1/models``, ``GET /health`` → ``{"status":"ok"}``.
  The server always sends ``do_sample: true``, so it never decodes greedily, and ``temperature: 0``
  fails the backend's ``temperature > 0`` check: 500 without streaming. Stream chunks are
  ``exclude_unset`` dumps: no ``object``/``created`` in chat chunks (completion chunks set
  ``object`` explicitly, so they have it), no usage chunk; ``stream_options`` is *ignored*
  (the request models ignore unknown fields). Chat streams open with a role chunk (one choice per
  ``n``), then one chunk per token, including the EOS token's own text (``<|im_end|>``: MII decodes
  streamed tokens without skipping special tokens), then ``{"content": ""}`` with the finish
  reason, then ``data: [DONE]``; only the first prompt is streamed. ``stop``: first list element;
  ``stop: []`` → 500. Wrong ``model`` → 400 code 40301 (chat: ``Model "x" not found. Please use
  "m".``; completions: ``Model x not found.``); invalid body → 400 code 40001 with pydantic's error
  list as message. Non-stream usage: chat ``prompt_tokens`` counts only message contents (× n).
  Generation errors are not caught by MII: 500 ``Internal Server Error`` (text/plain) before the
  response starts, a dropped connection (no ``[DONE]``, incomplete chunked body) after it.
FakeControl faults: REST ``internal``: 500 ``{"message": "Internal Server Error"}``. OpenAI
  ``internal``: a generation error (500 text, or a stream cut after the role chunk); ``midstream``:
  the stream is cut after three token chunks (non-stream: 500); and the generic faults of control.py.
  ``delay_s``: sleep before each generation; then each waits for one of ``control.max_running`` slots.
  ``healthy=False`` and, for REST, ``loading=True``: MII's health routes do not probe the model server,
  so they still answer ok while every generation fails as above (model server down or
  still loading). ``loading`` is not modelled on the OpenAI server (it only listens once loaded).
Capability fields: both apps append every JSON body POSTed to generate to ``received`` (their
  create function's), for tests to assert on. MII's request models accept ``presence_penalty``,
  ``frequency_penalty``, ``user`` (and for completions ``logprobs``, ``echo``, ``best_of``,
  ``use_beam_search``) and ignore them as they ignore any unknown field: the generate kwargs never carry
  them and answers have ``logprobs: null``; so does the fake. No generate kwarg takes a seed, and
  ``min_new_tokens`` is compared with the whole sequence (prompt included).
Guesses and simplifications: every engine stop id counts as the tokenizer's EOS; usage and lengths
  use ``engine.count_tokens`` (no BOS for the demo tokenizer); ``top_k`` and ``add_generation_prompt:
  false`` are accepted but not applied; API keys are not modelled; validation messages follow FastAPI's
  ``str(errors)`` shape but are not byte-exact; a client disconnect stops generation here (MII itself
  would likely finish the request inside its batch).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import asdict, dataclass
from typing import Any, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from tests.contract.control import FakeControl, with_faults
from tests.contract.tiny_engine import TinyEngine, Token

_ALPHABET = "23456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"  # shortuuid's
_MIDSTREAM_TOKENS = 3
_M = TypeVar("_M", bound=BaseModel)
_VALIDATION, _INVALID_MODEL = 40001, 40301  # fastchat ErrorCode
_FLASK_PAGE = "<!doctype html>\n<html lang=en>\n<title>{code} {name}</title>\n<h1>{name}</h1>\n<p>{text}</p>\n"
_NOT_FOUND = "The requested URL was not found on the server. If you entered the URL manually please check your spelling and try again."  # noqa: E501
_NOT_ALLOWED = "The method is not allowed for the requested URL."
_NOT_JSON = "Did not attempt to load JSON data because the request Content-Type was not 'application/json'."
_BAD_JSON = "The browser (or proxy) sent a request that this server could not understand."


class GenerationError(Exception):
    """MII's backend refused or failed the generation (a gRPC error in the front end)."""


class _Cut(Exception):
    """A generation error after the response started: uvicorn drops the connection."""


class _GenerateParams(BaseModel):
    """GenerateParamsConfig's checks (a DeepSpeedConfigModel: unknown fields are errors)."""

    model_config = ConfigDict(extra="forbid")
    prompt_length: int
    max_length: int | None = None
    max_new_tokens: int | None = None
    min_new_tokens: int = 0
    stream: bool = False
    ignore_eos: bool = False
    return_full_text: bool = False
    do_sample: bool = True
    top_p: float = Field(0.9, gt=0, le=1)
    top_k: int | None = Field(None, gt=0)
    temperature: float | None = Field(None, gt=0)
    stop: list[str] = Field(default_factory=list)

    @field_validator("stop", mode="before")
    @classmethod
    def _single(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value


@dataclass
class _Reply:
    generated_text: str
    prompt_length: int
    generated_length: int
    finish_reason: str


def _short_id() -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(22))


async def _pipeline(
    engine: TinyEngine, control: FakeControl, prompt: str, kwargs: dict[str, Any]
) -> AsyncGenerator[_Reply, None]:
    """What MII's pipeline puts on its result queue: per token when streaming, then the final reply."""
    vocab = engine._tokenizer  # the token pieces MII's stop criterion compares against
    ids: list[int] = vocab.encode(prompt, add_special_tokens=False).ids
    n_prompt = len(ids)
    try:
        p = _GenerateParams.model_validate({**kwargs, "prompt_length": n_prompt})
    except ValidationError as exc:
        raise GenerationError(str(exc)) from None
    max_length = engine.context_length if p.max_length is None else p.max_length
    if not 0 < n_prompt < max_length:
        raise GenerationError(f"max_length ({max_length}) must be greater than prompt_length ({n_prompt})")
    max_new = max_length - n_prompt if p.max_new_tokens is None else p.max_new_tokens
    budget = max(1, min(max_new, max_length - n_prompt + 1, engine.context_length - n_prompt))
    await asyncio.sleep(control.delay_s)
    await control.admit()  # queued while the batch is full (max_running)
    texts: list[str] = []
    count, reason = 0, "length"
    sampled = engine.stream(
        prompt, budget, greedy=not p.do_sample, temperature=p.temperature or 1.0, top_p=p.top_p, ignore_eos=True
    )  # ignore_eos: MII's own stop rules follow
    tokens = cast(AsyncGenerator[Token, None], sampled)
    try:
        async with aclosing(tokens):
            async for tok in tokens:
                count = tok.index
                piece = vocab.id_to_token(tok.id) or ""
                text = piece if tok.special else tok.text
                hit = piece in p.stop if p.stop else tok.special
                done = hit and not p.ignore_eos and n_prompt + count - 1 >= p.min_new_tokens
                if p.stream:
                    yield _Reply(text, n_prompt, count, "none")
                if done:
                    reason = "stop"
                    break
                texts.append(text)
                if count >= max_new or n_prompt + count - 1 >= max_length:
                    break
    finally:
        control.release()
    if p.return_full_text and not p.stream:
        texts.insert(0, vocab.decode(ids[1:], skip_special_tokens=False))
    yield _Reply("" if p.stream else "".join(texts), n_prompt, count, reason)


async def _final(engine: TinyEngine, control: FakeControl, prompt: str, kwargs: dict[str, Any]) -> _Reply:
    """MII's GeneratorReply: the first result for this request (the only one unless streaming)."""
    async with aclosing(_pipeline(engine, control, prompt, kwargs)) as replies:
        async for reply in replies:
            return reply
    raise GenerationError("no reply")


async def _all(engine: TinyEngine, control: FakeControl, prompts: list[str], kwargs: dict[str, Any]) -> list[_Reply]:
    return list(await asyncio.gather(*(_final(engine, control, p, kwargs) for p in prompts)))


class _EventStream(StreamingResponse):
    """SSE whose generator is always closed, so a client that leaves stops the engine."""

    def __init__(self, events: AsyncGenerator[str, None]) -> None:
        super().__init__(events, media_type="text/event-stream")
        self._events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._events.aclose()


def _flask_page(code: int, name: str, text: str, headers: dict[str, str] | None = None) -> Response:
    body = _FLASK_PAGE.format(code=code, name=name, text=text)
    return Response(body, code, headers, media_type="text/html; charset=utf-8")


def _restful(message: str, code: int, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps({"message": message}) + "\n", code, headers, media_type="application/json")


def create_rest_app(
    engine: TinyEngine,
    control: FakeControl,
    *,
    deployment: str = "enginegate-demo",
    received: list[dict[str, Any]] | None = None,
) -> ASGIApp:
    """MII's REST gateway; each JSON body POSTed to the resource is appended to ``received``."""
    bodies = [] if received is None else received

    async def resource(request: Request) -> Response:
        if request.method != "POST":
            return _restful(_NOT_ALLOWED, 405, {"Allow": "OPTIONS, POST"})
        mime = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if not (mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json"))):
            return _restful(_NOT_JSON, 415)
        try:
            data = json.loads(await request.body())
            bodies.append(data)
        except ValueError:
            return _restful(_BAD_JSON, 400)
        try:
            replies = await _rest_generate(engine, control, data)
        except GenerationError:
            return _restful("Internal Server Error", 500)
        body = json.dumps([asdict(r) for r in replies], sort_keys=True, separators=(",", ":")) + "\n"
        return Response(body, media_type="application/json")

    async def healthz(request: Request) -> Response:
        return Response("ok", media_type="text/html; charset=utf-8")

    async def terminate(request: Request) -> Response:
        return Response("Shutting down RESTful API gateway server", media_type="text/html; charset=utf-8")

    async def flask_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, HTTPException) and exc.status_code == 405:
            return _flask_page(405, "Method Not Allowed", _NOT_ALLOWED, {"Allow": "GET, HEAD, OPTIONS"})
        return _flask_page(404, "Not Found", _NOT_FOUND)

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    app = Starlette(
        routes=[
            Route(f"/mii/{deployment}", resource, methods=methods),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/terminate", terminate, methods=["GET"]),
        ],
        exception_handlers={404: flask_error, 405: flask_error},
    )
    app.router.redirect_slashes = False  # Flask answers 404 for a trailing slash
    return with_faults(app, control)


async def _rest_generate(engine: TinyEngine, control: FakeControl, data: Any) -> list[_Reply]:
    """``client.generate(**data)`` in the flask-restful resource; GenerationError means a 500."""
    if not isinstance(data, dict) or "prompts" not in data:
        raise GenerationError("generate() needs prompts")
    kwargs = dict(data)
    prompts = kwargs.pop("prompts")
    if kwargs.pop("streaming_fn", None) is not None:
        raise GenerationError("streaming_fn is not callable")
    prompts = [prompts] if isinstance(prompts, str) else prompts
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise GenerationError("prompts must be strings")
    if any(type(v) not in (str, int, float, bool, dict) for v in kwargs.values()):
        raise GenerationError("kwarg_dict_to_proto: unsupported value type")
    fault = control.take_fault()
    if fault == "internal" or not control.healthy or control.loading:
        raise GenerationError(fault or "model server unavailable")
    return await _all(engine, control, prompts, kwargs) if prompts else []


class _Sampling(BaseModel):
    """The fields both request models of MII's data_models.py share (unknown fields are ignored)."""

    temperature: float | None = 0.7
    top_p: float | None = 0.9
    top_k: int | None = None
    n: int | None = 1
    min_tokens: int | None = None
    max_tokens: int | None = 128
    stop: str | list[str] | None = None
    stream: bool | None = False


class _ChatRequest(_Sampling):
    model: str
    messages: str | list[dict[str, str]]
    add_generation_prompt: bool | None = True


class _CompletionRequest(_Sampling):
    model: str | None = None
    prompt: str | list[Any]
    max_length: int | None = 32768


def _error(code: int, message: str) -> JSONResponse:
    return JSONResponse({"object": "error", "message": message, "code": code}, status_code=400)


def _internal() -> Response:
    return PlainTextResponse("Internal Server Error", status_code=500)


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _choice(chat: bool, stream: bool, index: int, text: str, reason: str) -> dict[str, Any]:
    finish = None if reason == "none" else reason
    if not chat:
        return {"index": index, "text": text, "logprobs": None, "finish_reason": finish}
    key, body = ("delta", {"content": text}) if stream else ("message", {"role": "assistant", "content": text})
    return {"index": index, key: body, "finish_reason": finish}


async def _parse(request: Request, model: type[_M], received: list[dict[str, Any]]) -> _M | Response:
    """FastAPI's body validation, reported through MII's RequestValidationError handler."""
    try:
        body = json.loads(await request.body())
    except ValueError as exc:
        loc = ("body", getattr(exc, "pos", 0))
        return _error(_VALIDATION, str([{"type": "json_invalid", "loc": loc, "msg": "JSON decode error", "input": {}}]))
    try:
        received.append(body)
        return model.model_validate(body)
    except ValidationError as exc:
        errors: list[dict[str, Any]] = [dict(e) for e in exc.errors(include_url=False)]
        return _error(_VALIDATION, str([{**e, "loc": ("body", *e["loc"])} for e in errors]))


def _generate_args(req: _ChatRequest | _CompletionRequest) -> dict[str, Any]:
    """The kwargs the server sends to the backend: do_sample is always true."""
    args: dict[str, Any] = {"ignore_eos": False, "do_sample": True, "return_full_text": False}
    optional = {
        "max_length": req.max_length if isinstance(req, _CompletionRequest) else None,
        "min_new_tokens": req.min_tokens,
        "max_new_tokens": 128 if req.max_tokens is None else req.max_tokens,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "temperature": req.temperature,
        "stop": req.stop[0] if isinstance(req.stop, list) else req.stop,
        "stream": True if req.stream else None,
    }
    args.update({k: v for k, v in optional.items() if v is not None})
    return args


async def _events(
    engine: TinyEngine,
    control: FakeControl,
    prompt: str,
    args: dict[str, Any],
    fault: str | None,
    head: dict[str, Any],
    n: int,
) -> AsyncGenerator[str, None]:
    """StreamResults: the role chunk (chat), a chunk per pipeline result, [DONE]; errors cut the stream."""
    chat = "object" not in head
    if chat:
        first = [{"index": i, "delta": {"role": "assistant"}, "finish_reason": None} for i in range(n)]
        yield _sse({**head, "choices": first})
    if fault == "internal" or not control.healthy:
        raise _Cut(fault or "model server unavailable")
    try:
        async with aclosing(_pipeline(engine, control, prompt, args)) as replies:
            sent = 0
            async for r in replies:
                if fault == "midstream" and sent == _MIDSTREAM_TOKENS:
                    raise _Cut("generation failed mid-stream")
                yield _sse({**head, "choices": [_choice(chat, True, 0, r.generated_text, r.finish_reason)]})
                sent += 1
    except GenerationError as exc:
        raise _Cut(str(exc)) from None
    yield "data: [DONE]\n\n"


def create_openai_app(
    engine: TinyEngine,
    control: FakeControl,
    *,
    model: str = "enginegate-demo",
    received: list[dict[str, Any]] | None = None,
) -> ASGIApp:
    """MII's OpenAI server; each JSON body POSTed to the generate routes is appended to ``received``."""
    bodies = [] if received is None else received

    async def generate(request: Request) -> Response:
        chat = request.url.path.endswith("/chat/completions")
        req: _ChatRequest | _CompletionRequest | Response
        req = await (_parse(request, _ChatRequest, bodies) if chat else _parse(request, _CompletionRequest, bodies))
        if isinstance(req, Response):
            return req
        if req.model != model:
            wrong = f'Model "{req.model}" not found. Please use "{model}".' if chat else f"Model {req.model} not found."
            return _error(_INVALID_MODEL, wrong)
        if req.stop == []:
            return _internal()  # request.stop[0]: IndexError
        if isinstance(req, _ChatRequest):
            if not isinstance(req.messages, list) or req.n is None or req.n < 1:
                return _internal()  # apply_chat_template on a string; range(None)
            prompts = [engine.render_chat(req.messages)] * req.n
            prompt_tokens = sum(engine.count_tokens(m["content"]) for m in req.messages if "content" in m) * req.n
        else:
            prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
            if not prompts or not all(isinstance(p, str) for p in prompts):
                return _internal()  # protobuf refuses non-string prompts
            prompt_tokens = sum(engine.count_tokens(p) for p in prompts)
        args, fault = _generate_args(req), control.take_fault()
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{_short_id()}"
        if req.stream:
            head = {"id": rid, "model": model} if chat else {"id": rid, "object": "text_completion", "model": model}
            return _EventStream(_events(engine, control, prompts[0], args, fault, head, len(prompts)))
        if fault in ("internal", "midstream") or not control.healthy:
            return _internal()
        try:
            replies = await _all(engine, control, prompts, args)
        except GenerationError:
            return _internal()
        done = sum(engine.count_tokens(r.generated_text) for r in replies)
        usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + done, "completion_tokens": done}
        choices = [_choice(chat, False, i, r.generated_text, r.finish_reason) for i, r in enumerate(replies)]
        obj = "chat.completion" if chat else "text_completion"
        created = int(time.time())
        return JSONResponse(
            {"id": rid, "object": obj, "created": created, "model": model, "choices": choices, "usage": usage}
        )

    async def models(request: Request) -> Response:
        now = int(time.time())
        permission = {
            "id": f"modelperm-{_short_id()}", "object": "model_permission", "created": now,
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": True, "allow_view": True, "allow_fine_tuning": False,
            "organization": "*", "group": None, "is_blocking": False,
        }  # fmt: skip
        card = {"id": model, "object": "model", "created": now, "owned_by": "deepspeed-mii", "root": model}
        return JSONResponse({"object": "list", "data": [{**card, "parent": None, "permission": [permission]}]})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def fastapi_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", generate, methods=["POST"]),
            Route("/v1/completions", generate, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ],
        exception_handlers={404: fastapi_error, 405: fastapi_error},
    )
    return with_faults(app, control)
