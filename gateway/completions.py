"""The two generation routes, ``/v1/chat/completions`` and ``/v1/completions``.

One flow for both: read and validate the body, compute routing features,
``choose()``, dispatch, then answer as JSON or as SSE. Errors before the
commit point are HTTP errors; after it, an SSE error event and ``[DONE]``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson

from backends.base import BackendError, EngineClock, GenerationRequest, Usage
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
from gateway.streaming import DONE, Exchange, event
from routing.features import InvalidHeader, features
from routing.policy import choose
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


@dataclass
class Outcome:
    """One request's accounting, from dispatch to its last byte: the fleet learns TTFT and per-token
    time (estimator) and engine failures (circuit breaker); metrics and one log line record it."""

    state: AppState
    chat: bool
    request_id: str
    model: str
    decision: Decision
    started: float
    stream: bool
    clock: EngineClock
    backend: str = "none"
    ttft_s: float = 0.0
    first_at: float = 0.0
    failures: list[tuple[str, BackendError]] = field(default_factory=list)

    def committed(self, committed: dispatch.Committed) -> None:
        self.backend = committed.backend
        self.first_at = time.perf_counter()
        self.ttft_s = self.first_at - self.started
        self.failures = committed.failures
        self._attempts()

    def _attempts(self) -> None:
        metrics = self.state.metrics
        for name, exc in self.failures:
            metrics.attempt(name, exc.kind.value)
            if exc.engine_fault:
                self.state.fleet.failed(name)
        if self.backend != "none":
            metrics.attempt(self.backend, "ok")
            if self.failures:
                metrics.failover(self.model)

    def failed_to_start(self, error: BackendError | None) -> None:
        """No backend answered: every attempt failed (``error``), or the client left first (None)."""
        self.failures = error.failures if error is not None else []
        self._attempts()
        self._finish("error" if error is not None else "cancelled", None, error)

    def done(
        self, usage: Usage | None, error: BackendError | None = None, cancelled: bool = False, crashed: bool = False
    ) -> None:
        """The answer ended: completely (usage), with an engine error, because the client left, or
        because the gateway itself failed (``crashed``: not the engine's fault)."""
        fleet = self.state.fleet
        fleet.end(self.backend)
        if error is not None or crashed:
            if error is not None and error.engine_fault:
                fleet.failed(self.backend)
            self._finish("error", usage, error)
            return
        tokens = usage.completion_tokens if usage else 0
        tpot_s = (time.perf_counter() - self.first_at) / (tokens - 1) if tokens > 1 else None
        predicted = next(
            (c.prediction.prior_ttft_ms for c in self.decision.candidates if c.backend == self.backend), None
        )
        fleet.succeeded(
            self.backend, predicted if predicted is not None else self.ttft_s * 1000, self.ttft_s * 1000,
            None if tpot_s is None else tpot_s * 1000,
        )  # fmt: skip
        if usage is not None and not cancelled:
            self.state.metrics.answered(
                self.chat, self.model, self.backend, time.perf_counter() - self.started, self.ttft_s, tpot_s,
                usage.prompt_tokens, usage.completion_tokens,
            )  # fmt: skip
        self._finish("cancelled" if cancelled else "ok", usage, None)

    def _finish(self, result: str, usage: Usage | None, error: BackendError | None) -> None:
        self.state.metrics.request(self.chat, self.model, self.backend, result)
        if not log.isEnabledFor(logging.INFO):
            return
        log.info(
            "request",
            extra={
                "request_id": self.request_id,
                "route": "chat" if self.chat else "completions",
                "model": self.model,
                "backend": self.backend,
                "route_reason": self.decision.reason.value,
                "rule": self.decision.rule,
                "outcome": result,
                "error_kind": error.kind.value if error else None,
                "stream": self.stream,
                "attempts": len(self.failures) + (self.backend != "none"),
                "ttft_ms": round(self.ttft_s * 1000, 3) if self.backend != "none" else None,
                "duration_ms": round((time.perf_counter() - self.started) * 1000, 3),
                "engine_wait_ms": round(self.clock.waited_s * 1000, 3),
                "prompt_tokens": usage.prompt_tokens if usage else None,
                "completion_tokens": usage.completion_tokens if usage else None,
            },
        )


async def serve(
    ex: Exchange, headers: Mapping[str, str], state: AppState, chat: bool, received: float | None = None
) -> None:
    """Answer one generation request on ``ex``; errors before the answer starts raise ``ApiError``.
    ``received``: when the HTTP server parsed the request's first byte (``perf_counter``), if known."""
    started = received if received is not None else time.perf_counter()
    rt = state.runtime  # one config for the whole request, whatever a reload does meanwhile
    limits = rt.config.limits
    raw = await ex.body(limits.max_body_bytes, headers.get("content-length"))
    ex.watch()
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise error_for_json(exc) from None
    body = parse_body(ChatBody if chat else CompletionBody, data)
    gen = to_generation(body, ex.request_id, limits.max_tokens, limits.max_messages)
    if gen.model not in rt.model_names:
        raise model_not_found(gen.model)
    try:
        counter = rt.counters.get(gen.model)
        exact = counter.count(gen) if counter is not None else None
        feats = features(gen.model, prompt_texts(gen), gen.max_tokens, bool(body.stream), headers, exact)
    except InvalidHeader as exc:
        raise ApiError(400, str(exc), param=exc.name, code="invalid_header") from None
    decision = choose(feats, state.fleet.snapshot(), rt.rules)
    state.metrics.decision(decision.reason.value, decision.candidates[0].backend if decision.candidates else "none")
    if not decision.candidates or decision.reason is Reason.BUDGET_UNMEETABLE:
        raise _no_candidates(decision, gen.model)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    shape = ResponseShape(chat, ex.request_id, gen.model, include_usage)
    ex.header("x-enginegate-route", decision.reason.value)
    if decision.rule:
        ex.header("x-enginegate-rule", decision.rule)
    timeout = rt.config.routing.first_token_timeout_s
    hedge_after = decision.hedge_after_ms / 1000 if decision.hedge_after_ms is not None else None
    outcome = Outcome(state, chat, ex.request_id, gen.model, decision, started, bool(body.stream), gen.clock)
    state.metrics.started("chat" if chat else "completions")
    try:
        committed = await dispatch.start(
            decision, state.fleet.backends, gen, timeout, state.fleet, feats.prompt_tokens, hedge_after
        )
    except BackendError as exc:
        outcome.failed_to_start(exc)
        raise from_backend(exc) from None
    except BaseException:  # the client left before any backend answered
        outcome.failed_to_start(None)
        raise
    outcome.committed(committed)
    ex.header("x-enginegate-backend", committed.backend)
    if body.stream:
        # A stream's headers go out with its first token: what the gateway added up to there.
        _overhead(ex, state, chat, started, gen)
        await _stream(ex, _events(committed, shape, state, chat, outcome))
        return
    try:
        text, finish, usage = await _collect(committed)
    except BackendError as exc:
        outcome.done(None, exc)
        raise from_backend(exc) from None
    except BaseException:
        outcome.done(None, cancelled=True)
        raise
    outcome.done(usage)
    payload = orjson.dumps(shape.whole(text, finish, usage))
    _overhead(ex, state, chat, started, gen)
    await ex.respond(200, payload)


def _overhead(ex: Exchange, state: AppState, chat: bool, started: float, gen: GenerationRequest) -> None:
    """The request's time in the gateway so far minus the time it waited on its engine."""
    seconds = max(0.0, time.perf_counter() - started - gen.clock.waited_s)
    state.metrics.overhead(chat, seconds)
    ex.header("x-enginegate-overhead-ms", f"{seconds * 1000:.3f}")


async def _stream(ex: Exchange, events: AsyncGenerator[bytes, None]) -> None:
    try:
        await ex.start_stream()
        async for data in events:
            await ex.stream(data)
        await ex.end_stream()
    finally:  # also on cancellation: closing the events closes the backend stream
        await events.aclose()


async def _collect(committed: dispatch.Committed) -> tuple[str, str | None, Usage | None]:
    parts: list[str] = []
    finish: str | None = None
    usage: Usage | None = None
    try:
        for chunk in committed.first:
            parts.append(chunk.text)
            finish = chunk.finish_reason or finish
            usage = chunk.usage or usage
        async for chunk in committed.rest:  # straight from the backend: no generator layer per chunk
            parts.append(chunk.text)
            finish = chunk.finish_reason or finish
            usage = chunk.usage or usage
    finally:
        await committed.aclose()
    return "".join(parts), finish, usage


async def _events(
    committed: dispatch.Committed, shape: ResponseShape, state: AppState, chat: bool, outcome: Outcome
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
        log.warning("stream failed after commit", extra={"backend": committed.backend, "kind": exc.kind.value})
        yield b"".join(held) + event(from_backend(exc).body())  # what arrived before the failure, then why
    except Exception:  # never a silent close: the client gets an error event and [DONE]
        result = "error"
        log.exception("stream failed after commit", extra={"backend": committed.backend})
        failed = ApiError(500, "The gateway failed while streaming.", type="api_error", code="internal_error")
        yield b"".join(held) + event(failed.body())
    finally:
        await committed.aclose()
        outcome.done(usage, failure, cancelled=result == "cancelled", crashed=result == "error" and failure is None)
    yield DONE
