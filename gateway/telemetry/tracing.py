"""OpenTelemetry traces of the gateway's requests (``telemetry.otlp_endpoint``), with the GenAI
semantic conventions.

One SERVER span per request (``chat m``, ``text_completion m``, ``embeddings m``) holds what was asked
and answered (``gen_ai.*``: operation, request and response model, token usage, finish reasons, the
request's ``max_tokens`` and ``temperature``), the backend that answered (``server.address``,
``server.port``), ``http.route``, the status and the gateway's request id. Its children: ``route``
(rule, reason, the chosen backend and every candidate's predictions), one ``attempt <backend>`` per
backend tried (outcome, time to first token; its span context goes to the engine as ``traceparent``,
which vLLM and TGI continue) and, for a stream, ``stream`` (chunks, duration). A request that arrives
with a ``traceparent`` continues its caller's trace. Prompt and answer text go into spans only with
``telemetry.capture_content``.

Only this module imports OpenTelemetry, and only ``gateway.state`` imports this module, when an
endpoint is configured: with tracing off nothing of the SDK is loaded and the pipeline's hooks are a
``None`` test each. The tracer provider is the app's own (never OpenTelemetry's global one); its
batch processor exports from its own thread, and ``shutdown`` sends what is left.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping, Sequence
from importlib import metadata
from typing import Any
from urllib.parse import urlsplit

import orjson
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from backends.base import Chunk, GenerationRequest, Usage
from gateway.config import BackendConfig, CTranslate2Config, LlamaCppConfig, TelemetryConfig
from routing.decisions import Decision
from routing.types import RequestFeatures

OPERATIONS = {"chat": "chat", "completions": "text_completion", "embeddings": "embeddings"}
"""``gen_ai.operation.name`` by front door; Responses and Messages are chat."""
_PROPAGATOR = TraceContextTextMapPropagator()  # stateless: W3C trace context in and out


def _version() -> str:
    try:
        return metadata.version("enginegate")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


class Tracing:
    """The app's tracer provider and what every request's trace shares."""

    def __init__(self, config: TelemetryConfig) -> None:
        assert config.otlp_endpoint is not None
        version = _version()
        resource = Resource.create({"service.name": config.service_name, "service.version": version})
        sampler = ParentBased(TraceIdRatioBased(config.sampling_ratio))
        self.provider = TracerProvider(resource=resource, sampler=sampler)
        exporter = OTLPSpanExporter(endpoint=config.otlp_endpoint.rstrip("/") + "/v1/traces")
        batches = BatchSpanProcessor(exporter, schedule_delay_millis=config.export_delay_s * 1000)
        self.provider.add_span_processor(batches)
        self.tracer: Tracer = self.provider.get_tracer("enginegate", version)
        self.capture_content = config.capture_content
        self._addresses: dict[str, tuple[str, int] | None] = {}

    def request(
        self, headers: Mapping[str, str], request_id: str, route: str, path: str, started: float
    ) -> RequestTrace:
        """The trace of one request that arrived at ``started`` (``perf_counter``), under the caller's
        ``traceparent`` when it sent one."""
        parent = _PROPAGATOR.extract(headers) if "traceparent" in headers else None
        return RequestTrace(self, parent, request_id, route, path, _wall_ns(started))

    def address(self, config: BackendConfig) -> tuple[str, int] | None:
        """The backend's host and port (``server.address``, ``server.port``); None in process."""
        if isinstance(config, CTranslate2Config | LlamaCppConfig):
            return None
        url = config.url
        if url not in self._addresses:
            parts = urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            self._addresses[url] = (parts.hostname, port) if parts.hostname else None
        return self._addresses[url]

    def shutdown(self) -> None:
        """Send the spans still batched and stop the exporter's thread (blocks: call it off the loop)."""
        self.provider.shutdown()


def _wall_ns(perf: float) -> int:
    """A ``perf_counter`` reading as the wall-clock nanoseconds spans carry."""
    return time.time_ns() - int((time.perf_counter() - perf) * 1e9)


