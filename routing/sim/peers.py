"""The strongest routers enginegate is measured against, as their projects document them.

- ``power_of_two``: two backends drawn at random, the one with fewer requests in flight
  (Mitzenmacher's power of two choices; Envoy's and Linkerd's least-request balancers).
- ``jsq_kv``: join the shortest queue, queues normalised by each backend's slots, and the KV
  cache use the engine last reported counted too: the larger of the two shares is the load.
- ``llm_d``: llm-d's inference scheduler: filter, then a weighted sum of scorers in [0, 1]: the
  prefix-cache scorer (share of the prompt's blocks its own approximate index of routed blocks
  expects on the backend), the queue scorer (fewer queued requests, min-max normalised) and the
  KV-cache-utilization scorer (1 - reported usage). Weights 2 : 1 : 1 here (llm-d's guides
  vary them).
- ``llm_d_slo``: its SLO-aware variant: a latency predictor learned online per backend (here a
  linear model of TTFT on uncached prompt tokens and queue length, fitted by gradient steps on
  every finished request) picks, among backends predicted to meet the request's first-token
  budget, the best-scoring one; if none is, the one predicted fastest.
- ``sglang``: SGLang's cache-aware router: an approximate radix tree of what it sent each
  worker (here the same LRU of chained blocks, bounded by the worker's KV capacity); when the
  load is imbalanced (max - min in-flight above ``balance_abs_threshold`` 32 and max above
  ``balance_rel_threshold`` 1.0001 x min) the least loaded worker; else the worker with the
  longest prefix match if it covers more than ``cache_threshold`` 0.5 of the prompt, else the
  worker whose tree is smallest. Those are sglang-router's defaults.

Every policy sees what the gateway would: its own in-flight counts at once, engine gauges as
of the last poll, and nothing of the engines' caches but what it sent them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from routing.estimator import kv_capacity_tokens
from routing.prefix import PrefixIndex
from routing.sim.engine import Job
from routing.sim.policies import BackendView, Policy


def _current(v: BackendView) -> float:
    """Requests on the backend now: its last report moved by this router's own sends and finishes."""
    if v.polled is None:
        return float(v.in_flight)
    running, waiting = v.polled
    return float(max(v.in_flight, running + waiting + v.in_flight - v.in_flight_at_poll))


class PowerOfTwo:
    name = "power_of_two"

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed ^ 0x92)

    def pick(self, job: Job, views: Sequence[BackendView]) -> BackendView:
        if len(views) == 1:
            return views[0]
        a, b = self._rng.sample(list(views), 2)
        return a if a.in_flight <= b.in_flight else b

    def finished(self, job: Job, view: BackendView) -> None:
        pass


class ShortestQueueKv:
    name = "jsq_kv"

    def pick(self, job: Job, views: Sequence[BackendView]) -> BackendView:
        return min(views, key=lambda v: (max(_current(v) / v.engine.max_batch, v.polled_kv), v.name))

    def finished(self, job: Job, view: BackendView) -> None:
        pass


class _RoutedBlocks:
    """What a router sent each backend: one LRU of chained blocks per backend, bounded by its KV capacity."""

    def __init__(self) -> None:
        self._indexes: dict[str, PrefixIndex] = {}

    def of(self, v: BackendView) -> PrefixIndex:
        index = self._indexes.get(v.name)
        if index is None:
            index = self._indexes[v.name] = PrefixIndex(kv_capacity_tokens(v.engine.model, v.engine.profile))
        return index

    def sent(self, job: Job, v: BackendView) -> None:
        r = job.request
        if r.blocks:
            self.of(v).add(r.blocks, r.block_tokens)


