"""The decision and its account: one request's body in, the endpoints to try out, and what its
answer teaches the fleet.

``Picker.pick`` reads the body as the gateway's own OpenAI doors do (the same 400s), computes the
request's features and runs ``choose()`` over the fleet's snapshot, restricted to the proxy's subset
when it sends one. A refusal is an ``ApiError`` the proxy answers the client with. A pick comes with
a ``Ticket``: the request is in flight on its first endpoint, moves if the proxy reports another
served it, and when its answer ends the fleet learns the time to first token and per token (from a
stream), the engine's reused prompt tokens, and the breaker's verdict.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from backends.base import Usage
from backends.capabilities import needs
from backends.openai_wire import parse_chunk
from backends.sse import EventParser
from gateway.doors.openai_surface import OpenAISurface
from gateway.epp.pool import Pool
from gateway.fleet.entry import Entry
from gateway.http.errors import ApiError, error_for_json, model_not_found
from gateway.pipeline.generation import prompt_texts
from gateway.pipeline.refusals import no_candidates
from gateway.state import AppState
from routing.decisions import Decision, Reason
from routing.features import InvalidHeader, features
from routing.split import route
from routing.types import FleetSnapshot, RequestFeatures

log = logging.getLogger("enginegate.epp")

ROUTES = {"/v1/chat/completions": OpenAISurface(chat=True), "/v1/completions": OpenAISurface(chat=False)}
MAX_WHOLE_BYTES = 16 * 1024 * 1024
"""A whole (non-streamed) answer is read for its usage up to this size; a larger one teaches nothing."""


@dataclass(frozen=True)
class Picked:
    endpoints: list[str]
    """Best first: the proxy tries them in order."""
    ticket: Ticket


class Picker:
    """Decides for one fleet (``state``) whose backends are ``pool``'s endpoints."""

    def __init__(self, state: AppState, pool: Pool) -> None:
        self.state = state
        self.pool = pool

    async def pick(self, headers: Mapping[str, str], body: bytes, subset: frozenset[str] | None) -> Picked:
        """The endpoints for this request, or the ``ApiError`` its client gets instead."""
        path = headers.get(":path", "").partition("?")[0]
        surface = ROUTES.get(path)
        if surface is None:
            # The path is not echoed: what the client sent stays out of the answer.
            raise ApiError(404, f"The endpoint picker routes only {' and '.join(ROUTES)}.", code="unknown_url")
        rt = self.state.runtime
        limits = rt.config.limits
        if len(body) > limits.max_body_bytes:
            raise too_large(limits.max_body_bytes)
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise error_for_json(exc) from None
        asked = surface.asked(data, limits, headers.get("x-request-id") or uuid.uuid4().hex)
        gen = asked.gen
        if gen.model not in rt.model_names:
            raise model_not_found(gen.model)
        snapshot = self._within(self.state.fleet.snapshot(), subset, gen.model)
        wanted = needs(gen)
        extras = frozenset(gen.extra)
        exact, token_ids = await rt.measure(gen, snapshot)
        try:
            feats = features(
                gen.model, prompt_texts(gen), gen.max_tokens, asked.stream, headers, exact, random.random(),
                frozenset(wanted), extras,
                roles=[m.get("role", "") for m in gen.messages] if gen.messages is not None else None,
                top_logprobs=gen.top_logprobs, block_bytes=rt.block_bytes, token_ids=token_ids,
            )  # fmt: skip
        except InvalidHeader as exc:
            raise ApiError(400, str(exc), param=exc.name, code="invalid_header") from None
        decision = route(feats, snapshot, rt.rules, self.state.splits.stopped)
        self.state.metrics.decision(
            decision.reason.value, decision.candidates[0].backend if decision.candidates else "none"
        )
        if not decision.candidates or decision.reason is Reason.BUDGET_UNMEETABLE:
            raise refusal(decision, gen.model, wanted, extras)
        entries = self.state.fleet.targets(c.backend for c in decision.candidates[: decision.max_attempts])
        ticket = Ticket(self, gen.model, decision, feats, entries[0])
        return Picked([self.pool.endpoints[e.name] for e in entries], ticket)

    def _within(self, snapshot: FleetSnapshot, subset: frozenset[str] | None, model: str) -> FleetSnapshot:
        """The snapshot limited to the proxy's subset hint; 503 when none of it serves the model."""
        if subset is None:
            return snapshot
        endpoints = self.pool.endpoints
        kept = tuple(b for b in snapshot.backends if endpoints.get(b.name) in subset)
        if not any(model in b.profile.models for b in kept):
            raise ApiError(
                503,
                f"None of the endpoints the proxy allows for this request serves `{model}`.",
                type="api_error",
                code="no_backend_available",
                retry_after=1.0,
            )
        return FleetSnapshot(kept, snapshot.models)


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"Request body is larger than {limit} bytes.", code="request_too_large")


def refusal(decision: Decision, model: str, wanted: dict[str, str], extras: frozenset[str]) -> ApiError:
    """The gateway's own refusal for a decision without candidates, except that a request shed for
    load is a 429 (the picker protocol's "dropped"), where the gateway answers 503."""
    if decision.reason is Reason.OVERLOADED:
        return ApiError(
            429,
            f"Every endpoint serving `{model}` is at capacity; retry after the Retry-After interval.",
            type="rate_limit_error",
            code="overloaded",
            retry_after=decision.retry_after_s or 1.0,
        )
    return no_candidates(decision, model, wanted, extras)


