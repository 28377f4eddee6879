"""A real OTLP/HTTP trace receiver for tests: what a collector's ``otlphttp`` receiver does with the
SDK's protobuf export (``POST /v1/traces``, an ``ExportTraceServiceRequest``), decoded into plain
``Span`` records a test can assert on. It runs in a thread of the test process on a free loopback port.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests.polling import wait_until

SERVER, CLIENT, INTERNAL = 2, 3, 1
"""OTLP's span kinds."""
STATUS_ERROR = 2


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, Any]
    status: int
    status_message: str
    events: list[str]
    resource: dict[str, Any] = field(default_factory=dict)
    start_ns: int = 0
    end_ns: int = 0


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind) if kind is not None else None


class Receiver:
    """Every span received, in arrival order; ``url`` is the endpoint to configure."""

    def __init__(self, port: int = 0) -> None:
        self.spans: list[Span] = []
        self.posts = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces" or "protobuf" not in (self.headers.get("content-type") or ""):
                    self.send_error(404)
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.add(request)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, fmt: str, *args: Any) -> None:  # quiet: no line per export
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def add(self, request: ExportTraceServiceRequest) -> None:
        spans = []
        for rs in request.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append(
                        Span(
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            s.kind,
                            {kv.key: _value(kv.value) for kv in s.attributes},
                            s.status.code,
                            s.status.message,
                            [e.name for e in s.events],
                            resource,
                            s.start_time_unix_nano,
                            s.end_time_unix_nano,
                        )
                    )
        with self._lock:
            self.posts += 1
            self.spans.extend(spans)

    def trace(self, trace_id: str) -> list[Span]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def server_span(self, request_id: str, timeout: float = 30.0) -> Span:
        """The SERVER span of the gateway's request ``request_id``, once it arrived."""

        def found() -> Span | None:
            with self._lock:
                ours = (s for s in self.spans if s.attributes.get("enginegate.request_id") == request_id)
                return next((s for s in ours if s.kind == SERVER), None)

        span = wait_until(found, timeout, message=f"no server span of {request_id} within {timeout}s")
        assert span is not None
        return span

    def children(self, parent: Span, count: int, timeout: float = 30.0) -> list[Span]:
        """The spans under ``parent``, once there are at least ``count`` of them (children are ended,
        and so exported, before their parent: they are normally there already)."""

        def found() -> list[Span] | None:
            kids = [s for s in self.trace(parent.trace_id) if s.parent_id == parent.span_id]
            return kids if len(kids) >= count else None

        kids = wait_until(found, timeout, message=f"fewer than {count} spans under {parent.name} within {timeout}s")
        assert kids is not None
        return kids

    @contextmanager
    def running(self) -> Iterator[Receiver]:
        thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join(timeout=10)


def main() -> None:
    """``python -m tests.otlp [PORT]``: a receiver that counts what it gets (benchmarks/inprocess.py
    --otlp sends there) and says so every few seconds."""
    import sys
    import time

    receiver = Receiver(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    with receiver.running():
        print(receiver.url, flush=True)
        while True:
            time.sleep(5)
            with receiver._lock:
                count, receiver.spans = len(receiver.spans), []
            print(f"{count} spans in {receiver.posts} exports so far", flush=True)


if __name__ == "__main__":
    main()