class RequestTrace:
    """One request's spans: its RequestLife tells it what happens, in order."""

    def __init__(
        self, tracing: Tracing, parent: Context | None, request_id: str, route: str, path: str, start_ns: int
    ) -> None:
        self._tracing = tracing
        self.operation = OPERATIONS.get(route, "chat")
        self.span: Span = tracing.tracer.start_span(
            self.operation,
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                "gen_ai.operation.name": self.operation,
                "http.request.method": "POST",
                "http.route": path,
                "enginegate.request_id": request_id,
                "enginegate.route": route,
            },
            start_time=start_ns,
        )
        self.recording = self.span.is_recording()
        self._context = set_span_in_context(self.span, parent)
        self._attempts: dict[str, Span] = {}
        self._stream: Span | None = None
        self.chunks = 0
        self.finishes: list[str] = []
        self.texts: list[str] | None = [] if tracing.capture_content else None
        """The answer's text as it streams, kept only with ``capture_content``."""

    def asked(self, request: GenerationRequest) -> None:
        """What the client asked for; its text only with ``capture_content``."""
        if not self.recording:
            return
        attributes: dict[str, Any] = {
            "gen_ai.request.temperature": request.temperature,
            "gen_ai.request.top_p": request.top_p,
        }
        if request.max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = request.max_tokens
        if request.n != 1:
            attributes["gen_ai.request.choice.count"] = request.n
        if self.texts is not None:
            asked: Any = request.messages
            if asked is None:
                asked = [{"role": "user", "content": request.prompt}]
            attributes["gen_ai.input.messages"] = orjson.dumps(asked).decode()
        self.span.set_attributes(attributes)  # at once: the SDK takes a lock and checks values per call

    def routed(self, decision: Decision, features: RequestFeatures | None, began: float) -> None:
        """The routing decision, as a child span from ``began`` (``perf_counter``) to now."""
        if not self.recording:  # sampled out: no child spans either (the engine still gets the context)
            return
        self.span.set_attribute("enginegate.stream", bool(features is not None and features.stream))
        span = self._tracing.tracer.start_span("route", self._context, start_time=_wall_ns(began))
        span.set_attributes(_decision_attributes(decision, features))
        span.end()

    def sending(self, backend: str, config: BackendConfig) -> None:
        """An attempt on ``backend`` starts."""
        if not self.recording:
            return
        attributes: dict[str, str | int] = {"enginegate.backend": backend, "enginegate.engine": config.engine}
        address = self._tracing.address(config)
        if address is not None:
            attributes["server.address"], attributes["server.port"] = address
        self._attempts[backend] = self._tracing.tracer.start_span(
            f"attempt {backend}", self._context, SpanKind.CLIENT, attributes, start_time=time.time_ns()
        )

    def outgoing(self, backend: str) -> dict[str, str]:
        """The headers that carry the attempt's span context to its engine (``traceparent``)."""
        carrier: dict[str, str] = {}
        span = self._attempts.get(backend)
        _PROPAGATOR.inject(carrier, set_span_in_context(span) if span is not None else self._context)
        return carrier

    def first_token(self, backend: str, ttft_s: float) -> None:
        span = self._attempts.get(backend)
        if span is not None:
            span.add_event("first_token")
            span.set_attribute("enginegate.ttft_ms", round(ttft_s * 1000, 3))

    def failed(self, backend: str, kind: str, detail: str) -> None:
        """The attempt failed: its span ends in error (the engine's words only with ``capture_content``,
        as they may quote the request)."""
        span = self._attempts.pop(backend, None)
        if span is not None:
            span.set_attributes({"enginegate.outcome": kind, "error.type": kind})
            span.set_status(Status(StatusCode.ERROR, detail[:500] if self.texts is not None else kind))
            span.end()

    def ended(self, backend: str, outcome: str = "cancelled") -> None:
        """The attempt ended without an answer of its own (cancelled, or a hedge that lost)."""
        span = self._attempts.pop(backend, None)
        if span is not None:
            span.set_attribute("enginegate.outcome", outcome)
            span.end()

    def committed(
        self, backend: str, config: BackendConfig, first: Sequence[Chunk], rest: AsyncIterator[Chunk], stream: bool
    ) -> AsyncIterator[Chunk]:
        """The attempt on ``backend`` answered: the request is its. A whole answer is in ``first``; a
        stream goes on in the ``stream`` span, and its ``rest`` is to be read from what this returns."""
        if not self.recording:
            return rest
        address = self._tracing.address(config)
        span = self.span
        span.set_attribute("enginegate.backend", backend)
        if address is not None:
            span.set_attributes({"server.address": address[0], "server.port": address[1]})
        self.ended(backend, "ok")
        for chunk in first:
            self.chunk(chunk)
        if not stream:
            return rest
        self._stream = self._tracing.tracer.start_span("stream", self._context, start_time=time.time_ns())
        return _Counted(rest, self)

    def chunk(self, chunk: Chunk) -> None:
        """One chunk of the answer (every chunk of a stream, as it passes): its deltas counted."""
        self.chunks += len(chunk.pieces) or 1
        if chunk.finish_reason is not None:
            self.finishes.append(chunk.finish_reason)
        if self.texts is not None and chunk.text:
            self.texts.append(chunk.text)

    def finished(
        self,
        model: str,
        outcome: str,
        status: int | None,
        usage: Usage | None,
        error_kind: str | None,
        code: str | None,
        ttft_ms: float | None,
    ) -> None:
        """The request ended (answered, refused, failed or the client left): every span ends. ``model``:
        the model asked for ("none" when the body never named one); ``ttft_ms`` None: no answer began."""
        span = self.span
        if not self.recording:
            span.end()
            return
        for backend in list(self._attempts):
            self.ended(backend)
        attributes: dict[str, Any] = {"enginegate.outcome": outcome}
        if model != "none":
            span.update_name(f"{self.operation} {model}")
            attributes["gen_ai.request.model"] = model
            if ttft_ms is not None:  # the gateway answers under the model's name, whichever engine served it
                attributes["gen_ai.response.model"] = model
        if status is not None:
            attributes["http.response.status_code"] = status
        if usage is not None:
            attributes["gen_ai.usage.input_tokens"] = usage.prompt_tokens
            attributes["gen_ai.usage.output_tokens"] = usage.completion_tokens
        if self.finishes:
            attributes["gen_ai.response.finish_reasons"] = self.finishes
        if ttft_ms is not None:
            attributes["enginegate.ttft_ms"] = ttft_ms
        if self.texts is not None and self.chunks:
            answer = [{"role": "assistant", "content": "".join(self.texts)}]
            attributes["gen_ai.output.messages"] = orjson.dumps(answer).decode()
        stream = self._stream
        if stream is not None:
            stream.set_attributes({"enginegate.chunks": self.chunks, "enginegate.outcome": outcome})
            if outcome == "error":
                stream.set_status(Status(StatusCode.ERROR, error_kind or "internal"))
            stream.end()
        if outcome == "error":
            why = code or error_kind or "internal_error"
            attributes["error.type"] = why
            span.set_status(Status(StatusCode.ERROR, why))
        span.set_attributes(attributes)
        span.end()


