"""A real picker on a free port and the messages Envoy's ext_proc filter sends it, built by hand.

The Inference Extension publishes no picker-level conformance suite, so the picker is tested the way
a proxy uses it: ``ProcessingRequest`` sequences over a real gRPC stream (grpc.aio), in the order
Envoy sends them in full-duplex streamed mode. The endpoints are scripted backends (their health and
load are what the fleet polls); no engine is ever called, since the proxy carries the requests.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import orjson
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc

from backends.base import Backend, Load
from gateway.config import load_config
from gateway.epp import wire
from gateway.epp.server import EndpointPicker
from gateway.fleet.entry import Entry
from tests.conftest import write_config
from tests.fakes import ScriptedBackend, factory

H100, A10G = "10.0.0.1:8000", "10.0.0.2:8000"
FLEET = f"""
limits: {{health_interval_s: 0.2, max_body_bytes: 1000000}}
routing: {{mode: MODE}}
models:
  - {{name: m8b, params_b: 8, dtype: bf16, context: 32768}}
backends:
  - {{name: h100, engine: vllm, url: "http://{H100}", model: m8b, gpu: H100, cost_per_hour: 6}}
  - {{name: a10g, engine: vllm, url: "http://{A10G}", model: m8b, gpu: A10G, cost_per_hour: 0.01}}
"""
# About 1000 prompt tokens: prefill takes ~30 ms on an H100 and ~230 ms on an A10G for an 8B model.
LONG = "Beautiful is better than ugly. " * 130


@dataclass
class Endpoint(ScriptedBackend):
    """A pool member whose gauges the test sets (what the fleet's poll reads)."""

    running: int = 0
    waiting: int = 0

    async def load(self) -> Load | None:
        return Load(running=self.running, waiting=self.waiting)


def chat(content: str = LONG, **extra: Any) -> bytes:
    return orjson.dumps({"model": "m8b", "messages": [{"role": "user", "content": content}], **extra})


def request_headers(
    path: str = "/v1/chat/completions",
    headers: Iterable[tuple[str, str]] = (),
    end: bool = False,
    subset: Any = None,
    mode: int = wire.FULL_DUPLEX,
) -> Any:
    pairs = [(":method", "POST"), (":path", path), ("content-type", "application/json"), *headers]
    message = ext.ProcessingRequest(
        request_headers=ext.HttpHeaders(
            headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs]),
            end_of_stream=end,
        )
    )
    message.protocol_config.request_body_mode = mode
    message.protocol_config.response_body_mode = wire.FULL_DUPLEX
    if subset is not None:
        message.metadata_context.filter_metadata[wire.SUBSET_NAMESPACE].update({wire.SUBSET: subset})
    return message


def request_body(body: bytes, pieces: int = 1) -> list[Any]:
    """The body as Envoy streams it: ``pieces`` chunks, ``end_of_stream`` on the last."""
    size = -(-len(body) // pieces)
    chunks = [body[i : i + size] for i in range(0, len(body), size)]
    return [
        ext.ProcessingRequest(request_body=ext.HttpBody(body=c, end_of_stream=i == len(chunks) - 1))
        for i, c in enumerate(chunks)
    ]


def chunk(data: bytes, end: bool = False) -> Any:
    return ext.ProcessingRequest(request_body=ext.HttpBody(body=data, end_of_stream=end))


def response_headers(status: int = 200, content_type: str = "text/event-stream", served: str | None = None) -> Any:
    pairs = [(":status", str(status)), ("content-type", content_type)]
    message = ext.ProcessingRequest(
        response_headers=ext.HttpHeaders(
            headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs])
        )
    )
    if served is not None:
        message.metadata_context.filter_metadata[wire.NAMESPACE].update({wire.SERVED: served})
    return message


def response_body(data: bytes, end: bool) -> Any:
    return ext.ProcessingRequest(response_body=ext.HttpBody(body=data, end_of_stream=end))


def sse(*docs: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(d) + b"\n\n" for d in docs) + b"data: [DONE]\n\n"


def destination(answer: Any) -> tuple[str, str]:
    """(the header's value, the ``envoy.lb`` metadata's value) of a pick."""
    assert answer.WhichOneof("response") == "request_headers", answer
    headers = answer.request_headers.response.header_mutation.set_headers
    header = next(h.header.raw_value.decode() for h in headers if h.header.key == wire.DESTINATION)
    return header, answer.dynamic_metadata.fields[wire.NAMESPACE].struct_value.fields[wire.DESTINATION].string_value


def refused(answer: Any) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, OpenAI error body, headers) of an immediate response."""
    immediate = answer.immediate_response
    headers = {h.header.key: h.header.raw_value.decode() for h in immediate.headers.set_headers}
    return immediate.status.code, orjson.loads(immediate.body)["error"], headers


async def rest(call: Any) -> list[Any]:
    """Every answer still to come on ``call``, until the picker ends the stream."""
    answers = []
    while (answer := await call.read()) is not grpc.aio.EOF:
        answers.append(answer)
    return answers


class Picker:
    """The picker under test, its fleet's entries and a stub on a channel to it."""

    def __init__(self, epp: EndpointPicker, port: int, backends: dict[str, Endpoint]) -> None:
        self.epp = epp
        self.port = port
        self.backends = backends
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.stub = ext_grpc.ExternalProcessorStub(self.channel)

    def entry(self, name: str) -> Entry:
        return self.epp.state.fleet.entries[name]

    async def exchange(self, messages: Iterable[Any]) -> list[Any]:
        """Send every message, then read every answer until the picker ends the stream."""
        call = self.stub.Process()
        try:
            for message in messages:
                await call.write(message)
            await call.done_writing()
        except grpc.aio.AioRpcError:
            pass  # the picker ended the stream early: reading gives its answers and status
        return await rest(call)


@contextlib.asynccontextmanager
async def running(tmp_path: Path, mode: str = "best_effort", **health: bool) -> AsyncIterator[Picker]:
    """A picker over the two-GPU fleet; ``health`` marks endpoints down (``h100=False``)."""
    backends = {name: Endpoint(name, "m8b", healthy=health.get(name, True)) for name in ("h100", "a10g")}
    loaded = load_config(write_config(tmp_path / "epp.yaml", FLEET.replace("MODE", mode)))
    epp = EndpointPicker(loaded, factory(dict[str, Backend](backends)))
    [port] = await epp.start("127.0.0.1", [0])
    picker = Picker(epp, port, backends)
    try:
        yield picker
    finally:
        await picker.channel.close()
        await epp.stop(0)
