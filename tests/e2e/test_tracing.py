"""OpenTelemetry traces through a real gateway process (``telemetry.otlp_endpoint``) into a real OTLP/HTTP
receiver (tests/otlp.py decodes the SDK's protobuf export), with the contract fakes of vLLM and TGI as
the engines: one SERVER span per request with the GenAI attributes, its route, attempt and stream
children, the attempt's ``traceparent`` received by the engine, a caller's ``traceparent`` continued,
errors as span status, and no prompt or answer text in any span."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from backends.base import Chunk, GenerationRequest
from gateway.app import create_app
from gateway.config import load_config
from tests.conftest import GatewayProcess, write_config
from tests.contract import fake_tgi, fake_vllm
from tests.contract.control import FakeControl
from tests.contract.tiny_engine import TinyEngine
from tests.fakes import CONNECT_ERROR, ScriptedBackend, factory, serve_in_thread
from tests.otlp import CLIENT, SERVER, STATUS_ERROR, Receiver, Span

SECRET = "cobalt-heron-5821"
"""In every prompt: it must appear in no span."""
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


@dataclass
class HeaderTap:
    """An engine fake as deployed behind it: every POST's ``traceparent`` header is kept."""

    app: ASGIApp
    traceparents: list[str | None] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = dict(scope["headers"])
            value = headers.get(b"traceparent")
            self.traceparents.append(value.decode() if value is not None else None)
        await self.app(scope, receive, send)


@dataclass
class Traced:
    receiver: Receiver
    gateway: GatewayProcess
    engines: dict[str, HeaderTap]
    ports: dict[str, int]


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[Traced]:
    engine, control = TinyEngine(cache_dir), FakeControl()
    taps = {
        "vllm": HeaderTap(fake_vllm.create_app(engine)),
        "tgi": HeaderTap(fake_tgi.create_app(engine, control)),
    }
    with ExitStack() as stack:
        receiver = stack.enter_context(Receiver().running())
        urls = {name: stack.enter_context(serve_in_thread(tap, "/health")) for name, tap in taps.items()}
        backends = "\n".join(
            f"  - {{name: on-{n}, model: demo-{n}, engine: {n}, url: {u}, served_model: enginegate-demo}}"
            for n, u in urls.items()
        )
        models = "\n".join(f'  - {{name: demo-{n}, gguf: "{{GGUF}}"}}' for n in urls)
        config = write_config(
            tmp_path_factory.mktemp("tracing") / "c.yaml",
            f"telemetry: {{otlp_endpoint: '{receiver.url}', export_delay_s: 0.05}}\n"
            f"limits: {{health_interval_s: 0.5}}\nmodels:\n{models}\nbackends:\n{backends}\n",
        )
        gateway = GatewayProcess(config, cache_dir)
        stack.callback(gateway.stop)
        ports = {n: int(u.rsplit(":", 1)[1]) for n, u in urls.items()}
        yield Traced(receiver, gateway, taps, ports)


def _client(traced: Traced, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{traced.gateway.base_url}/v1", api_key="unused", max_retries=0, timeout=120, default_headers=headers
    )


def _no_text(spans: list[Span], *texts: str) -> None:
    for span in spans:
        for key, value in span.attributes.items():
            for text in texts:
                assert text not in str(value), (span.name, key)


def _engine_continued(tap: HeaderTap, attempt: Span, before: int) -> None:
    """The engine got one request, carrying the attempt's span context (W3C: version-trace-parent-flags)."""
    sent = tap.traceparents[before:]
    assert len(sent) == 1, sent
    assert sent[0] is not None
    version, trace_id, parent_id, _ = sent[0].split("-")
    assert (version, trace_id, parent_id) == ("00", attempt.trace_id, attempt.span_id)


