"""Generation work: a chat, completion, Responses or Messages request as the pipeline carries it
(``gateway.pipeline.serve`` runs it): its prompt measured for routing, generated on each target with
the gateway's per-backend shaping, and asked whole of engines that can answer whole when nothing of
the answer is needed before its end.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from backends.base import BackendError, Chunk, EngineClock, GenerationRequest, Usage
from backends.capabilities import needs
from gateway.config import LimitsConfig
from gateway.fleet.accounting import note_context
from gateway.fleet.entry import Entry
from gateway.http.errors import ApiError
from gateway.http.exchange import Exchange
from gateway.pipeline.fields import check_extras, drop_unsupported
from gateway.pipeline.refusals import no_candidates
from gateway.pipeline.restreams import Recount
from gateway.pipeline.shaping import open_answer, open_sized, prompt_bound, resized
from gateway.pipeline.surfaces import Answer, Asked, Surface
from routing.decisions import Decision
from routing.features import features
from routing.types import FleetSnapshot, RequestFeatures

if TYPE_CHECKING:
    from gateway.state import AppState, Runtime
    from gateway.telemetry.tracing import RequestTrace


LEARNING = 8
"""Answers a backend's estimate learns from (streamed ones) before whole answers are asked whole there."""
STREAM_EVERY = 16
"""After that, one whole answer in this many is still streamed: a whole answer shows no time to first
token and no pace, and the estimator keeps learning both from these (and from the clients' streams)."""
SAMPLE_EVERY_S = 1.0
"""And at most one a second per backend: a sample a second keeps the estimate current (its running
averages weigh a new observation 0.2), and at a high rate one streamed answer in 16 cost the gateway
and the engine a stream's work on 6% of the whole answers (about 3% of the gateway's CPU per whole
answer at 64 clients, and the engine's per-token work on each)."""


def needs_first(state: AppState, always: bool, clock: Callable[[], float] = time.monotonic) -> Callable[[Entry], bool]:
    """Whether an attempt of a whole answer needs its first token before the end, so that its engine
    is asked for a stream: ``always`` (hedging starts another target when a first token is late; or
    ``routing.ask_whole`` is off); on an engine that is queueing, which admission control gives up
    on when the request's first token is late (neither can tell from an answer that arrives whole);
    and for the estimator (``LEARNING``, then ``STREAM_EVERY`` and ``SAMPLE_EVERY_S``). Any other
    attempt is asked whole: the engine works less, and so does the gateway."""
    if always:
        return _always
    queue_wait_s = state.fleet.queue_wait_s

    def needs(target: Entry) -> bool:
        if target.observed.samples < LEARNING or queue_wait_s(target) is not None:
            return True
        target.whole_asks += 1
        if target.whole_asks < STREAM_EVERY:
            return False
        now = clock()
        if now - target.sampled_at < SAMPLE_EVERY_S:
            return False
        target.whole_asks, target.sampled_at = 0, now
        return True

    return needs


def _always(target: Entry) -> bool:
    return True


def prompt_texts(req: GenerationRequest) -> list[str]:
    """The texts of a request's prompt, as routing measures and matches them."""
    if req.messages is None:
        return [req.prompt or ""]
    texts = []
    for m in req.messages:
        content = m["content"]
        texts.append(content if isinstance(content, str) else "".join(p.get("text", "") for p in content))
        for call in m.get("tool_calls") or ():
            texts.append(call["function"]["arguments"])
    return texts


@dataclass(frozen=True, slots=True)
class Generating:
    """A generation ``Surface`` as the pipeline's door: its requests are ``Generation`` work."""

    surface: Surface

    @property
    def route(self) -> str:
        return self.surface.route

    def understood(self, data: Any, rt: Runtime, request_id: str) -> Generation:
        return Generation(self.surface, self.surface.asked(data, rt.config.limits, request_id), request_id, rt)

    def error_body(self, error: ApiError) -> bytes:
        return self.surface.error_body(error)


