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

What each carries beyond plain text (``capabilities``):

- trtllm-serve takes OpenAI's fields in OpenAI's form: ``tools`` with ``tool_choice`` "auto"/"none"
  (answers with ``tool_calls`` and ``finish_reason: "tool_calls"`` only when launched with
  ``--tool_parser``, e.g. ``qwen3`` for Hermes-style ``<tool_call>`` models: narrow with
  ``disable: [tools]`` otherwise); ``response_format`` json_object/json_schema (guided decoding: the
  server needs ``guided_decoding_backend: xgrammar`` in its ``--extra_llm_api_options``, else it
  answers 400 "Guided decoding is not enabled"); chat ``logprobs``/``top_logprobs`` and completions'
  integer ``logprobs`` (the PyTorch backend, trtllm-serve's default; its lists hold the sampled token
  beside the top ones, trimmed to what was asked); ``n``; penalties; ``logit_bias`` (an embedding
  bias: needs ``num_postprocess_workers: 0``); ``seed``; completions' ``echo``; image parts for
  multimodal models. Not declared: ``tool_choice`` "required" or a named function (accepted, but no
  call is forced: a named function's unconstrained text is labelled as its arguments) and
  ``parallel_tool_calls: false`` (accepted, not enforced).
- Triton gets the tools rendered into the prompt (the gateway parses the calls), ``response_format``
  as ``guided_decoding_guide_type`` ``json``/``json_schema`` with the schema in
  ``guided_decoding_guide`` (the tensorrt_llm model needs ``guided_decoding_backend`` in its
  config.pbtxt), ``presence_penalty``/``frequency_penalty`` and ``seed`` (UINT64) inputs. Logprobs
  only where each response's text belongs to its tokens (``cumulative``, ``per_token``): the
  chosen token's ``output_log_probs`` with the text that token added; the ensemble gives no
  alternatives. Not declared: ``logit_bias`` (``embedding_bias_words`` takes words the preprocessing
  tokenizes again, not token ids), ``n`` as ``num_return_sequences`` (the gateway asks n times with
  distinct seeds: the ensemble's responses per sequence are not told apart in this mode).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any, Literal

from backends import capabilities as cap
from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest, TokenLogprob, Usage
from backends.capabilities import Capabilities
from backends.http_base import HttpBackend, HttpSettings
from backends.openai_compat import OpenAICompatBackend
from backends.prom_text import Gauge, LoadMap
from backends.text import StopStrings, estimate_tokens

# Sampling fields trtllm-serve declares beside OpenAI's (its models use extra="forbid").
TRTLLM_SERVE_EXTRA = frozenset(
    {
        "top_k", "top_p_min", "min_p", "repetition_penalty", "length_penalty", "early_stopping",
        "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens",
        "spaces_between_special_tokens", "truncate_prompt_tokens", "use_beam_search",
    }
)  # fmt: skip

_SERVE_FEATURES = frozenset(
    {
        cap.TOOLS, cap.JSON_OBJECT, cap.JSON_SCHEMA, cap.LOGPROBS, cap.TOP_LOGPROBS, cap.PENALTIES,
        cap.LOGIT_BIAS, cap.SEED, cap.ECHO, cap.IMAGES,
    }
)  # fmt: skip
SERVE_CAPABILITIES = Capabilities(features=_SERVE_FEATURES, extras=TRTLLM_SERVE_EXTRA, native_n=True)

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
TRITON_EXTRA = frozenset({"top_k", "repetition_penalty", "min_tokens"})

TRITON_CAPABILITIES = Capabilities(
    features=frozenset({cap.TOOLS, cap.JSON_OBJECT, cap.JSON_SCHEMA, cap.PENALTIES, cap.SEED}),
    extras=TRITON_EXTRA,
    tools_in_prompt=True,
)
"""The whole-answer deployment; the streamed ones also give logprobs (``TritonTrtllmBackend``)."""
TRITON_STREAMED_CAPABILITIES = replace(TRITON_CAPABILITIES, features=TRITON_CAPABILITIES.features | {cap.LOGPROBS})

_UINT64 = 1 << 64


class TrtllmServeBackend(OpenAICompatBackend):
    engine = "trtllm_serve"
    health_path = "/health"
    metrics_path = "/prometheus/metrics"
    load_map = SERVE_LOAD
    capabilities = SERVE_CAPABILITIES

    def engine_fields(self, request: GenerationRequest) -> dict[str, Any]:
        fields = super().engine_fields(request)
        if request.logprobs and request.messages is None:
            # trtllm-serve reads completions' ``logprobs`` as "if logprobs": 0 would give none at all.
            fields["logprobs"] = max(1, request.top_logprobs)
        return fields


TextOutput = Literal["whole", "cumulative", "per_token"]


def guided_decoding(response_format: dict[str, Any] | None) -> dict[str, str]:
    """OpenAI's ``response_format`` as the ensemble's guided decoding inputs (none for plain text)."""
    kind = (response_format or {}).get("type")
    if kind == "json_object":
        return {"guided_decoding_guide_type": "json"}
    if kind == "json_schema":
        schema = ((response_format or {}).get("json_schema") or {}).get("schema")
        if schema is None:  # a schema named but not given: any JSON
            return {"guided_decoding_guide_type": "json"}
        return {"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": json.dumps(schema)}
    return {}


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
        payload["seed"] = req.seed % _UINT64  # a UINT64 input: OpenAI's seed may be negative
    if req.presence_penalty is not None:
        payload["presence_penalty"] = req.presence_penalty
    if req.frequency_penalty is not None:
        payload["frequency_penalty"] = req.frequency_penalty
    if req.response_format is not None:
        payload |= guided_decoding(req.response_format)
    for key, value in req.extra.items():
        if key in TRITON_EXTRA:
            payload[key] = value
    return payload


def log_probs(doc: dict[str, Any]) -> list[float] | None:
    """A response's ``output_log_probs`` (a flat or nested list), one per token it decoded, in order."""
    probs = doc.get("output_log_probs")
    if not isinstance(probs, list):
        return None
    out: list[float] = []
    todo: list[Any] = [probs]
    while todo:
        item = todo.pop()
        if isinstance(item, list):
            todo.extend(reversed(item))
        else:
            out.append(float(item))
    return out


def token_count(doc: dict[str, Any]) -> int | None:
    """Tokens a response decoded, from its ``output_log_probs``, when present."""
    probs = log_probs(doc)
    return None if probs is None else len(probs)


def paired(text: str, probs: list[float]) -> tuple[TokenLogprob, ...]:
    """One streamed response's tokens: its text is what they added. A response holds one token (more
    only with speculative decoding, when the text cannot be split between them: the first gets it)."""
    return tuple(TokenLogprob(text if i == 0 else "", lp) for i, lp in enumerate(probs))


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
    capabilities: Capabilities = TRITON_CAPABILITIES
    """The class says what the default (whole-answer) deployment honours; a streamed one adds logprobs."""

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
        if not self.answers_whole:
            self.capabilities = TRITON_STREAMED_CAPABILITIES

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        prompt = await self.render_prompt(request)
        mode = self.text_output
        payload = triton_payload(request, prompt, self.settings.default_max_tokens, stream=mode != "whole")
        stops = StopStrings(request.stop)
        cumulative = Cumulative()
        want_logprobs = request.logprobs and mode != "whole"
        pieces = 0
        counted: int | None = None  # tokens the engine says it generated (output_log_probs)
        last = ""
        path = f"/v2/models/{self.triton_model}/generate_stream"
        async with self.open_stream(request, path, payload) as response:
            async for doc in self.json_events(request, response):
                pieces += 1
                probs = log_probs(doc)
                if probs is not None:
                    counted = len(probs) if mode == "whole" else (counted or 0) + len(probs)
                raw = str(doc.get("text_output", ""))
                if mode == "cumulative":
                    last, raw = raw, cumulative.feed(raw)
                text = stops.feed(raw)
                if stops.stopped:
                    if text:
                        yield Chunk(text=text)
                    break
                if want_logprobs and probs:
                    yield Chunk(text=text, logprobs=paired(raw, probs))
                elif text:
                    yield Chunk(text=text)
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
