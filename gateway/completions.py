"""The two generation routes, ``/v1/chat/completions`` and ``/v1/completions``.

One flow for both: read and validate the body, compute routing features,
``choose()``, dispatch, then answer as JSON or as SSE. Errors before the
commit point are HTTP errors; after it, an SSE error event and ``[DONE]``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, cast

import orjson

from backends.base import BackendError, Chunk, GenerationRequest, Usage
from backends.capabilities import needs, without
from gateway import dispatch
from gateway.dispatch import Deadlines
from gateway.errors import ApiError, from_backend, model_not_found
from gateway.lifecycle import RequestLife
from gateway.openai_api import error_for_json, prompt_texts
from gateway.openai_shapes import UsageTotal
from gateway.shaping import Recount, default_length, open_answer
from gateway.streaming import Exchange
from gateway.surfaces import Answer, Surface
from routing.features import InvalidHeader, features
from routing.policy import choose, priority_factor
from routing.types import Decision, FleetSnapshot, Reason

if TYPE_CHECKING:
    from gateway.fleet import Entry
    from gateway.state import AppState

log = logging.getLogger("enginegate.request")


def _unsupported(decision: Decision, model: str, wanted: dict[str, str], extras: frozenset[str]) -> ApiError:
    """400 naming the field no backend serving the model can honour, and what each backend lacks."""
    lacks = decision.lacks
    why = "; ".join(f"{name} lacks {', '.join(items)}" for name, items in lacks.items())
    for extra in sorted(extras):
        if all(extra in items for items in lacks.values()):
            return ApiError(
                400,
                f"Unrecognized request argument supplied: {extra} (no backend serving `{model}` understands it).",
                param=extra,
                code="unknown_parameter",
            )
    for feature, param in wanted.items():
        if all(feature in items for items in lacks.values()):
            return ApiError(
                400,
                f"'{param}' cannot be honoured for `{model}`: no backend serving it supports {feature} ({why}).",
                param=param,
                code="unsupported_parameter",
            )
    params = sorted({wanted.get(item, item) for items in lacks.values() for item in items})
    return ApiError(
        400,
        f"No backend serving `{model}` supports all of {', '.join(params)} together ({why}).",
        param=params[0] if params else None,
        code="unsupported_parameter",
    )


def no_candidates(decision: Decision, model: str, wanted: dict[str, str], extras: frozenset[str]) -> ApiError:
    if decision.reason is Reason.NO_BACKEND_FOR_MODEL:
        return model_not_found(model)
    if decision.reason is Reason.UNSUPPORTED:
        return _unsupported(decision, model, wanted, extras)
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
    ex: Exchange, headers: Mapping[str, str], state: AppState, surface: Surface, received: float | None = None
) -> None:
    """Answer one generation request on ``ex``; errors before the answer starts raise ``ApiError``.
    ``received``: when the HTTP server parsed the request's first byte (``perf_counter``), if known.
    The request's ``RequestLife`` records how it ended, whichever way that is."""
    started = received if received is not None else time.perf_counter()
    life = RequestLife(state, surface.route, ex, started)
    await life.run(_serve(ex, headers, state, surface, life))


