"""What routing knows before any traffic: GPUs, number formats, and how well engines use hardware.

GPU figures are the vendors' datasheet numbers (dense FP16/BF16 tensor throughput,
HBM bandwidth). Engine efficiencies are the fraction of peak FLOP/s reached in
prefill (MFU) and of peak bandwidth reached in decode (MBU); the defaults are
rough readings of published engine benchmarks (TensorRT-LLM's and vLLM's own
performance pages, TGI's and llama.cpp's community numbers) and are only priors:
observed latencies replace them per backend as traffic arrives. Every entry can
be overridden in the config file.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    memory_gb: float
    bandwidth_gbs: float
    tflops: float
    """Dense FP16/BF16 tensor TFLOP/s."""


GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec("A10G", 24, 600, 125),
        GpuSpec("L4", 24, 300, 121),
        GpuSpec("A100-40GB", 40, 1555, 312),
        GpuSpec("A100-80GB", 80, 2039, 312),
        GpuSpec("H100", 80, 3350, 989),
        GpuSpec("H200", 141, 4800, 989),
        # A server CPU socket: DDR5 bandwidth and AVX-512/AMX matrix throughput, memory from the backend.
        GpuSpec("CPU", 0, 100, 4),
    )
}

BYTES_PER_PARAM: dict[str, float] = {
    "fp32": 4,
    "fp16": 2,
    "bf16": 2,
    "fp8": 1,
    "int8": 1,
    "int4": 0.5,
    "awq": 0.5,
    "gptq": 0.5,
    "q8_0": 1.0625,
    "q6_k": 0.82,
    "q5_k_m": 0.71,
    "q4_k_m": 0.6,
    "q4_0": 0.5625,
}


@dataclass(frozen=True, slots=True)
class EngineEfficiency:
    prefill_mfu: float
    decode_mbu: float
    overhead_ms: float
    """Fixed cost per request: scheduling, tokenization, HTTP."""


ENGINES: dict[str, EngineEfficiency] = {
    "trtllm_serve": EngineEfficiency(0.55, 0.80, 3.0),
    "triton_trtllm": EngineEfficiency(0.55, 0.80, 5.0),
    "vllm": EngineEfficiency(0.45, 0.70, 6.0),
    "tgi": EngineEfficiency(0.40, 0.65, 6.0),
    "tgi_messages": EngineEfficiency(0.40, 0.65, 6.0),
    "mii_rest": EngineEfficiency(0.45, 0.70, 8.0),
    "mii_openai": EngineEfficiency(0.45, 0.70, 8.0),
    "llama_server": EngineEfficiency(0.30, 0.60, 2.0),
    "llama_cpp": EngineEfficiency(0.30, 0.60, 1.0),
    "ctranslate2": EngineEfficiency(0.30, 0.60, 1.0),
}

PREFILL_CHUNK_TOKENS = 8192
"""Prompt tokens an engine prefills per iteration (chunked prefill; vLLM's and TensorRT-LLM's default
token budget per step): a prompt's first token waits one iteration per chunk of the prompts ahead."""

# Fraction of GPU memory an engine may fill with weights and KV cache (vLLM's default utilisation is 0.9).
MEMORY_HEADROOM = 0.9
