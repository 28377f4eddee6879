"""``Tenancy``: who is asking (keys), what they may do (scope, limits, budget), and what they used.

The gateway calls it at three points of a generation request: ``authenticate`` before the body is
read (401), ``admit`` once the model and prompt size are known and before routing (403, 429, 503
with OpenAI's x-ratelimit headers), and, through the request's ``RequestLife``, ``_ended`` once when
the request's end is recorded (settlement with the real usage, usage rows, team counters, the key id
and cost in the request's log line). Keys come from the database (cached ``auth.cache_s``) or from
the config by hash.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import itertools
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry

from backends.base import Usage
from gateway.tenancy import answers
from gateway.tenancy.fairness import FairShare
from gateway.tenancy.keys import KeyRecord, key_id_of, looks_like_key
from gateway.tenancy.limiter import NANOS_PER_USD, Ask, Limiter, LocalLimiter, Verdict
from gateway.tenancy.metrics import TenancyMetrics
from gateway.tenancy.pricing import FREE, Price, day_of, period_left, period_of, usd
from gateway.tenancy.redis_limiter import LimiterDown, RedisLimiter
from gateway.tenancy.settings import AuthConfig, DeclaredKey, RedisConfig
from gateway.tenancy.store import KeyStore, UsageRow, is_postgres, open_store, unavailable
from routing.decisions import Decision
from routing.types import RequestFeatures

if TYPE_CHECKING:
    from gateway.config import GatewayConfig, LoadedConfig

log = logging.getLogger("enginegate.tenancy")

_NEGATIVE_CACHE = 10_000
"""Unknown key ids remembered (so guessing does not reach the database each time), at most."""


ESTIMATE_FACTOR = 2
TEMPLATE_TOKENS = 8


def reserved_prompt(estimate: int, messages: int) -> int:
    """What to reserve for a prompt counted from its length (about four characters a token): twice
    that, plus the chat template's tokens around each message, so that the engine's real count
    (settled later) stays within the reservation and no budget is overspent by a short estimate."""
    return ESTIMATE_FACTOR * estimate + TEMPLATE_TOKENS * messages


class _Headers(Protocol):
    def header(self, name: str, value: str) -> None: ...


class Admitted(Protocol):
    """What admission writes on the request it admits (the pipeline's ``RequestLife``): the key, the
    limit headers, and what to do when the request ends. Tenancy sits below the pipeline."""

    key_id: str | None
    on_end: Callable[[Usage | None, bool], float] | None

    @property
    def ex(self) -> _Headers: ...


@dataclass(slots=True)
class _Cached:
    record: KeyRecord | None
    spent_nanos: int
    period: str
    until: float


@dataclass(slots=True)
class Admission:
    """A request admitted for a key: what it reserved, settled when it ends."""

    record: KeyRecord
    ask: Ask
    verdict: Verdict
    price: Price
    model: str
    priority: int = 0


def _declared(k: DeclaredKey) -> KeyRecord:
    fields = k.model_dump(exclude={"id", "sha256"})
    fields["models"] = tuple(fields["models"])
    return KeyRecord(id=k.id, sha256=k.sha256, source="config", created_at=0.0, **fields)


class Tenancy:
    def __init__(
        self,
        auth: AuthConfig,
        redis: RedisConfig,
        base: Path,
        prices: Mapping[str, Price],
        lease_s: float,
        registry: CollectorRegistry,
    ) -> None:
        self.auth = auth
        self.required = auth.required
        self.base = base
        self.prices = dict(prices)
        self.lease_s = lease_s
        self.metrics = TenancyMetrics(registry, auth.team_metrics_limit)
        self.declared = {k.id: _declared(k) for k in auth.keys}
        self.limiter: Limiter
        if redis.url:
            self.limiter = RedisLimiter(
                redis.url, redis.on_error == "open", redis.timeout_s, redis.retry_s, self.metrics.fallback,
                budget_fail_open=redis.budget_on_error == "open",
            )  # fmt: skip
        else:
            self.limiter = LocalLimiter()
        self.store: KeyStore | None = None
        self._cache: dict[str, _Cached] = {}
        self._usage: dict[tuple[str, str, str], list[float]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._flusher: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self.fair = FairShare()
        # Names of requests in the shared counters: unique across replicas and restarts (a client's
        # x-request-id is not: two requests named alike would count once).
        self._boot = secrets.token_hex(6)
        self._sequence = itertools.count()

    @property
    def dsn(self) -> str:
        return self.auth.database or "keys.db"

    async def start(self) -> None:
        self.store = await open_store(self.dsn, self.base)
        self._flusher = asyncio.get_running_loop().create_task(self._flush_every(self.auth.usage_flush_s))

    async def aclose(self) -> None:
        self._closing.set()
        if self._flusher is not None:  # its flush under way finishes: cancelled, its rows would be lost
            await self._flusher
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.flush()
        await self.limiter.close()
        if self.store is not None:
            await self.store.close()

    def reconfigure(self, auth: AuthConfig, prices: Mapping[str, Price]) -> None:
        """A reload: new prices and declared keys (database, Redis and ``required`` are read at start)."""
        self.prices = dict(prices)
        self.declared = {k.id: _declared(k) for k in auth.keys}
        self._cache.clear()

    def forget(self, key_id: str) -> None:
        """The key changed here (admin API): read it afresh on its next use."""
        self._cache.pop(key_id, None)

    # Who is asking.
    async def authenticate(self, authorization: str | None) -> KeyRecord | None:
        """The key the request presents; None for an anonymous request when keys are not required."""
        token = authorization[7:].strip() if authorization and authorization[:7].lower() == "bearer " else None
        if token is None or not looks_like_key(token):
            if self.required:
                self.metrics.refused("invalid_key")
                raise answers.unauthorized(answers.MISSING if token is None else "Incorrect API key provided.")
            return None
        key_id = key_id_of(token)
        record = await self._lookup(key_id) if key_id is not None else None
        if record is None or not record.matches(token):
            self.metrics.refused("invalid_key")
            raise answers.invalid(key_id)
        why = record.usable(time.time())
        if why is not None:
            self.metrics.refused("invalid_key")
            raise answers.unusable(record.id, why)
        return record

    async def _lookup(self, key_id: str) -> KeyRecord | None:
        declared = self.declared.get(key_id)
        if declared is not None:
            return declared
        cached = self._cache.get(key_id)
        if cached is not None and cached.until > time.monotonic():
            return cached.record
        try:
            return (await self._load(key_id)).record
        except unavailable() as exc:  # the database is unreachable: keys read before still count (a bug is a 500)
            log.warning("key store unavailable (%s); %s", type(exc).__name__,
                        "using the key as last read" if cached is not None else "refusing the request")  # fmt: skip
            if cached is None:
                self.metrics.refused("store_down")
                raise answers.STORE_DOWN from None
            cached.until = time.monotonic() + self.auth.cache_s
            return cached.record

    async def _load(self, key_id: str) -> _Cached:
        assert self.store is not None
        record = await self.store.get(key_id)
        spent, period = 0, ""
        if record is not None and record.budget_usd > 0:
            period, _, first_day = period_of(record.budget_period, time.time())
            rows = await self.store.usage(key_id, first_day)
            spent = round(sum(r.cost_usd for r in rows) * NANOS_PER_USD)
        if record is None and len(self._cache) >= _NEGATIVE_CACHE:
            self._cache = {k: v for k, v in self._cache.items() if v.record is not None}
        cached = _Cached(record, spent, period, time.monotonic() + self.auth.cache_s)
        self._cache[key_id] = cached
        return cached

    # What they may do.
    async def admit(
        self,
        record: KeyRecord,
        features: RequestFeatures,
        life: Admitted,
        explicit_priority: bool,
        max_tokens_cap: int,
        context: int | None,
        estimated: int | None = None,
    ) -> RequestFeatures:
        """Admit the request or raise its refusal; returns the features routing should see (the key's
        priority class, id and team). The reservation is the prompt plus the most the request may
        generate: its ``max_tokens``, else the gateway's cap (``limits.max_tokens``) within the context.
        ``estimated``: the prompt's message count when its tokens are an estimate from its length
        (no tokenizer for the model), else None (counted exactly)."""
        model = features.model
        life.key_id = record.id
        if not record.allows(model):
            self.metrics.refused("model_not_allowed")
            raise answers.not_allowed(record.id, model)
        now = time.time()
        price = self.prices.get(model, FREE)
        prompt = features.prompt_tokens if estimated is None else reserved_prompt(features.prompt_tokens, estimated)
        capped = None
        if features.max_tokens is not None:
            max_out = features.max_tokens
        else:  # the engine stops at its context: prompt and answer together fit in it
            max_out = max(1, min(max_tokens_cap, (context or (prompt + max_tokens_cap)) - prompt))
            if record.tpm and prompt + max_out > record.tpm:  # what the key's window can hold, and no more
                max_out = capped = record.tpm - prompt
        tokens = prompt + max_out
        if record.tpm and (tokens > record.tpm or max_out < 1):  # no wait would admit it: a 400, not a 429
            self.metrics.refused("too_large")
            raise answers.never_fits(record.id, record.tpm, prompt, tokens)
        budget_nanos, cost_nanos = round(record.budget_usd * NANOS_PER_USD), price.nanos(prompt, max_out)
        if budget_nanos and cost_nanos > budget_nanos:  # more than the whole budget: never admitted either
            self.metrics.refused("too_large")
            raise answers.over_budget(record.id, record.budget_usd, record.budget_period, cost_nanos)
        period, ttl, _ = period_of(record.budget_period, now)
        cached = self._cache.get(record.id)
        spent = cached.spent_nanos if cached is not None and cached.period == period else 0
        ask = Ask(
            key=record.id,
            member=f"{self._boot}:{next(self._sequence):x}",
            rpm=record.rpm,
            tpm=record.tpm,
            concurrency=record.concurrency,
            tokens=tokens,
            budget_nanos=budget_nanos,
            cost_nanos=cost_nanos,
            period=period,
            period_ttl_s=ttl,
            spent_nanos=spent,
            window_s=self.auth.window_s,
            lease_s=self.lease_s,
            period_left_s=period_left(record.budget_period, now),
        )
        try:
            verdict = await self.limiter.admit(ask, now)
        except LimiterDown as down:
            self.metrics.refused("budget_store_down" if down.budget else "limiter_down")
            raise (answers.BUDGET_DOWN if down.budget else answers.LIMITER_DOWN) from None
        for name, value in answers.headers(ask, verdict):
            life.ex.header(name, value)
        if not verdict.admitted:
            self.metrics.refused(verdict.refused or "requests")
            raise answers.refused(ask, verdict, model)
        self.metrics.admitted(record.team)
        cap = self.auth.priority_classes.get(record.priority, 0)
        priority = min(features.priority, cap) if explicit_priority else cap
        admission = Admission(record, ask, verdict, price, model, priority)
        self.fair.start(priority, record.id, ask.tokens)
        life.on_end = lambda usage, committed: self.ended(admission, usage, committed)
        # A request without max_tokens whose key's token limit is smaller than the default reservation
        # is answered within what it reserved (finish_reason "length" beyond).
        max_tokens = capped if capped is not None else features.max_tokens
        return replace(features, priority=priority, key=record.id, team=record.team or None, max_tokens=max_tokens)

    def fair_share(self, features: RequestFeatures, decision: Decision) -> None:
        """After routing: refuse the request of a key past its fair share of its class when the chosen
        backend is saturated (``gateway/tenancy/fairness.py``)."""
        if not decision.candidates or decision.candidates[0].prediction.queue_ms <= 0 or features.key is None:
            return
        if self.fair.over(features.priority, features.key):
            self.metrics.refused("fair_share")
            raise answers.fair_share(features.key, features.model)

    # What they used.
    def ended(self, admission: Admission, usage: Usage | None, committed: bool) -> float:
        """The request's end: settle its reservation, add its usage; returns its cost in dollars."""
        ask = admission.ask
        self.fair.end(admission.priority, ask.key, ask.tokens)
        if usage is not None:
            tokens, cost = usage.total_tokens, admission.price.of(usage)
            prompt, completion, cached = usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens or 0
        elif committed:  # an answer started but its usage is unknown (the client left): the reservation stands
            tokens, cost = ask.tokens, ask.cost_nanos
            prompt, completion, cached = 0, 0, 0
        else:
            tokens = cost = prompt = completion = cached = 0
        if isinstance(self.limiter, LocalLimiter):
            self.limiter.settle_now(ask, tokens, cost)
        else:  # Redis's limiter settles its own counters at once and Redis's when it can
            task = asyncio.get_running_loop().create_task(self.limiter.settle(ask, tokens, cost))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        spent = usd(cost)
        row = self._usage.setdefault((ask.key, day_of(time.time()), admission.model), [0, 0, 0, 0, 0.0])
        row[0] += 1
        row[1] += prompt
        row[2] += completion
        row[3] += cached
        row[4] += spent
        self.metrics.used(admission.record.team, prompt, completion, cached, spent)
        return round(spent, 9)

    async def flush(self) -> None:
        """Write the usage gathered since the last flush (kept for the next one if the database fails)."""
        if not self._usage or self.store is None:
            return
        pending, self._usage = self._usage, {}
        rows = [UsageRow(k, d, m, int(v[0]), int(v[1]), int(v[2]), int(v[3]), v[4]) for (k, d, m), v in pending.items()]
        try:
            await self.store.add_usage(rows)
        except Exception:
            log.exception("could not write usage; kept for the next flush")
            for key, values in pending.items():
                row = self._usage.setdefault(key, [0, 0, 0, 0, 0.0])
                for i, v in enumerate(values):
                    row[i] += v

    async def _flush_every(self, seconds: float) -> None:
        """A flush every ``seconds`` until ``aclose``, which waits for the last one instead of cancelling
        it: a write cancelled half way loses its rows (or, the database's thread having committed them,
        counts them again if they were put back)."""
        while not self._closing.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await self._closing.wait()
            await self.flush()


def prices_of(config: GatewayConfig) -> dict[str, Price]:
    return {
        m.name: Price(m.price_per_mtok_in, m.price_per_mtok_out, m.price_per_mtok_cached)
        for m in config.models
        if m.price_per_mtok_in or m.price_per_mtok_out or m.price_per_mtok_cached
    }


def build(loaded: LoadedConfig, registry: CollectorRegistry) -> Tenancy | None:
    """The gateway's tenancy, or None when ``auth:`` asks for no keys (the request path then has none)."""
    cfg = loaded.config
    if not cfg.auth.enabled:
        return None
    missing = [
        f"{loaded.path}: {what} needs the {package} package: pip install 'enginegate[tenancy]'"
        for what, package, wanted in (
            ("redis.url", "redis", bool(cfg.redis.url)),
            ("auth.database (PostgreSQL)", "asyncpg", is_postgres(cfg.auth.database or "")),
        )
        if wanted and importlib.util.find_spec(package) is None
    ]
    if missing:
        from gateway.config import ConfigError

        raise ConfigError(missing)
    # A concurrency slot is a lease: a replica that dies mid-request frees it when the lease ends.
    lease_s = max(cfg.routing.answer_timeout_s, cfg.routing.first_token_timeout_s) + 60
    return Tenancy(cfg.auth, cfg.redis, loaded.path.parent, prices_of(cfg), lease_s, registry)
