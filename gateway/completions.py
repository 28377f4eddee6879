"""The two generation routes, ``/v1/chat/completions`` and ``/v1/completions``.

One flow for both: read and validate the body, compute routing features,
``choose()``, dispatch, then answer as JSON or as SSE. Errors before the
commit point are HTTP errors; after it, an SSE error event and ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncGenerator, Mapping
from typing import TYPE_CHECKING

import orjson

from backends.base import BackendError, Chunk, Usage
from gateway import dispatch
from gateway.dispatch import Deadlines
from gateway.errors import ApiError, from_backend, model_not_found
from gateway.lifecycle import RequestLife
from gateway.openai_api import (
    ChatBody,
    CompletionBody,
    ResponseShape,
    error_for_json,
    parse_body,
    prompt_texts,
    to_generation,
)
from gateway.streaming import DONE, ClientGone, Exchange, event
from routing.features import InvalidHeader, features
from routing.policy import choose, priority_factor
from routing.types import Decision, Reason

if TYPE_CHECKING:
    from gateway.state import AppState

log = logging.getLogger("enginegate.request")


def _no_candidates(decision: Decision, model: str) -> ApiError:
    if decision.reason is Reason.NO_BACKEND_FOR_MODEL:
        return model_not_found(model)
    if decision.reason is Reason.BUDGET_UNMEETABLE:
        return ApiError(
            429,
            f"No backend serving `{model}` is predicted to meet this request's latency budget.",
            type="rate_limit_error",
            code="budget_unmeetable",
            retry_after=decision.retry_after_s or 1.0,
        )
    if decision.reason is Reason.OVERLOADED:
        return ApiError(
            503,
            f"Every backend serving `{model}` is at capacity; retry after the Retry-After interval.",
            type="api_error",
            code="overloaded",
            retry_after=decision.retry_after_s or 1.0,
        )
    if decision.reason is Reason.NOTHING_FITS:
        why = "; ".join(f"{name}: {text}" for name, text in decision.excluded.items())
        return ApiError(400, f"No backend can hold this request for `{model}` ({why}).", code="context_length_exceeded")
    return ApiError(
        503,
        f"No healthy backend serves `{model}` right now.",
        type="api_error",
        code="no_backend_available",
        retry_after=1.0,
    )


async def serve(
    ex: Exchange, headers: Mapping[str, str], state: AppState, chat: bool, received: float | None = None
) -> None:
    """Answer one generation request on ``ex``; errors before the answer starts raise ``ApiError``.
    ``received``: when the HTTP server parsed the request's first byte (``perf_counter``), if known.
    The request's ``RequestLife`` records how it ended, whichever way that is."""
    started = received if received is not None else time.perf_counter()
    life = RequestLife(state, chat, ex, started)
    try:
        await _serve(ex, headers, state, chat, life)
    except ApiError as exc:
        life.refused(exc, exc.__cause__ if isinstance(exc.__cause__, BackendError) else None)
        raise
    except (ClientGone, asyncio.CancelledError):
        life.left()
        raise
    except Exception:
        life.crashed()
        raise


