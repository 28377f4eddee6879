"""One owner of a generation request's bookkeeping, from arrival to its last byte.

``RequestLife`` is the dispatcher's tracker (every attempt: sent, first token,
failed, ended, counted on the fleet entry it went to), and it records how the
request ended exactly once: the estimator learns from successes, the breaker
from engine faults (never from the gateway's own bugs, a bad request or an
overload), the metrics count every response with its status class (refusals
before routing included), and one log line carries the request id. Error
responses get the same ``x-enginegate-*`` headers as answers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Protocol

from backends.base import BackendError, ErrorKind, Usage
from gateway.fleet.entry import Entry
from gateway.http.errors import ApiError
from gateway.http.exchange import ClientGone
from gateway.pipeline.dispatch import Committed
from gateway.telemetry.arms import arm_end
from gateway.whatif.records import Replayed, log_fields
from routing.decisions import Decision
from routing.types import RequestFeatures
from values.calls import perf_counter, wall_time

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.http.exchange import Exchange
    from gateway.state import AppState
    from gateway.telemetry.tracing import RequestTrace

log = logging.getLogger("enginegate.request")
_NOTHING = Usage(0, 0)


class Watcher(Protocol):
    """Who else hears how the request went: its shadow pair (``gateway.pipeline.shadow``)."""

    def committed(self, committed: Committed[Entry]) -> None: ...

    def end(self, life: RequestLife, outcome: str, usage: Usage | None) -> None: ...


class RequestLife:
    def __init__(self, state: AppState, route: str, ex: Exchange, started: float) -> None:
        self.state = state
        self.route = route
        """The front door it came through (chat, completions, ...): the metrics' route label."""
        self.ex = ex
        self.started = started
        self.model = "none"
        self.stream = False
        self.decision: Decision | None = None
        self.entry: Entry | None = None
        self.ttft_s = 0.0
        self.first_at = 0.0
        self.at_once = self.chosen_whole = False
        """The answer came whole at once (``ttft_s`` is the time to all of it); asked so by choice."""
        self.failures: list[tuple[str, BackendError]] = []
        self.attempts = 0
        self.fallbacks = 0
        """Models this request went on to after its own could not serve it (docs/traffic.md)."""
        self.engine_wait_s = 0.0
        self.caller: dict[str, object] = {}
        """What the client said about itself (OpenAI's user, metadata, safety_identifier): logged."""
        self.key_id: str | None = None
        """The API key's id (gateway/tenancy), logged; never the key."""
        self.on_end: Callable[[Usage | None, bool], float] | None = None
        """Tenancy's settlement hook: called once with the usage and whether an answer started, when the
        request's end is recorded; returns the request's cost in dollars (logged)."""
        self.shadow: Watcher | None = None
        """The request's shadow pair, when its rule mirrored it."""
        self._ended = False
        self._named = state.config.server.backend_headers
        """Whether answers name their backend and rule (``server.backend_headers``)."""
        self._tried = "none"
        """The last backend an attempt went to (a request cancelled before any answer names it)."""
        self._firsts: dict[str, float] = {}
        """When each attempt's first token came, by backend."""
        self.features: RequestFeatures | None = None
        self.arm_budgets: RequestFeatures | None = None
        """The request's features with its rule's default budgets, when a weighted split chose its arm
        (``Decision.arm``): what the arm's budgets met are judged by."""
        self._tpot_s: float | None = None
        self.trace: RequestTrace | None = None
        """The request's spans (``telemetry.otlp_endpoint``); None with tracing off."""
        self._sent: dict[str, tuple[int, list[float]]] = {}
        """Per backend tried: the prompt tokens it had to prefill (those not expected in its cache)
        and the ages of the blocks expected there, to judge its report of what it reused."""
        state.metrics.started(self.route)

    @property
    def backend(self) -> str:
        """The committed backend, else the last one tried (its failure is this request's error)."""
        if self.entry is not None:
            return self.entry.name
        return self.failures[-1][0] if self.failures else self._tried

    # The dispatcher's tracker: every attempt, as it happens.
    def sending(self, target: Entry, prompt_tokens: int) -> None:
        self.attempts += 1
        self._tried = target.name
        if self.trace is not None:
            self.trace.sending(target.name, target.config)
        f = self.features
        if f is not None and f.prefix_blocks:
            # Only the prompt tokens not expected in the engine's cache wait to be prefilled there.
            cached = self._predicted(target.name)
            blocks = min(len(f.prefix_blocks), int(cached / f.block_tokens)) if f.block_tokens > 0 else 0
            self._sent[target.name] = (prompt_tokens - cached, self.state.fleet.accounts.remember(target, f, blocks))
            prompt_tokens -= cached
        self.state.fleet.accounts.sending(target, prompt_tokens)

    def _predicted(self, backend: str) -> int:
        decision = self.decision
        if decision is None:
            return 0
        return next((c.prediction.cached_tokens for c in decision.candidates if c.backend == backend), 0)

    def _fresh(self, target: Entry, prompt_tokens: int) -> int:
        sent = self._sent.get(target.name)
        return sent[0] if sent is not None and prompt_tokens else prompt_tokens

    def first_token(self, target: Entry, prompt_tokens: int) -> None:
        # When each attempt's first token came: a whole answer commits at its end, but its time to
        # first token (what the estimator learns and the histogram shows) is this moment.
        self._firsts[target.name] = now = perf_counter()
        if self.trace is not None:
            self.trace.first_token(target.name, now - self.started)
        self.state.fleet.accounts.first_token(target, self._fresh(target, prompt_tokens))

    def failed(self, target: Entry, error: BackendError) -> None:
        self.failures.append((target.name, error))
        self.state.metrics.attempt(target.name, error.kind.value)
        if self.trace is not None:
            self.trace.failed(target.name, error.kind.value, error.detail)
        # A timeout on an engine that is queueing is its queue, not a fault: its breaker stays shut.
        queueing = error.kind is ErrorKind.TIMEOUT and self.state.fleet.queue_wait_s(target) is not None
        if error.engine_fault and not queueing:
            self.state.fleet.accounts.failed(target)
        log.warning(
            "attempt failed",
            extra={
                "request_id": self.ex.request_id,
                "backend": target.name,
                "kind": error.kind.value,
                "error": error.detail[:1000],
            },
        )

    def end(self, target: Entry, prompt_tokens: int = 0) -> None:
        self.state.fleet.accounts.end(target, self._fresh(target, prompt_tokens))
        if self.trace is not None:
            self.trace.ended(target.name)

    def queued(self, target: Entry) -> float | None:
        return self.state.fleet.queue_wait_s(target)

    # How the request goes on and ends.
    def routed(
        self,
        model: str,
        decision: Decision,
        stream: bool,
        features: RequestFeatures | None = None,
        armed: RequestFeatures | None = None,
        began: float = 0.0,
    ) -> None:
        """``choose()`` decided (it began at ``began``, ``perf_counter``). ``armed``: when a weighted split
        chose the arm, the features with the rule's default budgets."""
        self.model, self.decision, self.stream, self.features = model, decision, stream, features
        self.arm_budgets = armed
        if self.trace is not None:
            self.trace.routed(decision, features, began or perf_counter())
        self.ex.header("x-enginegate-route", decision.reason.value)
        if decision.rule and self._named:
            self.ex.header("x-enginegate-rule", decision.rule)
            if decision.arm is not None:
                self.ex.header("x-enginegate-arm", decision.arm)

    def committed(self, committed: Committed[Entry], chosen_whole: bool = False) -> None:
        """``chosen_whole``: the engine was asked whole although it could stream (no time to learn from)."""
        entry = committed.target
        self.entry = entry
        self.first_at = self._firsts.get(entry.name) or perf_counter()
        self.ttft_s = self.first_at - self.started
        self.at_once, self.chosen_whole = committed.at_once, chosen_whole
        self.state.metrics.attempt(entry.name, "ok")
        self.ex.header("x-enginegate-model", self.model)  # the model that answers (an alias's, a fallback)
        if self.trace is not None:  # a stream's rest passes through the trace, which counts its chunks
            committed.rest = self.trace.committed(
                entry.name, entry.config, committed.first, committed.rest, self.stream
            )
        if self.failures:
            self.state.metrics.failover(self.model)
        if self._named:
            self.ex.header("x-enginegate-backend", entry.name)
        if self.shadow is not None:
            self.shadow.committed(committed)

    def fell_back(self, model: str, to: str, cause: str) -> None:
        """The request went on to ``to`` because ``model`` could not serve it (``cause``)."""
        self.fallbacks += 1
        self.state.metrics.fallback(model, to, cause)
        log.info(
            "fallback",
            extra={"request_id": self.ex.request_id, "from_model": model, "to_model": to, "cause": cause},
        )

    def fallback_skipped(self, model: str, cause: str, why: str) -> None:
        log.info(
            "fallback skipped",
            extra={"request_id": self.ex.request_id, "to_model": model, "cause": cause, "why": why},
        )

    def overhead_header(self, engine_wait_s: float) -> None:
        """The request's time in the gateway so far minus the time it waited on its engine."""
        self.engine_wait_s = engine_wait_s
        seconds = max(0.0, perf_counter() - self.started - engine_wait_s)
        self.state.metrics.overhead(self.route, seconds)
        self.ex.header("x-enginegate-overhead-ms", f"{seconds * 1000:.3f}")

    def answered(self, usage: Usage | None, cancelled: bool = False) -> None:
        """The committed backend's answer ended: whole, or cut short because the client left."""
        entry = self.entry
        assert entry is not None
        self.state.fleet.accounts.end(entry)
        if not self._open():
            return
        tokens = usage.completion_tokens if usage else 0
        tpot_s = None
        if self.chosen_whole:
            # No first token seen before its end: the breaker hears of it, the estimator learns from the
            # engine's streamed answers (``generation.needs_first``).
            self.state.fleet.accounts.answered(entry)
        else:
            if tokens > 1:
                tpot_s = (perf_counter() - self.first_at) / (tokens - 1)
            candidates = self.decision.candidates if self.decision is not None else ()
            prior = next((c.prediction.prior_ttft_ms for c in candidates if c.backend == entry.name), None)
            ttft_ms, tpot_ms = self.ttft_s * 1000, None if tpot_s is None else tpot_s * 1000
            out = usage.completion_tokens if usage is not None and not cancelled else None
            self.state.fleet.accounts.succeeded(entry, ttft_ms if prior is None else prior, ttft_ms, tpot_ms, out)
        self._tpot_s = tpot_s
        if usage is not None and usage.cached_tokens is not None:
            self._reuse_reported(entry, usage.cached_tokens)
        if usage is not None and not cancelled:
            self.state.metrics.answered(
                self.route, self.model, entry.name, perf_counter() - self.started,
                None if self.chosen_whole else self.ttft_s, tpot_s,
                usage.prompt_tokens, usage.completion_tokens,
            )  # fmt: skip
        self._record("cancelled" if cancelled else "ok", 200, usage, None)

    def from_cache(self, usage: Usage | None) -> None:
        """Answered from the response cache: no engine worked, so the key is charged the request (its
        rate limits) but no tokens or dollars."""
        self._tried = "cache"
        if self._open():
            self._record("ok", 200, usage, None, charged=_NOTHING)

    def _reuse_reported(self, entry: Entry, cached_tokens: int) -> None:
        self.state.metrics.cached(entry.name, cached_tokens)
        sent, f = self._sent.get(entry.name), self.features
        if sent is not None and f is not None:
            self.state.fleet.accounts.cached(entry, sent[1], cached_tokens, f.block_tokens)

    def broke(self, error: BackendError | None, usage: Usage | None = None) -> None:
        """A committed stream failed after its first byte: the engine (``error``), or the gateway (None)."""
        entry = self.entry
        assert entry is not None
        self.state.fleet.accounts.end(entry)
        if error is not None:
            self.state.metrics.attempt(entry.name, error.kind.value)
            if error.engine_fault:
                self.state.fleet.accounts.failed(entry)
        if self._open():
            log.warning(
                "stream failed after commit",
                extra={
                    "request_id": self.ex.request_id,
                    "backend": entry.name,
                    "kind": error.kind.value if error else "internal",
                    "error": error.detail[:1000] if error else None,
                },
            )
            self._record("error", 200, usage, error)

    def refused(self, error: ApiError, cause: BackendError | None = None) -> None:
        """The request ends with an error response (before any answer was sent)."""
        if self.entry is None and self.failures and self._named:
            self.ex.header("x-enginegate-backend", self.backend)
        self.overhead_header(self.engine_wait_s)
        if self._open():
            self._record("error", error.status, None, cause, error.code)

    async def run(self, work: Awaitable[None]) -> None:
        """Await the request's handling; whichever way it ends before an answer began (refused, the
        client gone, a gateway bug), that is recorded here, once, and the exception goes on."""
        try:
            await work
        except ApiError as exc:
            self.refused(exc, exc.failure)
            raise
        except (ClientGone, asyncio.CancelledError):
            self.left()
            raise
        except Exception:
            self.crashed()
            raise

    def left(self) -> None:
        """The client went away before an answer started (nothing is sent)."""
        if self._open():
            self._record("cancelled", None, None, None)

    def crashed(self) -> None:
        """The gateway failed before answering (it answers 500)."""
        if self._open():
            self._record("error", 500, None, None, "internal_error")

    def _open(self) -> bool:
        """True the first time: a request ends once."""
        if self._ended:
            return False
        self._ended = True
        return True

    def _record(
        self,
        outcome: str,
        status: int | None,
        usage: Usage | None,
        error: BackendError | None,
        code: str | None = None,
        charged: Usage | None = None,
    ) -> None:
        """``charged``: the usage tenancy settles, when not the answer's."""
        backend = self.backend
        cost = self.on_end(charged or usage, self.entry is not None) if self.on_end is not None else None
        self.state.metrics.request(self.route, self.model, backend, outcome, status)
        recent, logging_on = self.state.recent, log.isEnabledFor(logging.INFO)
        features = self.features
        replayed = None
        if features is not None and (recent is not None or logging_on):
            # What a what-if replay needs (gateway/whatif): routed requests only, never their text.
            arrived = round(wall_time() - (perf_counter() - self.started), 3)
            replayed = Replayed(arrived, features, usage.completion_tokens if usage else None)
            if recent is not None:
                recent.append(replayed)
        if self.shadow is not None:
            self.shadow.end(self, outcome, usage)
        if self.trace is not None:
            ttft_ms = round(self.ttft_s * 1000, 3) if self.entry is not None else None
            self.trace.finished(self.model, outcome, status, usage, error.kind.value if error else None, code, ttft_ms)
        decision = self.decision
        if self.arm_budgets is not None:
            entry, decision = self.entry, self.decision
            assert decision is not None
            failed = outcome == "error" and (entry is not None or bool(self.failures))
            elapsed_s = perf_counter() - self.started
            profile = entry.profile if entry is not None else None
            times = (elapsed_s, self.ttft_s, self._tpot_s)
            self.state.splits.ended(arm_end(decision, self.arm_budgets, profile, outcome, failed, times, usage))
        if not logging_on:
            return
        log.info(
            "request",
            extra={
                "request_id": self.ex.request_id,
                "client_request_id": self.ex.client_request_id,
                "route": self.route,
                "model": self.model,
                "backend": backend,
                "route_reason": decision.reason.value if decision else None,
                "rule": decision.rule if decision else None,
                "arm": decision.arm if decision else None,
                "outcome": outcome,
                "status": status,
                "code": code,
                "error_kind": error.kind.value if error else None,
                "stream": self.stream,
                "attempts": self.attempts,
                "fallbacks": self.fallbacks,
                "ttft_ms": round(self.ttft_s * 1000, 3) if self.entry is not None else None,
                "duration_ms": round((perf_counter() - self.started) * 1000, 3),
                "engine_wait_ms": round(self.engine_wait_s * 1000, 3),
                "prompt_tokens": usage.prompt_tokens if usage else None,
                "completion_tokens": usage.completion_tokens if usage else None,
                "key_id": self.key_id,
                "cost_usd": cost,
                **(log_fields(replayed) if replayed is not None else {}),
                **self.caller,
            },
        )
