"""One pipeline for every front door: chat, completions, Responses, Messages and embeddings.

Authenticate, read the body, let the door understand it as ``Work``, check the model, measure the
request's routing features, admit it (tenancy), ``choose()`` (within the arm of a weighted split:
``routing.split``), refuse it when no backend takes it, dispatch it with failover under its
deadlines, then answer as JSON or as SSE. Errors before the commit point are HTTP errors; after it,
an SSE error event and ``[DONE]``. ``RequestLife`` records how the request ended, whichever way.

The generation doors' work is ``Generation`` (below): a ``Surface``'s request, its prompt measured
for routing, generated on a target with the gateway's per-backend shaping.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

import orjson

from backends.answer_stream import AnswerStream
from backends.base import BackendError, Chunk
from gateway.config import LimitsConfig
from gateway.fleet.entry import Entry
from gateway.http.errors import ApiError, error_for_json, from_backend, model_not_found
from gateway.http.exchange import Exchange
from gateway.pipeline import cached, dispatch, fallback
from gateway.pipeline.arms import routed
from gateway.pipeline.dispatch import Committed, Deadlines
from gateway.pipeline.events import Events
from gateway.pipeline.generation import Generation, needs_first
from gateway.pipeline.lifecycle import RequestLife
from gateway.pipeline.shadow import mirror
from gateway.pipeline.surfaces import Answer, Door, Work
from routing.decisions import Decision, Reason
from routing.features import InvalidHeader
from routing.policy import priority_factor
from routing.types import FleetSnapshot, RequestFeatures
from values.calls import json_dumps, json_loads, perf_counter

if TYPE_CHECKING:
    from gateway.state import AppState, Runtime
    from gateway.tenancy.gate import Tenancy
    from gateway.tenancy.keys import KeyRecord

log = logging.getLogger("enginegate.request")


async def serve(
    ex: Exchange, headers: Mapping[str, str], state: AppState, door: Door, received: float | None = None, path: str = ""
) -> None:
    """Answer one request of ``door`` on ``ex``; errors before the answer starts raise ``ApiError``.
    ``received``: when the HTTP server parsed the request's first byte (``perf_counter``), if known; ``path``:
    its route. The request's ``RequestLife`` records how it ended, whichever way that is."""
    started = received if received is not None else perf_counter()
    life = RequestLife(state, door.route, ex, started)
    if state.tracing is not None:  # its spans; an incoming traceparent makes them its caller's children
        life.trace = state.tracing.request(headers, ex.request_id, door.route, path, started)
    await life.run(_serve(ex, headers, state, door, life))


async def _serve(ex: Exchange, headers: Mapping[str, str], state: AppState, door: Door, life: RequestLife) -> None:
    rt = state.runtime  # one config for the whole request, whatever a reload does meanwhile
    tenancy = state.tenancy  # None without API keys: nothing below costs anything then
    key = await tenancy.authenticate(headers.get("authorization")) if tenancy is not None else None
    data = await _json(ex, headers, rt.config.limits)
    if rt.aliases:
        data = fallback.unaliased(data, rt.aliases)
    work = door.understood(data, rt, ex.request_id)
    work.trace = life.trace
    if work.model not in rt.model_names:
        raise model_not_found(work.model)
    life.model = work.model
    life.caller = work.caller
    snapshot = state.fleet.snapshot()
    try:
        feats = await work.features(ex, rt, snapshot, headers)
    except InvalidHeader as exc:
        raise ApiError(400, str(exc), param=exc.name, code="invalid_header") from None
    if key is not None and tenancy is not None:
        feats = await _admit(tenancy, key, rt, work, feats, snapshot, "x-priority" in headers, life)
    missed = None
    if state.cache is not None and isinstance(work, Generation):  # after admission: limits count a hit
        answered, missed = await cached.look(state.cache, rt.config, work.gen, feats, ex, work, life)
        if answered:
            return
    asked, keyed = work.model, tenancy if key is not None else None
    chain = rt.chains.get(work.model)
    if chain is None or not isinstance(work, fallback.Retargetable):
        committed = await _on_model(state, rt, work, snapshot, keyed, (ex, headers), life, feats)
    else:
        attempt = partial(_on_model, state, rt, work, snapshot, keyed, (ex, headers), life)
        measure = partial(work.features, ex, rt, snapshot, headers)
        allowed = key.allows if key is not None else fallback.anyone
        committed = await fallback.walk(chain, work, work.model, feats, attempt, measure, allowed, life)
    if work.model != asked:
        missed = None  # another model answered: not the answer stored for the model asked
    life.committed(committed, isinstance(work, Generation) and committed.target.name in work.chosen_whole)
    answer = work.events
    if answer is not None:
        # A stream's headers go out with its first token: what the gateway added up to there.
        life.overhead_header(work.clock.waited_s)
        ex.failure = answer.failure  # a shutdown that cuts the stream ends it in this front door's events
        kept = await _stream(ex, committed, answer, life, missed is not None)
        if missed is not None and kept is not None:
            await missed.keep(kept)
        return
    doc, usage = work.whole(committed.first)  # a whole answer: dispatch read it to its end
    life.answered(usage)
    payload = json_dumps(doc)
    life.overhead_header(work.clock.waited_s)
    await ex.respond(200, payload)
    if missed is not None:
        await missed.keep(committed.first)


