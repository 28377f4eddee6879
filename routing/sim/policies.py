"""The routing policies the simulator compares: enginegate's own and the peers' usual ones.

Every policy sees the same ``BackendView``s: backends that serve the request's model,
are up and can hold the request (context and memory, as LiteLLM's pre-call checks and
any sane router do), with the router's own in-flight count and the engine gauges of
the last poll. Baselines follow their projects' documentation:

- ``round_robin``: next backend in turn.
- ``random``: uniform choice (LiteLLM's default ``simple-shuffle`` without weights).
- ``least_busy``: fewest requests in flight from this router (LiteLLM ``least-busy``).
- ``latency``: lowest average of the last ten observed latencies, untried backends
  first (LiteLLM ``latency-based-routing``: time to first token for streamed
  requests, else response time per completion token).
- ``static``: a strawman, kept to show what a hand-written engine table costs: the usual
  engine decision tree, round-robin inside the chosen group: big models to multi-GPU
  backends, tight first-token budgets to TensorRT-LLM, other interactive and bounded work
  to vLLM, batch work to the cheapest backends (CPU). No serious router works this way.
- ``enginegate``: ``routing.policy.choose`` on a snapshot built the way the gateway's
  fleet builds it (its own prefix index per backend included), learning from completed
  requests through ``routing.estimator.observe`` (the gateway's online correction: TTFT ratio, time
  per token and answer length, fed as the gateway's accounting feeds them) and from the engines'
  cached-token counts. Its own predictive admission (``Rules.max_queue_wait_ms``) is off here:
  admission is the simulated fleet's, the same for every policy (``SimFleet.admission_s``). It does
  shed requests predicted hopeless (``routing.shed_over_budget``, ``SHED_RATIO`` in the benchmark's
  fleets): a policy choice, counted as missed.
  ``enginegate_2x`` is two independent replicas of it (each with its own index and view of
  the fleet's requests), requests split between them at random: how much a prefix scatters.

The strong peers (power of two choices, join-shortest-queue normalised by capacity and KV,
llm-d's scorer and its SLO variant, SGLang's cache-aware router) are in ``routing.sim.peers``.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from routing import load
from routing.decisions import Reason
from routing.estimator import kv_capacity_tokens, observe
from routing.policy import choose
from routing.prefix import PrefixIndex
from routing.rules import Rules
from routing.sim.engine import Job, SimEngine
from routing.types import BackendState, FleetSnapshot, ModelSpec, Observed, RequestFeatures

LATENCY_WINDOW = 10
"""LiteLLM keeps the last ten latencies per deployment."""
TIGHT_TTFT_MS = 1000.0
"""The static table's line between "tight latency" and ordinary interactive budgets."""
BIG_MODEL_B = 30.0
SHED_RATIO = 3.0
"""What the benchmark's fleets set as ``routing.shed_over_budget`` (``configs/sim-fleet.yaml``; off by
default in the gateway): a request predicted above three times its budget on every backend while every
one queues is shed. Past saturation, serving such requests only delays those that can still make it
(six H100s at 120% load, seeds 0 and 1, within budget with rejected requests counted as missed:
Mooncake 45.3/52.9% without, 75.2/77.7% with; Azure conversation 64.3/64.7% and 88.0/90.3%; at
50-100% and on the mixed fleet within noise or better; 2 and 4 did no better)."""
_FAILURE_OF = {Reason.BUDGET_UNMEETABLE: "strict_429", Reason.OVERLOADED: "hopeless"}
"""Its queue-wait admission is off here (the fleet's applies), so it sheds only as hopeless."""


@dataclass(eq=False)
class BackendView:
    engine: SimEngine
    in_flight: int = 0
    """Requests this router sent there that have not finished."""
    polled: tuple[int, int] | None = None
    """(running, waiting) the engine reported at the last poll."""
    in_flight_at_poll: int = 0
    prefill_backlog: int = 0
    """Prompt tokens of this router's requests there that have no first token yet."""
    polled_kv: float = 0.0
    """KV-cache usage the engine reported at the last poll, 0..1."""
    ttfts: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    per_token: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    observed: Observed = field(default_factory=Observed)

    @property
    def name(self) -> str:
        return self.engine.name


