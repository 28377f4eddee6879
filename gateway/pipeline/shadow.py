"""Shadow traffic: a rule mirrors a share of its requests to a candidate (``routing.rules[].shadow``).

The client is answered by the primary only. The mirrored request starts with the primary's dispatch
(so their times to first token compare), as its own task: the primary never awaits it, a full
rule (``max_concurrency``) drops it instead of queueing it, and shutdown cancels it. It is routed by
``choose()`` among the candidate's backends and sent through the same ``dispatch`` and per-backend
shaping as any request, read to its end and dropped. It never passes tenancy (no key's limits or
budget see it) and never counts as a client request in the metrics; only the fleet's in-flight
figures see it, because the candidate's engine really is busier.

When both sides are done the pair is written down (``gateway.telemetry.shadow_pairs``): the primary's
side comes from its ``RequestLife`` (``Watcher``) and the text it streamed or answered whole.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from backends.base import BackendError, Chunk, EngineClock, GenerationRequest, Usage
from gateway.config import RuleConfig
from gateway.config.shadow import RuleShadow
from gateway.fleet.entry import Entry
from gateway.http.errors import ApiError
from gateway.pipeline import dispatch
from gateway.pipeline.dispatch import Committed, Deadlines
from gateway.pipeline.lifecycle import RequestLife
from gateway.pipeline.restreams import Recount
from gateway.pipeline.shaping import open_answer, open_sized, prompt_bound
from gateway.pipeline.surfaces import Answer, UsageTotal
from gateway.telemetry.shadow_pairs import COMPARED_CHARS, PairInfo, Side, capacity_cost, comparison
from routing.decisions import Decision
from routing.policy import choose, with_rule_defaults
from routing.rules import Mode, Rule
from routing.types import FleetSnapshot, RequestFeatures

if TYPE_CHECKING:
    from gateway.state import AppState, Runtime

log = logging.getLogger("enginegate.shadow")


class Mirrorable(Protocol):
    """A generation request as the pipeline carries it (``gateway.pipeline.generation.Generation``)."""

    gen: GenerationRequest
    cap: int
    bound: int
    model_context: int
    recount: Recount | None
    events: Answer | None


def mirror(
    state: AppState,
    rt: Runtime,
    work: Mirrorable,
    feats: RequestFeatures,
    decision: Decision,
    snapshot: FleetSnapshot,
    life: RequestLife,
) -> None:
    """Mirror the request when its rule says so and it is drawn; called after routing, before dispatch,
    with the fleet's ``snapshot`` the primary was routed on (the candidate is routed on it too)."""
    name = decision.rule
    rule = state.shadows.plan(rt.config.routing, name) if name is not None else None
    if rule is None or rule.shadow is None or random.random() >= rule.shadow.share:
        return
    plan = rule.shadow
    if state.draining:
        state.shadows.dropped(rule.name, plan.to, "draining")
        return
    if not state.shadows.take(rule.name, plan.max_concurrency):
        state.shadows.dropped(rule.name, plan.to, "full")
        return
    pair = Pair(_info(rule, plan, work.gen, feats, life.ex.request_id, work.events is not None))
    life.shadow = pair
    if work.events is not None:
        work.events = _Listening(work.events, pair.primary)
    state.shadows.spawn(_shadow(state, rt, rule, plan, work, feats, snapshot, pair))


def _info(
    rule: RuleConfig, plan: RuleShadow, gen: GenerationRequest, feats: RequestFeatures, rid: str, stream: bool
) -> PairInfo:
    budgets = with_rule_defaults(feats, _rule(rule))
    return PairInfo(
        rid, rule.name, plan.to, gen.model, gen.greedy, stream,
        budgets.ttft_budget_ms, budgets.latency_budget_ms, budgets.tpot_budget_ms,
    )  # fmt: skip


def _rule(rule: RuleConfig, require: tuple[str, ...] = ()) -> Rule:
    return Rule(
        rule.name, require=require, max_attempts=1,
        default_ttft_budget_ms=rule.default_ttft_budget_ms, default_latency_budget_ms=rule.default_latency_budget_ms,
    )  # fmt: skip