async def _serve(
    ex: Exchange, headers: Mapping[str, str], state: AppState, surface: Surface, life: RequestLife
) -> None:
    rt = state.runtime  # one config for the whole request, whatever a reload does meanwhile
    limits = rt.config.limits
    tenancy = state.tenancy  # None without API keys: nothing below costs anything then
    key = await tenancy.authenticate(headers.get("authorization")) if tenancy is not None else None
    raw = await ex.body(limits.max_body_bytes, headers.get("content-length"))
    ex.watch()
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise error_for_json(exc) from None
    asked = surface.asked(data, limits, ex.request_id)
    gen = asked.gen
    if gen.stream != asked.stream:  # a door that builds its request without the client's choice (a copy)
        gen = replace(gen, stream=asked.stream)
    if gen.model not in rt.model_names:
        raise model_not_found(gen.model)
    life.model = gen.model
    life.caller = asked.caller
    fleet = state.fleet
    snapshot = fleet.snapshot()
    wanted = needs(gen)
    extras = frozenset(gen.extra)
    if (wanted or extras) and rt.config.routing.drop_unsupported:
        gen, wanted, extras = _drop_unsupported(ex, gen, wanted, extras, snapshot)
    try:
        exact, token_ids = await rt.measure(gen, snapshot)
        stream = asked.stream
        feats = features(
            gen.model,
            prompt_texts(gen),
            gen.max_tokens,
            stream,
            headers,
            exact,
            random.random(),
            frozenset(wanted),
            extras,
            roles=[m.get("role", "") for m in gen.messages] if gen.messages is not None else None,
            top_logprobs=gen.top_logprobs,
            block_bytes=rt.block_bytes,
            token_ids=token_ids,
        )
    except InvalidHeader as exc:
        raise ApiError(400, str(exc), param=exc.name, code="invalid_header") from None
    spec = snapshot.models.get(gen.model)  # the model's figures as this request's snapshot has them
    if key is not None and tenancy is not None:  # scope, limits and budget, before any backend is chosen
        context = spec.context if spec is not None else None
        estimated = None if exact is not None else len(gen.messages or ((),))  # messages when counted roughly
        feats = await tenancy.admit(key, feats, life, "x-priority" in headers, limits.max_tokens, context, estimated)
    decision = choose(feats, snapshot, rt.rules)
    state.metrics.decision(decision.reason.value, decision.candidates[0].backend if decision.candidates else "none")
    life.routed(gen.model, decision, stream, feats)
    if not decision.candidates or decision.reason is Reason.BUDGET_UNMEETABLE:
        raise no_candidates(decision, gen.model, wanted, extras)
    if key is not None and tenancy is not None:
        tenancy.fair_share(feats, decision)  # within a class, no key takes a saturated backend from the others
    answer = surface.answer(asked, ex.request_id)
    routing = rt.config.routing
    deadlines = Deadlines(
        routing.first_token_timeout_s,
        routing.answer_timeout_s,
        routing.max_queue_wait_s * priority_factor(feats.priority),
    )
    hedge_after = decision.hedge_after_ms / 1000 if decision.hedge_after_ms is not None else None
    targets = fleet.targets(c.backend for c in decision.candidates[: decision.max_attempts])
    assert spec is not None  # choose() found candidates, so the snapshot knows the model
    model_context = spec.context
    prompt_tokens = feats.prompt_tokens

    counter = rt.counters.get(gen.model)
    recount = Recount(exact, counter.count_text) if counter is not None else None

    def open_answer_at(target: dispatch.Target, request: GenerationRequest) -> AsyncIterator[Chunk]:
        entry = cast("Entry", target)
        request = default_length(request, limits.max_tokens, entry.profile.context or model_context, prompt_tokens)
        return open_answer(entry.backend, entry.capabilities, request, recount)

    try:
        committed = await dispatch.start(
            targets, gen, deadlines, life, prompt_tokens, not stream, hedge_after, open_answer_at
        )
    except BackendError as exc:
        life.engine_wait_s = gen.clock.waited_s
        raise from_backend(exc) from exc
    life.committed(committed)
    if stream:
        # A stream's headers go out with its first token: what the gateway added up to there.
        life.overhead_header(gen.clock.waited_s)
        ex.failure = answer.failure  # a shutdown that cuts the stream ends it in this front door's events
        await _stream(ex, _events(committed, answer, life))
        return
    doc, usage = answer.whole(committed.first)  # a whole answer: dispatch read it to its end
    life.answered(usage)
    payload = orjson.dumps(doc)
    life.overhead_header(gen.clock.waited_s)
    await ex.respond(200, payload)


def _drop_unsupported(
    ex: Exchange, gen: GenerationRequest, wanted: dict[str, str], extras: frozenset[str], snapshot: FleetSnapshot
) -> tuple[GenerationRequest, dict[str, str], frozenset[str]]:
    """``routing.drop_unsupported``: what no backend serving the model honours is dropped from the
    request and named in the ``x-enginegate-dropped`` header, instead of refused."""
    serving = [b.profile for b in snapshot.backends if gen.model in b.profile.models]
    features = frozenset().union(*(p.features for p in serving))
    understood = frozenset().union(*(p.extras for p in serving))
    dropped_features = [name for name in wanted if name not in features]
    dropped_extras = sorted(extras - understood)
    if not dropped_features and not dropped_extras:
        return gen, wanted, extras
    gen = without(gen, dropped_features, dropped_extras)
    names = sorted({wanted[name] for name in dropped_features} | set(dropped_extras))
    ex.header("x-enginegate-dropped", ",".join(names))
    return gen, needs(gen), extras - set(dropped_extras)


async def _stream(ex: Exchange, events: AsyncGenerator[bytes, None]) -> None:
    try:
        await ex.start_stream()
        async for data in events:
            await ex.stream(data)
        await ex.end_stream()
    finally:  # also on cancellation: closing the events closes the backend stream
        await events.aclose()


async def _events(committed: dispatch.Committed, answer: Answer, life: RequestLife) -> AsyncGenerator[bytes, None]:
    result = "cancelled"
    usage: Usage | None = None
    failure: BackendError | None = None
    held = answer.opening()  # events of chunks that arrived together go out in one write
    total = UsageTotal()
    try:
        async for chunk in committed.chunks():
            if chunk.usage is not None:
                total.add(chunk)
                usage = total.usage
            data = answer.chunk(chunk)
            if data is not None:
                held.append(data)
            if held and not chunk.more:
                yield b"".join(held)
                held = []
        result = "ok"
        yield b"".join(held) + answer.closing(usage)
    except BackendError as exc:
        result, failure = "error", exc
        yield b"".join(held) + answer.failure(from_backend(exc))  # what arrived before the failure, then why
    except Exception:  # never a silent close: the client gets an error event and [DONE]
        result = "error"
        log.exception("the gateway failed while streaming", extra={"request_id": life.ex.request_id})
        failed = ApiError(500, "The gateway failed while streaming.", type="api_error", code="internal_error")
        yield b"".join(held) + answer.failure(failed)
    finally:
        await committed.aclose()
        if result == "error":
            life.broke(failure, usage)
        else:
            life.answered(usage, cancelled=result == "cancelled")