async def _json(ex: Exchange, headers: Mapping[str, str], limits: LimitsConfig) -> Any:
    raw = await ex.body(limits.max_body_bytes, headers.get("content-length"))
    ex.watch()
    try:
        return json_loads(raw)
    except orjson.JSONDecodeError as exc:
        raise error_for_json(exc) from None


async def _admit(
    tenancy: Tenancy,
    key: KeyRecord,
    rt: Runtime,
    work: Work,
    feats: RequestFeatures,
    snapshot: FleetSnapshot,
    explicit_priority: bool,
    life: RequestLife,
) -> RequestFeatures:
    """Scope, limits and budget of the caller's key, before any backend is chosen."""
    spec = snapshot.models.get(work.model)
    cap, estimated = work.admission(rt.config.limits)
    context = spec.context if spec is not None else None
    admitted = await tenancy.admit(key, feats, life, explicit_priority, cap, context, estimated)
    work.admitted(admitted)
    return admitted


async def _on_model(
    state: AppState,
    rt: Runtime,
    work: Work,
    snapshot: FleetSnapshot,
    tenancy: Tenancy | None,
    asked: tuple[Exchange, Mapping[str, str]],
    life: RequestLife,
    feats: RequestFeatures,
) -> Committed[Entry]:
    """The work on its model: routed, a key's fair share kept, dispatched up to its commit point. A
    weighted split's arm may send it to another model: then it is measured and answered as that one's."""
    ex, headers = asked
    decision = _route(state, rt, feats, snapshot, work, life, headers)
    if decision.model is not None and decision.model != work.model and isinstance(work, fallback.Retargetable):
        work.serve_as(decision.model)
        life.model = decision.model
        fresh = await work.features(ex, rt, snapshot, headers)
        feats = replace(fresh, priority=feats.priority, key=feats.key, team=feats.team)
    if tenancy is not None:
        tenancy.fair_share(feats, decision)  # within a class, no key takes a saturated backend from the others
    if decision.rule is not None and isinstance(work, Generation):  # a rule may mirror it: shadow traffic
        mirror(state, rt, work, feats, decision, snapshot, life)
    return await _dispatch(state, rt, work, feats, decision, life)


