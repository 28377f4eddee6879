"""One simulated engine instance: a queue in front of continuous batching.

Each iteration (an engine "step") decodes one token for every running sequence and
prefills up to ``PREFILL_CHUNK`` prompt tokens of sequences still reading their
prompt (chunked prefill, as vLLM, TensorRT-LLM and TGI schedule it); how long a
step takes comes from the instance's ``truth.StepClock`` (the physics fitted to published numbers
plus what the router's estimator does not model: per-sequence cost, interference, a hidden
per-instance speed and noise). A
sequence's first token comes out of the step that finishes its prompt. Admission
is FIFO while the batch has a free slot and the KV cache can hold the sequence's
prompt and whole answer (reserved up front: no preemption, which keeps the model
simple and only errs on the side of queueing). Taking a backend down fails what
it holds. Admission, when the fleet has it (``max_wait_s``), is the same for every routing policy: a
request still queued ``max_wait_s`` after it reached the engine (waiting, or holding a slot with no
prefill chunk yet) is shed (the client's 503).

Prefix cache: requests that carry prompt blocks find the longest run of leading
blocks the instance holds (an LRU bounded by its KV capacity in tokens, the same
structure as the gateway's own estimate, ``routing.prefix.PrefixIndex``) and
prefill only the rest; their blocks join the cache at admission.

Cost per step is O(log n) in the batch: decoding sequences wait in a heap keyed by
the step they finish at, and the batch's total context grows by the batch size
each step, so nothing walks the whole batch.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from routing.catalog import PREFILL_CHUNK_TOKENS
from routing.prefix import PrefixIndex
from routing.sim.calibration import PERF, EnginePerf, family_for_engine
from routing.sim.truth import EXACT, Truth
from routing.sim.workload import SimRequest
from routing.types import BackendProfile, ModelSpec

PREFILL_CHUNK = PREFILL_CHUNK_TOKENS
"""Prompt tokens per step: the engines' default token budget per iteration (an engine setting, so the
routing catalog and the simulator share it)."""


FAILURES = {
    "shed": "shed by admission (queued past the fleet's limit, the same for every policy: 503)",
    "hopeless": "shed by enginegate's policy as predicted hopeless (over its shed ratio of the budget everywhere: 503)",
    "strict_429": "refused in strict mode (no backend can meet its budget: 429)",
    "no_backend": "no backend (none up, serving its model, or holding it)",
    "lost": "lost mid-answer (its backend went down after the first token)",
}
"""Why a simulated request got no answer, as the gateway would tell its client."""


@dataclass(slots=True, eq=False)
class Job:
    """A request on its way through the fleet, with what happened to it."""

    request: SimRequest
    model: str
    backend: str = ""
    attempts: int = 0
    first_token_s: float | None = None
    done_s: float | None = None
    failed: bool = False
    rejected: bool = False
    failure: str = ""
    """Why it got no answer: a ``FAILURES`` key (empty while it has one or is still on its way)."""
    prefill_left: int = 0
    finish_step: int = 0
    queued_s: float = 0.0
    """When it joined its backend's queue (admission measures the wait from here)."""
    predicted_ttft_ms: float | None = None
    """What the router predicted at its decision (enginegate's policies only), as are the next two."""
    predicted_tpot_ms: float | None = None
    predicted_e2e_ms: float | None = None
    prior_ttft_ms: float | None = None
    cached_tokens: int = 0
    """Prompt tokens the engine found in its prefix cache (known at admission)."""
    expected_cached: int = 0
    """Prompt tokens the router expected its backend to hold (set by the policy that placed it)."""
    backlog_tokens: int = 0
    """Prompt tokens the router counted as waiting for prefill on its backend."""
    ages: list[float] = field(default_factory=list)
    """What the router expected cached, as block ages (``PrefixIndex.ages``), to judge the engine's report."""

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.request.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.done_s is None else self.done_s - self.request.arrival_s

    @property
    def within_budget(self) -> bool:
        r = self.request
        if self.failed or self.rejected or self.done_s is None or self.first_token_s is None:
            return False
        ttft_ok = r.ttft_budget_ms is None or (self.first_token_s - r.arrival_s) * 1000 <= r.ttft_budget_ms
        e2e_ok = r.latency_budget_ms is None or (self.done_s - r.arrival_s) * 1000 <= r.latency_budget_ms
        return ttft_ok and e2e_ok


@dataclass(slots=True)
class StepResult:
    """What one finished step produced: sequences that got their first token and those that finished."""

    first_tokens: list[Job] = field(default_factory=list)
    finished: list[Job] = field(default_factory=list)