def _usage_of(document: bytes | bytearray) -> Usage | None:
    """The usage of a whole OpenAI answer; None for anything else."""
    try:
        doc = orjson.loads(document)
        return parse_chunk(doc).usage if isinstance(doc, dict) else None
    except (AttributeError, TypeError, ValueError, KeyError):  # orjson's decode error is a ValueError
        return None


class Ticket:
    """One picked request on the fleet's books, from the pick to its answer's end (released once)."""

    def __init__(self, picker: Picker, model: str, decision: Decision, feats: RequestFeatures, entry: Entry) -> None:
        self._picker = picker
        self._accounts = picker.state.fleet.accounts
        self.model = model
        self.decision = decision
        self.features = feats
        self.entry = entry
        """The backend that has the request now: the first pick, until the proxy reports another."""
        self._backlog = 0
        """Its prompt tokens still waiting for a first token there."""
        self._ages: list[float] = []
        self._picked_at = time.perf_counter()
        self._first_at: float | None = None
        self._status = 0
        self._events: EventParser | None = None
        self._whole: bytearray | None = bytearray()
        self._usage: Usage | None = None
        self._pieces = 0
        self.open = True
        self._send(entry)

    def _send(self, entry: Entry) -> None:
        f = self.features
        cached = next((c.prediction.cached_tokens for c in self.decision.candidates if c.backend == entry.name), 0)
        blocks = min(len(f.prefix_blocks), int(cached / f.block_tokens)) if f.block_tokens > 0 else 0
        self._ages = self._accounts.remember(entry, f, blocks) if f.prefix_blocks else []
        self._backlog = max(0, f.prompt_tokens - cached)
        self._accounts.sending(entry, self._backlog)
        self.entry = entry

    def served(self, endpoint: str | None) -> None:
        """The proxy says which endpoint answered: the request's account moves there if it moved."""
        name = self._picker.pool.backend(endpoint, self.model) if endpoint else None
        if not self.open or name is None or name == self.entry.name:
            return
        moved = self._picker.state.fleet.targets([name])
        if moved:
            self._accounts.end(self.entry, self._backlog)
            self._send(moved[0])

    def response(self, headers: Mapping[str, str]) -> None:
        """The answer's status and kind: a stream is read event by event, a document whole."""
        try:
            self._status = int(headers.get(":status", "0"))
        except ValueError:
            self._status = 0
        if "text/event-stream" in headers.get("content-type", ""):
            self._events, self._whole = EventParser(), None

    def body(self, chunk: bytes) -> None:
        """A piece of the answer, as the proxy passes it on. An answer not shaped as OpenAI's is still
        passed on whole; only reading it stops."""
        if self._events is not None:
            try:
                for event in self._events.feed(chunk):
                    self._event(event.data)
            except (AttributeError, TypeError, ValueError, KeyError) as exc:
                log.warning("unreadable stream from %s, not learned from: %r", self.entry.name, exc)
                self._events = None
        elif self._whole is not None:
            self._whole += chunk
            if len(self._whole) > MAX_WHOLE_BYTES:
                self._whole = None

    def _event(self, data: str) -> None:
        if data == "[DONE]":
            return
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if not isinstance(doc, dict):
            return
        parsed = parse_chunk(doc)
        if any(c.text or c.tool_calls for c in parsed.choices):
            self._pieces += 1
            if self._first_at is None:
                self._first_at = time.perf_counter()
                self._accounts.first_token(self.entry, self._backlog)
                self._backlog = 0
        if parsed.usage is not None:
            self._usage = parsed.usage

    def finish(self) -> None:
        """The answer ended: the endpoint's account closes and the fleet learns from it."""
        if not self.open:
            return
        self.open = False
        entry = self.entry
        self._accounts.end(entry, self._backlog)
        if self._status >= 500:
            self._accounts.failed(entry)
        if self._status != 200:
            return  # a refusal of the client's request teaches nothing about the engine
        if self._events is not None and self._first_at is not None:
            self._learn_stream(entry)
        elif self._whole is not None:
            self._usage = _usage_of(self._whole)
            self._accounts.answered(entry)
        usage = self._usage
        if usage is not None and usage.cached_tokens is not None and self._ages:
            self._accounts.cached(entry, self._ages, usage.cached_tokens, self.features.block_tokens)

    def _learn_stream(self, entry: Entry) -> None:
        assert self._first_at is not None
        now = time.perf_counter()
        # Without a usage chunk (the client did not ask for one), each content event counts as a token,
        # as the engines stream them.
        tokens = self._usage.completion_tokens if self._usage is not None else self._pieces
        ttft_ms = (self._first_at - self._picked_at) * 1000
        tpot_ms = (now - self._first_at) * 1000 / (tokens - 1) if tokens > 1 else None
        prior = next((c.prediction.prior_ttft_ms for c in self.decision.candidates if c.backend == entry.name), None)
        self._accounts.succeeded(entry, prior if prior is not None else ttft_ms, ttft_ms, tpot_ms, tokens)

    def release(self) -> None:
        """The exchange ended before its answer did (the client or the proxy went away): the request
        is no longer in flight, and nothing is learned."""
        if self.open:
            self.open = False
            self._accounts.end(self.entry, self._backlog)
