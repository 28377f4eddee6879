"""The discrete-event loop: arrivals, engine steps, load polls and outages, one policy at a time.

Every policy replays the same requests on a fresh copy of the same fleet. Events are
processed in time order (ties in the order they were scheduled), so a run is a pure
function of its inputs and seed.

Admission is the fleet's, the same for every policy (``SimFleet.admission_s``): a request queued
on an engine longer than that is shed; enginegate's own predictive admission
(``Rules.max_queue_wait_ms``) is off in the simulator so that no policy sheds where another cannot;
its shedding of requests predicted hopeless (``routing.shed_over_budget``) is a policy choice, counted apart.

What the policies see, the same for all: health at once (an outage is noticed when it
starts), the router's own in-flight counts at once, and engine gauges (running,
waiting) as of the last poll, every ``poll_s`` like the gateway's poller. A request
on a backend that goes down before its first token is routed again (the gateway's
failover); one that had started streaming fails.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

from routing.catalog import PREFILL_CHUNK_TOKENS
from routing.rules import Rules
from routing.sim.engine import FAILURES, Job, SimEngine
from routing.sim.policies import BackendView, Policy
from routing.sim.truth import Truth
from routing.sim.workload import SimRequest
from routing.types import BackendProfile, ModelSpec

_ARRIVAL, _STEP, _POLL, _DOWN, _UP = range(5)


@dataclass(frozen=True, slots=True)
class Outage:
    backend: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class SimFleet:
    """What is simulated: backends (as the gateway's config describes them), models and routing rules."""

    profiles: tuple[BackendProfile, ...]
    models: dict[str, ModelSpec]
    rules: Rules = field(default_factory=Rules)
    poll_s: float = 5.0
    outages: tuple[Outage, ...] = ()
    admission_s: float | None = None
    """Admission for every policy alike: a request still queued on an engine this many seconds after it
    got there is shed (503). None: no admission, every request waits its turn."""
    truth: Truth = field(default_factory=Truth)
    """How the engines' step times depart from the fitted physics (hidden speeds and noise seeded)."""

    def engines(self) -> list[SimEngine]:
        return [
            SimEngine(p, self.models[_model_of(p)], truth=self.truth, max_wait_s=self.admission_s)
            for p in self.profiles
        ]


def _model_of(profile: BackendProfile) -> str:
    if len(profile.models) != 1:
        raise ValueError(f"backend {profile.name}: the simulator runs one model per backend")
    return next(iter(profile.models))


@dataclass(frozen=True)
class Result:
    policy: str
    jobs: tuple[Job, ...]
    span_s: float
    """From the first arrival to the last: the window goodput and the fleet's cost are counted over
    (busy time also counts the work that drains after it)."""
    busy_s: dict[str, float]
    cost_per_hour: dict[str, float]

    @property
    def attainment(self) -> float:
        return sum(j.within_budget for j in self.jobs) / len(self.jobs) if self.jobs else 0.0

    def attainment_of(self, klass: str) -> float:
        jobs = [j for j in self.jobs if j.request.klass == klass]
        return sum(j.within_budget for j in jobs) / len(jobs) if jobs else float("nan")

    @property
    def cache_hit_rate(self) -> float:
        """Share of prompt tokens of the answered requests that engines found in their prefix caches."""
        answered = [j for j in self.jobs if j.first_token_s is not None]
        total = sum(j.request.prompt_tokens for j in answered)
        return sum(j.cached_tokens for j in answered) / total if total else 0.0

    @property
    def goodput(self) -> float:
        """Requests answered within budget per second."""
        return sum(j.within_budget for j in self.jobs) / self.span_s

    @property
    def failed(self) -> int:
        return sum(j.failed for j in self.jobs)

    @property
    def rejected(self) -> int:
        return sum(j.rejected for j in self.jobs)

    @property
    def failures(self) -> dict[str, int]:
        """Requests without an answer by reason (``engine.FAILURES`` keys), every reason present."""
        counts = dict.fromkeys(FAILURES, 0)
        for j in self.jobs:
            if j.failure:
                counts[j.failure] += 1
        return counts

    @property
    def fleet_cost_per_hour(self) -> float:
        """Dollars per hour of keeping every backend up."""
        return sum(self.cost_per_hour.values())

    @property
    def busy_cost_per_hour(self) -> float:
        """Dollars per hour for the share of the arrival window each backend was working (what a fleet
        scaled to its work pays), each backend's share at most all of it."""
        return sum(self.cost_per_hour[n] * min(1.0, u) for n, u in self.utilization.items())

    def percentile(self, what: str, q: float, *, unanswered: bool = False) -> float:
        """Seconds; ``what``: ``ttft`` or ``e2e``. Over answered requests; with ``unanswered``, over every
        request, one without an answer (rejected, failed) counting as never answered (infinite)."""
        values = sorted(v for j in self.jobs if (v := j.ttft_s if what == "ttft" else j.e2e_s) is not None)
        missing = len(self.jobs) - len(values) if unanswered else 0
        if not values:
            return float("inf") if missing else float("nan")
        n = len(values) + missing
        rank = min(n - 1, int(q * n))
        return values[rank] if rank < len(values) else float("inf")

    @property
    def unanswered(self) -> int:
        """Requests that never got a first token (rejected or failed before it), all counted as missed."""
        return sum(j.first_token_s is None for j in self.jobs)

    def prediction_errors(self, what: str) -> list[float]:
        """Absolute errors, as shares of what happened, of the router's prediction at its decision
        against the ground truth, for every answered request it placed with a prediction. ``what``:
        ``ttft``, ``e2e`` (as predicted, output length unknown) or ``e2e_known`` (the predicted TTFT and
        time per token with the answer's true length: the timing error alone)."""
        out = []
        for j in self.jobs:
            ttft, e2e = j.ttft_s, j.e2e_s
            if j.predicted_ttft_ms is None or ttft is None or e2e is None:
                continue
            if what == "ttft":
                predicted, actual = j.predicted_ttft_ms, ttft * 1000
            elif what == "e2e":
                predicted, actual = j.predicted_e2e_ms or 0.0, e2e * 1000
            else:
                tpot = j.predicted_tpot_ms or 0.0
                predicted, actual = j.predicted_ttft_ms + tpot * (j.request.output_tokens - 1), e2e * 1000
            if actual > 0:
                out.append(abs(predicted - actual) / actual)
        return out

    @property
    def utilization(self) -> dict[str, float]:
        """Busy time over the arrival window (above 100% when a backlog drains after it)."""
        return {name: busy / self.span_s for name, busy in self.busy_s.items()}

    @property
    def busy_cost(self) -> float:
        """GPU cost of the time backends were working (what a fleet that scales idle capacity away pays)."""
        return sum(self.cost_per_hour[n] * busy / 3600 for n, busy in self.busy_s.items())

    @property
    def fleet_cost(self) -> float:
        """GPU cost of keeping every backend up for the whole run (the same for every policy)."""
        return sum(c * self.span_s / 3600 for c in self.cost_per_hour.values())


def assign_models(requests: Sequence[SimRequest], shares: Sequence[tuple[str, float]], seed: int) -> list[str]:
    """A model for each request, drawn from ``shares`` with its own seeded generator."""
    rng = random.Random(seed ^ 0x5EED)
    names = [name for name, _ in shares]
    weights = [share for _, share in shares]
    return [rng.choices(names, weights)[0] for _ in requests] if len(names) > 1 else [names[0]] * len(requests)


class _Run:
    """One replay: the event queue, the fleet's engines and the gateway's views of them, the policy."""

    def __init__(self, fleet: SimFleet, policy: Policy) -> None:
        self.fleet = fleet
        self.policy = policy
        self.engines = fleet.engines()
        self.views = {e.name: BackendView(e) for e in self.engines}
        self.by_model: dict[str, list[BackendView]] = {}
        for v in self.views.values():
            self.by_model.setdefault(v.engine.model.name, []).append(v)
        self.events: list[tuple[float, int, int, object]] = []
        self.serial = 0
        self.epochs = {e.name: 0 for e in self.engines}
        """Bumped when an outage wipes an engine: steps planned before it are dropped."""

    def schedule(self, at: float, kind: int, payload: object) -> None:
        self.serial += 1
        heapq.heappush(self.events, (at, self.serial, kind, payload))

    def kick(self, engine: SimEngine, now: float) -> None:
        if engine.stepping or not engine.up:
            return
        duration = engine.start_step(now)
        if engine.shed:
            view = self.views[engine.name]
            for job in engine.shed:
                view.in_flight -= 1
                view.prefill_backlog -= job.backlog_tokens
                self.policy.finished(job, view)
            engine.shed.clear()
        if duration is not None:
            self.schedule(now + duration, _STEP, (engine, self.epochs[engine.name], duration))

    def dispatch(self, job: Job, now: float) -> None:
        candidates = [v for v in self.by_model.get(job.model, ()) if v.engine.up and v.engine.fits(job)]
        job.expected_cached = 0
        choice = self.policy.pick(job, candidates) if candidates else None
        if choice is None:
            job.rejected = True
            job.failure = job.failure or "no_backend"  # a policy that refuses says why first
            return
        choice.in_flight += 1
        job.backlog_tokens = job.request.prompt_tokens - job.expected_cached
        choice.prefill_backlog += job.backlog_tokens
        choice.engine.submit(job, now)
        self.kick(choice.engine, now)

    def stepped(self, engine: SimEngine, epoch: int, duration: float, now: float) -> None:
        if epoch != self.epochs[engine.name]:
            return  # planned before an outage wiped the engine
        result = engine.end_step(now, duration)
        view = self.views[engine.name]
        for job in result.first_tokens:
            view.prefill_backlog -= job.backlog_tokens
        for job in result.finished:
            view.in_flight -= 1
            self.policy.finished(job, view)
        engine.stepping = False
        self.kick(engine, now)

    def poll(self, now: float, end: float) -> None:
        for v in self.views.values():
            v.polled = (v.engine.running, len(v.engine.waiting)) if v.engine.up else None
            v.polled_kv = v.engine.kv_usage if v.engine.up else 1.0
            v.in_flight_at_poll = v.in_flight
        if now < end:
            self.schedule(now + self.fleet.poll_s, _POLL, None)

    def down(self, name: str, now: float) -> None:
        view = self.views[name]
        self.epochs[name] += 1
        lost = view.engine.take_down()
        view.in_flight -= len(lost)
        view.prefill_backlog = 0
        for job in lost:
            if job.first_token_s is None:
                self.dispatch(job, now)  # failover: nothing was sent to the client yet
            else:
                job.failed = True
                job.failure = "lost"

    def replay(self, jobs: list[Job], end: float) -> None:
        for job in jobs:
            self.schedule(job.request.arrival_s, _ARRIVAL, job)
        for outage in self.fleet.outages:
            self.schedule(outage.start_s, _DOWN, outage.backend)
            self.schedule(outage.end_s, _UP, outage.backend)
        self.schedule(0.0, _POLL, None)
        while self.events:
            now, _, kind, payload = heapq.heappop(self.events)
            if kind == _ARRIVAL:
                assert isinstance(payload, Job)
                self.dispatch(payload, now)
            elif kind == _STEP:
                engine, epoch, duration = cast(tuple[SimEngine, int, float], payload)
                self.stepped(engine, epoch, duration, now)
            elif kind == _POLL:
                self.poll(now, end)
            elif kind == _DOWN:
                self.down(str(payload), now)
            elif kind == _UP:
                self.views[str(payload)].engine.up = True


def simulate(fleet: SimFleet, requests: Sequence[SimRequest], models: Sequence[str], policy: Policy) -> Result:
    """Replay ``requests`` (``models[i]`` is request i's model) through ``policy``, a fresh instance
    (policies learn as they go), on a fresh copy of the fleet."""
    run = _Run(fleet, policy)
    jobs = [Job(r, m) for r, m in zip(requests, models, strict=True)]
    end = max((r.arrival_s for r in requests), default=0.0)
    run.replay(jobs, end)
    return Result(
        policy=policy.name,
        jobs=tuple(jobs),
        span_s=end if end > 0 else 1.0,
        busy_s={e.name: e.busy_s for e in run.engines},
        cost_per_hour={e.name: e.profile.cost_per_hour for e in run.engines},
    )


def backend_capacity_rps(engine: SimEngine, prompt: float, out: float, prefill_share: float = 1.0) -> float:
    """Requests per second one backend sustains at best on requests of these mean sizes.

    In a steady state at batch B every step decodes B tokens and prefills B x prompt / out prompt
    tokens (each prompt once per answer), at most a chunk per step; the best B (up to the slots and
    the KV cache) gives the capacity.
    """
    limit = max(1, min(engine.max_batch, int(engine.kv_tokens / (prompt + out))))
    best = 0.0
    batch = 1
    fresh = prompt * prefill_share  # cached tokens are not prefilled, but take KV and are read by every decode step
    while True:
        prefill = min(PREFILL_CHUNK_TOKENS, batch * fresh / out)
        ms = engine.clock.mean_ms(batch, batch * (prompt + out / 2), prefill)
        best = max(best, min(batch / out, prefill / fresh) / (ms / 1000))
        if batch >= limit:
            return best
        batch = min(limit, batch * 2)


def capacity_rps(
    fleet: SimFleet, requests: Sequence[SimRequest], models: Sequence[str], prefill_share: float = 1.0
) -> float:
    """The request rate at which this fleet saturates on this workload (an estimate): per model, the
    sum of its backends' capacities on the model's mean request; the fleet's, the smallest ratio of a
    model's capacity to its share of the requests. ``prefill_share``: the share of prompt tokens
    that must be prefilled (1 - what caches reuse)."""
    total = len(requests)
    fleet_capacity = float("inf")
    for model in sorted(set(models)):
        mine = [r for r, m in zip(requests, models, strict=True) if m == model]
        prompt = sum(r.prompt_tokens for r in mine) / len(mine)
        out = sum(r.output_tokens for r in mine) / len(mine)
        capacity = sum(
            backend_capacity_rps(e, prompt, out, prefill_share) for e in fleet.engines() if e.model.name == model
        )
        fleet_capacity = min(fleet_capacity, capacity / (len(mine) / total))
    return fleet_capacity
