"""One request pair of shadow traffic as a record: each side's times, tokens, finish reason and cost,
and whether their texts agree. Pure functions; ``gateway.pipeline.shadow`` measures, this writes down.

Agreement: a greedy request (temperature 0) is deterministic on both engines, so its answers agree
only when their texts are equal. A sampled one is compared by the Jaccard similarity of the two
answers' sets of words (whitespace-separated, over their first ``COMPARED_CHARS`` characters):
linear in the text, cheap enough for the event loop, and 1.0 for equal texts; they agree when it
reaches ``shadow.similarity_threshold``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

COMPARED_CHARS = 65_536
"""Characters of each answer kept and compared."""


@dataclass(frozen=True, slots=True)
class Side:
    """How one side of a pair went, times from the moment both were sent."""

    backend: str
    model: str
    outcome: str
    """ok, error (the engine or the gateway failed it) or cancelled (the client left: the primary only)."""
    ttft_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    text: str = ""
    cost_usd: float | None = None
    """The backend's ``cost_per_hour`` for the answer's end-to-end time, divided by the sequences it runs
    at once (routing's prediction of its slots for this request): the request's share of the capacity."""
    error: str | None = None
    """The error kind, when it failed."""

    @property
    def tpot_s(self) -> float | None:
        n = self.completion_tokens
        if self.ttft_s is None or self.e2e_s is None or n is None or n < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (n - 1)

    def doc(self, stream: bool = True) -> dict[str, Any]:
        """As a record's side. A whole answer (not streamed) has no TPOT: the engine sent it at once."""
        return {
            "backend": self.backend,
            "model": self.model,
            "outcome": self.outcome,
            "error": self.error,
            "ttft_ms": _ms(self.ttft_s),
            "tpot_ms": _ms(self.tpot_s) if stream else None,
            "e2e_ms": _ms(self.e2e_s),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "finish_reason": self.finish_reason,
            "cost_usd": self.cost_usd,
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def capacity_cost(cost_per_hour: float, e2e_s: float | None, slots: int) -> float | None:
    """A request's share of its backend's hourly price (``Side.cost_usd``)."""
    if e2e_s is None:
        return None
    return cost_per_hour * e2e_s / 3600 / max(1, slots)


def similarity(a: str, b: str, greedy: bool) -> tuple[str, float]:
    """(the method, a score in [0, 1]): exact equality for greedy answers, else word-set Jaccard."""
    if greedy:
        return "exact", 1.0 if a == b else 0.0
    wa, wb = set(a[:COMPARED_CHARS].split()), set(b[:COMPARED_CHARS].split())
    union = wa | wb
    return "jaccard", len(wa & wb) / len(union) if union else 1.0


@dataclass(frozen=True, slots=True)
class PairInfo:
    """What is known of a pair when it is mirrored: the request's side of the record."""

    request_id: str
    rule: str
    candidate: str
    """The rule's ``shadow.to``."""
    model: str
    greedy: bool
    stream: bool
    ttft_budget_ms: float | None
    latency_budget_ms: float | None
    tpot_budget_ms: float | None


def comparison(
    info: PairInfo, primary: Side, shadow: Side, threshold: float, prompt: Any = None, texts: bool = False
) -> dict[str, Any]:
    """The pair's record (one JSON line). The texts are compared here and kept only with ``texts``."""
    agreement: dict[str, Any] | None = None
    if primary.outcome == "ok" and shadow.outcome == "ok":
        method, score = similarity(primary.text, shadow.text, info.greedy)
        agreement = {"method": method, "score": round(score, 4), "agree": score >= (1.0 if info.greedy else threshold)}
    doc: dict[str, Any] = {
        "ts": round(time.time(), 3),
        "request_id": info.request_id,
        "rule": info.rule,
        "candidate": info.candidate,
        "model": info.model,
        "greedy": info.greedy,
        "stream": info.stream,
        "budget": {
            "ttft_ms": info.ttft_budget_ms,
            "latency_ms": info.latency_budget_ms,
            "tpot_ms": info.tpot_budget_ms,
        },
        "primary": primary.doc(info.stream),
        "shadow": shadow.doc(info.stream),
        "agreement": agreement,
    }
    if texts:
        doc["texts"] = {"prompt": prompt, "primary": primary.text, "shadow": shadow.text}
    return doc