class SimEngine:
    def __init__(
        self, profile: BackendProfile, model: ModelSpec, perf: EnginePerf | None = None, truth: Truth = EXACT,
        max_wait_s: float | None = None,
    ) -> None:  # fmt: skip
        """``max_wait_s``: shed what has queued this long (None: everything waits its turn)."""
        self.profile = profile
        self.model = model
        self.perf = perf or PERF[family_for_engine(profile.engine, profile.gpu.name)]
        self.clock = truth.clock(self.perf, profile, model)
        self.max_wait_s = max_wait_s
        self.shed: list[Job] = []
        """Shed by the last ``start_step``: the run collects them."""
        self.name = profile.name
        self.max_batch = profile.max_concurrency
        free = profile.usable_bytes - model.weight_bytes
        self.kv_tokens = max(0, int(free / model.kv_bytes_per_token))
        self.cache = PrefixIndex(self.kv_tokens)
        self.up = True
        self.waiting: deque[Job] = deque()
        self.prefilling: list[Job] = []
        self._decoding: list[tuple[int, int, Job]] = []
        self._ctx = 0
        """Total context of the decoding sequences."""
        self._kv_used = 0
        self._step = 0
        self.busy_s = 0.0
        self.stepping = False
        self._planned: list[tuple[Job, int]] = []
        self._serial = 0

    @property
    def running(self) -> int:
        return len(self.prefilling) + len(self._decoding)

    @property
    def kv_usage(self) -> float:
        """Share of the KV cache the running sequences reserve (what engines report as usage)."""
        return self._kv_used / self.kv_tokens if self.kv_tokens else 1.0

    def fits(self, job: Job) -> bool:
        """Whether the KV cache could ever hold this request (else it can only fail here)."""
        return self._need(job) <= self.kv_tokens

    def _need(self, job: Job) -> int:
        return job.request.prompt_tokens + job.request.output_tokens

    def submit(self, job: Job, now: float = 0.0) -> None:
        job.backend = self.name
        job.attempts += 1
        job.queued_s = now
        self.waiting.append(job)

    def _expire(self, now: float) -> None:
        """Shed what has queued past ``max_wait_s``: in the queue, or holding a slot without a prefill
        chunk yet (vLLM keeps those in its waiting queue; this model gives them a slot at once)."""
        limit = self.max_wait_s
        if limit is None:
            return
        # Both lists are in order of queued_s, so the expired are at the head of the queue and at the
        # head of the prompts not yet started (the chunk budget goes to the oldest prompts first).
        while self.waiting and now - self.waiting[0].queued_s > limit:
            self._shed(self.waiting.popleft())
        i = 0
        while i < len(self.prefilling) and self._started(self.prefilling[i]):
            i += 1
        while i < len(self.prefilling) and now - self.prefilling[i].queued_s > limit:
            job = self.prefilling.pop(i)
            self._kv_used -= self._need(job)
            self._shed(job)

    @staticmethod
    def _started(job: Job) -> bool:
        return job.prefill_left < job.request.prompt_tokens - job.cached_tokens

    def _shed(self, job: Job) -> None:
        job.rejected = True
        job.failure = "shed"
        self.shed.append(job)

    def start_step(self, now: float = 0.0) -> float | None:
        """Plan the next step (at ``now``, after shedding what queued too long); its duration in seconds,
        or None when there is nothing to do."""
        self._expire(now)  # before admitting, so nothing expired joins the batch or the prefix cache
        while self.waiting and self.running < self.max_batch:
            job = self.waiting[0]
            if self._kv_used + self._need(job) > self.kv_tokens:
                break
            self.waiting.popleft()
            self._kv_used += self._need(job)
            r = job.request
            if r.blocks:
                job.cached_tokens = min(r.prompt_tokens - 1, self.cache.match(r.blocks) * r.block_tokens)
                self.cache.add(r.blocks, r.block_tokens)
            job.prefill_left = r.prompt_tokens - job.cached_tokens
            self.prefilling.append(job)
        if not self.prefilling and not self._decoding:
            self.stepping = False
            return None
        budget = PREFILL_CHUNK
        self._planned = []
        for job in self.prefilling:
            if budget <= 0:
                break
            take = min(job.prefill_left, budget)
            self._planned.append((job, take))
            budget -= take
        ms = self.clock.step_ms(len(self._decoding), self._ctx, PREFILL_CHUNK - budget)
        self.stepping = True
        return ms / 1000

    def end_step(self, now: float, duration_s: float) -> StepResult:
        """Apply the step planned by ``start_step`` (which took ``duration_s``), at time ``now``."""
        self.busy_s += duration_s
        self._step += 1
        self._ctx += len(self._decoding)  # every decoding sequence gained a token
        result = StepResult()
        while self._decoding and self._decoding[0][0] <= self._step:
            _, _, job = heapq.heappop(self._decoding)
            self._finish(job, now, result)
        done_prefill = []
        for job, take in self._planned:
            job.prefill_left -= take
            if job.prefill_left == 0:
                done_prefill.append(job)
        self._planned = []
        for job in done_prefill:
            self.prefilling.remove(job)
            job.first_token_s = now
            result.first_tokens.append(job)
            remaining = job.request.output_tokens - 1
            if remaining <= 0:
                self._finish_unqueued(job, now, result)
                continue
            job.finish_step = self._step + remaining
            self._ctx += job.request.prompt_tokens + 1
            self._serial += 1
            heapq.heappush(self._decoding, (job.finish_step, self._serial, job))
        return result

    def _finish(self, job: Job, now: float, result: StepResult) -> None:
        self._ctx -= job.request.prompt_tokens + job.request.output_tokens
        self._finish_unqueued(job, now, result)

    def _finish_unqueued(self, job: Job, now: float, result: StepResult) -> None:
        self._kv_used -= self._need(job)
        job.done_s = now
        result.finished.append(job)

    def take_down(self) -> list[Job]:
        """The backend fails: everything it holds is handed back (the caller fails or re-routes it)."""
        lost = [*self.waiting, *self.prefilling, *(job for _, _, job in self._decoding)]
        self.waiting.clear()
        self.prefilling.clear()
        self._decoding.clear()
        self._planned = []
        self._ctx = 0
        self._kv_used = 0
        self.cache = PrefixIndex(self.kv_tokens)  # a restarted engine starts cold
        self.up = False
        self.stepping = False
        return lost