class Heard:
    """What one side answered: its first choice's text (tool calls' names and arguments included,
    bounded) and finish reason, and the usage of every choice."""

    __slots__ = ("_parts", "_size", "finish", "total")

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._size = 0
        self.finish: str | None = None
        self.total = UsageTotal()

    def add(self, chunk: Chunk) -> None:
        if chunk.usage is not None:
            self.total.add(chunk)
        if chunk.index != 0:
            return
        if chunk.finish_reason is not None:
            self.finish = chunk.finish_reason
        if self._size < COMPARED_CHARS:
            for text in (chunk.text, *(f"{c.name or ''}{c.arguments}" for c in chunk.tool_calls)):
                if text:
                    self._parts.append(text)
                    self._size += len(text)

    @property
    def text(self) -> str:
        return "".join(self._parts)[:COMPARED_CHARS]


class _Listening:
    """The primary's stream events, unchanged, with every chunk also heard."""

    __slots__ = ("_answer", "_heard")

    def __init__(self, answer: Answer, heard: Heard) -> None:
        self._answer, self._heard = answer, heard

    def whole(self, chunks: list[Chunk]) -> tuple[dict[str, Any], Usage | None]:
        return self._answer.whole(chunks)

    def opening(self) -> list[bytes]:
        return self._answer.opening()

    def chunk(self, chunk: Chunk) -> bytes | None:
        self._heard.add(chunk)
        return self._answer.chunk(chunk)

    def text_events(self) -> None:
        return None  # every chunk is heard

    def closing(self, usage: Usage | None) -> bytes:
        return self._answer.closing(usage)

    def failure(self, error: ApiError) -> bytes:
        return self._answer.failure(error)


class Pair:
    """One mirrored request's pair; the primary's ``RequestLife`` tells it how the primary went."""

    def __init__(self, info: PairInfo) -> None:
        self.info = info
        self.t0 = time.perf_counter()
        """When both were sent: every time of the pair counts from here."""
        self.primary = Heard()
        self.ended: asyncio.Future[Side] = asyncio.get_running_loop().create_future()

    def committed(self, committed: Committed[Entry]) -> None:
        if not self.info.stream:  # a whole answer: every chunk is here (a stream's pass ``_Listening``)
            for chunk in committed.first:
                self.primary.add(chunk)

    def end(self, life: RequestLife, outcome: str, usage: Usage | None) -> None:
        """The primary ended (``RequestLife`` records it once): its side, in a few operations."""
        if self.ended.done():
            return
        entry = life.entry
        now = time.perf_counter()
        first = life.first_at - self.t0 if entry is not None and life.first_at else None
        e2e = now - self.t0 if outcome == "ok" else None
        side = Side(
            life.backend, self.info.model, outcome, first, e2e,
            usage.prompt_tokens if usage else None, usage.completion_tokens if usage else None,
            self.primary.finish, self.primary.text,
            capacity_cost(entry.config.cost_per_hour, e2e, _slots(life.decision, entry.name)) if entry else None,
        )  # fmt: skip
        self.ended.set_result(side)


def _slots(decision: Decision | None, backend: str) -> int:
    if decision is None:
        return 1
    return next((c.prediction.slots for c in decision.candidates if c.backend == backend), 1)


class _Tracker:
    """The mirrored attempt as the fleet sees it: in flight on its backend, nothing else (no breaker,
    no learned estimate, no metric of client requests)."""

    def __init__(self, state: AppState) -> None:
        self.fleet = state.fleet
        self.first_at: float | None = None

    def sending(self, target: Entry, prompt_tokens: int) -> None:
        self.fleet.accounts.sending(target, prompt_tokens)

    def first_token(self, target: Entry, prompt_tokens: int) -> None:
        self.first_at = time.perf_counter()
        self.fleet.accounts.first_token(target, prompt_tokens)

    def failed(self, target: Entry, error: BackendError) -> None:
        return None

    def end(self, target: Entry, prompt_tokens: int = 0) -> None:
        self.fleet.accounts.end(target, prompt_tokens)

    def queued(self, target: Entry) -> float | None:
        return self.fleet.queue_wait_s(target)


class _Opening:
    """The mirrored request on a candidate backend, shaped for it as the primary is for its own."""

    def __init__(self, gen: GenerationRequest, cap: int, context: int, bound: int, recount: Recount | None) -> None:
        self.gen, self.cap, self.context, self.bound, self.recount = gen, cap, context, bound, recount

    def open_at(self, target: Entry) -> AsyncIterator[Chunk]:
        gen, caps = self.gen, target.capabilities
        if gen.max_tokens is not None:
            return open_answer(target.backend, caps, gen, self.recount)
        context = target.context(self.context)
        return open_sized(target.backend, caps, gen, self.cap, context, self.bound, self.recount)

    def reopen(self, target: Entry, error: BackendError) -> None:
        return None  # a mirror is not retried: it is nobody's answer

    def at_once(self, target: Entry) -> bool:
        whole = target.whole
        return whole is not None and whole.answers_whole(self.gen)


