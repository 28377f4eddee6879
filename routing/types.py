"""Plain data the routing policy works on: no I/O, no engine objects, no gateway imports."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    model: str
    prompt_tokens: int
    """Estimated from the text unless the model's tokenizer was at hand."""
    max_tokens: int | None
    stream: bool = False
    latency_budget_ms: float | None = None
    ttft_budget_ms: float | None = None
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class BackendState:
    """One backend as routing sees it: what it serves and how it is doing right now."""

    name: str
    models: frozenset[str]
    healthy: bool
    running: int = 0
    waiting: int = 0


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    backends: tuple[BackendState, ...]


@dataclass(frozen=True, slots=True)
class Rules:
    max_attempts: int = 3


class Reason(enum.Enum):
    FIRST_HEALTHY = "first_healthy"
    NO_BACKEND_FOR_MODEL = "no_backend_for_model"
    NO_HEALTHY_BACKEND = "no_healthy_backend"


@dataclass(frozen=True, slots=True)
class Candidate:
    backend: str
    score: float


@dataclass(frozen=True, slots=True)
class Decision:
    """Ranked candidates (best first), why, and what was left out."""

    reason: Reason
    candidates: tuple[Candidate, ...] = ()
    excluded: dict[str, str] = field(default_factory=dict)
