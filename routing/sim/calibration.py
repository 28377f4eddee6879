"""How fast a simulated engine instance is by the physics fitted per engine family: the base of the ground truth.

The routing estimator has its own priors (``routing.catalog.ENGINES``) and learns from what it
observes; the simulator must not reuse them, or the policy would be graded against its own guess.
The constants here were fitted by ``benchmarks/calibration.py`` to the published numbers in
``data/published_engine_numbers.csv``; ``benchmarks/results/calibration.md`` shows every row used,
measured against modelled, and the rows left out with the reason. The simulated engines run on
``routing.sim.truth``, which adds what neither this fit nor the estimator models (per-sequence cost,
prefill/decode interference, hidden per-instance speeds, step noise).

One engine iteration (continuous batching) runs the model once over every token scheduled in it:
one new token for each decoding sequence plus the prompt tokens being prefilled. Its time is

    step = overhead + weights / bandwidth + KV cache / bandwidth + 2 x params x tokens / FLOP/s

- Reading the weights: once per iteration, whatever the batch; it bounds small decode batches.
- Reading the KV cache of every decoding sequence (attention runs as separate kernels).
- The matrix multiplications' FLOPs for every token in the iteration, decode tokens included:
  at batch 768 (7B, FP8, H100) they take three to four times as long as the weight read.
- ``overhead``: what neither bandwidth nor FLOPs explain (scheduling, kernel launches, sampling,
  host synchronisation; with tensor parallelism also the all-reduce latency).

A sum rather than the roofline's max(memory, FLOPs): kernels never overlap loads and math fully,
and on the published rows the sum fits as well or better (TensorRT-LLM squared-log loss 1.83 against
2.18 for ``max(weights, FLOPs) + KV`` and 3.10 for ``max(weights + KV, FLOPs)``) with plausible
constants, where the max forms need MBU 0.94-1.0 and 7-8.5 ms of overhead to make up the time they
leave out. Counting the decode tokens' FLOPs matters: without them the loss doubles (3.86).

Peak figures are scaled by the family's MFU (share of peak FLOP/s reached) and MBU (share of peak
bandwidth reached). N GPUs in tensor parallel act as ``N x tp_eff ** log2(N)`` GPUs: each doubling
keeps only ``tp_eff`` of the ideal gain because of the all-reduces between layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from routing.catalog import GPUS, GpuSpec


@dataclass(frozen=True, slots=True)
class EnginePerf:
    """Fitted efficiency of one engine family."""

    family: str
    mfu: float
    """Share of the GPU's peak tensor FLOP/s reached by the matrix multiplications."""
    mbu: float
    """Share of the peak memory bandwidth reached reading weights and KV cache."""
    step_overhead_ms: float
    """Fixed time per engine iteration."""
    tp_eff: float
    """Share of the ideal speed-up kept per doubling of tensor-parallel GPUs."""


# Fitted by benchmarks/calibration.py; tests/unit/test_sim_calibration.py checks that the fit still gives these.
# tgi and mii have no usable published rows: derived from vllm there, with the reasons.
PERF: dict[str, EnginePerf] = {
    p.family: p
    for p in (
        EnginePerf("trtllm", mfu=0.6788, mbu=0.8982, step_overhead_ms=4.291, tp_eff=0.8098),
        EnginePerf("vllm", mfu=0.5115, mbu=0.8445, step_overhead_ms=2.158, tp_eff=0.8098),
        EnginePerf("tgi", mfu=0.4348, mbu=0.8445, step_overhead_ms=2.158, tp_eff=0.8098),
        EnginePerf("mii", mfu=0.5115, mbu=0.8445, step_overhead_ms=2.158, tp_eff=0.8098),
        EnginePerf("llamacpp_gpu", mfu=0.2235, mbu=0.6845, step_overhead_ms=3.936, tp_eff=0.6),
        EnginePerf("cpu", mfu=0.5077, mbu=0.9031, step_overhead_ms=11.91, tp_eff=0.9),
    )
}

