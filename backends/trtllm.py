"""TensorRT-LLM, in its two deployments.

- ``trtllm-serve``: OpenAI routes, but its request models forbid unknown
  fields, so only the fields it declares are sent. Prometheus text lives at
  ``/prometheus/metrics`` with ``trtllm_`` names (2026 releases; the first
  release had no load gauges, so the gateway's own count is used then).
- Triton with the TensorRT-LLM ensemble: ``/v2/models/<model>/generate_stream``
  with ``text_input`` and a required ``max_tokens``; no ``[DONE]`` (the stream
  just ends), no finish reason. The ensemble's postprocessing decodes the tokens
  of each response by themselves, so its per-token stream drops every
  word-leading space of a SentencePiece tokenizer ("Machine", "learning") and
  splits multi-byte characters; only text decoded together is exact. Hence
  ``text_output`` modes: ``whole`` (default: one response with the whole answer,
  exact on any deployment; the backend ``answers_whole``), ``cumulative`` (the
  ``tensorrt_llm_bls`` model deployed with ``accumulate_tokens: true``: each
  response holds the whole text so far, diffed here; exact and streamed) and
  ``per_token`` (the ensemble's stream as it is, for byte-level tokenizers that
  keep their spaces). Completion tokens are counted from ``output_log_probs``
  (one per generated token, asked with ``return_log_probs``); prompt tokens are
  estimated. The adapter renders chat with the model's template, leaves the
  prompt out of the output, sends the request id as Triton's ``id`` and cuts
  stop strings itself (Triton keeps the stop word in its text).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal

from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest, Usage
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

# TensorRT-LLM's "active" requests are every request its batch manager holds, the ones its scheduler could
# not fit into this iteration's batch too; "scheduled" are those in the batch (running); "waiting" are still
# queued before the batch manager. So running is "scheduled", and active beyond scheduled waits.
_TRT_REQUESTS = ("nv_trt_llm_request_metrics",)
TRITON_LOAD = LoadMap(
    running=Gauge(_TRT_REQUESTS, (("request_type", "scheduled"),)),
    waiting=Gauge((*_TRT_REQUESTS, "nv_inference_pending_request_count"), (("request_type", "waiting"),)),
    kv_cache=Gauge(("nv_trt_llm_kv_cache_block_metrics",), (("kv_cache_block_type", "fraction"),)),
    held=(Gauge(_TRT_REQUESTS, (("request_type", "active"),)), Gauge(_TRT_REQUESTS, (("request_type", "scheduled"),))),
)

# Triton ensemble inputs the adapter may pass through from a client's extra fields.
TRITON_EXTRA = frozenset({"top_k", "repetition_penalty", "min_tokens", "presence_penalty", "frequency_penalty"})


class TrtllmServeBackend(OpenAICompatBackend):
    engine = "trtllm_serve"
    health_path = "/health"
    metrics_path = "/prometheus/metrics"
    load_map = SERVE_LOAD
    accepted_extra = TRTLLM_SERVE_EXTRA


TextOutput = Literal["whole", "cumulative", "per_token"]


def triton_payload(req: GenerationRequest, prompt: str, default_max_tokens: int, stream: bool) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "id": req.request_id,
        "text_input": prompt,
        "max_tokens": req.max_tokens or default_max_tokens,
        "stream": stream,
        "exclude_input_in_output": True,
        "return_log_probs": True,  # one output_log_probs entry per generated token: the token count
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


def token_count(doc: dict[str, Any]) -> int | None:
    """Tokens a response decoded, from its ``output_log_probs`` (a flat or nested list), when present."""
    probs = doc.get("output_log_probs")
    if not isinstance(probs, list):
        return None
    count, todo = 0, list(probs)
    while todo:
        item = todo.pop()
        if isinstance(item, list):
            todo.extend(item)
        else:
            count += 1
    return count


class Cumulative:
    """Deltas from responses that each carry the whole text so far. A trailing U+FFFD is half a character
    still being decoded: held until the next response completes it."""

    def __init__(self) -> None:
        self.sent = ""

    def feed(self, text: str) -> str:
        stable = text.rstrip("\ufffd")
        if not stable.startswith(self.sent):
            return ""  # the engine rewrote text already sent: wait for it to agree again (checked at the end)
        delta, self.sent = stable[len(self.sent) :], stable
        return delta

    def close(self, last: str) -> str:
        """The final text's rest; raises when it contradicts what was sent."""
        if not last.startswith(self.sent):
            raise ValueError("cumulative text changed what was already sent")
        delta, self.sent = last[len(self.sent) :], last
        return delta


class TritonTrtllmBackend(HttpBackend):
    engine = "triton_trtllm"
    health_path = "/v2/health/ready"
    metrics_path = "/metrics"
    load_map = TRITON_LOAD

    def __init__(
        self,
        name: str,
        model: str,
        settings: HttpSettings,
        triton_model: str = "ensemble",
        text_output: TextOutput = "whole",
    ) -> None:
        super().__init__(name, model, settings)
        self.triton_model = triton_model
        self.text_output: TextOutput = text_output
        self.answers_whole = text_output == "whole"
        """The whole answer arrives at once: the gateway applies a whole-answer deadline, not a first-token one."""

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        prompt = await self.render_prompt(request)
        mode = self.text_output
        payload = triton_payload(request, prompt, self.settings.default_max_tokens, stream=mode != "whole")
        stops = StopStrings(request.stop)
        cumulative = Cumulative()
        pieces = 0
        counted: int | None = None  # tokens the engine says it generated (output_log_probs)
        last = ""
        path = f"/v2/models/{self.triton_model}/generate_stream"
        async with self.open_stream(request, path, payload) as response:
            async for doc in self.json_events(request, response):
                pieces += 1
                n = token_count(doc)
                if n is not None:
                    counted = n if mode == "whole" else (counted or 0) + n
                raw = str(doc.get("text_output", ""))
                if mode == "cumulative":
                    last, raw = raw, cumulative.feed(raw)
                text = stops.feed(raw)
                if text:
                    yield Chunk(text=text)
                if stops.stopped:
                    break
        if mode == "cumulative" and not stops.stopped:
            try:
                text = stops.feed(cumulative.close(last))
            except ValueError as exc:
                raise BackendError(ErrorKind.PROTOCOL, f"{self.name}: {exc}") from exc
            if text:
                yield Chunk(text=text)
        tail = stops.flush()
        generated = counted if counted is not None else pieces
        finish = "length" if generated >= payload["max_tokens"] and not stops.stopped else "stop"
        yield Chunk(text=tail, finish_reason=finish, usage=Usage(estimate_tokens(prompt), generated))
