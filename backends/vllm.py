"""vLLM's OpenAI server: the thin path, health from ``/health``, load from ``/metrics``.

vLLM accepts extra sampling fields (``top_k``, ``min_p``, ``ignore_eos``...), so
extras pass through. It streams usage only when asked: the adapter always asks
and the gateway drops it when the client did not.
"""

from __future__ import annotations

from backends.openai_compat import OpenAICompatBackend
from backends.prom_text import Gauge, LoadMap

# kv_cache_usage_perc since 0.9.2; gpu_cache_usage_perc before (and until 0.10.x beside it).
LOAD = LoadMap(
    running=Gauge(("vllm:num_requests_running",)),
    waiting=Gauge(("vllm:num_requests_waiting",)),
    kv_cache=Gauge(("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
)


class VLLMBackend(OpenAICompatBackend):
    engine = "vllm"
    health_path = "/health"
    metrics_path = "/metrics"
    load_map = LOAD