def _route(
    state: AppState, rt: Runtime, feats: RequestFeatures, snapshot: FleetSnapshot, work: Work, life: RequestLife,
    headers: Mapping[str, str],
) -> Decision:  # fmt: skip
    """``choose()`` (within the arm of a weighted split), counted and told (``x-enginegate-route``); a
    refusal when no backend takes it."""
    began = perf_counter() if life.trace is not None else 0.0
    decision, armed = routed(state.splits, rt.rules, feats, snapshot, headers)
    state.metrics.decision(decision.reason.value, decision.candidates[0].backend if decision.candidates else "none")
    life.routed(work.model, decision, work.events is not None, feats, armed, began)
    if state.decisions is not None:  # refusals too: the console shows why a request had no backend
        state.decisions.record(life.ex.request_id, feats, decision)
    if not decision.candidates or decision.reason is Reason.BUDGET_UNMEETABLE:
        # The client is told why without backend names; the log has each backend's reason.
        log.info(
            "no backend can take the request", extra={"request_id": life.ex.request_id, "excluded": decision.excluded}
        )
        raise work.refusal(decision)
    return decision


async def _dispatch(
    state: AppState, rt: Runtime, work: Work, feats: RequestFeatures, decision: Decision, life: RequestLife
) -> Committed[Entry]:
    """The candidates in order (or hedged) until one commits, under the request's deadlines."""
    routing = rt.config.routing
    deadlines = Deadlines(
        routing.first_token_timeout_s,
        routing.answer_timeout_s,
        routing.max_queue_wait_s * priority_factor(feats.priority),
    )
    hedge_after = decision.hedge_after_ms / 1000 if decision.hedge_after_ms is not None else None
    targets = state.fleet.targets(c.backend for c in decision.candidates[: decision.max_attempts])
    whole = work.events is None  # an answer sent whole commits at its end
    if whole and isinstance(work, Generation):
        work.needs_first = needs_first(state, hedge_after is not None or not routing.ask_whole)
    try:
        loop = life.ex.loop
        return await dispatch.start(targets, work, deadlines, life, feats.prompt_tokens, whole, hedge_after, loop)
    except BackendError as exc:
        life.engine_wait_s = work.clock.waited_s
        raise from_backend(exc) from exc


async def _stream(
    ex: Exchange, committed: Committed[Entry], answer: Answer, life: RequestLife, keep: bool
) -> list[Chunk] | None:
    """The committed answer as SSE, read and written in this one coroutine (no generator between
    the backend's stream and the socket). A failure of the engine or of the gateway ends the stream
    in an error event; the client leaving (the write raises, or the task is cancelled) does not.
    ``keep``: returns the chunks of a stream that ran to its end (for the response cache)."""
    events = Events(answer, keep)
    rest = committed.rest
    if isinstance(rest, AnswerStream):  # chunks that arrive while it waits are written in the engine's callback

        def pushed(chunk: Chunk) -> bool:
            if not ex.can_stream_now():
                return False
            data = events.add(chunk)
            if data is not None:
                ex.stream_now(data)
            return True

        def pushed_texts(texts: list[str]) -> bool:
            if not ex.can_stream_now():
                return False
            ex.stream_now(events.texts(texts))
            return True

        rest.push_to(pushed, None if events.text_events is None else pushed_texts)
    result = "cancelled"
    failure: BackendError | None = None
    writing = False  # an exception while writing is the client's side: it goes on, counted as cancelled
    try:
        await ex.start_stream()
        try:
            for chunk in committed.first:
                data = events.add(chunk)
                if data is not None:
                    writing = True
                    await ex.stream(data)
                    writing = False
            async for chunk in committed.rest:
                data = events.add(chunk)
                if data is not None:
                    writing = True
                    await ex.stream(data)
                    writing = False
            result, tail = "ok", events.closing()
        except BackendError as exc:
            result, failure, tail = "error", exc, events.failed(from_backend(exc))
        except Exception:  # never a silent close: the client gets an error event and [DONE]
            if writing:
                raise
            result = "error"
            log.exception("the gateway failed while streaming", extra={"request_id": life.ex.request_id})
            failed = ApiError(500, "The gateway failed while streaming.", type="api_error", code="internal_error")
            tail = events.failed(failed)
        await ex.end_stream(tail)  # the last events and the stream's end in one write
    finally:  # also on cancellation: closing the committed answer closes the backend stream
        await committed.aclose()
        if result == "error":
            life.broke(failure, events.usage)
        else:
            life.answered(events.usage, cancelled=result == "cancelled")
    return events.kept if result == "ok" else None