class Policy(Protocol):
    name: str

    def pick(self, job: Job, views: Sequence[BackendView]) -> BackendView | None:
        """Where ``job`` goes among ``views`` (never empty); None rejects it."""

    def finished(self, job: Job, view: BackendView) -> None: ...


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._turn = 0

    def pick(self, job: Job, views: Sequence[BackendView]) -> BackendView:
        self._turn += 1
        return views[self._turn % len(views)]

    def finished(self, job: Job, view: BackendView) -> None:
        pass


class Random:
    name = "random"

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def pick(self, job: Job, views: Sequence[BackendView]) -> BackendView:
        return self._rng.choice(views)

    def finished(self, job: Job, view: BackendView) -> None:
        pass


class LeastBusy:
    name = "least_busy"

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def pick(self, job: Job, views: Sequence[BackendView]) -> BackendView:
        fewest = min(v.in_flight for v in views)
        return self._rng.choice([v for v in views if v.in_flight == fewest])

    def finished(self, job: Job, view: BackendView) -> None:
        pass


class LowestLatency:
    name = "latency"

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    @staticmethod
    def _streamed(job: Job) -> bool:
        return job.request.ttft_budget_ms is not None  # chat and agent clients stream; batch jobs do not

    def pick(self, job: Job, views: Sequence[BackendView]) -> BackendView:
        def average(v: BackendView) -> float:
            values = v.ttfts if self._streamed(job) else v.per_token
            return sum(values) / len(values) if values else 0.0

        best = min(average(v) for v in views)
        return self._rng.choice([v for v in views if average(v) == best])

    def finished(self, job: Job, view: BackendView) -> None:
        if job.ttft_s is not None:
            view.ttfts.append(job.ttft_s)
        if job.e2e_s is not None:
            view.per_token.append(job.e2e_s / max(1, job.request.output_tokens))


class StaticTable:
    name = "static"

    def __init__(self) -> None:
        self._turns: dict[str, int] = {}

    @staticmethod
    def group(job: Job, params_b: float, views: Sequence[BackendView]) -> tuple[str, list[BackendView]]:
        r = job.request
        if params_b >= BIG_MODEL_B:
            return "multi_gpu", [v for v in views if v.engine.profile.gpu_count > 1]
        if r.ttft_budget_ms is not None and r.ttft_budget_ms <= TIGHT_TTFT_MS:
            return "tensorrt", [v for v in views if v.engine.profile.engine in ("trtllm_serve", "triton_trtllm")]
        if r.ttft_budget_ms is not None or (r.latency_budget_ms is not None and r.latency_budget_ms <= 30000):
            return "vllm", [v for v in views if v.engine.profile.engine == "vllm"]
        cheapest = min(v.engine.profile.cost_per_hour for v in views)
        return "cheap", [v for v in views if v.engine.profile.cost_per_hour == cheapest]

    def pick(self, job: Job, views: Sequence[BackendView]) -> BackendView:
        name, group = self.group(job, views[0].engine.model.params_b, views)
        group = group or list(views)  # the table's engine is missing or down: anything that serves
        turn = self._turns[name] = self._turns.get(name, -1) + 1
        return group[turn % len(group)]

    def finished(self, job: Job, view: BackendView) -> None:
        pass