EXTRA_HARDWARE: dict[str, GpuSpec] = {
    h.name: h
    for h in (
        # Datasheet figures: dense FP16/BF16 tensor TFLOP/s with FP32 accumulation (FP8 runs at twice that).
        GpuSpec("L40S", 48, 864, 362),
        GpuSpec("H100-PCIe", 80, 2000, 756),
        # GeForce cards accumulate FP16 products in FP32 at half the FP16-accumulate rate (330).
        GpuSpec("RTX-4090", 24, 1008, 165),
        # Benchmark hosts of the CPU rows. Bandwidth: channels x 8 bytes x MT/s. TFLOP/s: FP32 FMA peak
        # at all-core clocks (llama.cpp's quantized dot products run on the same vector units).
        GpuSpec("i9-13900K", 0, 102.4, 2.5),  # DDR5-6400 dual channel; 8 P-cores AVX2 + 16 E-cores
        GpuSpec("Xeon-W-3245", 0, 140.8, 3.3),  # Mac Pro 2019 16-core: DDR4-2933 six channels, AVX-512
        GpuSpec("i7-7820HQ", 0, 38.4, 0.44),  # laptop: DDR4-2400 dual channel, 4 cores AVX2
    )
}
"""Hardware the published rows ran on that ``routing.catalog.GPUS`` does not list."""

_FAMILY_OF_ENGINE = {
    "trtllm_serve": "trtllm",
    "triton_trtllm": "trtllm",
    "vllm": "vllm",
    "tgi": "tgi",
    "tgi_messages": "tgi",
    "mii_rest": "mii",
    "mii_openai": "mii",
    "llama_server": "llamacpp_gpu",
    "llama_cpp": "llamacpp_gpu",
    # CTranslate2 on a GPU: an in-process engine without paged attention, closest to llama.cpp's.
    "ctranslate2": "llamacpp_gpu",
}


def hardware(name: str) -> GpuSpec:
    """A GPU (or CPU host) by name: the routing catalog first, then ``EXTRA_HARDWARE``."""
    spec = GPUS.get(name) or EXTRA_HARDWARE.get(name)
    if spec is None:
        raise KeyError(f"unknown hardware {name!r}")
    return spec


def family_for_engine(engine_kind: str, gpu_name: str = "") -> str:
    """The engine family whose constants simulate ``engine_kind`` (a ``routing.catalog.ENGINES`` key).

    Every engine on the catalog's ``"CPU"`` pseudo-GPU is simulated as llama.cpp on a CPU.
    """
    if engine_kind not in _FAMILY_OF_ENGINE:
        raise ValueError(f"unknown engine kind {engine_kind!r}")
    if gpu_name == "CPU":
        return "cpu"
    return _FAMILY_OF_ENGINE[engine_kind]


def effective_gpus(perf: EnginePerf, gpu_count: int) -> float:
    """What ``gpu_count`` GPUs in tensor parallel are worth in single GPUs."""
    if gpu_count < 1:
        raise ValueError(f"gpu_count must be at least 1, got {gpu_count}")
    return gpu_count * float(perf.tp_eff ** math.log2(gpu_count))


def step_ms(
    perf: EnginePerf,
    gpu: GpuSpec,
    gpu_count: int,
    params_b: float,
    bytes_per_param: float,
    kv_bytes_per_token: float,
    batch: int,
    ctx_tokens: float,
    prefill_tokens: float,
    *,
    fp8: bool = False,
) -> float:
    """Milliseconds for one engine iteration.

    ``batch``: sequences decoding one token in this iteration (not counting prompts being
    prefilled); ``ctx_tokens``: their total context (prompt plus tokens generated so far), whose KV
    cache is read; ``prefill_tokens``: prompt tokens processed in this iteration (their attention
    FLOPs are left out: small next to the weights' for prompts up to a few thousand tokens).
    ``fp8``: weights and activations in FP8, so the tensor cores run at twice the FP16 rate
    (``bytes_per_param`` then is 1).
    """
    gpus = effective_gpus(perf, gpu_count)
    bandwidth = gpu.bandwidth_gbs * 1e9 * gpus * perf.mbu
    flops = gpu.tflops * 1e12 * (2 if fp8 else 1) * gpus * perf.mfu
    memory_s = (params_b * 1e9 * bytes_per_param + kv_bytes_per_token * ctx_tokens) / bandwidth
    matmul_s = 2 * params_b * 1e9 * (batch + prefill_tokens) / flops
    return perf.step_overhead_ms + (memory_s + matmul_s) * 1000
