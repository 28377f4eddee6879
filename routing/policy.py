"""``choose()``: the routing policy, pure and synchronous: match a rule, filter, predict, score, rank.

Each candidate's predicted times hold its queue and the prefill its cached prompt tokens skip;
``routing.placement`` adds the price of the capacity it takes while the fleet is busy, scores the
budget fit and cost (terms in [0, 1]) and bounds each backend's load. Ranked: backends meeting the
budget first, then the rule's preference, then those within their load bound, then the score; the
conversation's home (where its history is, or the rendezvous home of a new one's opening, which
every gateway replica computes alike) breaks ties.
"""

from __future__ import annotations

import fnmatch
from dataclasses import replace

from routing.decisions import Candidate, Decision, Prediction, Reason
from routing.estimator import fit_problem, predict
from routing.placement import Scored, scored
from routing.rules import Mode, Rule, Rules
from routing.types import BackendState, Breaker, FleetSnapshot, ModelSpec, RequestFeatures
from values import value

DEFAULT_MAX_TOKENS = 256
"""Output length assumed for predictions when the request does not cap it."""


def priority_factor(priority: int) -> float:
    """How much of the admission limit a request may wait: twice it for positive priorities, half for
    negative ones, so low-priority requests are shed first as queues grow."""
    return 2.0 if priority > 0 else (0.5 if priority < 0 else 1.0)


def _in(value: float | None, bounds: tuple[float | None, float | None]) -> bool:
    low, high = bounds
    if low is None and high is None:
        return True
    if value is None:
        return False
    return (low is None or value >= low) and (high is None or value <= high)


def matches(rule: Rule, f: RequestFeatures) -> bool:
    headers = dict(f.headers)
    return (
        (not rule.models or any(fnmatch.fnmatchcase(f.model, m) for m in rule.models))
        and _in(f.ttft_budget_ms, rule.ttft_budget_ms)
        and _in(f.latency_budget_ms, rule.latency_budget_ms)
        and (not rule.tenants or f.tenant in rule.tenants)
        and (not rule.keys or f.key in rule.keys)
        and (not rule.teams or f.team in rule.teams)
        and all(headers.get(k) == v for k, v in rule.headers)
    )


def _named(state: BackendState, names: tuple[str, ...]) -> bool:
    return state.name in names or (state.profile.pool is not None and state.profile.pool in names)


def lacking(state: BackendState, f: RequestFeatures) -> list[str]:
    """Capabilities and extra fields the request uses that the backend lacks."""
    if not f.needs and not f.extras:
        return []
    p = state.profile
    lacks = sorted(f.needs - p.features) + sorted(f.extras - p.extras)
    if f.top_logprobs > p.max_top_logprobs and "top_logprobs" in p.features:
        lacks.append(f"top_logprobs above {p.max_top_logprobs}")
    return lacks


def _held(state: BackendState, f: RequestFeatures) -> tuple[int, int]:
    """(blocks, tokens) of the prompt's leading blocks the backend is expected to hold: exactly,
    from its KV-cache events, where it sends them and the prompt's token ids are known; else from
    the gateway's own account of what it sent there."""
    if state.exact is not None and f.token_ids:
        tokens = state.exact.cached_tokens(f.token_ids)
        return (min(len(f.prefix_blocks), int(tokens / f.block_tokens)) if f.block_tokens > 0 else 0), tokens
    blocks = state.prefix.match(f.prefix_blocks) if state.prefix is not None else 0
    return blocks, int(blocks * f.block_tokens)


def _excluded(state: BackendState, rule: Rule | None, f: RequestFeatures, model: ModelSpec, out: int) -> str | None:
    lacks = lacking(state, f)
    if lacks:
        return "lacks " + ", ".join(lacks)
    if not state.healthy:
        return "unhealthy"
    if state.breaker is Breaker.OPEN:
        return "circuit breaker open"
    if rule is not None and rule.require and not _named(state, rule.require):
        return f"rule {rule.name} requires {', '.join(rule.require)}"
    return fit_problem(model, state, f.prompt_tokens, out)