class Enginegate:
    name = "enginegate"

    def __init__(
        self,
        rules: Rules,
        models: dict[str, ModelSpec],
        replicas: int = 1,
        seed: int = 0,
        share_s: float | None = None,
        shed_ratio: float | None = None,
    ) -> None:
        """``replicas`` gateways, each request to one at random, each with its own prefix index;
        ``share_s``: they tell each other where they sent each prompt (``routing.prefix.share``), heard
        this much later; ``shed_ratio``: overrides the config's ``routing.shed_over_budget``."""
        # The fleet's queue-wait admission applies to every policy; shedding requests predicted hopeless
        # is enginegate's own policy choice (its rejections count as missed in the tables).
        shed = rules.shed_ratio if shed_ratio is None else shed_ratio
        self._rules = replace(rules, max_queue_wait_ms=float("inf"), shed_ratio=shed)
        self._models = models
        self._indexes: list[dict[str, PrefixIndex]] = [{} for _ in range(replicas)]
        self._rng = random.Random(seed ^ 0x2E91)
        self._replica_of: dict[int, int] = {}
        self._share_s = share_s
        self._news: deque[tuple[float, int, str, tuple[int, ...], int]] = deque()
        """(heard at, sender, backend, blocks, block tokens), oldest first."""
        if replicas > 1:
            self.name = f"enginegate_{replicas}x" + ("_shared" if share_s is not None else "")

    def _index(self, replica: int, v: BackendView) -> PrefixIndex:
        indexes = self._indexes[replica]
        index = indexes.get(v.name)
        if index is None:
            index = indexes[v.name] = PrefixIndex(kv_capacity_tokens(v.engine.model, v.engine.profile))
        return index

    def state(self, v: BackendView, index: PrefixIndex | None = None) -> BackendState:
        p = v.engine.profile
        polled_running, polled_waiting = v.polled if v.polled is not None else (None, None)
        running, waiting = load.current(polled_running, polled_waiting, v.in_flight_at_poll, v.in_flight,
                                        p.max_concurrency)  # fmt: skip
        return BackendState(
            profile=p, running=running, waiting=waiting, prefill_backlog_tokens=v.prefill_backlog, observed=v.observed,
            prefix=index,
        )  # fmt: skip

    def _hear(self, now: float, views: Sequence[BackendView]) -> None:
        by_name = {v.name: v for v in views}
        while self._news and self._news[0][0] <= now:
            _, sender, backend, blocks, block_tokens = self._news.popleft()
            view = by_name.get(backend)
            if view is None:
                continue
            for replica in range(len(self._indexes)):
                if replica != sender:
                    self._index(replica, view).add(blocks, block_tokens)

    def pick(self, job: Job, views: Sequence[BackendView]) -> BackendView | None:
        r = job.request
        replica = self._rng.randrange(len(self._indexes))
        self._replica_of[id(job)] = replica
        if self._share_s is not None:
            self._hear(r.arrival_s, views)
        features = RequestFeatures(
            model=job.model,
            prompt_tokens=r.prompt_tokens,
            max_tokens=None,  # clients rarely say how long the answer will be; routing must not peek
            stream=r.ttft_budget_ms is not None,
            latency_budget_ms=r.latency_budget_ms,
            ttft_budget_ms=r.ttft_budget_ms,
            prefix_hash=r.key,
            prefix_blocks=r.blocks,
            block_tokens=float(r.block_tokens),
            preamble_blocks=r.preamble_blocks,
        )
        indexes = {v.name: self._index(replica, v) for v in views} if r.blocks else {}
        snapshot = FleetSnapshot(tuple(self.state(v, indexes.get(v.name)) for v in views), self._models)
        decision = choose(features, snapshot, self._rules)
        if not decision.candidates or decision.reason is Reason.BUDGET_UNMEETABLE:
            # The gateway answers 429 (strict mode) rather than queue hopeless work, 503 when it sheds.
            job.failure = _FAILURE_OF.get(decision.reason, "no_backend")
            return None
        first = decision.candidates[0]
        job.predicted_ttft_ms = first.prediction.ttft_ms
        job.predicted_tpot_ms = first.prediction.tpot_ms
        job.predicted_e2e_ms = first.prediction.e2e_ms
        job.prior_ttft_ms = first.prediction.prior_ttft_ms
        if r.blocks:
            index = indexes[first.backend]
            job.expected_cached = first.prediction.cached_tokens
            job.ages = index.ages(r.blocks, min(len(r.blocks), job.expected_cached // r.block_tokens))
            index.add(r.blocks, r.block_tokens, r.key)
            if self._share_s is not None:
                self._news.append((r.arrival_s + self._share_s, replica, first.backend, r.blocks, r.block_tokens))
        return next(v for v in views if v.name == first.backend)

    def finished(self, job: Job, view: BackendView) -> None:
        ttft, e2e = job.ttft_s, job.e2e_s
        if ttft is None or e2e is None:
            return
        out = job.request.output_tokens
        tpot_ms = (e2e - ttft) * 1000 / (out - 1) if out > 1 else None
        prior = job.prior_ttft_ms if job.prior_ttft_ms is not None else ttft * 1000
        view.observed = observe(view.observed, prior, ttft * 1000, tpot_ms, out)
        replica = self._replica_of.pop(id(job), 0)
        if job.request.blocks:  # engines report what they reused (usage.prompt_tokens_details.cached_tokens)
            self._index(replica, view).reported(job.ages, job.cached_tokens, job.request.block_tokens)
