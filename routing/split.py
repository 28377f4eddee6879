"""Weighted splits and canaries: which arm of a rule's split a request goes to, and when a canary
arm should stop. Pure and synchronous, as ``choose()`` is.

An arm is chosen by a stable hash (BLAKE2b, the same in every process and replica; Python's
``hash`` of a string is salted per process) of the rule's name and the request's sticky value: its
conversation's opening, its API key or a header. The hash is a point in [0, 100); arms hold
consecutive ranges of it in config order, as wide as their weights, so one conversation or user
always lands on the same arm, and raising the last arm's weight keeps every caller it had.

Within its arm a request is routed as under ``require:``: budgets, breakers, capabilities and load
choose among the arm's backends. An arm may name another model instead: its requests are routed as
that model's (its backends, its rules) and answered in its name (``Decision.model``).
When the arm has no candidate (every backend down, full or
lacking what the request needs), or the guard stopped it, the request goes to the other arms in
config order, the control (first) arm first: a canary's outage never becomes the client's error.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

from routing.decisions import Decision
from routing.policy import choose, matches
from routing.rules import Arm, Rule, Rules
from routing.types import FleetSnapshot, RequestFeatures

SCALE = 100.0
"""A split's weights sum to this."""


def point(rule: str, sticky: str) -> float:
    """Where a sticky value falls in [0, ``SCALE``) for ``rule``: the same in every process."""
    digest = hashlib.blake2b(f"{rule}\x00{sticky}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 * SCALE


def sticky_value(rule: Rule, f: RequestFeatures) -> str:
    """What keeps this request's caller on one arm (see ``Split.sticky``)."""
    how = rule.split.sticky if rule.split is not None else "conversation"
    if how == "key" and f.key is not None:
        return f"key:{f.key}"
    if how.startswith("header:"):
        name = how.removeprefix("header:")
        value = next((v for h, v in f.headers if h == name), None)
        if value is not None:
            return f"header:{value}"
    return f"conversation:{f.prefix_hash}"


def arm_at(arms: tuple[Arm, ...], at: float) -> Arm:
    """The arm whose range holds ``at`` (arms in order, ranges as wide as their weights)."""
    edge = 0.0
    for arm in arms:
        edge += arm.weight
        if at < edge:
            return arm
    return arms[-1]  # rounding of weights that sum to 100 within a hair


def arm_order(rule: Rule, f: RequestFeatures, stopped: frozenset[tuple[str, str]] = frozenset()) -> list[Arm]:
    """The arms this request tries, in order: its own (unless stopped), then the others in config
    order, the control first. The control is never stopped, so the list is never empty."""
    assert rule.split is not None
    arms = rule.split.arms
    own = arm_at(arms, point(rule.name, sticky_value(rule, f)))
    order = [own] if (rule.name, own.name) not in stopped else []
    order += [a for a in arms if a is not own and (rule.name, a.name) not in stopped]
    return order


def route(
    f: RequestFeatures, snapshot: FleetSnapshot, rules: Rules, stopped: frozenset[tuple[str, str]] = frozenset()
) -> Decision:
    """``choose()``, within the arm of the matched rule's split when it has one (``Decision.arm``).
    ``stopped``: (rule, arm) pairs the canary guard took out of the split."""
    if not rules.splits:
        return choose(f, snapshot, rules)
    rule = next((r for r in rules.rules if matches(r, f)), None)
    if rule is None or rule.split is None:
        return choose(f, snapshot, rules)
    first: Decision | None = None
    for arm in arm_order(rule, f, stopped):
        if arm.model is not None:  # another model: its backends and rules; the split's rule and arm kept
            other = choose(replace(f, model=arm.model), snapshot, rules)
            decision = replace(other, rule=rule.name, arm=arm.name, model=arm.model)
        else:
            armed = replace(rule, require=arm.targets)
            within = replace(rules, rules=tuple(armed if r is rule else r for r in rules.rules))
            decision = replace(choose(f, snapshot, within), arm=arm.name)
        if decision.candidates:
            return decision
        first = first or decision
    assert first is not None
    return first


@dataclass(frozen=True, slots=True)
class ArmCounts:
    """What one arm's requests did since the split was loaded."""

    requests: int = 0
    """Requests that ended with an answer or an error (cancelled ones are not counted)."""
    errors: int = 0
    """Of those, the ones that failed on the gateway's or the engine's side (not 4xx)."""
    budgeted: int = 0
    """Answers to requests with a latency budget."""
    missed: int = 0
    """Of those, the ones that missed it."""

    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def miss_rate(self) -> float:
        return self.missed / self.budgeted if self.budgeted else 0.0


@dataclass(frozen=True, slots=True)
class Guard:
    """When a canary arm stops: its error rate or budget-miss rate above the control's by more than
    the margin, once both arms have ``min_requests`` (budget misses: ``min_requests`` budgeted answers)."""

    max_error_rate_delta: float | None = None
    max_budget_miss_delta: float | None = None
    min_requests: int = 100


def verdict(guard: Guard, control: ArmCounts, arm: ArmCounts) -> str | None:
    """Why ``arm`` should stop against ``control``, or None while it may go on."""
    checks = (
        ("error rate", guard.max_error_rate_delta, "requests", control.requests, arm.requests,
         control.error_rate(), arm.error_rate()),
        ("budget-miss rate", guard.max_budget_miss_delta, "budgeted answers", control.budgeted, arm.budgeted,
         control.miss_rate(), arm.miss_rate()),
    )  # fmt: skip
    for what, delta, unit, base_n, n, base, rate in checks:
        if delta is not None and min(base_n, n) >= guard.min_requests and rate - base > delta:
            return (
                f"{what} {rate:.3f} against the control's {base:.3f} (over {n} and {base_n} {unit}) "
                f"exceeds the margin {delta}"
            )
    return None
