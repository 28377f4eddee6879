"""``choose()``: the routing policy, pure and synchronous: match a rule, filter, predict, score, rank.

Scores are weighted sums of terms in [0, 1]: how well the predicted latency
meets the budget (or, with no budget, how fast it is), cost per request, free
capacity, and affinity. Prompt tokens a backend is expected to hold in its
prefix cache (``routing.prefix``) shorten its predicted prefill, so cache hits
are traded against queueing and budgets in the predictions themselves; the
affinity bonus only keeps a conversation where its history is (or, for a new
one, at the rendezvous home of its opening, which every gateway replica
computes alike) when predictions are about even. Backends predicted to meet
the budget always rank before those that are not.
"""

from __future__ import annotations

import fnmatch
import hashlib
from dataclasses import dataclass, replace

from routing.estimator import fit_problem, predict, prefill_ms
from routing.types import (
    BackendState,
    Breaker,
    Candidate,
    Decision,
    FleetSnapshot,
    Mode,
    ModelSpec,
    Prediction,
    Reason,
    RequestFeatures,
    Rule,
    Rules,
)

DEFAULT_MAX_TOKENS = 256
"""Output length assumed for predictions when the request does not cap it."""
HOPELESS_RATIO = 2.0
"""Predicted at more than this multiple of its budget on every backend, a request goes to the cheapest
capacity rather than where it misses least."""
SAFE_RATIO = 0.5
"""A prediction at most this share of the budget meets it safely, whatever the estimate's error."""


HOME_BOUND = 1.1
"""Among equally busy backends, a new conversation's home holds at most this multiple of their mean
expected cache."""
HOME_SLACK = 2.0
"""The backend holding a conversation's own history counts as meeting its budget while predicted
within this multiple of it. Leaving costs the fleet the whole history's prefill on a cold backend,
and one prediction is a noisy thing to pay that for (simulated chat sessions, six identical GPUs
near saturation: actual first-token times ran 0.5x to 1.7x the prediction between the quartiles;
slack 2 moved a third fewer conversations and met 14 points more budgets at 100% load)."""


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