class _Counted:
    """A stream's rest as the client reads it, each chunk counted on the way. Closing it closes the
    engine's stream (which stops its work) even when it was never read: a generator would not."""

    __slots__ = ("_rest", "_trace")

    def __init__(self, rest: AsyncIterator[Chunk], trace: RequestTrace) -> None:
        self._rest, self._trace = rest, trace

    def __aiter__(self) -> _Counted:
        return self

    async def __anext__(self) -> Chunk:
        chunk = await anext(self._rest)
        self._trace.chunk(chunk)
        return chunk

    async def aclose(self) -> None:
        aclose = getattr(self._rest, "aclose", None)  # as dispatch closes streams: an iterator may have none
        if aclose is not None:
            await aclose()


def _decision_attributes(decision: Decision, features: RequestFeatures | None) -> dict[str, Any]:
    """The routing span's attributes: why, and what each candidate was predicted to do."""
    attributes: dict[str, Any] = {"enginegate.route.reason": decision.reason.value}
    if decision.rule:
        attributes["enginegate.route.rule"] = decision.rule
    if decision.candidates:
        attributes["enginegate.route.backend"] = decision.candidates[0].backend
        attributes["enginegate.route.candidates"] = [c.backend for c in decision.candidates]
    if features is not None:
        attributes["enginegate.request.prompt_tokens"] = features.prompt_tokens
        budgets = (
            ("ttft_budget_ms", features.ttft_budget_ms),
            ("tpot_budget_ms", features.tpot_budget_ms),
            ("latency_budget_ms", features.latency_budget_ms),
        )
        for name, budget in budgets:
            if budget is not None:
                attributes[f"enginegate.request.{name}"] = budget
    for c in decision.candidates:
        p, prefix = c.prediction, f"enginegate.candidate.{c.backend}."
        attributes[prefix + "score"] = round(c.score, 6)
        attributes[prefix + "ttft_ms"] = round(p.ttft_ms, 3)
        attributes[prefix + "tpot_ms"] = round(p.tpot_ms, 3)
        attributes[prefix + "e2e_ms"] = round(p.e2e_ms, 3)
        attributes[prefix + "queue_ms"] = round(p.queue_ms, 3)
        attributes[prefix + "cached_tokens"] = p.cached_tokens
        attributes[prefix + "meets_budget"] = c.meets_budget
    for backend, why in decision.excluded.items():
        attributes[f"enginegate.excluded.{backend}"] = why
    return attributes
