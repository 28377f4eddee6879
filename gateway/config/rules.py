"""The ``routing:`` section: attempts, deadlines, breakers, weights, prefix blocks and rules."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gateway.config.models import Name
from gateway.config.shadow import RuleShadow
from gateway.config.splits import Arms, GuardConfig, StickyConfig, check_split
from gateway.strict import Frozen
from routing.features import RULE_HEADERS
from routing.prefix import DEFAULT_BLOCK_TOKENS


class Range(Frozen):
    min: float | None = Field(default=None, ge=0)
    """Lowest value matched (inclusive); null: no lower bound."""
    max: float | None = Field(default=None, ge=0)
    """Highest value matched (inclusive); null: no upper bound."""


class MatchConfig(Frozen):
    models: list[str] = []
    """Glob patterns of model names."""
    ttft_budget_ms: Range = Range()
    """The request's time-to-first-token budget (``x-ttft-budget-ms``) in this range; with a bound set, a
    request without the header does not match."""
    latency_budget_ms: Range = Range()
    """The request's whole-answer budget (``x-latency-budget-ms``) in this range; with a bound set, a
    request without the header does not match."""
    tenants: list[str] = []
    """Matched against the x-tenant header."""
    keys: list[str] = []
    """API key ids (gateway/tenancy); a request without a key matches no such rule."""
    teams: list[str] = []
    """Teams of API keys."""
    headers: dict[str, str] = {}
    """Exact values of x-tenant, x-priority, x-enginegate-pool or x-enginegate-class."""

    @model_validator(mode="after")
    def _known_headers(self) -> MatchConfig:
        unknown = sorted(h for h in self.headers if h.lower() not in RULE_HEADERS)
        if unknown:  # never read, the rule would silently never match
            raise ValueError(f"headers {', '.join(unknown)} cannot be matched (only {', '.join(RULE_HEADERS)})")
        if any(h != h.lower() for h in self.headers):
            raise ValueError("header names in match.headers must be lower case")
        return self


class RuleConfig(Frozen):
    name: Name
    """The rule's name, in ``x-enginegate-rule``, logs and routing explanations."""
    match: MatchConfig = MatchConfig()
    """What a request must have for this rule to apply (every condition given); empty: every request."""
    prefer: list[Name] = []
    """Backends or pools ranked ahead of the others that meet the request's budget as well."""
    avoid: list[Name] = []
    """Backends or pools ranked behind the others that meet the request's budget as well."""
    require: list[Name] = []
    """The only backends or pools the request may go to; empty: any."""
    max_attempts: int | None = Field(default=None, ge=1, le=16)
    """Backends tried per request under this rule; default: ``routing.max_attempts``."""
    hedging: bool | None = None
    """Hedging under this rule; default: ``routing.hedging``."""
    mode: Literal["best_effort", "strict"] | None = None
    """Budget mode under this rule; default: ``routing.mode``."""
    default_ttft_budget_ms: float | None = Field(default=None, gt=0)
    """Time-to-first-token budget in ms for requests under this rule that send none; default: none."""
    default_latency_budget_ms: float | None = Field(default=None, gt=0)
    """Whole-answer budget in ms for requests under this rule that send none; default: none."""
    # Shadow traffic (docs/traffic.md#shadow-traffic).
    shadow: RuleShadow | None = None
    """Mirror a share of this rule's requests to a candidate backend, pool or model: the client is
    answered by the primary only; the pair's times, tokens, finish reasons and agreement are recorded."""

    # Weighted splits and canaries (docs/traffic.md).
    split: Arms = []
    """The rule's traffic divided by weight between backends or pools (weights sum to 100), the first
    arm being the control; each caller stays on one arm (``sticky``). Empty: no split."""
    sticky: StickyConfig | None = None
    """What keeps a caller on one arm of ``split``; default: the conversation (its opening's hash)."""
    guard: GuardConfig | None = None
    """Stops a canary arm whose error or budget-miss rate exceeds the control arm's by a margin."""

    @model_validator(mode="after")
    def _split_valid(self) -> RuleConfig:
        check_split(self.split, self.sticky, self.guard, self.require)
        return self


class WeightsConfig(Frozen):
    budget: float = Field(default=1.0, ge=0)
    """Weight of meeting the request's latency budgets (the predicted time against the budget)."""
    cost: float = Field(default=0.2, ge=0)
    """Weight of the price of the capacity the request takes (``cost_per_hour`` times its predicted work)."""
    load: float | None = Field(default=None, ge=0)
    """No longer used (accepted, with a warning, so older configs load): queueing is in the predicted
    times and balance comes from ``routing.prefix.load_bound``."""
    affinity: float | None = Field(default=None, ge=0)
    """No longer used (accepted, with a warning, so older configs load): the time and GPU work a
    backend's cached prompt tokens save are in its predicted times."""