def with_rule_defaults(f: RequestFeatures, rule: Rule | None) -> RequestFeatures:
    if rule is None:
        return f
    return replace(
        f,
        ttft_budget_ms=f.ttft_budget_ms if f.ttft_budget_ms is not None else rule.default_ttft_budget_ms,
        latency_budget_ms=f.latency_budget_ms if f.latency_budget_ms is not None else rule.default_latency_budget_ms,
    )


@value(frozen=True)
class _Plan:
    """What the matched rule (or the defaults) settles for one request."""

    rule: Rule | None
    f: RequestFeatures
    """The request's features with the rule's default budgets applied."""
    max_attempts: int
    hedging: bool
    mode: Mode

    def __init__(
        self,
        rule: Rule | None,
        f: RequestFeatures,
        max_attempts: int,
        hedging: bool,
        mode: Mode,
    ) -> None:
        # Written out, compiled: the record's fields assigned once (see routing.types).
        self.rule = rule  # type: ignore[misc]
        self.f = f  # type: ignore[misc]
        self.max_attempts = max_attempts  # type: ignore[misc]
        self.hedging = hedging  # type: ignore[misc]
        self.mode = mode  # type: ignore[misc]

    @property
    def name(self) -> str | None:
        return self.rule.name if self.rule else None

    def decision(
        self,
        reason: Reason,
        excluded: dict[str, str] | None = None,
        *,
        lacks: dict[str, tuple[str, ...]] | None = None,
        retry_after_s: float | None = None,
    ) -> Decision:
        """A decision with no candidates: why, and what was excluded."""
        return Decision(
            reason, excluded=excluded or {}, rule=self.name, max_attempts=self.max_attempts,
            retry_after_s=retry_after_s, lacks=lacks or {},
        )  # fmt: skip


def choose(features: RequestFeatures, snapshot: FleetSnapshot, rules: Rules) -> Decision:
    """Match a rule, filter the backends serving the model, predict, refuse what cannot wait, score, rank."""
    plan = _plan(features, rules)
    f = plan.f
    model = snapshot.models.get(f.model)
    serving = [b for b in snapshot.backends if f.model in b.profile.models]
    if model is None or not serving:
        return plan.decision(Reason.NO_BACKEND_FOR_MODEL)
    if f.needs or f.extras:
        lacks = {s.name: tuple(lacking(s, f)) for s in serving}
        if all(lacks.values()):
            excluded_all = {backend: "lacks " + ", ".join(items) for backend, items in lacks.items()}
            return plan.decision(Reason.UNSUPPORTED, excluded_all, lacks=lacks)
    excluded, alive, probing = _filter(serving, plan, model)
    if not alive:
        # Backends lacking a capability never could serve it: the ones that could are down.
        down = all(r in ("unhealthy", "circuit breaker open") or r.startswith("lacks ") for r in excluded.values())
        return plan.decision(Reason.NO_HEALTHY_BACKEND if down else Reason.NOTHING_FITS, excluded)
    out = f.max_tokens or DEFAULT_MAX_TOKENS
    limit = rules.max_queue_wait_ms * priority_factor(f.priority)
    held = [_held(s, f) for s in alive]
    predictions = [predict(model, s, f.prompt_tokens, out, tokens) for s, (_, tokens) in zip(alive, held)]
    # Every backend's match counts for whether the conversation is new, the ones admission refuses too.
    new = max(blocks for blocks, _ in held) <= f.preamble_blocks
    admitted = [i for i, p in enumerate(predictions) if not p.queue_ms > limit]  # as _refuse_full refuses
    if len(admitted) < len(alive):
        _refuse_full(alive, predictions, excluded, limit)
        if not admitted:
            retry = max(1.0, (min(p.queue_ms for p in predictions) - limit) / 1000)  # every one was full
            return plan.decision(Reason.OVERLOADED, excluded, retry_after_s=retry)
        alive = [alive[i] for i in admitted]
        predictions = [predictions[i] for i in admitted]
        held = [held[i] for i in admitted]
    result = scored(alive, predictions, [blocks for blocks, _ in held], new, probing, f, model, rules, out)
    wait = min(p.queue_ms for p in predictions) / 1000
    if result.closest_miss > rules.shed_ratio and plan.mode is Mode.BEST_EFFORT and wait > 0:
        # Hopeless everywhere while every backend queues: served, it would only delay requests that can
        # still meet their budgets. On a fleet with a free backend it is served late as before: a budget
        # no hardware here meets is not overload, and a 503 saying so would be retried in vain.
        why = f"predicted at best {result.closest_miss:.1f}x its budget, over the shed ratio {rules.shed_ratio:g}"
        excluded.update((c.backend, why) for c in result.candidates)
        return plan.decision(Reason.OVERLOADED, excluded, retry_after_s=max(1.0, wait))
    return _decided(_ranked(result, alive, probing, plan.rule), excluded, plan)