@pytest.mark.parametrize("engine", ["vllm", "tgi"])
def test_a_whole_answer_is_a_server_span_with_its_route_and_attempt(traced: Traced, engine: str) -> None:
    before = len(traced.engines[engine].traceparents)
    raw = _client(traced).chat.completions.with_raw_response.create(
        model=f"demo-{engine}",
        messages=[{"role": "user", "content": f"Hello {SECRET}"}],
        max_tokens=12,
        temperature=0,
    )
    answer = raw.parse()
    assert answer.usage is not None
    span = traced.receiver.server_span(raw.headers["x-request-id"])
    assert span.kind == SERVER and span.name == f"chat demo-{engine}"
    a = span.attributes
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == a["gen_ai.response.model"] == f"demo-{engine}"
    assert a["gen_ai.request.max_tokens"] == 12 and a["gen_ai.request.temperature"] == 0.0
    assert a["gen_ai.usage.input_tokens"] == answer.usage.prompt_tokens
    assert a["gen_ai.usage.output_tokens"] == answer.usage.completion_tokens
    assert a["gen_ai.response.finish_reasons"] == [answer.choices[0].finish_reason]
    assert (a["server.address"], a["server.port"]) == ("127.0.0.1", traced.ports[engine])
    assert a["http.route"] == "/v1/chat/completions" and a["http.response.status_code"] == 200
    assert a["enginegate.backend"] == f"on-{engine}" and a["enginegate.outcome"] == "ok"
    assert span.resource["service.name"] == "enginegate"
    kids = {s.name: s for s in traced.receiver.children(span, 2)}
    assert set(kids) == {"route", f"attempt on-{engine}"}
    route = kids["route"].attributes
    assert route["enginegate.route.backend"] == f"on-{engine}"
    assert route["enginegate.route.reason"] == raw.headers["x-enginegate-route"]
    assert route[f"enginegate.candidate.on-{engine}.ttft_ms"] > 0
    attempt = kids[f"attempt on-{engine}"]
    assert attempt.kind == CLIENT and attempt.events == ["first_token"]
    assert attempt.attributes["enginegate.outcome"] == "ok" and attempt.attributes["enginegate.ttft_ms"] > 0
    assert attempt.attributes["server.port"] == traced.ports[engine]
    _engine_continued(traced.engines[engine], attempt, before)
    content = answer.choices[0].message.content
    assert content
    _no_text(traced.receiver.trace(span.trace_id), SECRET, content)


def test_a_stream_has_a_stream_span_and_continues_the_callers_trace(traced: Traced) -> None:
    before = len(traced.engines["vllm"].traceparents)
    client = _client(traced, traceparent=f"00-{CALLER_TRACE}-{CALLER_SPAN}-01")
    with client.chat.completions.with_streaming_response.create(
        model="demo-vllm",
        messages=[{"role": "user", "content": f"Say {SECRET}"}],
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ) as raw:
        rid = raw.headers["x-request-id"]
        chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = next(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason)
    usage = chunks[-1].usage
    assert usage is not None and text
    span = traced.receiver.server_span(rid)
    assert (span.trace_id, span.parent_id) == (CALLER_TRACE, CALLER_SPAN)  # the caller's trace, continued
    a = span.attributes
    assert a["gen_ai.usage.output_tokens"] == usage.completion_tokens
    assert a["gen_ai.response.finish_reasons"] == [finish]
    assert a["enginegate.stream"] is True
    kids = {s.name: s for s in traced.receiver.children(span, 3)}
    assert set(kids) == {"route", "attempt on-vllm", "stream"}
    assert kids["stream"].attributes["enginegate.chunks"] >= usage.completion_tokens
    assert kids["stream"].attributes["enginegate.outcome"] == "ok"
    assert kids["stream"].start_ns >= kids["attempt on-vllm"].end_ns  # the stream goes on after the commit
    _engine_continued(traced.engines["vllm"], kids["attempt on-vllm"], before)
    _no_text(traced.receiver.trace(span.trace_id), SECRET, text)


def test_an_error_sets_the_span_status_with_its_code(traced: Traced) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        _client(traced).chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "Hi"}])
    span = traced.receiver.server_span(caught.value.response.headers["x-request-id"])
    assert span.status == STATUS_ERROR and span.status_message == "model_not_found"
    assert span.attributes["error.type"] == "model_not_found"
    assert span.attributes["http.response.status_code"] == 404


def test_a_completion_names_its_operation(traced: Traced) -> None:
    raw = _client(traced).completions.with_raw_response.create(
        model="demo-vllm", prompt=f"Once {SECRET}", max_tokens=4, temperature=0
    )
    span = traced.receiver.server_span(raw.headers["x-request-id"])
    assert span.attributes["gen_ai.operation.name"] == "text_completion"
    assert span.attributes["http.route"] == "/v1/completions"
    _no_text(traced.receiver.trace(span.trace_id), SECRET)


def _spans_hold(spans: list[Span], text: str) -> bool:
    return any(text in str(v) for s in spans for v in s.attributes.values())