class BreakerConfig(Frozen):
    threshold: int = Field(default=5, ge=1)
    """Consecutive engine failures that open a backend's breaker."""
    cooldown_s: float = Field(default=1.0, gt=0)
    """Open this long before the first probes; doubles with each failed recovery."""
    max_cooldown_s: float = Field(default=30.0, gt=0)
    """Longest an open breaker waits before probing again, however often recovery failed."""


class PrefixConfig(Frozen):
    block_tokens: int = Field(default=DEFAULT_BLOCK_TOKENS, ge=4, le=4096)
    """Prompt blocks the prefix index keeps per backend, in tokens (cut as ``4 x block_tokens`` bytes
    of the prompt's text: the gateway tokenizes nothing for them). 64 is TensorRT-LLM's KV page and
    four of vLLM's blocks; every replica must use the same size."""
    load_bound: float = Field(default=1.25, ge=1.0, le=10.0)
    """Bounded loads: a backend whose requests in flight, this one included, would pass this multiple
    of its fair share (the fleet's in-flight requests shared by slots, rounded up; one more for the
    backend holding the conversation) ranks after those within theirs, whatever its cache holds,
    unless every backend would pass it (1: as even as whole requests allow)."""
    share: bool = False
    """Replicas tell each other where they sent each prompt's blocks, through ``redis.url``'s pub/sub,
    so a conversation whose turns reach different replicas still finds its history."""


class RoutingConfig(Frozen):
    max_attempts: int = Field(default=3, ge=1, le=16)
    """Backends tried per request before the error is the client's (failover on engine faults before
    the first byte)."""
    first_token_timeout_s: float = Field(default=60.0, gt=0)
    """A streaming engine's first content token must arrive within this, or the next backend is tried."""
    answer_timeout_s: float = Field(default=600.0, gt=0)
    """Whole answers (non-streaming requests, whose commit point is the complete answer, and engines
    that answer at once such as MII REST) must be complete within this."""
    breaker: BreakerConfig = BreakerConfig()
    """Each backend's circuit breaker: engine faults in a row take it out of routing for a while."""
    max_queue_wait_s: float = Field(default=20.0, gt=0)
    """Admission control: a request is not queued where it is predicted to wait longer than this
    (twice for positive ``x-priority``, half for negative); when no backend can take it, 503 with
    Retry-After from the predicted wait, instead of a timeout a minute later."""
    shed_over_budget: float | None = Field(default=None, gt=1)
    """Shed (503 with Retry-After) a request predicted above this multiple of its budget on every
    backend, rather than serve it late with capacity that requests still within reach need (past
    saturation this is what keeps the rest within budget; 3 in the simulator). Off when unset."""
    mode: Literal["best_effort", "strict"] = "best_effort"
    """strict: a request no backend can serve within its budget gets 429 with Retry-After."""
    hedging: bool = False
    """With a time-to-first-token budget: when the first token is late against it, the request is also
    sent to the next backend and the first to answer wins (the other is cancelled)."""
    ask_whole: bool = True
    """A client that does not stream gets its answer from an engine asked for a whole answer where the
    engine can give one (vLLM, llama-server, trtllm-serve): it and the gateway work less than for a
    stream. Such an attempt is under ``answer_timeout_s`` (no first token is seen before the end) and
    admission by queue wait applies when it is sent (an engine queueing then, or a request that may
    be hedged, is still asked for a stream). false: engines always stream, and a whole answer's
    first token is watched as a stream's is."""
    weights: WeightsConfig = WeightsConfig()
    """How backends are scored: each term in [0, 1] times its weight; the weights' sum normalizes."""
    stale_after_s: float = Field(default=15.0, gt=0)
    """Engine load older than this is ignored in favour of the gateway's own in-flight count."""
    rules: list[RuleConfig] = []
    """Routing rules, tried in order: the first whose ``match`` fits the request applies."""
    prefix: PrefixConfig = PrefixConfig()
    """The prefix index: which backend holds which prompt blocks in its KV cache."""
    drop_unsupported: bool = False
    """A request field no backend serving the model can honour is dropped (and named in the
    ``x-enginegate-dropped`` response header) instead of refused with 400."""