def _share(key: int, name: str) -> float:
    """A stable number in [0, 1) for (request key, backend): ranks prefix affinity."""
    digest = hashlib.blake2b(f"{key}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def lacking(state: BackendState, f: RequestFeatures) -> list[str]:
    """Capabilities and extra fields the request uses that the backend lacks."""
    if not f.needs and not f.extras:
        return []
    p = state.profile
    lacks = sorted(f.needs - p.features) + sorted(f.extras - p.extras)
    if f.top_logprobs > p.max_top_logprobs and "top_logprobs" in p.features:
        lacks.append(f"top_logprobs above {p.max_top_logprobs}")
    return lacks


def _home(alive: list[BackendState], matched: dict[str, int], f: RequestFeatures) -> str:
    """Where this conversation belongs: the backend holding most of its own blocks (beyond the
    preamble, its system prompt, that many conversations share), else, for a new conversation, the
    least busy backend by its share of slots in use, ties broken by rendezvous with bounded loads on
    the opening (system prompt and first user message), which every gateway replica computes alike.

    A new conversation's first turn decides where all its turns will find their history, so
    placing it by load is what keeps the fleet even; a rendezvous home bounded by the cache each
    backend holds (the earlier rule) left the least busy backend idle while caches were full
    everywhere (simulated chat sessions on six identical GPUs at 100% load: 78% within budget,
    against 93% placing by load).
    """
    beyond = max(matched[s.name] for s in alive) - f.preamble_blocks
    if beyond > 0:
        # Backends holding about as much of it as the best (up to a quarter less) are equals: after
        # a failover, a long conversation goes back to its home rather than drifting to where the
        # failover sent it (the predictions still move it when the difference costs real time).
        least = beyond - beyond // 4
        alive = [s for s in alive if matched[s.name] - f.preamble_blocks >= least]
    if beyond <= 0:  # a new conversation: the least busy backends only
        idlest = min(_busy(s) for s in alive)
        alive = [s for s in alive if _busy(s) <= idlest]
    # Rendezvous with bounded loads (Mirrokni, Thorup and Zadimoghaddam, 2018) among equals: the
    # opening's rendezvous order, skipping backends whose expected cache holds more than
    # ``HOME_BOUND`` times the candidates' mean, so conversations spread evenly over an idle fleet
    # however the hash falls (a conversation per slot: more on one engine than it has slots evicts
    # them in turn), and every replica agrees while loads are even.
    ranked = sorted(alive, key=lambda s: -_share(f.prefix_hash, s.name))
    tokens = [s.prefix.tokens if s.prefix is not None else 0.0 for s in ranked]
    bound = HOME_BOUND * sum(tokens) / len(tokens)
    return next((s.name for s, held in zip(ranked, tokens, strict=True) if held <= bound), ranked[0].name)


def _held(state: BackendState, f: RequestFeatures) -> tuple[int, int]:
    """(blocks, tokens) of the prompt's leading blocks the backend is expected to hold: exactly,
    from its KV-cache events, where it sends them and the prompt's token ids are known; else from
    the gateway's own account of what it sent there."""
    if state.exact is not None and f.token_ids:
        tokens = state.exact.cached_tokens(f.token_ids)
        return (min(len(f.prefix_blocks), int(tokens / f.block_tokens)) if f.block_tokens > 0 else 0), tokens
    blocks = state.prefix.match(f.prefix_blocks) if state.prefix is not None else 0
    return blocks, int(blocks * f.block_tokens)


def _busy(state: BackendState) -> float:
    return (state.running + state.waiting) / max(1, state.profile.max_concurrency)


def _work_ms(model: ModelSpec, state: BackendState, p: Prediction, f: RequestFeatures, out: int) -> float:
    """Backend time a request takes: all of it while its uncached prompt is prefilled (compute-bound:
    the batch's step waits for the chunk), then its share of the batch per output token (decode
    reads the weights once for every sequence). Waiting takes none. Counting prefill at a batch
    share, as e2e / slots did, priced a cache miss at almost nothing: in the simulator that sent
    conversations to cold backends whenever theirs looked busier, until the fleet drowned in
    prefill (chat sessions, uniform fleet, 50% load: 42% within budget, against 100% now)."""
    return prefill_ms(model, state, f.prompt_tokens - p.cached_tokens) + p.tpot_ms * out / p.slots


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


def _meets(p: Prediction, f: RequestFeatures) -> bool:
    return (
        (f.ttft_budget_ms is None or p.ttft_ms <= f.ttft_budget_ms)
        and (f.latency_budget_ms is None or p.e2e_ms <= f.latency_budget_ms)
        and (f.tpot_budget_ms is None or p.tpot_ms <= f.tpot_budget_ms)
    )


def _budget_ratio(p: Prediction, f: RequestFeatures) -> float | None:
    """Prediction over budget for the tightest stated budget (above 1: missed), None without budgets."""
    pairs = ((p.ttft_ms, f.ttft_budget_ms), (p.e2e_ms, f.latency_budget_ms), (p.tpot_ms, f.tpot_budget_ms))
    ratios = [pred / budget for pred, budget in pairs if budget is not None]
    return max(ratios) if ratios else None


def _budget_term(ratio: float | None, p: Prediction, fastest_e2e: float, closest_miss: float) -> float:
    """1 for meeting the budget with a safe margin (cost and load then pick among such backends, so
    loose requests leave the fast backends to tight ones), down to 0.5 for just meeting it; below 0.5
    for missing it, the closest miss scoring 0.5; without a budget, speed relative to the fastest."""
    if ratio is None:
        return fastest_e2e / p.e2e_ms if p.e2e_ms > 0 else 1.0
    if ratio <= SAFE_RATIO:
        return 1.0
    if ratio <= 1:
        return 1 - 0.5 * (ratio - SAFE_RATIO) / (1 - SAFE_RATIO)
    return 0.5 * closest_miss / ratio


def with_rule_defaults(f: RequestFeatures, rule: Rule | None) -> RequestFeatures:
    if rule is None:
        return f
    return replace(
        f,
        ttft_budget_ms=f.ttft_budget_ms if f.ttft_budget_ms is not None else rule.default_ttft_budget_ms,
        latency_budget_ms=f.latency_budget_ms if f.latency_budget_ms is not None else rule.default_latency_budget_ms,
    )


@dataclass(frozen=True, slots=True)
class _Plan:
    """What the matched rule (or the defaults) settles for one request."""

    rule: Rule | None
    f: RequestFeatures
    """The request's features with the rule's default budgets applied."""
    max_attempts: int
    hedging: bool
    mode: Mode

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
    held = {s.name: _held(s, f) for s in alive}
    predictions = {s.name: predict(model, s, f.prompt_tokens, out, held[s.name][1]) for s in alive}
    alive = _admitted(alive, predictions, excluded, rules.max_queue_wait_ms * priority_factor(f.priority))
    if not alive:
        limit = rules.max_queue_wait_ms * priority_factor(f.priority)
        retry = max(1.0, (min(p.queue_ms for p in predictions.values()) - limit) / 1000)  # every one was full
        return plan.decision(Reason.OVERLOADED, excluded, retry_after_s=retry)
    matched = {name: blocks for name, (blocks, _) in held.items()}
    candidates, hopeless = _scored(alive, predictions, matched, probing, plan, model, rules, out)
    states = {s.name: s for s in alive}

    def rank(c: Candidate) -> tuple[int, int, int, float, float]:
        s = states[c.backend]
        rule = plan.rule
        preference = 0 if rule and _named(s, rule.prefer) else (2 if rule and _named(s, rule.avoid) else 1)
        last = 1 if c.backend in probing else 0
        return (last, 0 if c.meets_budget else 1, preference, -c.terms["cost"] if hopeless else 0.0, -c.score)

    return _decided(tuple(sorted(candidates, key=rank)), excluded, plan)


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


def _admitted(
    alive: list[BackendState], predictions: dict[str, Prediction], excluded: dict[str, str], limit: float
) -> list[BackendState]:
    """The backends whose predicted queue wait is within ``limit`` (ms); the others join ``excluded``."""
    full = {s.name: predictions[s.name].queue_ms for s in alive if predictions[s.name].queue_ms > limit}
    for backend, wait in full.items():
        excluded[backend] = f"queue full: predicted wait {wait / 1000:.1f}s over {limit / 1000:.1f}s"
    return [s for s in alive if s.name not in full]


def _scored(
    alive: list[BackendState],
    predictions: dict[str, Prediction],
    matched: dict[str, int],
    probing: set[str],
    plan: _Plan,
    model: ModelSpec,
    rules: Rules,
    out: int,
) -> tuple[list[Candidate], bool]:
    """Each backend's score and terms, and whether the request is hopeless everywhere."""
    f = plan.f
    fastest = min(p.e2e_ms for p in predictions.values())  # queue-full backends too, as predicted
    # The price of the capacity a request takes (``_work_ms``): a prompt found in cache takes less.
    cost = {s.name: s.profile.cost_per_hour * _work_ms(model, s, predictions[s.name], f, out) for s in alive}
    cheapest = min(cost.values())
    affine = _home(alive, matched, f)
    ratios = {s.name: _budget_ratio(predictions[s.name], f) for s in alive}
    history = matched[affine] > f.preamble_blocks
    if history and (ratio := ratios[affine]) is not None:
        ratios[affine] = ratio / HOME_SLACK  # the conversation's history is there: see HOME_SLACK
    closest_miss = min((r for r in ratios.values() if r is not None and r > 1), default=1.0)
    # Load relative to the least loaded candidate, by each backend's share of its slots in use: it
    # never flattens to 0 once requests outnumber slots (1 - used/slots did, and then nothing
    # balanced a saturated fleet but the noisy budget predictions).
    used = {s.name: (s.running + s.waiting) / predictions[s.name].slots for s in alive}
    lightest = min(used.values())
    w = rules.weights
    total = w.budget + w.cost + w.load + w.affinity
    candidates = []
    for s in alive:
        p = predictions[s.name]
        terms = {
            "budget": _budget_term(ratios[s.name], p, fastest, closest_miss),
            "cost": cheapest / cost[s.name] if cost[s.name] > 0 else 1.0,
            "load": (1 + lightest) / (1 + used[s.name]),
            "affinity": 1.0 if s.name == affine else 0.0,
            "last_resort": 1.0 if s.name in probing else 0.0,
        }
        score = (w.budget * terms["budget"] + w.cost * terms["cost"] + w.load * terms["load"]) / total
        score += w.affinity * terms["affinity"] / total
        meets = _meets(p, f) or (history and s.name == affine and (ratios[s.name] or 0.0) <= 1)
        candidates.append(Candidate(s.name, round(score, 6), p, meets, terms))
    # Far from its budget everywhere, a request cannot be saved; sent to the backend closest to its
    # budget it would only take that backend's capacity from requests that can still make theirs, so
    # it takes the cheapest capacity instead (in the simulator this beat "least loaded" and "closest").
    hopeless = closest_miss > HOPELESS_RATIO and not any(c.meets_budget for c in candidates)
    return candidates, hopeless


def _decided(ranked: tuple[Candidate, ...], excluded: dict[str, str], plan: _Plan) -> Decision:
    f = plan.f
    has_budget = any(b is not None for b in (f.ttft_budget_ms, f.latency_budget_ms, f.tpot_budget_ms))
    if not has_budget:
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