async def _serve(ex: Exchange, headers: Mapping[str, str], state: AppState, chat: bool, life: RequestLife) -> None:
    rt = state.runtime  # one config for the whole request, whatever a reload does meanwhile
    limits = rt.config.limits
    raw = await ex.body(limits.max_body_bytes, headers.get("content-length"))
    ex.watch()
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise error_for_json(exc) from None
    body = parse_body(ChatBody if chat else CompletionBody, data, limits.max_messages, limits.max_stop_chars)
    gen = to_generation(body, ex.request_id, limits.max_tokens, limits.max_messages)
    if gen.model not in rt.model_names:
        raise model_not_found(gen.model)
    life.model = gen.model
    try:
        counter = rt.counters.get(gen.model)
        exact = await counter.measure(gen) if counter is not None else None
        stream = bool(body.stream)
        feats = features(gen.model, prompt_texts(gen), gen.max_tokens, stream, headers, exact, random.random())
    except InvalidHeader as exc:
        raise ApiError(400, str(exc), param=exc.name, code="invalid_header") from None
    fleet = state.fleet
    decision = choose(feats, fleet.snapshot(), rt.rules)
    state.metrics.decision(decision.reason.value, decision.candidates[0].backend if decision.candidates else "none")
    life.routed(gen.model, decision, stream)
    if not decision.candidates or decision.reason is Reason.BUDGET_UNMEETABLE:
        raise _no_candidates(decision, gen.model)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    shape = ResponseShape(chat, ex.request_id, gen.model, include_usage)
    routing = rt.config.routing
    deadlines = Deadlines(
        routing.first_token_timeout_s,
        routing.answer_timeout_s,
        routing.max_queue_wait_s * priority_factor(feats.priority),
    )
    hedge_after = decision.hedge_after_ms / 1000 if decision.hedge_after_ms is not None else None
    targets = fleet.targets(c.backend for c in decision.candidates[: decision.max_attempts])
    try:
        committed = await dispatch.start(targets, gen, deadlines, life, feats.prompt_tokens, not stream, hedge_after)
    except BackendError as exc:
        life.engine_wait_s = gen.clock.waited_s
        raise from_backend(exc) from exc
    life.committed(committed)
    if stream:
        # A stream's headers go out with its first token: what the gateway added up to there.
        life.overhead_header(gen.clock.waited_s)
        await _stream(ex, _events(committed, shape, life))
        return
    text, finish, usage = _collect(committed.first)  # a whole answer: dispatch read it to its end
    life.answered(usage)
    payload = orjson.dumps(shape.whole(text, finish, usage))
    life.overhead_header(gen.clock.waited_s)
    await ex.respond(200, payload)


async def _stream(ex: Exchange, events: AsyncGenerator[bytes, None]) -> None:
    try:
        await ex.start_stream()
        async for data in events:
            await ex.stream(data)
        await ex.end_stream()
    finally:  # also on cancellation: closing the events closes the backend stream
        await events.aclose()


def _collect(chunks: list[Chunk]) -> tuple[str, str | None, Usage | None]:
    finish: str | None = None
    usage: Usage | None = None
    for chunk in chunks:
        finish = chunk.finish_reason or finish
        usage = chunk.usage or usage
    return "".join([chunk.text for chunk in chunks]), finish, usage


async def _events(
    committed: dispatch.Committed, shape: ResponseShape, life: RequestLife
) -> AsyncGenerator[bytes, None]:
    result = "cancelled"
    usage: Usage | None = None
    failure: BackendError | None = None
    held: list[bytes] = []  # events of chunks that arrived together go out in one write
    try:
        opening = shape.role_chunk()
        if opening is not None:
            held.append(event(opening))
        async for chunk in committed.chunks():
            usage = chunk.usage or usage
            doc = shape.delta(chunk)
            if doc is not None:
                held.append(event(doc))
            if held and not chunk.more:
                yield b"".join(held)
                held = []
        if shape.include_usage:
            held.append(event(shape.usage_chunk(usage)))
        if held:
            yield b"".join(held)
            held = []
        result = "ok"
    except BackendError as exc:
        result, failure = "error", exc
        yield b"".join(held) + event(from_backend(exc).body())  # what arrived before the failure, then why
    except Exception:  # never a silent close: the client gets an error event and [DONE]
        result = "error"
        log.exception("the gateway failed while streaming", extra={"request_id": life.ex.request_id})
        failed = ApiError(500, "The gateway failed while streaming.", type="api_error", code="internal_error")
        yield b"".join(held) + event(failed.body())
    finally:
        await committed.aclose()
        if result == "error":
            life.broke(failure, usage)
        else:
            life.answered(usage, cancelled=result == "cancelled")
    yield DONE
