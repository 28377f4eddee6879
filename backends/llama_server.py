"""llama.cpp's ``llama-server`` over HTTP (OpenAI routes), beside the in-process mode.

Health: ``/health`` answers 503 while the model loads. Load: ``/metrics``
(only with ``--metrics``): requests processing and deferred; the kv-cache
gauges were removed from llama-server in 2025 and are read only when present.
"""

from __future__ import annotations

from backends.openai_compat import OpenAICompatBackend
from backends.prom_text import Gauge, LoadMap

LOAD = LoadMap(
    running=Gauge(("llamacpp:requests_processing",)),
    waiting=Gauge(("llamacpp:requests_deferred",)),
    kv_cache=Gauge(("llamacpp:kv_cache_usage_ratio",)),
)


class LlamaServerBackend(OpenAICompatBackend):
    engine = "llama_server"
    health_path = "/health"
    metrics_path = "/metrics"
    load_map = LOAD
