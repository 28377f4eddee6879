"""Routing a request under weighted splits (``routing.split``): the header values splits keep callers
on one arm by, the arms the canary guard stopped, and the budgets an arm's answers are judged by."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from gateway.telemetry.arms import Splits
from routing.decisions import Decision
from routing.policy import with_rule_defaults
from routing.rules import Rules
from routing.split import route
from routing.types import FleetSnapshot, RequestFeatures


def routed(
    splits: Splits, rules: Rules, f: RequestFeatures, snapshot: FleetSnapshot, headers: Mapping[str, str]
) -> tuple[Decision, RequestFeatures | None]:
    """The decision, and when a split chose its arm, the request's features with its rule's default
    budgets (what the arm's budgets met count)."""
    if not rules.splits:
        return route(f, snapshot, rules), None
    if splits.sticky_headers:
        f = replace(f, headers=f.headers + tuple((h, headers[h]) for h in splits.sticky_headers if h in headers))
    decision = route(f, snapshot, rules, splits.stopped)
    if decision.arm is None:
        return decision, None
    rule = next(r for r in rules.rules if r.name == decision.rule)  # a split rule's name is its own
    return decision, with_rule_defaults(f, rule)
