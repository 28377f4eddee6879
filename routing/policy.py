"""``choose()``: the routing policy, pure and synchronous (filter, score, rank).

For now the score is the order of the config file among healthy backends that
serve the model; the routing issue replaces it with latency estimates.
"""

from __future__ import annotations

from routing.types import Candidate, Decision, FleetSnapshot, Reason, RequestFeatures, Rules


def choose(features: RequestFeatures, snapshot: FleetSnapshot, rules: Rules) -> Decision:
    serving = [b for b in snapshot.backends if features.model in b.models]
    if not serving:
        return Decision(Reason.NO_BACKEND_FOR_MODEL)
    excluded = {b.name: "unhealthy" for b in serving if not b.healthy}
    healthy = [b for b in serving if b.healthy]
    if not healthy:
        return Decision(Reason.NO_HEALTHY_BACKEND, excluded=excluded)
    n = len(healthy)
    ranked = tuple(Candidate(b.name, 1.0 - i / n) for i, b in enumerate(healthy[: rules.max_attempts]))
    return Decision(Reason.FIRST_HEALTHY, ranked, excluded)
