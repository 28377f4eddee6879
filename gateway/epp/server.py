"""The picker's gRPC server: Envoy's ``ExternalProcessor`` and gRPC health, on grpc.aio.

Each HTTP request is one bidirectional stream. ``Exchange`` answers its messages in the order the
full-duplex protocol needs: the request headers' answer waits for the body's last piece (the pick
needs the body), then goes out with the pick, followed by the body handed back; the answer's headers
and body pass through while the ticket reads them. A message out of order ends the stream with
INVALID_ARGUMENT; whatever way a stream ends, its ticket is released.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from gateway.config import ConfigError, LoadedConfig
from gateway.epp import wire
from gateway.epp.picker import Picker, Ticket, too_large
from gateway.epp.pool import Pool, problems
from gateway.fleet.engines import BackendFactory, build_backend
from gateway.http.errors import ApiError
from gateway.state import AppState

log = logging.getLogger("enginegate.epp")

SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
HEALTH = ("liveness", "readiness", SERVICE)
EXPECTED = {
    "request headers": ("request_headers",),
    "request body": ("request_body", "request_trailers"),
    "upstream": ("request_trailers", "response_headers"),
    "response": ("response_body", "response_trailers"),
}
"""The messages each phase of a stream takes (after the answer's end, none)."""


class UnsupportedMode(wire.ProtocolError):
    """The proxy sends the request body in a mode the picker cannot pick in (FAILED_PRECONDITION)."""


class Exchange:
    """One HTTP request's stream of messages, answered in order."""

    def __init__(self, picker: Picker) -> None:
        self._picker = picker
        self._phase = "request headers"
        self._headers: dict[str, str] = {}
        self._body = bytearray()
        self._body_seen = False
        """Whether the request has a body (a request whose headers end it has none to hand back)."""
        self._subset: frozenset[str] | None = None
        self.ticket: Ticket | None = None
        self.done = False
        """An immediate response went out, or the answer ended: the stream is over."""

    async def on(self, request: Any) -> list[Any]:
        """The answers to one message (none while the request body is still arriving)."""
        kind = wire.kind(request)
        subset = wire.subset_of(request)
        if subset is not None:
            self._subset = subset
        if kind not in EXPECTED.get(self._phase, ()):
            raise wire.ProtocolError(f"{kind or 'a message with no request'} is out of order: {self._phase} expected")
        if self.ticket is not None:
            self.ticket.served(wire.served_of(request))
        if kind == "request_headers":
            return await self._request_headers(request)
        if kind == "request_body":
            return await self._request_body(request.request_body.body, request.request_body.end_of_stream)
        if kind == "request_trailers":
            answers = await self._decide(end=False) if self._phase == "request body" else []
            return [*answers, wire.trailers_seen(response=False)] if not self.done else answers
        return self._response(request, kind)

    async def _request_headers(self, request: Any) -> list[Any]:
        if not wire.streamed_mode(request):
            raise UnsupportedMode("the request body must be sent FULL_DUPLEX_STREAMED to pick by its content")
        self._headers = wire.headers_of(request.request_headers)
        self._phase = "request body"
        return await self._decide(end=True) if request.request_headers.end_of_stream else []

    async def _request_body(self, chunk: bytes, end: bool) -> list[Any]:
        self._body_seen = True
        self._body += chunk
        limit = self._picker.state.runtime.config.limits.max_body_bytes
        if len(self._body) > limit:  # refused as soon as it is known, not after the rest arrives
            self.done = True
            return [wire.refusal(too_large(limit))]
        return await self._decide(end=True) if end else []

    async def _decide(self, end: bool) -> list[Any]:
        """The pick (or refusal) once the body is whole, then the body handed back."""
        body = bytes(self._body)
        try:
            picked = await self._picker.pick(self._headers, body, self._subset)
        except ApiError as exc:
            self.done = True
            return [wire.refusal(exc)]
        except Exception:  # a bug in the picker: the client gets a 500, the log gets the traceback
            log.exception("the endpoint picker failed", extra={"path": self._headers.get(":path")})
            self.done = True
            return [wire.refusal(ApiError(500, "The endpoint picker failed.", type="api_error", code="internal_error"))]
        self.ticket = picked.ticket
        self._phase = "upstream"
        answers = [wire.picked(picked.endpoints)]
        if self._body_seen:
            answers += wire.request_body(body, end)
        return answers

    def _response(self, request: Any, kind: str) -> list[Any]:
        ticket = self.ticket
        assert ticket is not None  # only after a pick: the phases say so
        if kind == "response_headers":
            ticket.response(wire.headers_of(request.response_headers))
            self._phase = "response"
            if request.response_headers.end_of_stream:
                self._end(ticket)
            return [wire.headers_seen(response=True)]
        if kind == "response_body":
            chunk, end = request.response_body.body, request.response_body.end_of_stream
            ticket.body(chunk)
            if end:
                self._end(ticket)
            return [wire.body(chunk, end, response=True)]
        self._end(ticket)
        return [wire.trailers_seen(response=True)]

    def _end(self, ticket: Ticket) -> None:
        ticket.finish()
        self.done = True

    def close(self) -> None:
        if self.ticket is not None:
            self.ticket.release()


class Processor(ext_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """``envoy.service.ext_proc.v3.ExternalProcessor/Process``."""

    def __init__(self, picker: Picker) -> None:
        self._picker = picker

    async def Process(  # noqa: N802 - the service's method name
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        exchange = Exchange(self._picker)
        try:
            async for request in requests:
                for answer in await exchange.on(request):
                    yield answer
                if exchange.done:
                    return
        except UnsupportedMode as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except wire.ProtocolError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Exception:  # a bug: this stream ends with INTERNAL, the picker serves the next
            log.exception("the endpoint picker failed on a stream")
            await context.abort(grpc.StatusCode.INTERNAL, "the endpoint picker failed")
        finally:  # also when the proxy or the client went away mid-stream (cancelled)
            exchange.close()


class EndpointPicker:
    """A running picker: the fleet it polls, the gRPC server and the health it reports."""

    def __init__(self, loaded: LoadedConfig, factory: BackendFactory = build_backend) -> None:
        found = problems(loaded)
        if found:
            raise ConfigError(found)
        self.state = AppState(loaded, factory)
        self.picker = Picker(self.state, Pool.of(loaded))
        self.health = health.aio.HealthServicer()
        self.server = grpc.aio.server()
        ext_grpc.add_ExternalProcessorServicer_to_server(Processor(self.picker), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)

    async def start(self, host: str, ports: list[int]) -> list[int]:
        """Serve on ``ports`` (0: a free one), every service on each; returns the ports bound. Ready
        (``readiness`` and the processor's service SERVING) once every endpoint was polled once."""
        await self.health.set("liveness", health_pb2.HealthCheckResponse.SERVING)
        for service in HEALTH[1:]:
            await self.health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        bound = [self.server.add_insecure_port(f"{host}:{port}") for port in ports]
        await self.server.start()
        await self.state.fleet.start()
        for service in HEALTH[1:]:
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        return bound

    async def stop(self, grace_s: float) -> None:
        """Not ready at once (the proxy stops sending), streams under way get ``grace_s`` to end."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)
        await self.state.fleet.aclose()


async def run(loaded: LoadedConfig, host: str, ports: list[int]) -> None:
    """``enginegate epp`` until SIGTERM or SIGINT."""
    picker = EndpointPicker(loaded)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    bound = await picker.start(host, ports)
    log.info("endpoint picker serving on %s", ", ".join(f"{host}:{p}" for p in bound))
    await stopping.wait()
    await picker.stop(loaded.config.server.shutdown_grace_s)
