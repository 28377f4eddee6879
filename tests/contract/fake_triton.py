"""Contract fake of Triton Inference Server serving the TensorRT-LLM ensemble through the generate extension.

Behaviour read from triton-inference-server/server src/http_server.cc and docs/protocol/extension_generate.md,
triton-inference-server/core (model lookup, input validation, ensemble scheduler), the TensorRT-LLM Triton backend
(triton_backend/inflight_batcher_llm) and /work/shared/reference/tensorrt-llm/examples.json; nothing copied.
Text comes from the real TinyEngine.

Reproduced:
- POST /v2/models/{model}[/versions/{v}]/generate and /generate_stream. Top-level keys (and the members of a
  "parameters" object) that name an ensemble input become tensors; any other key becomes a request *parameter*
  that the ensemble ignores, so unknown keys are accepted (Triton errors only when a parameter value is not a
  string/number/bool). Missing text_input/max_tokens is core's "expected number of inputs between 2 and 29 ..."
  400. Unknown model: 404 "Request for unknown model: 'x' is not found". Errors are ``{"error": "..."}``.
- Response ``{model_name, model_version:"1", sequence_end:false, sequence_id:0, sequence_start:false,
  text_output}``, compact JSON in key order (``cum_log_probs`` and one ``output_log_probs`` entry per decoded
  token with ``return_log_probs``). Without exclude_input_in_output, text_output is the prompt followed by the
  generated text (non-streaming); streamed responses carry only the new token.
- Text is what the ensemble's postprocessing model makes of it: it decodes the tokens of each response by
  themselves. A whole answer decodes exactly; a streamed response (one per token) is one token decoded alone,
  which with a SentencePiece tokenizer drops the word-leading space (the reference's stream reads "Machine",
  "learning") and shows half a multi-byte character as U+FFFD. ``tensorrt_llm_bls`` is served beside the
  ensemble; with its ``accumulate_tokens`` parameter (create_app's, default true) each streamed response
  decodes every token so far: the whole text yet. The request's "id" is recorded in ``control.started``.
- /generate_stream sends one ``data: {...}\\n\\n`` per response and simply ends (no [DONE]). Per-token events need
  the ``stream: true`` input; without it the ensemble answers once, with the whole text, as a single event.
  ``stream: true`` on /generate makes several responses, which Triton answers with 200
  ``{"error":"generate expects model to produce exactly 1 response, ..."}``.
- The first response fixes the HTTP status: an error before any token gives its status (503/500) with a
  ``data: {"error": ...}`` event (text/event-stream); an error after tokens is a 200 stream ending with that event.
  Errors from the ensemble are prefixed "in ensemble '<name>', ".
- Sampling: TensorRT-LLM is greedy unless top_k > 1 or top_p > 0 (runtime top_k=0, top_p=0 means greedy), so
  temperature alone does not sample; top_k 1 and temperature 0 are greedy. top_k > 1 samples the full vocabulary
  here (the TinyEngine has no top-k). stop_words stop generation with the word kept in the output; end_id
  replaces the model's end token (-1: none); bad_words and the other inputs are accepted and ignored.
- Prompt + max_tokens beyond max_seq_len shrinks max_tokens (TensorRT-LLM only warns); a prompt longer than
  max_input_len (context_length - 1) fails in the executor: 500.
- /v2/health/live, /v2/health/ready (200 empty / 400 empty), /v2/models/{model}/ready (400 "Model version not
  ready"), 404/405 as ``{"error": "Not Found"}``/``{"error": "Method Not Allowed"}``. GET /metrics serves the
  Prometheus text (Triton serves it on port 8002; one app here): nv_inference_* for the ensemble and the
  tensorrt_llm model, nv_trt_llm_request_metrics and nv_trt_llm_kv_cache_block_metrics from live state.
- A client disconnect stops generation.

FakeControl.fail_next names: "unavailable" (core's queue rejection, 503 "... Exceeds maximum queue size"),
"internal" (500 "Executor failed process requestId N due to the following error: ..."), "midstream" (three
tokens, then that executor error as a final event on a 200 stream; 500 from /generate), and the generic faults
of control.py. control.delay_s is spent pending before the first token, and so is waiting for one of
``control.max_running`` slots (reported as request_type "waiting"; "active" and "scheduled" are the running).
healthy False fails live and ready; loading True fails ready and model ready and answers generate with 404
"... has no available versions".

Capability inputs (the ensemble's config.pbtxt inputs in the reference; tensorrtllm_backend docs/guided_decoding.md):
every body POSTed to generate is appended to ``received`` (create_app's) as parsed JSON. ``output_log_probs`` hold
the demo model's own log probability of each token a response carries (``Token.logprob``), ``cum_log_probs`` their
running sum over the sequence. ``guided_decoding_guide_type`` json/json_schema/regex/ebnf_grammar (the last three
need ``guided_decoding_guide``) are accepted when the tensorrt_llm model has a ``guided_decoding_backend``
(create_app's, default "xgrammar"), else the executor refuses the request; the TinyEngine cannot constrain, so a
test scripts the answer (``TinyEngine.scripted``). ``presence_penalty``, ``frequency_penalty``, ``seed``,
``num_return_sequences``, ``embedding_bias_*`` are typed inputs, recorded but not applied (no such sampling in the
TinyEngine). Guessed: the executor's wording for a missing guided decoding backend or guide.

Deployment switches (create_app's), for the adapter's fallbacks: ``output_log_probs`` False is an ensemble whose
outputs lack ``output_log_probs`` (no token count from log probabilities); ``token_counts`` True is a 2025+ ensemble
with the ``return_num_input_tokens``/``return_num_output_tokens`` inputs and the ``num_input_tokens``/
``num_output_tokens`` outputs (the tensorrt_llm model's count of the prompt, and of the output ids of each response;
without it those keys are ignored request parameters); ``decoupled`` False is a tensorrt_llm model not in decoupled
mode: it can answer only whole, and ``stream: true`` fails before any response with 400 "in ensemble '<name>',
Streaming is only supported if model is deployed using decoupled mode." (wording and status guessed).

Not modelled: a SentencePiece decoder also drops the leading space of the first token of every decode call, so
a real whole answer asked with exclude_input_in_output starts without it (" ugly." reads "ugly.").
Guessed: the exact texts of JSON parse errors, tensor type/shape errors and the executor's prompt-length error;
no empty final event after the last token; temperature 0 treated as greedy; KV geometry (32-token blocks,
room for 64 full sequences); no GPU metrics (the fake has no GPU).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from tests.contract.control import FakeControl, with_faults
from tests.contract.fake_trtllm_serve import EventStream, unless_disconnected
from tests.contract.tiny_engine import TinyEngine, Token

MAX_ACTIVE, TOKENS_PER_BLOCK, COMPOSING, BLS = 64, 32, "tensorrt_llm", "tensorrt_llm_bls"
ONE_RESPONSE = (
    "generate expects model to produce exactly 1 response, use generate stream for model that generates various "
    "number of responses"
)
# The ensemble's inputs in config order: (datatype, required, shape [-1] i.e. a list is allowed).
# fmt: off
INPUTS: dict[str, tuple[str, bool, bool]] = {
    "text_input": ("BYTES", True, False), "max_tokens": ("INT32", True, False),
    "decoder_text_input": ("BYTES", False, False), "num_return_sequences": ("INT32", False, False),
    "bad_words": ("BYTES", False, True), "stop_words": ("BYTES", False, True),
    "exclude_input_in_output": ("BOOL", False, False), "end_id": ("INT32", False, False),
    "pad_id": ("INT32", False, False), "top_k": ("INT32", False, False), "top_p": ("FP32", False, False),
    "temperature": ("FP32", False, False), "length_penalty": ("FP32", False, False),
    "repetition_penalty": ("FP32", False, False), "min_tokens": ("INT32", False, False),
    "presence_penalty": ("FP32", False, False), "frequency_penalty": ("FP32", False, False),
    "seed": ("UINT64", False, False), "return_log_probs": ("BOOL", False, False),
    "return_context_logits": ("BOOL", False, False), "return_generation_logits": ("BOOL", False, False),
    "return_perf_metrics": ("BOOL", False, False), "beam_width": ("INT32", False, False),
    "stream": ("BOOL", False, False), "embedding_bias_words": ("BYTES", False, True),
    "embedding_bias_weights": ("FP32", False, True), "lora_task_id": ("UINT64", False, False),
    "guided_decoding_guide_type": ("BYTES", False, False), "guided_decoding_guide": ("BYTES", False, False),
}
# fmt: on
COUNT_INPUTS = {"return_num_input_tokens": ("BOOL", False, False), "return_num_output_tokens": ("BOOL", False, False)}
"""Inputs of the 2025+ ensembles (``token_counts``)."""
NOT_DECOUPLED = "Streaming is only supported if model is deployed using decoupled mode."
# fmt: off
COUNTERS = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes", "success"),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)", "count"),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)", "count"),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds (includes cached "
     "requests)", "request_us"),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds (includes cached "
     "requests)", "queue_us"),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds (does not "
     "include cached requests)", "infer_us"),
)
# fmt: on
_KINDS = {"BYTES": (str,), "INT32": (int,), "UINT64": (int,), "FP32": (int, float), "BOOL": (bool,)}


class TritonError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class _Job:
    rid: str
    prompt: str
    prompt_tokens: int
    max_tokens: int
    greedy: bool
    temperature: float
    top_p: float
    stops: list[str]
    end_id: int | None
    log_probs: bool = False
    num_tokens: tuple[bool, bool] = (False, False)
    """``num_input_tokens`` and ``num_output_tokens`` asked for (``token_counts`` deployments)."""
    fault: str | None = None
    cum_log_prob: float = 0.0
    guide_error: str = ""


@dataclass
class _Live:
    prompt: int
    generated: int = 0
    arrival: float = field(default_factory=time.monotonic)


def _json(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _names(names: list[str]) -> str:
    return "[" + ",".join(f"'{n}'" for n in names) + "]"


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class _Server:
    def __init__(
        self,
        engine: TinyEngine,
        control: FakeControl,
        model_name: str,
        accumulate_tokens: bool,
        received: list[dict[str, Any]],
        guided_decoding_backend: str | None,
        output_log_probs: bool = True,
        token_counts: bool = False,
        decoupled: bool = True,
    ) -> None:
        self.engine, self.control, self.name, self.received = engine, control, model_name, received
        self.guided_decoding_backend = guided_decoding_backend
        self.output_log_probs, self.decoupled = output_log_probs, decoupled
        self.inputs = INPUTS | COUNT_INPUTS if token_counts else INPUTS
        self.accumulate_tokens = accumulate_tokens
        self.executor_ids = self.pending = 0
        self.live: dict[int, _Live] = {}
        self.stats = dict.fromkeys(("success", "count", "request_us", "queue_us", "infer_us"), 0)
        reasons = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
        self.failures = {"ensemble": dict.fromkeys(reasons, 0), "composing": dict.fromkeys(reasons, 0)}
        self.first_ms = [0, 0, 0, 0, 0]  # buckets 100, 500, 2000, 5000, +Inf
        self.first_ms_sum = 0.0
        self.max_blocks = engine.context_length * MAX_ACTIVE // TOKENS_PER_BLOCK

    def _fail(self, reason: str) -> None:
        self.failures["ensemble"]["OTHER"] += 1
        self.failures["composing"][reason] += 1

    def _lookup(self, request: Request) -> str:
        """The model asked for: the ensemble or the BLS model beside it."""
        model, version = request.path_params["model"], request.path_params.get("version", "")
        if not version.isdigit() and version:
            raise HTTPException(404)
        if model not in (self.name, BLS):
            raise TritonError(404, f"Request for unknown model: '{model}' is not found")
        if version not in ("", "1"):
            raise TritonError(404, f"Request for unknown model: '{model}' version {version} is not found")
        if self.control.loading:
            raise TritonError(404, f"Request for unknown model: '{model}' has no available versions")
        return str(model)

    def _inputs(self, raw: bytes) -> tuple[dict[str, Any], str]:
        """Triton's ConvertGenerateRequest and core's ValidateRequestInputs: the input tensors and the request id."""
        try:
            data = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError as exc:
            raise TritonError(400, f"failed to parse the request JSON buffer: {exc.msg} at {exc.pos}") from None
        if not isinstance(data, dict):
            raise TritonError(400, "failed to parse the request JSON buffer: expected a JSON object")
        self.received.append(dict(data))
        rid = data.get("id", "")
        if not isinstance(rid, str):
            raise TritonError(400, "Unable to parse 'id'")
        nested = data.pop("parameters", {})
        if not isinstance(nested, dict):
            raise TritonError(400, "Expected JSON object for keyword: 'parameters'")
        inputs: dict[str, Any] = {}
        for key, value in [*data.items(), *nested.items()]:
            if key not in self.inputs:
                if not isinstance(value, str | int | float | bool):
                    raise TritonError(
                        400, f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'."
                    )
                continue
            dtype, _, is_list = self.inputs[key]
            values = value if isinstance(value, list) else [value]
            if not is_list and len(values) != 1:
                raise TritonError(400, f"The schema can not convert input '{key}' to tensor with proper shape")
            if any(not isinstance(v, _KINDS[dtype]) or (dtype != "BOOL" and isinstance(v, bool)) for v in values):
                raise TritonError(400, f"Unable to parse '{key}': expected {dtype} data")
            inputs[key] = values if is_list else values[0]
        missing = [name for name, (_, required, _) in self.inputs.items() if required and name not in inputs]
        if missing:
            raise TritonError(
                400,
                f"[request id: {rid or '<id_unknown>'}] expected number of inputs between 2 and {len(self.inputs)} but "
                f"got {len(inputs)} inputs for model '{self.name}'. Got input(s) {_names(list(inputs))}, but "
                f"missing required input(s) {_names(missing)}. Please provide all required input(s).",
            )
        return inputs, rid

    def _job(self, inputs: dict[str, Any], rid: str) -> _Job:
        prompt, seq = inputs["text_input"], self.engine.context_length
        n, top_k, top_p = self.engine.count_tokens(prompt), inputs.get("top_k", 0), inputs.get("top_p", 0.0)
        temperature = float(inputs.get("temperature", 1.0))
        greedy = (top_k <= 1 and top_p <= 0) or top_k == 1 or temperature == 0
        stops = [s for s in inputs.get("stop_words", []) if s]
        max_tokens = min(inputs["max_tokens"], seq - n)
        job = _Job(
            rid, prompt, n, max_tokens, greedy, temperature, top_p or 1.0, stops, inputs.get("end_id"),
            bool(inputs.get("return_log_probs", False)) and self.output_log_probs,
            (bool(inputs.get("return_num_input_tokens")), bool(inputs.get("return_num_output_tokens"))),
        )  # fmt: skip
        guide = inputs.get("guided_decoding_guide_type")
        if guide is not None:
            if guide not in ("json", "json_schema", "regex", "ebnf_grammar"):
                job.guide_error = f"Unknown guided decoding guide type: {guide}"
            elif guide != "json" and not inputs.get("guided_decoding_guide"):
                job.guide_error = f"guided_decoding_guide is required for guide type {guide}"
            elif self.guided_decoding_backend is None:
                job.guide_error = "Guided decoding is not enabled: guided_decoding_backend is not set"
        return job

    def _executor_error(self, message: str) -> TritonError:
        self.executor_ids += 1
        text = f"Executor failed process requestId {self.executor_ids} due to the following error: {message}"
        return TritonError(500, f"in ensemble '{self.name}', {text}")

    async def _run(self, job: _Job) -> AsyncGenerator[Token, None]:
        """Each generated token, as the TensorRT-LLM model hands it to postprocessing."""
        if job.fault == "unavailable":
            self._fail("REJECTED")
            queue = f"[request id: {job.rid or '<id_unknown>'}] Exceeds maximum queue size"
            raise TritonError(503, f"in ensemble '{self.name}', {queue}")
        if job.prompt_tokens > self.engine.context_length - 1:
            self._fail("BACKEND")
            raise self._executor_error(
                f"Encountered an error when fetching new request: Prompt length ({job.prompt_tokens}) exceeds maximum "
                f"input length ({self.engine.context_length - 1}). Set log level to info and check TRTGptModel logs "
                "for how maximum input length is set"
            )
        if job.max_tokens <= 0:
            self._fail("BACKEND")
            raise self._executor_error("Encountered an error when fetching new request: maxNewTokens must be > 0")
        if job.fault == "internal":
            self._fail("BACKEND")
            raise self._executor_error("Encountered an error in forwardAsync function: injected fault")
        if job.guide_error:
            self._fail("BACKEND")
            raise self._executor_error(f"Encountered an error when fetching new request: {job.guide_error}")
        rec, key, outcome, admitted = _Live(job.prompt_tokens), id(job), "CANCELED", False
        self.pending += 1
        try:
            if self.control.delay_s > 0:
                await asyncio.sleep(self.control.delay_s)
            await self.control.admit(job.rid)  # queued in the executor while the batch is full
            admitted = True
            self.pending -= 1
            self.live[key], started, text = rec, time.monotonic(), ""
            self.stats["queue_us"] += int((started - rec.arrival) * 1e6)
            ignore_eos = job.end_id is not None
            tokens = cast(AsyncGenerator[Token, None], self.engine.stream(
                job.prompt, job.max_tokens, greedy=job.greedy, temperature=job.temperature, top_p=job.top_p,
                ignore_eos=ignore_eos,
            ))  # fmt: skip
            async with contextlib.aclosing(tokens):
                async for tok in tokens:
                    if (tok.special and not ignore_eos) or tok.id == job.end_id:
                        break
                    rec.generated += 1
                    if rec.generated == 1:
                        elapsed_ms = (time.monotonic() - rec.arrival) * 1e3
                        for i, bound in enumerate((100, 500, 2000, 5000, math.inf)):
                            self.first_ms[i] += elapsed_ms <= bound
                        self.first_ms_sum += elapsed_ms
                    if job.fault == "midstream" and rec.generated > 3:
                        outcome = "BACKEND"
                        raise self._executor_error("Encountered an error in forwardAsync function: injected fault")
                    text += tok.text
                    yield tok
                    if any(s in text[-len(tok.text) - len(s) :] for s in job.stops):
                        break
            outcome, now = "success", time.monotonic()
            self.stats["infer_us"] += int((now - started) * 1e6)
            self.stats["request_us"] += int((now - rec.arrival) * 1e6)
        finally:
            if admitted:
                self.control.release()
            if self.live.pop(key, None) is None:
                self.pending -= 1
            if outcome == "success":
                self.stats["success"] += 1
                self.stats["count"] += 1
            else:
                self._fail(outcome)

    def _response(self, job: _Job, model: str, text: str, tokens: list[Token]) -> dict[str, Any]:
        """Triton writes the outputs in name order; a request "id" comes back as "id". With
        ``return_log_probs`` the response carries the log-prob of each token it decodes, and the sum so far."""
        job.cum_log_prob += sum(t.logprob for t in tokens)
        probs = {"cum_log_probs": job.cum_log_prob} if job.log_probs else {}
        fields: dict[str, Any] = {"model_name": model, "model_version": "1"}
        if job.num_tokens[0]:
            fields["num_input_tokens"] = [job.prompt_tokens]
        if job.num_tokens[1]:
            fields["num_output_tokens"] = [len(tokens)]
        if job.log_probs:
            fields["output_log_probs"] = [t.logprob for t in tokens]
        fields = dict(sorted(fields.items()))
        fields |= {"sequence_end": False, "sequence_id": 0, "sequence_start": False, "text_output": text}
        return ({"id": job.rid} if job.rid else {}) | probs | fields

    def _texts(self, job: _Job, model: str, tokens: list[Token]) -> str:
        """What postprocessing makes of a streamed response's tokens. The ensemble decodes each response's
        tokens alone (its default streaming: word-leading spaces are lost); the BLS model with
        ``accumulate_tokens`` decodes every token so far, so each response carries the whole text yet."""
        if model == BLS and self.accumulate_tokens:
            return self.engine.decode([t.id for t in tokens])
        return self.engine.decode_alone(tokens[-1].id)

    async def generate(self, request: Request) -> Response:
        streaming = request.url.path.endswith("_stream")
        try:
            model = self._lookup(request)
            inputs, rid = self._inputs(await request.body())
            job = self._job(inputs, rid)
            job.fault = self.control.take_fault()
        except TritonError as exc:
            return JSONResponse({"error": exc.message}, exc.status)
        per_token = bool(inputs.get("stream", False))
        if per_token and not self.decoupled:  # the tensorrt_llm model refuses it before any response
            return JSONResponse({"error": f"in ensemble '{self.name}', {NOT_DECOUPLED}"}, 400)
        prefix = "" if per_token or inputs.get("exclude_input_in_output", False) else job.prompt
        if streaming:
            return await self._stream(request, job, model, per_token, prefix)
        try:
            tokens = await unless_disconnected(request, self._collect(job))
        except TritonError as exc:
            return JSONResponse({"error": exc.message}, exc.status)
        if tokens is None:
            return Response()
        if per_token and len(tokens) > 1:
            return JSONResponse({"error": ONE_RESPONSE}, 200)
        return JSONResponse(self._whole(job, model, prefix, tokens))

    def _whole(self, job: _Job, model: str, prefix: str, tokens: list[Token]) -> dict[str, Any]:
        """One response for the whole answer: postprocessing decodes all its tokens together."""
        return self._response(job, model, prefix + self.engine.decode([t.id for t in tokens]), tokens)

    async def _collect(self, job: _Job) -> list[Token]:
        async with contextlib.aclosing(self._run(job)) as tokens:
            return [tok async for tok in tokens]

    async def _stream(self, request: Request, job: _Job, model: str, per_token: bool, prefix: str) -> Response:
        """The first response decides the HTTP status; later errors become a last event on a 200 stream."""

        async def responses() -> AsyncGenerator[str, None]:
            if per_token:
                seen: list[Token] = []
                async with contextlib.aclosing(self._run(job)) as tokens:
                    async for tok in tokens:
                        seen.append(tok)
                        yield _json(self._response(job, model, self._texts(job, model, seen), [tok]))
            else:
                yield _json(self._whole(job, model, prefix, await self._collect(job)))

        async def head() -> tuple[str | None]:
            return (await anext(events, None),)

        events, status = responses(), 200
        try:
            started = await unless_disconnected(request, head())
        except TritonError as exc:
            started, status = (_json({"error": exc.message}),), exc.status
        if started is None:
            return Response()
        first = started[0]

        async def body() -> AsyncGenerator[str, None]:
            async with contextlib.aclosing(events):
                if first is not None:
                    yield f"data: {first}\n\n"
                if status != 200:
                    return
                try:
                    async for event in events:
                        yield f"data: {event}\n\n"
                except TritonError as exc:
                    yield f"data: {_json({'error': exc.message})}\n\n"

        return EventStream(body(), status_code=status, media_type="text/event-stream")

    async def live_route(self, request: Request) -> Response:
        return Response(status_code=200 if self.control.healthy else 400)

    async def ready_route(self, request: Request) -> Response:
        return Response(status_code=200 if self.control.healthy and not self.control.loading else 400)

    async def model_ready(self, request: Request) -> Response:
        version = request.path_params.get("version", "")
        ready = self.control.healthy and not self.control.loading and request.path_params["model"] == self.name
        if ready and version in ("", "1"):
            return Response(status_code=200)
        return JSONResponse({"error": "Model version not ready"}, 400)

    async def metrics(self, request: Request) -> Response:
        lines: list[str] = []

        def family(name: str, kind: str, doc: str, samples: Sequence[tuple[dict[str, str], float]]) -> None:
            lines.extend((f"# HELP {name} {doc}", f"# TYPE {name} {kind}"))
            for labels, value in samples:
                lines.append(f"{name}{{{_labels(labels)}}} {_num(value)}" if labels else f"{name} {_num(value)}")

        ensemble, trt = {"model": self.name, "version": "1"}, {"model": COMPOSING, "version": "1"}
        for name, doc, key in COUNTERS:
            family(name, "counter", doc, [(m, self.stats[key]) for m in (ensemble, trt)])
        failures = [(m | {"reason": r}, c) for m, k in ((ensemble, "ensemble"), (trt, "composing"))
                    for r, c in self.failures[k].items()]  # fmt: skip
        family(
            "nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes", failures
        )
        doc = "Instantaneous number of pending requests awaiting execution per-model."
        family("nv_inference_pending_request_count", "gauge", doc, [(ensemble, self.pending), (trt, self.pending)])
        bounds = [{"le": le} for le in ("100", "500", "2000", "5000", "+Inf")]
        name = "nv_inference_first_response_histogram_ms"
        family(name, "histogram", "Duration from request to first response in milliseconds",
               [(ensemble | le, c) for le, c in zip(bounds, self.first_ms, strict=True)])  # fmt: skip
        lines[-5:] = [line.replace(name, f"{name}_bucket", 1) for line in lines[-5:]]
        lines += [f"{name}_count{{{_labels(ensemble)}}} {self.first_ms[-1]}"]
        lines += [f"{name}_sum{{{_labels(ensemble)}}} {_num(round(self.first_ms_sum, 3))}"]
        family("nv_cpu_utilization", "gauge", "CPU utilization rate [0.0 - 1.0]", [({}, 0.0)])
        running, waiting = len(self.live), self.pending
        context = sum(1 for r in self.live.values() if r.generated == 0)
        requests = {"active": running, "waiting": waiting, "scheduled": running, "context": context, "max": MAX_ACTIVE}
        family("nv_trt_llm_request_metrics", "gauge", "TRT LLM request metrics",
               [(trt | {"request_type": k}, v) for k, v in requests.items()])  # fmt: skip
        used = sum(math.ceil((r.prompt + r.generated) / TOKENS_PER_BLOCK) for r in self.live.values())
        blocks = {"fraction": used / self.max_blocks, "used": used, "free": self.max_blocks - used,
                  "max": self.max_blocks, "tokens_per": TOKENS_PER_BLOCK}  # fmt: skip
        family("nv_trt_llm_kv_cache_block_metrics", "gauge", "TRT LLM KV cache block metrics",
               [(trt | {"kv_cache_block_type": k}, v) for k, v in blocks.items()])  # fmt: skip
        return Response("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4; charset=utf-8")


async def _not_found(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return JSONResponse({"error": "Not Found" if exc.status_code == 404 else "Method Not Allowed"}, exc.status_code)


def create_app(
    engine: TinyEngine,
    control: FakeControl,
    *,
    model_name: str = "ensemble",
    accumulate_tokens: bool = True,
    received: list[dict[str, Any]] | None = None,
    guided_decoding_backend: str | None = "xgrammar",
    output_log_probs: bool = True,
    token_counts: bool = False,
    decoupled: bool = True,
) -> ASGIApp:
    """The fake, serving the ensemble (``model_name``) and ``tensorrt_llm_bls`` (``accumulate_tokens``: its
    config parameter), behind the generic faults of ``control``; each generate body is appended to
    ``received``; ``guided_decoding_backend`` is the tensorrt_llm model's parameter (None: unset);
    ``output_log_probs``, ``token_counts`` and ``decoupled`` are the deployment switches above."""
    server = _Server(
        engine, control, model_name, accumulate_tokens, [] if received is None else received,
        guided_decoding_backend, output_log_probs, token_counts, decoupled,
    )  # fmt: skip
    routes = [Route("/v2/health/live", server.live_route), Route("/v2/health/ready", server.ready_route)]
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        routes.append(Route(f"{base}/ready", server.model_ready, methods=["GET"]))
        routes.append(Route(f"{base}/generate", server.generate, methods=["POST"]))
        routes.append(Route(f"{base}/generate_stream", server.generate, methods=["POST"]))
    routes.append(Route("/metrics", server.metrics, methods=["GET"]))
    return with_faults(Starlette(routes=routes, exception_handlers={HTTPException: _not_found}), control)