class LlmD:
    name = "llm_d"
    WEIGHTS = (2.0, 1.0, 1.0)
    """Prefix, queue, KV-cache utilization."""

    def __init__(self) -> None:
        self._blocks = _RoutedBlocks()

    def scores(self, job: Job, views: Sequence[BackendView]) -> dict[str, float]:
        r = job.request
        queues = {v.name: _current(v) for v in views}
        low, high = min(queues.values()), max(queues.values())
        wp, wq, wk = self.WEIGHTS
        out = {}
        for v in views:
            prefix = self._blocks.of(v).match(r.blocks) / len(r.blocks) if r.blocks else 0.0
            queue = 1.0 if high == low else (high - queues[v.name]) / (high - low)
            out[v.name] = wp * prefix + wq * queue + wk * (1 - v.polled_kv)
        return out

    def pick(self, job: Job, views: Sequence[BackendView]) -> BackendView:
        scores = self.scores(job, views)
        choice = max(views, key=lambda v: (scores[v.name], -_current(v)))
        self._blocks.sent(job, choice)
        return choice

    def finished(self, job: Job, view: BackendView) -> None:
        pass


class LlmDSlo(LlmD):
    """TTFT ~ a + b x uncached prompt tokens + c x queue, per backend, by normalised gradient steps."""

    name = "llm_d_slo"
    RATE = 0.05
    TOKEN_SCALE = 1000.0
    QUEUE_SCALE = 10.0

    def __init__(self) -> None:
        super().__init__()
        self._model: dict[str, list[float]] = {}
        self._features: dict[int, tuple[float, float, float]] = {}

    def _x(self, job: Job, v: BackendView) -> tuple[float, float, float]:
        r = job.request
        cached = self._blocks.of(v).match(r.blocks) * r.block_tokens if r.blocks else 0
        return 1.0, (r.prompt_tokens - cached) / self.TOKEN_SCALE, _current(v) / self.QUEUE_SCALE

    def predict_ms(self, job: Job, v: BackendView) -> float:
        w = self._model.get(v.name, [0.0, 0.0, 0.0])
        return sum(wi * xi for wi, xi in zip(w, self._x(job, v), strict=True))

    def pick(self, job: Job, views: Sequence[BackendView]) -> BackendView:
        predicted = {v.name: self.predict_ms(job, v) for v in views}
        budget = job.request.ttft_budget_ms
        meeting = [v for v in views if budget is None or predicted[v.name] <= budget]
        if meeting:
            scores = self.scores(job, meeting)
            choice = max(meeting, key=lambda v: (scores[v.name], -predicted[v.name]))
        else:
            choice = min(views, key=lambda v: predicted[v.name])
        self._features[id(job)] = self._x(job, choice)
        self._blocks.sent(job, choice)
        return choice

    def finished(self, job: Job, view: BackendView) -> None:
        x = self._features.pop(id(job), None)
        if x is None or job.ttft_s is None:
            return
        w = self._model.setdefault(view.name, [0.0, 0.0, 0.0])
        error = job.ttft_s * 1000 - sum(wi * xi for wi, xi in zip(w, x, strict=True))
        norm = sum(xi * xi for xi in x)
        for i, xi in enumerate(x):
            w[i] += self.RATE * error * xi / norm


class SglangCacheAware:
    name = "sglang"
    CACHE_THRESHOLD = 0.5
    BALANCE_ABS = 32
    BALANCE_REL = 1.0001

    def __init__(self) -> None:
        self._blocks = _RoutedBlocks()

    def pick(self, job: Job, views: Sequence[BackendView]) -> BackendView:
        loads = {v.name: v.in_flight for v in views}
        low, high = min(loads.values()), max(loads.values())
        r = job.request
        imbalanced = high - low > self.BALANCE_ABS and high > self.BALANCE_REL * low
        if imbalanced or not r.blocks:
            choice = min(views, key=lambda v: (loads[v.name], v.name))
        else:
            matched = {v.name: self._blocks.of(v).match(r.blocks) for v in views}
            best = max(views, key=lambda v: (matched[v.name], -loads[v.name]))
            if matched[best.name] / len(r.blocks) > self.CACHE_THRESHOLD:
                choice = best
            else:
                choice = min(views, key=lambda v: (self._blocks.of(v).tokens, loads[v.name], v.name))
        self._blocks.sent(job, choice)
        return choice

    def finished(self, job: Job, view: BackendView) -> None:
        pass


def strong_peers(seed: int) -> list[Policy]:
    return [PowerOfTwo(seed), ShortestQueueKv(), LlmD(), LlmDSlo(), SglangCacheAware()]
