"""The two generation routes, ``/v1/chat/completions`` and ``/v1/completions``.

One flow for both: read and validate the body, compute routing features,
``choose()``, dispatch, then answer as JSON or as SSE. Errors before the
commit point are HTTP errors; after it, an SSE error event and ``[DONE]``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import orjson
from starlette.requests import Request
from starlette.responses import Response

from backends.base import BackendError, Usage
from gateway import dispatch
from gateway.errors import ApiError, from_backend, model_not_found
from gateway.openai_api import (
    ChatBody,
    CompletionBody,
    ResponseShape,
    error_for_json,
    parse_body,
    prompt_texts,
    to_generation,
)
from gateway.streaming import DONE, SSEResponse, event, until_disconnect
from routing.features import InvalidHeader, features
from routing.policy import choose
from routing.types import Decision, Reason

if TYPE_CHECKING:
    from gateway.app import AppState

log = logging.getLogger("enginegate.request")


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"Request body is larger than {limit} bytes.", code="request_too_large")
    parts = []
    size = 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise ApiError(413, f"Request body is larger than {limit} bytes.", code="request_too_large")
        parts.append(part)
    return b"".join(parts)


def _no_candidates(decision: Decision, model: str) -> ApiError:
    if decision.reason is Reason.NO_BACKEND_FOR_MODEL:
        return model_not_found(model)
    return ApiError(
        503,
        f"No healthy backend serves `{model}` right now.",
        type="api_error",
        code="no_backend_available",
        retry_after=1.0,
    )


async def complete(request: Request, state: AppState, chat: bool) -> Response:
    started = time.perf_counter()
    request_id: str = request.scope["enginegate.request_id"]
    raw = await read_body(request, state.config.limits.max_body_bytes)
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise error_for_json(exc) from None
    body = parse_body(ChatBody if chat else CompletionBody, data)
    gen = to_generation(body, request_id, state.config.limits.max_tokens, state.config.limits.max_messages)
    if gen.model not in state.model_names:
        raise model_not_found(gen.model)
    try:
        feats = features(gen.model, prompt_texts(gen), gen.max_tokens, bool(body.stream), request.headers)
    except InvalidHeader as exc:
        raise ApiError(400, str(exc), param=exc.name, code="invalid_header") from None
    decision = choose(feats, state.fleet.snapshot(), state.rules)
    if not decision.candidates:
        raise _no_candidates(decision, gen.model)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    shape = ResponseShape(chat, request_id, gen.model, include_usage)
    headers = {"x-enginegate-route": decision.reason.value}
    before_backend = time.perf_counter() - started
    timeout = state.config.routing.first_token_timeout_s
    try:
        committed = await until_disconnect(
            dispatch.start(decision, state.fleet.backends, gen, timeout), request.receive
        )
    except BackendError as exc:
        state.metrics.request(chat, gen.model, "none", "error")
        raise from_backend(exc) from None
    headers["x-enginegate-backend"] = committed.backend
    if body.stream:
        headers["x-enginegate-overhead-ms"] = f"{before_backend * 1000:.3f}"
        return SSEResponse(_events(committed, shape, state, chat), headers)
    try:
        text, finish, usage = await until_disconnect(_collect(committed), request.receive)
        backend_done = time.perf_counter()
    except BackendError as exc:
        state.metrics.request(chat, gen.model, committed.backend, "error")
        raise from_backend(exc) from None
    payload = orjson.dumps(shape.whole(text, finish, usage))
    state.metrics.request(chat, gen.model, committed.backend, "ok")
    overhead = before_backend + (time.perf_counter() - backend_done)
    headers["x-enginegate-overhead-ms"] = f"{overhead * 1000:.3f}"
    return Response(payload, media_type="application/json", headers=headers)


async def _collect(committed: dispatch.Committed) -> tuple[str, str | None, Usage | None]:
    parts: list[str] = []
    finish: str | None = None
    usage: Usage | None = None
    try:
        async for chunk in committed.chunks():
            parts.append(chunk.text)
            finish = chunk.finish_reason or finish
            usage = chunk.usage or usage
    finally:
        await committed.aclose()
    return "".join(parts), finish, usage


async def _events(
    committed: dispatch.Committed, shape: ResponseShape, state: AppState, chat: bool
) -> AsyncIterator[bytes]:
    outcome = "cancelled"
    usage: Usage | None = None
    try:
        opening = shape.role_chunk()
        if opening is not None:
            yield event(opening)
        async for chunk in committed.chunks():
            usage = chunk.usage or usage
            doc = shape.delta(chunk)
            if doc is not None:
                yield event(doc)
        if shape.include_usage:
            yield event(shape.usage_chunk(usage))
        outcome = "ok"
    except BackendError as exc:
        outcome = "error"
        log.warning("stream failed after commit", extra={"backend": committed.backend, "kind": exc.kind.value})
        yield event(from_backend(exc).body())
    except Exception:  # never a silent close: the client gets an error event and [DONE]
        outcome = "error"
        log.exception("stream failed after commit", extra={"backend": committed.backend})
        yield event(
            ApiError(500, "The gateway failed while streaming.", type="api_error", code="internal_error").body()
        )
    finally:
        await committed.aclose()
        state.metrics.request(chat, shape.model, committed.backend, outcome)
    yield DONE
