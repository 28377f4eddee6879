"""Weighted splits as the gateway runs them: per-arm metrics, so a dashboard compares a canary with
its control, and the canary guard's counts and verdicts (``routing.split.verdict``).

The guard counts since the config was loaded: a reload (``POST /admin/reload``, SIGHUP) starts
every split's counts afresh and resumes stopped arms, which is how an operator lets a fixed canary
back in. Each gateway process counts and judges its own traffic.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from backends.base import Usage
from gateway.config import RuleConfig
from gateway.telemetry.metrics import LATENCY_BUCKETS, TOKEN_TIME_BUCKETS, _Children
from routing.decisions import Decision
from routing.split import ArmCounts, Guard, verdict
from routing.types import BackendProfile, RequestFeatures

log = logging.getLogger("enginegate.split")


@dataclass(frozen=True, slots=True)
class ArmEnd:
    """How one request routed to an arm ended."""

    rule: str
    arm: str
    outcome: str
    """ok, error or cancelled (``enginegate_requests_total``'s outcomes)."""
    failed: bool
    """The arm's engines failed it (every attempt, or its stream after the first byte): what the
    guard's error rate counts. Refusals before any engine was tried are not the arm's errors."""
    budget_met: bool | None = None
    """For an answer to a request with a latency budget: whether it met it."""
    ttft_s: float | None = None
    tpot_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    """The capacity the answer took: its backend's ``cost_per_hour`` over its time there, per slot."""


@dataclass
class _Split:
    """One rule's split since the config was loaded."""

    arms: dict[str, str]
    """Arm name -> what it sends to (backend or pool), in config order: the first is the control."""
    weights: dict[str, float]
    guard: Guard | None
    counts: dict[str, ArmCounts] = field(default_factory=dict)
    stopped: dict[str, str] = field(default_factory=dict)
    """Arm -> why the guard stopped it."""


class Splits:
    """Every rule's split: the per-arm series, the guard's counts and the arms it stopped."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        labels = ["rule", "arm"]
        self._requests = _Children(Counter(
            "enginegate_split_requests", "Requests by rule, split arm and outcome (ok, error, cancelled).",
            [*labels, "outcome"], registry=r,
        ))  # fmt: skip
        self._errors = _Children(Counter(
            "enginegate_split_errors", "Requests the arm's engines failed (what the canary guard's error rate counts).",
            labels, registry=r,
        ))  # fmt: skip
        self._ttft = _Children(Histogram(
            "enginegate_split_time_to_first_token_seconds", "Time to first token of the arm's answers.",
            labels, buckets=LATENCY_BUCKETS, registry=r,
        ))  # fmt: skip
        self._tpot = _Children(Histogram(
            "enginegate_split_time_per_output_token_seconds", "Mean time between output tokens of the arm's answers.",
            labels, buckets=TOKEN_TIME_BUCKETS, registry=r,
        ))  # fmt: skip
        self._budgets = _Children(Counter(
            "enginegate_split_budgets", "Answers to requests with a latency budget, by result (met, missed).",
            [*labels, "result"], registry=r,
        ))  # fmt: skip
        self._tokens = _Children(Counter(
            "enginegate_split_tokens", "Tokens of the arm's answers by kind (prompt, completion).",
            [*labels, "kind"], registry=r,
        ))  # fmt: skip
        self._cost = _Children(Counter(
            "enginegate_split_cost_dollars",
            "Capacity cost of the arm's answers (backend cost_per_hour over their time, per slot): over "
            "enginegate_split_tokens_total times a million, the cost per million tokens.",
            labels, registry=r,
        ))  # fmt: skip
        self._stopped = Gauge(
            "enginegate_split_arm_stopped", "1 while the canary guard keeps the arm out of its split.",
            labels, registry=r, multiprocess_mode="max",
        )  # fmt: skip
        self._splits: dict[str, _Split] = {}
        self.stopped: frozenset[tuple[str, str]] = frozenset()
        """(rule, arm) pairs the guard stopped: routing sends their requests to the other arms."""
        self.sticky_headers: tuple[str, ...] = ()
        """Headers a split keeps callers on one arm by: routing needs their values."""

    def configure(self, rules: Sequence[RuleConfig]) -> None:
        """A config was loaded: counts start afresh, stopped arms resume."""
        for name, old in self._splits.items():  # arms a new config may have retired
            for arm in old.arms:
                with contextlib.suppress(KeyError):
                    self._stopped.remove(name, arm)
        self._splits = {}
        for rc in rules:
            if not rc.split:
                continue
            g = rc.guard
            guard = Guard(g.max_error_rate_delta, g.max_budget_miss_delta, g.min_requests) if g is not None else None
            arms = {a.label: a.to for a in rc.split}
            self._splits[rc.name] = _Split(arms, {a.label: a.weight for a in rc.split}, guard)
            for arm in arms:
                self._stopped.labels(rc.name, arm).set(0)
        self.stopped = frozenset()
        headers = {rc.sticky.header for rc in rules if rc.split and rc.sticky is not None and rc.sticky.header}
        self.sticky_headers = tuple(sorted(h for h in headers if h is not None))

    def ended(self, end: ArmEnd) -> None:
        """Count one request's end on its arm, and judge the arm."""
        rule, arm = end.rule, end.arm
        self._requests(rule, arm, end.outcome).inc()
        if end.failed:
            self._errors(rule, arm).inc()
        if end.ttft_s is not None:
            self._ttft(rule, arm).observe(end.ttft_s)
        if end.tpot_s is not None:
            self._tpot(rule, arm).observe(end.tpot_s)
        if end.budget_met is not None:
            self._budgets(rule, arm, "met" if end.budget_met else "missed").inc()
        if end.prompt_tokens or end.completion_tokens:
            self._tokens(rule, arm, "prompt").inc(end.prompt_tokens)
            self._tokens(rule, arm, "completion").inc(end.completion_tokens)
        if end.cost_usd:
            self._cost(rule, arm).inc(end.cost_usd)
        split = self._splits.get(rule)
        if split is None or arm not in split.arms or end.outcome == "cancelled":
            return  # a request of the config before a reload, or one that tells nothing
        if end.outcome == "error" and not end.failed:
            return  # refused before any engine was tried: not the arm's doing
        c = split.counts.get(arm, ArmCounts())
        split.counts[arm] = replace(
            c, requests=c.requests + 1, errors=c.errors + end.failed,
            budgeted=c.budgeted + (end.budget_met is not None), missed=c.missed + (end.budget_met is False),
        )  # fmt: skip
        self._judge(rule, split, arm)

    def _judge(self, rule: str, split: _Split, arm: str) -> None:
        control = next(iter(split.arms))
        if split.guard is None or arm in split.stopped:
            return
        # A request on the control moves every canary's comparison; one on a canary moves its own.
        for canary in [a for a in split.arms if a != control] if arm == control else [arm]:
            if canary in split.stopped:
                continue
            why = verdict(split.guard, split.counts.get(control, ArmCounts()), split.counts.get(canary, ArmCounts()))
            if why is None:
                continue
            split.stopped[canary] = why
            self.stopped = self.stopped | {(rule, canary)}
            self._stopped.labels(rule, canary).set(1)
            log.warning(
                "canary arm stopped: its traffic goes to the other arms until the next reload",
                extra={"rule": rule, "arm": canary, "control": control, "reason": why},
            )

    def describe(self) -> dict[str, Any]:
        """Every split's arms with their weights, counts and state (``GET /admin/splits``)."""
        doc: dict[str, Any] = {}
        for rule, split in self._splits.items():
            arms = []
            for arm, to in split.arms.items():
                c = split.counts.get(arm, ArmCounts())
                arms.append({
                    "arm": arm, "to": to, "weight": split.weights[arm], "requests": c.requests, "errors": c.errors,
                    "error_rate": round(c.error_rate(), 6), "budgeted": c.budgeted, "budget_missed": c.missed,
                    "budget_miss_rate": round(c.miss_rate(), 6), "stopped": arm in split.stopped,
                    "reason": split.stopped.get(arm),
                })  # fmt: skip
            doc[rule] = {"control": next(iter(split.arms)), "guarded": split.guard is not None, "arms": arms}
        return doc


def arm_end(
    decision: Decision,
    budgets: RequestFeatures,
    profile: BackendProfile | None,
    outcome: str,
    failed: bool,
    times: tuple[float, float, float | None],
    usage: Usage | None,
) -> ArmEnd:
    """How a request ended on its arm of a weighted split: its times (end to end, to the first token,
    per output token; seconds), tokens, capacity cost and budgets. ``profile``: the backend that
    answered, None when none did; ``budgets``: the request's features with its rule's default budgets."""
    assert decision.rule is not None and decision.arm is not None
    rule, arm, f = decision.rule, decision.arm, budgets
    if profile is None or outcome != "ok":
        return ArmEnd(rule, arm, outcome, failed)
    elapsed_s, ttft_s, tpot_s = times
    met = None
    if f.budgeted:
        met = (
            (f.ttft_budget_ms is None or ttft_s * 1000 <= f.ttft_budget_ms)
            and (f.latency_budget_ms is None or elapsed_s * 1000 <= f.latency_budget_ms)
            and (f.tpot_budget_ms is None or tpot_s is None or tpot_s * 1000 <= f.tpot_budget_ms)
        )
    # One of the backend's slots for the request's time (arrival to last token: an upper bound).
    cost = profile.cost_per_hour * elapsed_s / 3600 / max(1, profile.max_concurrency)
    return ArmEnd(
        rule, arm, outcome, failed, met, ttft_s, tpot_s,
        usage.prompt_tokens if usage else 0, usage.completion_tokens if usage else 0, cost,
    )  # fmt: skip
