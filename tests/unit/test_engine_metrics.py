"""Per-engine load maps read recorded /metrics texts (see tests/data/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends import llama_server, tgi, trtllm, vllm
from backends.base import Load
from backends.prom_text import LoadMap, read_load

DATA = Path(__file__).resolve().parents[1] / "data"

# vLLM up to 0.9.1 named the kv-cache gauge gpu_cache_usage_perc (docs, as in the engine references).
VLLM_0_9 = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 7.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.9
"""
TGI_3 = """\
# TYPE tgi_queue_size gauge
tgi_queue_size 4
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 12
# TYPE tgi_request_count counter
tgi_request_count 100
"""
TRTLLM_SERVE_2026 = """\
# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running{model_name="undefined",engine_type="undefined"} 5.0
# TYPE trtllm_num_requests_waiting gauge
trtllm_num_requests_waiting{model_name="undefined",engine_type="undefined"} 1.0
# TYPE trtllm_kv_cache_utilization gauge
trtllm_kv_cache_utilization{model_name="undefined",engine_type="undefined"} 0.25
"""
# TensorRT-LLM behind Triton with a batch of 2 and 10 requests: its batch manager holds 7 ("active"), runs 2
# ("scheduled") and 3 are still queued ("waiting"): 2 running, 8 waiting (read as 7 running before).
TRITON_BATCH_FULL = """\
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 3
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="context",version="1"} 0
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 2
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 512
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 7
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="tensorrt_llm",version="1"} 0.5
"""
# The first trtllm-serve release had only histograms and counters: no load gauges at all.
TRTLLM_SERVE_2025 = """\
# TYPE request_success_total counter
request_success_total{finished_reason="stop"} 4.0
"""


@pytest.mark.parametrize(
    ("text", "mapping", "expected"),
    [
        ((DATA / "vllm_docs_excerpt.metrics.txt").read_text(), vllm.LOAD, Load(8, 2, 0.42)),
        ((DATA / "vllm_0.32.0_cpu.metrics.txt").read_text(), vllm.LOAD, Load(1, 0, 0.00024420024420024333)),
        (VLLM_0_9, vllm.LOAD, Load(3, 7, 0.9)),
        # running is the scheduled batch; queued requests and active ones left out of the batch wait
        ((DATA / "triton_trtllm_backend_excerpt.metrics.txt").read_text(), trtllm.TRITON_LOAD, Load(1, 1, 0.4875)),
        (TRITON_BATCH_FULL, trtllm.TRITON_LOAD, Load(2, 8, 0.5)),
        ((DATA / "llama_server_b-vendored-0.3.36.metrics.txt").read_text(), llama_server.LOAD, Load(0, 0, None)),
        (TGI_3, tgi.LOAD, Load(12, 4, None)),
        (TRTLLM_SERVE_2026, trtllm.SERVE_LOAD, Load(5, 1, 0.25)),
    ],
)
def test_load_maps_read_each_engine_version(text: str, mapping: LoadMap, expected: Load) -> None:
    assert read_load(text, mapping) == expected


def test_an_engine_without_the_mapped_gauges_gives_no_load() -> None:
    assert read_load(TRTLLM_SERVE_2025, trtllm.SERVE_LOAD) is None
