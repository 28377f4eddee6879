"""Server-sent events and the disconnect invariant.

``SSEResponse`` sends an async iterator of byte events while it watches the
connection; when the client goes away it cancels the sender, whose unwinding
closes the backend stream (stopping the engine). ``until_disconnect`` gives a
non-streaming handler the same guarantee.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Any, TypeVar

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

T = TypeVar("T")

DONE = b"data: [DONE]\n\n"


def event(doc: Any) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(work: Awaitable[T], receive: Receive) -> T:
    """Await ``work`` unless the client disconnects first; then cancel it and raise ClientGone."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        done, _ = await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise ClientGone


class SSEResponse(Response):
    """A streamed ``text/event-stream`` response that cancels its source on disconnect."""

    def __init__(self, events: AsyncIterator[bytes], headers: Mapping[str, str]) -> None:
        self.status_code = 200
        self.background = None
        self._events = events
        self._sse_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self._sse_headers += [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]

    async def _send_all(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self._sse_headers})
        try:
            async for data in self._events:
                await send({"type": "http.response.body", "body": data, "more_body": True})
        except OSError:  # the transport is gone: same as a disconnect
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            with contextlib.suppress(ClientGone):
                await until_disconnect(self._send_all(send), receive)
        finally:
            aclose = getattr(self._events, "aclose", None)
            if aclose is not None:
                await aclose()