def _ranked(result: Scored, alive: list[BackendState], probing: set[str], rule: Rule | None) -> tuple[Candidate, ...]:
    """The candidates in order: recovering ones last, then those meeting the budget, the rule's
    preference, those within their load bound, (hopeless everywhere: the cheapest), the score, the home."""
    hopeless = result.hopeless
    keys = []
    for s, c in zip(alive, result.candidates):
        preference = 0 if rule and _named(s, rule.prefer) else (2 if rule and _named(s, rule.avoid) else 1)
        keys.append((
            1 if c.backend in probing else 0, 0 if c.meets_budget else 1, preference, int(c.over_bound),
            -c.terms["cost"] if hopeless else 0.0, -c.score, -c.terms["home"],
        ))  # fmt: skip
    if len(keys) == 1:
        return (result.candidates[0],)
    order = sorted(range(len(keys)), key=keys.__getitem__)  # stable, as sorting the candidates by key
    return tuple(result.candidates[i] for i in order)


def _plan(features: RequestFeatures, rules: Rules) -> _Plan:
    rule = next((r for r in rules.rules if matches(r, features)), None)
    return _Plan(
        rule,
        with_rule_defaults(features, rule),
        (rule.max_attempts if rule and rule.max_attempts else None) or rules.max_attempts,
        rule.hedging if rule and rule.hedging is not None else rules.hedging,
        rule.mode if rule and rule.mode is not None else rules.mode,
    )


def _filter(
    serving: list[BackendState], plan: _Plan, model: ModelSpec
) -> tuple[dict[str, str], list[BackendState], set[str]]:
    """(excluded with why, the backends left, the recovering ones among them, which go last)."""
    f = plan.f
    excluded: dict[str, str] = {}
    alive: list[BackendState] = []
    probes: list[BackendState] = []
    for state in serving:
        # Without max_tokens the answer takes what the context leaves: the prompt must leave a token.
        problem = _excluded(state, plan.rule, f, model, f.max_tokens or 1)
        if problem is not None:
            excluded[state.name] = problem
        elif state.breaker is Breaker.HALF_OPEN and f.gate >= state.recovery:
            # Recovering, and this request is not in its share: still its last resort, tried only when
            # every other candidate failed (a lone recovering backend takes every request as its probe).
            probes.append(state)
        else:
            alive.append(state)
    return excluded, alive + probes, {state.name for state in probes}


def _refuse_full(
    alive: list[BackendState], predictions: list[Prediction], excluded: dict[str, str], limit: float
) -> None:
    """The backends whose predicted queue wait is over ``limit`` (ms) join ``excluded``, saying so."""
    for s, p in zip(alive, predictions):
        if p.queue_ms > limit:
            excluded[s.name] = f"queue full: predicted wait {p.queue_ms / 1000:.1f}s over {limit / 1000:.1f}s"


def _decided(ranked: tuple[Candidate, ...], excluded: dict[str, str], plan: _Plan) -> Decision:
    f = plan.f
    if not f.budgeted:
        reason = Reason.NO_BUDGET
    elif ranked[0].meets_budget:
        reason = Reason.MEETS_BUDGET
    elif plan.mode is Mode.STRICT:
        wait = min(c.prediction.queue_ms for c in ranked) / 1000
        return Decision(
            Reason.BUDGET_UNMEETABLE, ranked, excluded, plan.name, plan.max_attempts, plan.hedging,
            retry_after_s=max(1.0, wait),
        )  # fmt: skip
    else:
        reason = Reason.BEST_EFFORT
    hedge_after = f.ttft_budget_ms if plan.hedging and f.ttft_budget_ms is not None and len(ranked) > 1 else None
    return Decision(reason, ranked, excluded, plan.name, plan.max_attempts, plan.hedging, hedge_after_ms=hedge_after)
