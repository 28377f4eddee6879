"""One HTTP exchange on the raw ASGI interface, and the disconnect invariant.

The generation routes are the gateway's hot path, so they skip the framework:
``Exchange`` reads the body, sends JSON or SSE, and watches the connection with
one task per request. When the client goes away the watcher cancels the
request's own task; the handler's unwinding closes the backend stream (which
stops the engine) and ``Exchange.left`` tells that cancellation apart from a
server shutdown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from starlette.types import Receive, Send

from gateway.http.coalesce import chunk_now, chunk_open, cycle_of, send_chunk, send_whole, start_chunked, write_chunk
from gateway.http.errors import ApiError
from values.calls import current_task, json_dumps

DONE = b"data: [DONE]\n\n"
WATCH_AFTER_S = 0.05
"""How long after the body is read the disconnect watcher starts."""
_JSON = (b"content-type", b"application/json")
_SSE = (
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
)


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"Request body is larger than {limit} bytes.", code="request_too_large")


class ClientGone(Exception):
    """The client disconnected while its request was still being read."""


def event(doc: Any) -> bytes:
    return b"data: " + json_dumps(doc) + b"\n\n"


class Exchange:
    def __init__(
        self,
        receive: Receive,
        send: Send,
        request_id: str,
        error_body: Callable[[ApiError], bytes] | None = None,
        client_request_id: str | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self._receive = receive
        self._send = send
        self._cycle = cycle_of(send)
        self.request_id = request_id
        """The gateway's own id of the request, unique: in logs, response ids and ``x-request-id``."""
        self.client_request_id = client_request_id
        """The client's ``x-request-id``, when it sent a plain one: logged and echoed beside ours."""
        self.error_body = error_body
        """The front door's error JSON for an error response; default OpenAI's."""
        self.failure: Callable[[ApiError], bytes] | None = None
        """How the front door ends a stream that failed (its own error events); default OpenAI's."""
        self.headers: list[tuple[bytes, bytes]] = [(b"x-request-id", request_id.encode())]
        if client_request_id is not None:
            self.headers.append((b"x-client-request-id", client_request_id.encode()))
        """Sent with the response; handlers add theirs before it starts."""
        self.started = False
        self.left = False
        """The client disconnected (and the request's task was cancelled because of it)."""
        known = current_task(loop) if loop is not None else None  # None: a test's other loop
        task = known if known is not None else current_task()
        if task is None:
            raise RuntimeError("an exchange is served by a task")
        self.task: asyncio.Task[Any] = task
        """The task serving the request, cancelled when the client leaves. ``loop``, the server's, when
        the caller keeps it: each look-up of the running loop is a ``getpid`` system call (CPython's check
        for a forked loop), and the request needs it once here and once per attempt (``dispatch``)."""
        self.loop = task.get_loop()
        self._finished = False
        self._watcher: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._chunked = False  # chunk_now said True: the response is chunked, under way

    def header(self, name: str, value: str) -> None:
        self.headers.append((name.encode("latin-1"), value.encode("latin-1")))

    async def body(self, limit: int, declared: str | None) -> bytes:
        """The whole request body; ``declared`` is the content-length header, refused early when too big."""
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _too_large(limit)
        parts = []
        size = 0
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.left = True
                raise ClientGone
            part = message.get("body", b"")
            size += len(part)
            if size > limit:
                raise _too_large(limit)
            parts.append(part)
            if not message.get("more_body", False):
                return b"".join(parts)

    def watch(self) -> None:
        """From here on, a disconnect cancels the current task. Call after the body is read.

        The watching starts ``WATCH_AFTER_S`` later: most answers are done by then and never need a
        watcher task (a timer costs far less), and a client gone sooner is noticed that much later."""
        self._timer = self.loop.call_later(WATCH_AFTER_S, self._start_watching, self.loop, self.task)

    def _start_watching(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any] | None) -> None:
        self._timer = None
        if not self._finished:
            self._watcher = loop.create_task(self._watch(task))

    async def _watch(self, task: asyncio.Task[Any] | None) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        if not self._finished and task is not None:
            self.left = True
            task.cancel()

    def close(self) -> None:
        self._finished = True
        if self._timer is not None:
            self._timer.cancel()
        if self._watcher is not None:
            self._watcher.cancel()

    async def respond(self, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.started = True
        cycle = self._cycle
        if cycle is not None and send_whole(cycle, status, [*self.headers, *(headers or ()), _JSON], body):
            self._finished = True
            return
        all_headers = [*self.headers, *(headers or ()), _JSON, (b"content-length", str(len(body)).encode())]
        await self._send({"type": "http.response.start", "status": status, "headers": all_headers})
        self._finished = True
        await self._send({"type": "http.response.body", "body": body})

    async def error(self, exc: ApiError) -> None:
        """``exc`` as an HTTP error, in the front door's own error shape."""
        extra = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in exc.headers().items()]
        await self.respond(exc.status, exc.json() if self.error_body is None else self.error_body(exc), extra)

    async def start_stream(self) -> None:
        self.started = True
        headers = [*self.headers, *_SSE]
        cycle = self._cycle
        if cycle is None or not start_chunked(cycle, 200, headers):
            await self._send({"type": "http.response.start", "status": 200, "headers": headers})

    async def stream(self, data: bytes) -> None:
        cycle = self._cycle
        if cycle is None or not send_chunk(cycle, data, True):
            await self._send({"type": "http.response.body", "body": data, "more_body": True})

    def can_stream_now(self) -> bool:
        """``stream_now`` would write. Asked for every event of a stream pushed from the engine's
        callback: once it said True, only what can change mid-response is asked again."""
        cycle = self._cycle
        if cycle is None:
            return False
        if self._chunked:
            return chunk_open(cycle)
        chunked = self._chunked = chunk_now(cycle)
        return chunked

    def stream_now(self, data: bytes) -> None:
        """``stream`` without awaiting, right after ``can_stream_now`` said True (nothing ran since)."""
        cycle = self._cycle
        if cycle is None:
            raise RuntimeError("stream_now without can_stream_now")
        write_chunk(cycle, data)

    async def end_stream(self, last: bytes = b"") -> None:
        """The stream's end, with its ``last`` events: one write for both."""
        self._finished = True
        cycle = self._cycle
        if cycle is None or not send_chunk(cycle, last, False):
            await self._send({"type": "http.response.body", "body": last, "more_body": False})

    async def abort(self, exc: ApiError) -> None:
        """End the exchange with ``exc`` whatever point it reached: an error response before the
        answer started, else an SSE error event and ``[DONE]`` (a graceful shutdown's last word).
        The stream writer must be stopped first (its task cancelled and unwound): writes never interleave."""
        if not self.started:
            await self.error(exc)
        elif not self._finished:
            self._finished = True
            last = self.failure(exc) if self.failure is not None else event(exc.body()) + DONE
            await self._send({"type": "http.response.body", "body": last, "more_body": False})