def test_content_is_captured_only_when_asked(tmp_path: Path, cache_dir: Path, traced: Traced) -> None:
    """``capture_content: true``: the prompt and answer go into the server span (the default holds neither)."""
    url = f"http://127.0.0.1:{traced.ports['vllm']}"
    config = write_config(
        tmp_path / "c.yaml",
        f"telemetry: {{otlp_endpoint: '{traced.receiver.url}', export_delay_s: 0.05, capture_content: true}}\n"
        f'models: [{{name: demo, gguf: "{{GGUF}}"}}]\n'
        f"backends: [{{name: v, model: demo, engine: vllm, url: '{url}', served_model: enginegate-demo}}]\n",
    )
    gateway = GatewayProcess(config, cache_dir)
    try:
        client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
        raw = client.chat.completions.with_raw_response.create(
            model="demo", messages=[{"role": "user", "content": f"Hi {SECRET}"}], max_tokens=6, temperature=0
        )
        answer: Any = raw.parse().choices[0].message.content
        span = traced.receiver.server_span(raw.headers["x-request-id"])
    finally:
        gateway.stop()
    assert SECRET in span.attributes["gen_ai.input.messages"]
    assert answer in span.attributes["gen_ai.output.messages"]
    assert _spans_hold([span], SECRET)


def _in_process(tmp_path: Path, receiver: Receiver, telemetry: str, backends: dict[str, ScriptedBackend]) -> Any:
    """A gateway app in this process over scripted backends (named in ``backends``, the first preferred)."""
    names = list(backends)
    rows = "\n".join(
        f"  - {{name: {n}, model: m, engine: vllm, gpu: H100, url: 'http://10.0.0.{i + 1}:8000'}}"
        for i, n in enumerate(names)
    )
    config = write_config(
        tmp_path / "c.yaml",
        f"telemetry: {{otlp_endpoint: '{receiver.url}', export_delay_s: 0.05, {telemetry}}}\n"
        f"routing: {{rules: [{{name: first, prefer: [{names[0]}]}}]}}\n"
        f"models: [{{name: m, params_b: 8}}]\nbackends:\n{rows}\n",
    )
    return create_app(load_config(config), factory(dict(backends)))


def test_a_failed_attempt_is_an_error_span_beside_the_one_that_answered(tmp_path: Path, traced: Traced) -> None:
    down = ScriptedBackend("down", "m", fail_with=CONNECT_ERROR)
    app = _in_process(tmp_path, traced.receiver, "sampling_ratio: 1", {"down": down, "up": ScriptedBackend("up", "m")})
    with serve_in_thread(app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        raw = client.chat.completions.with_raw_response.create(model="m", messages=[{"role": "user", "content": "Hi"}])
    assert raw.headers["x-enginegate-backend"] == "up" and down.calls == 1
    span = traced.receiver.server_span(raw.headers["x-request-id"])
    assert span.attributes["enginegate.backend"] == "up" and span.attributes["server.address"] == "10.0.0.2"
    kids = {s.name: s for s in traced.receiver.children(span, 3)}
    failed, answered = kids["attempt down"], kids["attempt up"]
    assert failed.status == STATUS_ERROR and failed.attributes["error.type"] == "connect"
    assert failed.attributes["server.address"] == "10.0.0.1" and "first_token" not in failed.events
    assert answered.status != STATUS_ERROR and answered.attributes["enginegate.outcome"] == "ok"
    assert kids["route"].attributes["enginegate.route.candidates"][:2] == ["down", "up"]


def test_a_request_not_sampled_makes_no_span_but_passes_its_context_on(tmp_path: Path, traced: Traced) -> None:
    seen: list[str] = []

    class Seeing(ScriptedBackend):
        def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
            seen.append(request.headers.get("traceparent", ""))
            return super().generate(request)

    app = _in_process(tmp_path, traced.receiver, "sampling_ratio: 0", {"only": Seeing("only", "m")})
    with serve_in_thread(app) as url:  # leaving it shuts the app down: what was batched is sent
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        raw = client.chat.completions.with_raw_response.create(model="m", messages=[{"role": "user", "content": "Hi"}])
    rid = raw.headers["x-request-id"]
    assert len(seen) == 1
    version, _, _, flags = seen[0].split("-")
    assert version == "00" and int(flags, 16) & 1 == 0  # passed on, its sampled flag off
    assert not [s for s in traced.receiver.spans if s.attributes.get("enginegate.request_id") == rid]