def _opening(rt: Runtime, work: Mirrorable, model: str, context: int) -> _Opening:
    gen = replace(work.gen, request_id=f"{work.gen.request_id}-shadow", clock=EngineClock())
    if model == work.gen.model:
        return _Opening(gen, work.cap, work.model_context, work.bound, work.recount)
    gen = replace(gen, model=model)  # another model: its own context, and the prompt counted for it roughly
    counter = rt.counters.get(model)
    recount = Recount(None, counter.count_text) if counter is not None else None
    return _Opening(gen, work.cap, context, prompt_bound(gen, None), recount)


async def _shadow(
    state: AppState, rt: Runtime, rule: RuleConfig, plan: RuleShadow, work: Mirrorable, feats: RequestFeatures,
    snapshot: FleetSnapshot, pair: Pair,
) -> None:  # fmt: skip
    """The mirrored request, then (its slot free again) the pair's record once the primary ended."""
    book = state.shadows
    try:
        side = await _candidate(state, rt, rule, plan, work, feats, snapshot, pair)
    except asyncio.CancelledError:
        book.dropped(rule.name, plan.to, "cancelled")
        raise
    finally:
        book.release(rule.name)
    if side is None:
        return
    try:
        async with asyncio.timeout(rt.config.routing.answer_timeout_s + 60):  # the primary always ends; bounded anyway
            primary = await pair.ended
    except TimeoutError:
        log.warning("shadow pair not compared: its primary did not end", extra={"request_id": pair.info.request_id})
        return
    cfg = rt.config.shadow
    prompt = (work.gen.messages if work.gen.messages is not None else work.gen.prompt) if cfg.log_texts else None
    doc = comparison(pair.info, primary, side, cfg.similarity_threshold, prompt, cfg.log_texts)
    book.record(doc, rt.loaded.resolve(cfg.log_path) if cfg.log_path else None)


async def _candidate(
    state: AppState, rt: Runtime, rule: RuleConfig, plan: RuleShadow, work: Mirrorable, feats: RequestFeatures,
    snapshot: FleetSnapshot, pair: Pair,
) -> Side | None:  # fmt: skip
    """Route and send the mirrored request and read its answer to the end; None when no backend takes it."""
    model = plan.to if plan.to in rt.model_names else work.gen.model
    require = () if model != work.gen.model else (plan.to,)
    # The gateway's own routing settings (weights, admission, load bound) with only the shadow's rule.
    rules = replace(rt.rules, rules=(_rule(rule, require),), max_attempts=1, mode=Mode.BEST_EFFORT, hedging=False)
    decision = choose(replace(feats, model=model) if model != feats.model else feats, snapshot, rules)
    if not decision.candidates:
        state.shadows.dropped(rule.name, plan.to, "no_backend")
        return None
    spec = snapshot.models.get(model)
    opening = _opening(rt, work, model, spec.context if spec is not None else work.model_context)
    routing = rt.config.routing
    tracker = _Tracker(state)
    state.shadows.sent(rule.name, plan.to)
    backend = decision.candidates[0].backend
    heard, failure = Heard(), None
    try:
        committed = await dispatch.start(
            state.fleet.targets([backend]), opening, Deadlines(routing.first_token_timeout_s, routing.answer_timeout_s),
            tracker, feats.prompt_tokens,
        )  # fmt: skip
    except BackendError as exc:
        failure = exc
    else:
        try:
            for chunk in committed.first:
                heard.add(chunk)
            async for chunk in committed.rest:
                heard.add(chunk)
        except BackendError as exc:
            failure = exc
        finally:
            await committed.aclose()
            tracker.end(committed.target)
    end = time.perf_counter()
    usage = heard.total.usage
    first = tracker.first_at - pair.t0 if tracker.first_at is not None else None
    if failure is not None:
        state.shadows.failed(rule.name, plan.to, failure.kind.value)
        return Side(backend, model, "error", first, None, error=failure.kind.value)
    entry = state.fleet.entries.get(backend)
    cost = capacity_cost(entry.config.cost_per_hour, end - pair.t0, _slots(decision, backend)) if entry else None
    return Side(
        backend, model, "ok", first, end - pair.t0, usage.prompt_tokens if usage else None,
        usage.completion_tokens if usage else None, heard.finish, heard.text, cost,
    )  # fmt: skip
