"""The rules the config's ``routing`` section compiles to: what ``choose()`` reads besides the request and
the fleet (weights, modes, splits, per-rule budgets and limits)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Mode(enum.Enum):
    BEST_EFFORT = "best_effort"
    STRICT = "strict"


@dataclass(frozen=True, slots=True)
class Weights:
    """How scores combine: each term is in [0, 1]."""

    budget: float = 1.0
    cost: float = 0.2
    """The price of the capacity the request takes (``cost_per_hour`` times its GPU time). Load and
    cache affinity have no weight: queues and cached prefill are in the predicted times, the capacity
    a cache miss costs a busy fleet is added to them, and balance comes from ``Rules.load_bound``."""


@dataclass(frozen=True, slots=True)
class Arm:
    """One arm of a rule's weighted split: the backends or pools its requests may go to."""

    name: str
    targets: tuple[str, ...]
    """Backend names or pools: the arm restricts the candidates as ``Rule.require`` does."""
    weight: float
    """Percent of the rule's traffic (a split's weights sum to 100)."""
    model: str | None = None
    """An arm that sends its requests to another model (then ``targets`` is empty): they are routed
    and answered as that model's."""


@dataclass(frozen=True, slots=True)
class Split:
    """A rule's traffic divided by weight between arms, the first being the control."""

    arms: tuple[Arm, ...]
    sticky: str = "conversation"
    """What keeps a caller on one arm: ``conversation`` (the hash of the prompt's opening, as
    ``RequestFeatures.prefix_hash``), ``key`` (the API key's id) or ``header:<name>`` (that request
    header's value); without the key or the header, the conversation."""


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    models: tuple[str, ...] = ()
    """Glob patterns; empty matches every model."""
    ttft_budget_ms: tuple[float | None, float | None] = (None, None)
    latency_budget_ms: tuple[float | None, float | None] = (None, None)
    tenants: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    """API key ids; empty matches any request."""
    teams: tuple[str, ...] = ()
    """Teams of API keys; empty matches any request."""
    headers: tuple[tuple[str, str], ...] = ()
    prefer: tuple[str, ...] = ()
    """Backend names or pools ranked first when they qualify."""
    avoid: tuple[str, ...] = ()
    """Backend names or pools ranked last."""
    require: tuple[str, ...] = ()
    """Only these backend names or pools may serve."""
    max_attempts: int | None = None
    hedging: bool | None = None
    mode: Mode | None = None
    default_ttft_budget_ms: float | None = None
    default_latency_budget_ms: float | None = None
    split: Split | None = None
    """Weighted arms (``routing.split``): each request goes to one, chosen by a stable hash."""


@dataclass(frozen=True, slots=True)
class Rules:
    rules: tuple[Rule, ...] = ()
    max_attempts: int = 3
    mode: Mode = Mode.BEST_EFFORT
    hedging: bool = False
    weights: Weights = field(default_factory=Weights)
    max_queue_wait_ms: float = float("inf")
    """Admission control: a backend predicted to queue a request longer than this (scaled by the
    request's priority) does not take it; when none can, the request is shed with Retry-After."""
    shed_ratio: float = float("inf")
    """Shedding what cannot be saved: a request predicted above this multiple of its budget on every
    backend (the home's slack included) is shed with Retry-After (``Reason.OVERLOADED``) instead of
    taking capacity from requests that can still meet theirs (``routing.shed_over_budget``)."""
    load_bound: float = 1.25
    """Bounded loads: no backend takes more than this multiple of its fair share (by slots) of the
    requests in flight unless every one would (``routing.prefix.load_bound``)."""
    splits: bool = field(init=False, default=False)
    """Some rule splits its traffic (``Rule.split``): without, routing skips the arm choice."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "splits", any(r.split is not None for r in self.rules))
