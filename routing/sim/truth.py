"""The simulated engines' clock: how long an engine step really takes, independent of the router's model.

The router predicts with ``routing.estimator`` (its own priors, corrected online by what it observes).
If the simulated engines ran on that formula, or on one with the same shape and constants, the router
would be graded against its own guess. This module is the simulator's ground truth instead: it starts
from the per-family physics fitted to published engine numbers (``routing.sim.calibration.step_ms``,
see ``benchmarks/results/calibration.md``) and adds what the estimator does not model:

- **Per-sequence cost that makes batching saturate.** Every sequence in a step costs scheduler,
  sampler and per-sequence kernel time (``SEQ_OVERHEAD_MS``), so throughput stops growing with the
  batch well before the FLOP bound. Source: the calibration's residuals, where the fitted sum
  over-predicts throughput at the largest published batches (TensorRT-LLM v0.6.1 rows trt061-5, -6
  and -8, batch 64-1024: +25% to +82%) while it fits batch 1 within about 10-30%; and vLLM's v0.6.0
  performance post (September 2024), which measured the CPU side (scheduling, sampling, detokenising)
  as the larger part of a step for an 8B model on an H100. 0.01 ms a sequence is +2.6 ms at batch 256
  (about +10% on a 7B step there) and +10 ms at batch 1024: an estimate of that order, not a fit.
- **Prefill/decode interference.** A step that prefills a chunk while decoding takes longer than the
  two parts apart: the prefill's long GEMMs and the decode's attention kernels compete for the SMs
  and the decode tokens wait for the chunk (Sarathi-Serve, Agrawal et al., OSDI'24; DistServe, Zhong
  et al., OSDI'24, both show decode latency rising with a prefill in the batch). ``INTERFERENCE``:
  the share of the smaller part added on top; 0.25 is an assumption of that order, not a fit.
- **Per-instance hidden speed.** Instances of the same GPU and engine differ: Sinha et al., "Not All
  GPUs Are Created Equal" (SC'22) measured spreads of the order of 10-20% between GPUs of one model
  in one cluster, and the published rows of one engine and GPU scatter about the fitted model by a
  median 10-19% (calibration.md). Each instance draws a fixed factor within ``SPEED_SPREAD`` (+-12%),
  seeded by the run's seed and the instance's name, that no configuration states: the router finds
  it only by observing.
- **Step noise.** Every step's time is multiplied by a seeded lognormal draw of mean 1 and
  ``NOISE_SIGMA`` 0.08 (garbage collection, host jitter, kernel-time variance). An assumption: the
  published numbers are averages and say nothing of the spread.

The estimator, by contrast, predicts prefill and decode apart with its own catalog priors, no
per-sequence cost, no interference, no per-instance factor and no noise: it must learn the rest
online (``routing.estimator.observe``), as the gateway does in production.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from routing.sim.calibration import EnginePerf, step_ms
from routing.types import BackendProfile, ModelSpec

SEQ_OVERHEAD_MS = 0.01
"""Milliseconds per sequence in a step (scheduling, sampling, per-sequence kernels); see the module notes."""
INTERFERENCE = 0.25
"""Share of the smaller of a mixed step's prefill and decode parts added for their interference."""
SPEED_SPREAD = 0.12
"""Each instance's hidden time factor is drawn uniformly within 1 +- this."""
NOISE_SIGMA = 0.08
"""Standard deviation of the log of each step's time factor (mean 1)."""


@dataclass(frozen=True, slots=True)
class Truth:
    """How the simulated engines depart from the fitted physics; ``EXACT`` is the physics alone."""

    seed: int = 0
    seq_overhead_ms: float = SEQ_OVERHEAD_MS
    interference: float = INTERFERENCE
    speed_spread: float = SPEED_SPREAD
    noise_sigma: float = NOISE_SIGMA

    def clock(self, perf: EnginePerf, profile: BackendProfile, model: ModelSpec) -> StepClock:
        return StepClock(self, perf, profile, model)


EXACT = Truth(seq_overhead_ms=0.0, interference=0.0, speed_spread=0.0, noise_sigma=0.0)
"""The fitted physics alone (``calibration.step_ms``): for tests of the engine's mechanics."""


class StepClock:
    """One engine instance's step times: its hidden speed fixed at creation, its noise drawn per step."""

    def __init__(self, truth: Truth, perf: EnginePerf, profile: BackendProfile, model: ModelSpec) -> None:
        self.truth = truth
        self._perf = perf
        self._profile = profile
        self._model = model
        # A string seed hashes the same in every process (unlike hash()), so runs repeat exactly.
        draw = random.Random(f"speed:{truth.seed}:{profile.name}")
        self.speed = 1.0 + truth.speed_spread * (2 * draw.random() - 1)
        """This instance's hidden time factor (above 1: slower than its kind)."""
        self._noise = random.Random(f"noise:{truth.seed}:{profile.name}")
        self._mu = -(truth.noise_sigma**2) / 2  # a lognormal of mean 1

    def _physics(self, batch: int, ctx_tokens: float, prefill_tokens: float) -> float:
        p, m = self._profile, self._model
        return step_ms(
            self._perf, p.gpu, p.gpu_count, m.params_b, m.bytes_per_param, m.kv_bytes_per_token, batch, ctx_tokens,
            prefill_tokens,
        )  # fmt: skip

    def mean_ms(self, batch: int, ctx_tokens: float, prefill_tokens: float) -> float:
        """A step's time without noise: physics, per-sequence cost, interference, this instance's speed."""
        t = self.truth
        total = self._physics(batch, ctx_tokens, prefill_tokens)
        if batch and prefill_tokens and t.interference:
            decode = self._physics(batch, ctx_tokens, 0)
            prefill = total - decode
            total += t.interference * min(prefill, decode - self._perf.step_overhead_ms)
        return (total + t.seq_overhead_ms * batch) * self.speed

    def step_ms(self, batch: int, ctx_tokens: float, prefill_tokens: float) -> float:
        """A step's time as it happens: the mean times a fresh noise draw."""
        mean = self.mean_ms(batch, ctx_tokens, prefill_tokens)
        sigma = self.truth.noise_sigma
        return mean * math.exp(self._noise.gauss(self._mu, sigma)) if sigma else mean
