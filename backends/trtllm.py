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
  ``text_output`` modes: ``whole`` (default: a request whose client does not
  stream gets one response with the whole answer, exact on any deployment, under
  the whole-answer deadline; a streamed request gets the ensemble's per-token
  stream, tokens as they come, exact for tokenizers whose tokens decode alone,
  as byte-level BPE ones do; a deployment that cannot stream, its tensorrt_llm
  model not decoupled, refuses that once and is then answered whole),
  ``cumulative`` (the ``tensorrt_llm_bls`` model deployed with
  ``accumulate_tokens: true``: each response holds the whole text so far, diffed
  here; exact and streamed, the choice for SentencePiece tokenizers) and
  ``per_token`` (the ensemble's stream as it is, for every request). Closing a
  stream closes its connection, which stops the engine.
  Token counts, most exact first: the ensemble's ``num_output_tokens`` and
  ``num_input_tokens`` (asked with ``return_num_output_tokens`` and
  ``return_num_input_tokens``: 2025+ ensembles; older ones take them as ignored
  request parameters), then one per ``output_log_probs`` entry (asked with
  ``return_log_probs``; only where the ensemble outputs them), then, in a
  stream, one per response. A whole answer with neither, and a prompt without
  ``num_input_tokens``, are estimates marked as such (``Usage``), which the
  gateway replaces with its tokenizer's count where it has the model's; the
  finish reason is "length" when the count reached ``max_tokens`` (judged again
  by the gateway from its own count when the adapter's was an estimate). The
  adapter renders chat with the model's template, leaves the prompt out of the
  output, sends the request id as Triton's ``id`` and cuts stop strings itself
  (Triton keeps the stop word in its text).

What each carries beyond plain text (``capabilities``):

- trtllm-serve takes OpenAI's fields in OpenAI's form: ``tools`` with ``tool_choice`` "auto"/"none"
  (the engine renders them with the model's template; it answers with ``tool_calls`` and
  ``finish_reason: "tool_calls"`` only when launched with ``--tool_parser``, e.g. ``qwen3`` for
  Hermes-style ``<tool_call>`` models, which the backend setting ``tool_parser`` says. Without it
  the call markup comes back as text, and the gateway parses it with the model's ``tool_parser``
  (``tools_in_prompt``), or, for a model without one, declares no ``tools``: such requests are
  refused naming the field); ``response_format`` json_object/json_schema (guided decoding: the
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
from backends.text import StopStrings, estimate_for, estimate_tokens

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
"""Launched with ``--tool_parser``: the engine parses the model's tool calls."""
SERVE_TEXT_TOOLS = replace(SERVE_CAPABILITIES, tools_in_prompt=True)
"""trtllm-serve's default, no ``--tool_parser``: it renders the tools into the prompt with the model's
template and returns the call markup as text, which the gateway parses (the model's ``tool_parser``)."""

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
    token_counts="estimate",  # ensembles before num_input_tokens/num_output_tokens count no prompt
)
"""The whole-answer deployment; the streamed ones also give logprobs (``TritonTrtllmBackend``)."""
TRITON_STREAMED_CAPABILITIES = replace(TRITON_CAPABILITIES, features=TRITON_CAPABILITIES.features | {cap.LOGPROBS})

_UINT64 = 1 << 64


class TrtllmServeBackend(OpenAICompatBackend):
    engine = "trtllm_serve"
    health_path = "/health"
    metrics_path = "/prometheus/metrics"
    load_map = SERVE_LOAD
    capabilities = SERVE_TEXT_TOOLS
    """The class says what trtllm-serve's default launch (no ``--tool_parser``) honours."""

    def __init__(self, name: str, model: str, settings: HttpSettings, tool_parser: str | None = None) -> None:
        super().__init__(name, model, settings)
        self.tool_parser = tool_parser
        """The engine's ``--tool_parser`` (backend setting ``tool_parser``); None: the gateway parses calls."""
        if tool_parser is not None:  # this deployment's, over the class's (the default launch's)
            self.capabilities = SERVE_CAPABILITIES  # type: ignore[misc]

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
        # What the engine can say of the tokens: their counts (ensembles since 2025; older ones take these as
        # request parameters and ignore them) and one output_log_probs entry per generated token.
        "return_num_input_tokens": True,
        "return_num_output_tokens": True,
        "return_log_probs": True,
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
        self.decoupled = True
        """Whether the deployment streams (its tensorrt_llm model in decoupled mode): learnt False from the
        first streamed request it refuses, after which ``whole`` answers streamed requests whole too."""
        if text_output != "whole":
            self.capabilities = TRITON_STREAMED_CAPABILITIES

    def answers_whole(self, request: GenerationRequest, whole: bool | None = None) -> bool:
        """``whole`` answers a request whole unless its client streams and the deployment can stream
        (whether the gateway asked it whole does not matter)."""
        return self.text_output == "whole" and not (request.stream and self.decoupled)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        prompt = await self.render_prompt(request)
        mode = self.text_output
        if mode == "whole" and not self.answers_whole(request):
            started = False
            try:
                async for chunk in self._generate(request, prompt, "per_token"):
                    started = True
                    yield chunk
                return
            except BackendError as exc:
                if started or not _refused_streaming(exc):
                    raise
                self.decoupled = False  # refused before any response: this deployment answers whole
        async for chunk in self._generate(request, prompt, mode):
            yield chunk

    async def _generate(self, request: GenerationRequest, prompt: str, mode: TextOutput) -> AsyncIterator[Chunk]:
        payload = triton_payload(request, prompt, self.settings.default_max_tokens, stream=mode != "whole")
        stops = StopStrings(request.stop)
        cumulative = Cumulative()
        want_logprobs = request.logprobs and mode != "whole"
        count = Count()
        chars = 0  # of the answer kept, for an estimate where the engine counts nothing
        last = ""
        path = f"/v2/models/{self.triton_model}/generate_stream"
        async with self.open_stream(request, path, payload) as response:
            async for doc in self.json_events(request, response):
                probs = log_probs(doc)
                count.add(doc, probs, whole=mode == "whole")
                raw = str(doc.get("text_output", ""))
                if mode == "cumulative":
                    last, raw = raw, cumulative.feed(raw)
                text = stops.feed(raw)
                chars += len(text)
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
            chars += len(text)
            if text:
                yield Chunk(text=text)
        tail = stops.flush()
        generated = count.output if count.output is not None else estimate_for(chars + len(tail))
        # Triton names no finish reason: the cap was reached or not. A stop string ends it either way.
        finish = "length" if generated >= payload["max_tokens"] and not stops.stopped else "stop"
        estimated = count.output is None
        usage = Usage(
            count.input if count.input is not None else estimate_tokens(prompt),
            generated,
            prompt_estimated=count.input is None,
            completion_estimated=estimated,
            finish_from_count=estimated and not stops.stopped,
        )
        yield Chunk(text=tail, finish_reason=finish, usage=usage)


def _refused_streaming(exc: BackendError) -> bool:
    """The deployment cannot stream: its tensorrt_llm model is not in decoupled mode ("Streaming is only
    supported in decoupled mode", refused before any response)."""
    return exc.kind in (ErrorKind.BAD_REQUEST, ErrorKind.UPSTREAM) and "decoupled" in exc.detail


class Count:
    """The tokens an answer's responses say they carry, most exact source first: ``num_output_tokens``
    (ensembles that take ``return_num_output_tokens``), then one per ``output_log_probs`` entry, then (a
    stream, which sends one response per token) one per response; a whole answer without either is not
    counted (None). ``input``: the ensemble's ``num_input_tokens`` where it gives one."""

    def __init__(self) -> None:
        self.output: int | None = None
        self.input: int | None = None

    def add(self, doc: dict[str, Any], probs: list[float] | None, whole: bool) -> None:
        counted = _first_int(doc.get("num_output_tokens"))
        if counted is None and probs is not None:
            counted = len(probs)
        if counted is None and not whole:
            counted = 1
        if counted is not None:
            self.output = counted if whole else (self.output or 0) + counted
        prompt = _first_int(doc.get("num_input_tokens"))
        if prompt is not None:
            self.input = prompt


def _first_int(value: Any) -> int | None:
    """A scalar output as Triton writes it: a number, or a one-element (nested) list."""
    while isinstance(value, list) and len(value) == 1:
        value = value[0]
    return value if isinstance(value, int) and not isinstance(value, bool) else None
