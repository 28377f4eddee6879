"""TensorRT-LLM, in its two deployments.

- ``trtllm-serve``: OpenAI routes, but its request models forbid unknown
  fields, so only the fields it declares are sent. Prometheus text lives at
  ``/prometheus/metrics`` with ``trtllm_`` names (2026 releases; the first
  release had no load gauges, so the gateway's own count is used then).
- Triton with the TensorRT-LLM ensemble: ``/v2/models/<model>/generate_stream``
  with ``text_input`` and a required ``max_tokens``; no ``[DONE]`` (the stream
  just ends), no finish reason and no token counts. The adapter renders chat
  with the model's template, asks to leave the prompt out of the output,
  enforces stop strings itself, and counts one token per streamed piece
  (Triton streams one decoding step per event); prompt tokens are estimated.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from backends.base import Chunk, GenerationRequest, Usage
from backends.http_base import HttpBackend, HttpSettings
from backends.openai_compat import OpenAICompatBackend
from backends.prom_text import Gauge, LoadMap
from backends.text import StopStrings, estimate_tokens

# Sampling fields trtllm-serve declares beside OpenAI's (its models use extra="forbid").
TRTLLM_SERVE_EXTRA = frozenset(
    {
        "top_k", "top_p_min", "min_p", "repetition_penalty", "length_penalty", "early_stopping",
        "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens",
        "spaces_between_special_tokens", "truncate_prompt_tokens", "best_of", "use_beam_search",
        "presence_penalty", "frequency_penalty", "logit_bias", "user", "n",
    }
)  # fmt: skip

SERVE_LOAD = LoadMap(
    running=Gauge(("trtllm_num_requests_running",)),
    waiting=Gauge(("trtllm_num_requests_waiting",)),
    kv_cache=Gauge(("trtllm_kv_cache_utilization",)),
)

TRITON_LOAD = LoadMap(
    running=Gauge(("nv_trt_llm_request_metrics",), (("request_type", "active"),)),
    waiting=Gauge(("nv_trt_llm_request_metrics", "nv_inference_pending_request_count"), (("request_type", "waiting"),)),
    kv_cache=Gauge(("nv_trt_llm_kv_cache_block_metrics",), (("kv_cache_block_type", "fraction"),)),
)

# Triton ensemble inputs the adapter may pass through from a client's extra fields.
TRITON_EXTRA = frozenset({"top_k", "repetition_penalty", "min_tokens", "presence_penalty", "frequency_penalty"})


class TrtllmServeBackend(OpenAICompatBackend):
    engine = "trtllm_serve"
    health_path = "/health"
    metrics_path = "/prometheus/metrics"
    load_map = SERVE_LOAD
    accepted_extra = TRTLLM_SERVE_EXTRA


def triton_payload(req: GenerationRequest, prompt: str, default_max_tokens: int) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "text_input": prompt,
        "max_tokens": req.max_tokens or default_max_tokens,
        "stream": True,
        "exclude_input_in_output": True,
        "bad_words": "",
        "stop_words": list(req.stop) if req.stop else "",
    }
    if req.greedy:
        payload["top_k"] = 1
    else:
        payload["temperature"] = req.temperature
        payload["top_p"] = req.top_p
    if req.seed is not None:
        payload["seed"] = req.seed
    for key, value in req.extra.items():
        if key in TRITON_EXTRA:
            payload[key] = value
    return payload


class TritonTrtllmBackend(HttpBackend):
    engine = "triton_trtllm"
    health_path = "/v2/health/ready"
    metrics_path = "/metrics"
    load_map = TRITON_LOAD

    def __init__(self, name: str, model: str, settings: HttpSettings, triton_model: str = "ensemble") -> None:
        super().__init__(name, model, settings)
        self.triton_model = triton_model

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        prompt = self.prompt_text(request)
        payload = triton_payload(request, prompt, self.settings.default_max_tokens)
        stops = StopStrings(request.stop)
        pieces = 0
        path = f"/v2/models/{self.triton_model}/generate_stream"
        async with self.open_stream(request, path, payload) as response:
            async for doc in self.json_events(request, response):
                pieces += 1
                text = stops.feed(str(doc.get("text_output", "")))
                if text:
                    yield Chunk(text=text)
                if stops.stopped:
                    break
        tail = stops.flush()
        finish = "length" if pieces >= payload["max_tokens"] and not stops.stopped else "stop"
        yield Chunk(text=tail, finish_reason=finish, usage=Usage(estimate_tokens(prompt), pieces))
