"""One backend of the running fleet: its config, adapter and profile, and what the gateway knows of
it now (health, load, observed latencies, breaker, in-flight requests, the prompt blocks it holds)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from backends.base import Backend, Health, Load, WholeAnswers
from backends.capabilities import PLAIN, Capabilities
from gateway.config import BackendConfig
from gateway.fleet.breaker import CircuitBreaker
from routing.kv_exact import ExactIndex
from routing.prefix import PrefixIndex
from routing.types import BackendProfile, Observed

if TYPE_CHECKING:
    from gateway.fleet.kv_events import KvEventSubscriber


@dataclass
class Entry:
    config: BackendConfig
    backend: Backend
    profile: BackendProfile
    health: Health = field(default_factory=lambda: Health(ok=False, detail="not polled yet"))
    probed: bool = False
    """Whether its health was probed yet (the first result is logged, healthy or not)."""
    load: Load | None = None
    load_at: float = 0.0
    observed: Observed = field(default_factory=Observed)
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    in_flight: int = 0
    """Requests this gateway has sent there and not finished (from the attempt's start)."""
    in_flight_at_poll: int = 0
    whole_asks: int = 0
    """Whole answers asked of it whole since the last one streamed for the estimator
    (``gateway.pipeline.generation.needs_first``): at least ``STREAM_EVERY``, and ``SAMPLE_EVERY_S``,
    between those, so the estimator keeps learning its times."""
    sampled_at: float = float("-inf")
    """When (``time.monotonic``) a whole answer was last streamed there for the estimator."""
    prefill_backlog: int = 0
    """Prompt tokens of those requests that have no first token yet."""
    drained: asyncio.Event | None = None
    """Set once this entry, retired by a reload, has no request left (its pool then closes)."""
    engine_slots: int | None = None
    """How many requests the engine runs at once, learned from its gauges: its running count when
    it reported requests waiting (an engine started with a lower cap than the config says)."""
    prefix: PrefixIndex | None = None
    """The prompt blocks the gateway expects the engine to hold (made with the entry's first request)."""
    capabilities: Capabilities = PLAIN
    """What the backend honours (adapter, config and model entry together): routing reads its
    ``features`` from the profile; dispatch reads how to shape the answer (``n``, tools in text)."""
    exact: ExactIndex | None = None
    """What the engine holds, from its KV-cache events (``backends[].kv_events``, vLLM)."""
    events: KvEventSubscriber | None = None
    events_task: asyncio.Task[None] | None = None
    published_context: int | None = None
    """The context the engine last published (``profile.context`` may be lower: learned from a refusal)."""

    def __post_init__(self) -> None:
        self.name = self.config.name
        """The backend's name (read about a dozen times per request: a compiled attribute, not a look-up
        in the config's pydantic model each time)."""
        self.breaker.name = self.name
        # The optional protocol checked once here: isinstance on a runtime protocol costs about 8 µs.
        self.whole: WholeAnswers | None = self.backend if isinstance(self.backend, WholeAnswers) else None
        """The backend, when it may answer a request whole at once (``WholeAnswers``)."""

    def context(self, model_context: int) -> int:
        """The most prompt plus answer tokens one request may have here: the model entry's context, or
        the engine's own when it is smaller (``profile.context``)."""
        engine = self.profile.context
        return model_context if engine is None else min(model_context, engine)
