"""Per-team Prometheus counters (bounded: teams past the limit count as ``other``) and limiter health."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

OTHER_TEAM = "other"


class TenancyMetrics:
    def __init__(self, registry: CollectorRegistry, team_limit: int) -> None:
        self._limit = team_limit
        self._teams: set[str] = set()
        self._tokens = Counter(
            "enginegate_team_tokens", "Tokens used by keys of each team (kind: prompt, completion, cached).",
            ["team", "kind"], registry=registry,
        )  # fmt: skip
        self._spend = Counter(
            "enginegate_team_spend_usd", "Dollars charged to keys of each team, at the models' prices.", ["team"],
            registry=registry,
        )  # fmt: skip
        self._requests = Counter(
            "enginegate_team_requests", "Requests of each team's keys admitted by the limiter.", ["team"],
            registry=registry,
        )  # fmt: skip
        self._refusals = Counter(
            "enginegate_auth_refusals",
            "Requests refused by tenancy: invalid_key, store_down, model_not_allowed, requests, tokens,"
            " too_large (400), concurrency, quota, limiter_down, budget_store_down, fair_share.",
            ["reason"], registry=registry,
        )  # fmt: skip
        self._fallbacks = Counter(
            "enginegate_ratelimit_fallbacks",
            "Limiter calls made without Redis (admit: decided by this process's counters or refused; settle: kept"
            " for Redis; write_back: a try to write back what this process counted alone, failed).",
            ["op"], registry=registry,
        )  # fmt: skip

    def team(self, name: str) -> str:
        """The label of a team: its name while fewer than the limit have one, else ``other``."""
        if name in self._teams:
            return name
        if len(self._teams) < self._limit:
            self._teams.add(name)
            return name
        return OTHER_TEAM

    def admitted(self, team: str) -> None:
        self._requests.labels(self.team(team)).inc()

    def used(self, team: str, prompt: int, completion: int, cached: int, cost_usd: float) -> None:
        label = self.team(team)
        self._tokens.labels(label, "prompt").inc(prompt)
        self._tokens.labels(label, "completion").inc(completion)
        if cached:
            self._tokens.labels(label, "cached").inc(cached)
        if cost_usd:
            self._spend.labels(label).inc(cost_usd)

    def refused(self, reason: str) -> None:
        self._refusals.labels(reason).inc()

    def fallback(self, op: str) -> None:
        self._fallbacks.labels(op).inc()