class Generation:
    """A generation request (chat, completions, Responses, Messages) as the pipeline carries it: its
    prompt measured for routing, generated on each target with the gateway's shaping for that backend."""

    def __init__(self, surface: Surface, asked: Asked, request_id: str, rt: Runtime) -> None:
        self._surface, self._asked, self._request_id = surface, asked, request_id
        gen = asked.gen
        if gen.stream != asked.stream or gen.whole == asked.stream:  # a door that builds its request without
            gen = replace(gen, stream=asked.stream, whole=not asked.stream)  # the client's choice (a copy)
        self.gen = gen
        self.model = self.gen.model
        self.stream = asked.stream
        self.events: Answer | None = surface.answer(asked, request_id) if asked.stream else None
        self.caller = asked.caller
        self.clock: EngineClock = self.gen.clock  # shared by every copy of the request
        self.wanted: dict[str, str] = {}
        self.extras: frozenset[str] = frozenset()
        self.exact: int | None = None
        self.cap = rt.config.limits.max_tokens
        self.model_context = 0
        self.prompt_tokens = 0
        self.recount: Recount | None = None
        self.bound = 0
        self.trace: RequestTrace | None = None
        self.needs_first: Callable[[Entry], bool] | None = None
        """Set by dispatch for a whole answer: whether an attempt on a target needs the answer's first
        token before its end (hedging, admission by queue wait); the engine then streams it."""
        self.chosen_whole: set[str] = set()
        """Targets asked for a whole answer that would have streamed it: their time to it is no time to
        first token (a whole-only engine's is: it is when the client's first byte can leave)."""
        self._streamed: set[str] = set()
        """Targets whose attempts are asked for a stream although the answer is taken whole."""

    async def features(
        self, ex: Exchange, rt: Runtime, snapshot: FleetSnapshot, headers: Mapping[str, str]
    ) -> RequestFeatures:
        gen = self.gen
        wanted = needs(gen)
        extras = frozenset(gen.extra)
        if (wanted or extras) and rt.config.routing.drop_unsupported:
            gen, wanted, extras = drop_unsupported(ex, gen, wanted, extras, snapshot)
        self.gen, self.wanted, self.extras = gen, wanted, extras
        check_extras(gen)
        if self.trace is not None:
            self.trace.asked(gen)
        exact, token_ids = await rt.measure(gen, snapshot)
        feats = features(
            gen.model,
            prompt_texts(gen),
            gen.max_tokens,
            self.stream,
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
        spec = snapshot.models.get(gen.model)  # the model's figures as this request's snapshot has them
        self.exact, self.prompt_tokens = exact, feats.prompt_tokens
        self.bound = prompt_bound(gen, exact)  # the prompt as the engine will count it, erring long
        self.model_context = spec.context if spec is not None else 0  # a model with candidates has its figures
        counter = rt.counters.get(gen.model)
        self.recount = Recount(exact, counter.count_text) if counter is not None else None
        return feats

    def admission(self, limits: LimitsConfig) -> tuple[int, int | None]:
        gen = self.gen
        return limits.max_tokens, None if self.exact is not None else len(gen.messages or ((),))  # messages: rough

    def admitted(self, features: RequestFeatures) -> None:
        if self.gen.max_tokens is None and features.max_tokens is not None:  # the key's token limit bounds the answer
            self.gen = replace(self.gen, max_tokens=features.max_tokens)

    def refusal(self, decision: Decision) -> ApiError:
        return no_candidates(decision, self.model, self.wanted, self.extras)

    def _attempted(self, target: Entry) -> GenerationRequest:
        """The request as an attempt on ``target`` sends it: streamed by the engine where the attempt
        needs its first token (``at_once`` decided it)."""
        return replace(self.gen, whole=False) if target.name in self._streamed else self.gen

    def open_at(self, target: Entry) -> AsyncIterator[Chunk]:
        request = self._attempted(target)
        if self.trace is not None:  # the attempt's span context goes to the engine
            request = replace(request, headers=self.trace.outgoing(target.name))
        if request.max_tokens is not None:  # the client's: the engine's word on it is the client's answer
            return open_answer(target.backend, target.capabilities, request, self.recount)
        context = target.context(self.model_context)
        return open_sized(target.backend, target.capabilities, request, self.cap, context, self.bound, self.recount)

    def reopen(self, target: Entry, error: BackendError) -> AsyncIterator[Chunk] | None:
        """The engine refused the answer length the gateway chose (``open_sized``) as too long: once more,
        sized to what its refusal says is left; the fleet keeps the limit it named."""
        if self.gen.max_tokens is not None:
            return None
        learned = partial(note_context, target, published=False, model_context=self.model_context)
        context = target.context(self.model_context)
        gen = self._attempted(target)
        gen = gen if self.trace is None else replace(gen, headers=self.trace.outgoing(target.name))
        request = resized(gen, self.cap, context, self.bound, error, learned)
        return None if request is None else open_answer(target.backend, target.capabilities, request, self.recount)

    def serve_as(self, model: str) -> None:
        """A fallback (``gateway.pipeline.fallback``): the same request to ``model``, answered in its name."""
        self._asked = replace(self._asked, gen=replace(self._asked.gen, model=model))
        self.gen = replace(self.gen, model=model)
        self.model = model
        if self.events is not None:
            self.events = self._surface.answer(self._asked, self._request_id)

    def at_once(self, target: Entry) -> bool:
        whole = target.whole
        if whole is None:
            return False
        asked_whole = self.gen.whole
        if asked_whole and self.needs_first is not None and self.needs_first(target):
            self._streamed.add(target.name)
            asked_whole = False
        at_once = whole.answers_whole(self.gen, whole=asked_whole)
        if at_once and asked_whole and not whole.answers_whole(self.gen, whole=False):
            self.chosen_whole.add(target.name)
        return at_once

    def whole(self, chunks: list[Chunk]) -> tuple[dict[str, Any], Usage | None]:
        return self._surface.answer(self._asked, self._request_id).whole(chunks)
