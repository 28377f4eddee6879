"""What the routing policy answers: a ``Decision`` (why, and the candidates ranked best first, each with
its ``Prediction``). ``routing.types`` holds what it reads.

Each record writes out its ``__init__`` for mypyc, as ``routing.types`` says; hence the ``misc`` code off
here too (assigning a field of the type checker's frozen view).
"""

# mypy: disable-error-code="misc"

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

    def __init__(
        self,
        ttft_ms: float,
        tpot_ms: float,
        e2e_ms: float,
        queue_ms: float,
        prior_ttft_ms: float = 0.0,
        slots: int = 1,
        cached_tokens: int = 0,
    ) -> None:
        self.ttft_ms = ttft_ms
        self.tpot_ms = tpot_ms
        self.e2e_ms = e2e_ms
        self.queue_ms = queue_ms
        self.prior_ttft_ms = prior_ttft_ms
        self.slots = slots
        self.cached_tokens = cached_tokens


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

    def __init__(
        self,
        backend: str,
        score: float,
        prediction: Prediction,
        meets_budget: bool,
        terms: dict[str, float] | None = None,
        saved_ms: float = 0.0,
        saved_gpu_ms: float = 0.0,
        capacity_ms: float = 0.0,
        in_flight: int = 0,
        bound: int = 0,
        over_bound: bool = False,
    ) -> None:
        self.backend = backend
        self.score = score
        self.prediction = prediction
        self.meets_budget = meets_budget
        self.terms = {} if terms is None else terms
        self.saved_ms = saved_ms
        self.saved_gpu_ms = saved_gpu_ms
        self.capacity_ms = capacity_ms
        self.in_flight = in_flight
        self.bound = bound
        self.over_bound = over_bound


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

    def __init__(
        self,
        reason: Reason,
        candidates: tuple[Candidate, ...] = (),
        excluded: dict[str, str] | None = None,
        rule: str | None = None,
        max_attempts: int = 3,
        hedging: bool = False,
        retry_after_s: float | None = None,
        hedge_after_ms: float | None = None,
        lacks: dict[str, tuple[str, ...]] | None = None,
        arm: str | None = None,
        model: str | None = None,
    ) -> None:
        self.reason = reason
        self.candidates = candidates
        self.excluded = {} if excluded is None else excluded
        self.rule = rule
        self.max_attempts = max_attempts
        self.hedging = hedging
        self.retry_after_s = retry_after_s
        self.hedge_after_ms = hedge_after_ms
        self.lacks = {} if lacks is None else lacks
        self.arm = arm
        self.model = model
