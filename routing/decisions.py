"""What the routing policy answers: a ``Decision`` (why, and the candidates ranked best first, each with
its ``Prediction``). ``routing.types`` holds what it reads."""

from __future__ import annotations

import enum
from dataclasses import field

from values import value


class Reason(enum.Enum):
    MEETS_BUDGET = "meets_budget"
    """At least one backend is predicted to meet the budget; the best of those leads."""
    NO_BUDGET = "no_budget"
    """The request states no budget: fastest and cheapest weighed together."""
    BEST_EFFORT = "best_effort"
    """No backend is predicted to meet the budget; the closest leads."""
    BUDGET_UNMEETABLE = "budget_unmeetable"
    """Strict mode and no backend can meet the budget: rejected (429)."""
    NO_BACKEND_FOR_MODEL = "no_backend_for_model"
    NO_HEALTHY_BACKEND = "no_healthy_backend"
    NOTHING_FITS = "nothing_fits"
    """Backends serve the model but none holds it with this context (memory or context length)."""
    UNSUPPORTED = "unsupported"
    """No backend serving the model has every capability the request uses (a 400 naming the field)."""
    OVERLOADED = "overloaded"
    """Every backend that could serve would queue the request past the admission limit: shed (503)."""


@value(frozen=True)
class Prediction:
    ttft_ms: float
    tpot_ms: float
    e2e_ms: float
    queue_ms: float
    prior_ttft_ms: float = 0.0
    """The TTFT physics predicts before the backend's learned correction: what observations are
    compared with (the correction may change between a prediction and its observation)."""
    slots: int = 1
    """Sequences of this request's size the backend runs at once (its slots or its KV cache)."""
    cached_tokens: int = 0
    """Prompt tokens expected in the backend's prefix cache: its prefill skips them."""


@value(frozen=True)
class Candidate:
    backend: str
    score: float
    prediction: Prediction
    meets_budget: bool
    terms: dict[str, float] = field(default_factory=dict)
    """Each score term before weighting, for explanations."""
    saved_ms: float = 0.0
    """How much sooner the first token comes here for the prompt tokens expected cached."""
    saved_gpu_ms: float = 0.0
    """GPU time those cached tokens save the backend: the prefill it does not do."""
    capacity_ms: float = 0.0
    """Added to its predicted times for ranking: the GPU time it takes beyond the least costly
    candidate, scaled by how busy the fleet is (the delay that work causes the others)."""
    in_flight: int = 0
    """Requests running and waiting there before this one."""
    bound: int = 0
    """The most requests it may have in flight with this one (bounded loads)."""
    over_bound: bool = False
    """This request would take it over its bound (while another backend stays within its own)."""


@value(frozen=True)
class Decision:
    """Ranked candidates (best first), why, what was left out and the rule that shaped it."""

    reason: Reason
    candidates: tuple[Candidate, ...] = ()
    excluded: dict[str, str] = field(default_factory=dict)
    rule: str | None = None
    max_attempts: int = 3
    hedging: bool = False
    retry_after_s: float | None = None
    hedge_after_ms: float | None = None
    """With hedging on and a first-token budget: start the next candidate too when the first token is this late."""
    lacks: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """``UNSUPPORTED``: each serving backend's missing capabilities and extra fields, by name."""
    arm: str | None = None
    """The arm of the rule's weighted split the candidates come from (``routing.split``)."""
    model: str | None = None
    """Set when that arm sends the request to another model: the candidates serve this model."""
