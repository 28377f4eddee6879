"""Fault injection for the contract fakes: tests set it, the fake acts on it like the real engine would.

Every fake's ``create_app`` takes a ``FakeControl`` and returns its app wrapped by ``with_faults``, so
one control drives a fake in three ways:

- engine-specific faults: ``fail_next`` set to a name the fake documents (its real failure modes, in
  the engine's own wire format);
- generic transport faults, the same on every fake: ``fail_next`` set to one of ``GENERIC_FAULTS``
  (handled in front of the app, on the next POST);
- knobs that stay set: ``delay_s``, ``token_delay_s``, ``max_running``, ``healthy``, ``loading``.

And it records what the engine saw: ``started`` (one entry per generation the engine began, with the
engine's own request id field where it has one) and ``seen`` (every POST, with its ``X-Request-Id``).
A test resets what it changed; ``reset()`` restores every knob.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

GENERIC_FAULTS = {
    "refuse": "the connection closes at once: no byte of the request is answered and the engine never sees it",
    "drop": "the engine runs the request, then the connection closes before the first response byte",
    "hang": "no byte is ever answered (the engine never sees the request); ends when the client leaves",
    "status_500": "500 with a JSON error body before any token",
    "status_503": "503 with Retry-After (``retry_after_s``) before any token",
    "status_429": "429 with Retry-After (``retry_after_s``) before any token",
    "cut": "the connection closes after ``fault_after_events`` SSE events (a whole-answer body: after half of it)",
    "error_event": "after ``fault_after_events`` SSE events, an OpenAI-shaped error event ends the stream "
    "(a whole-answer body: that error JSON instead, on the 200)",
    "malformed": "after ``fault_after_events`` SSE events, an event that is not JSON ends the stream "
    "(a whole-answer body: its first half only)",
}
"""Names ``fail_next`` may take on every fake, with what they do."""


@dataclass(frozen=True)
class Seen:
    """One POST as it reached the fake."""

    path: str
    request_id: str
    """Its ``X-Request-Id`` header, "" without one."""


@dataclass
class FakeControl:
    fail_next: str | None = None
    """The next generation request fails this way, then this resets to None: a generic fault
    (``GENERIC_FAULTS``) or one of the engine's real failure modes (each fake documents its names)."""
    delay_s: float = 0.0
    """Injected latency before the first token of every generation (spent queued: counted as waiting)."""
    token_delay_s: float = 0.0
    """Slow tokens: a pause before each piece of a response body after its first."""
    healthy: bool = True
    """False: the health route answers as the engine does when unhealthy."""
    loading: bool = False
    """True: the engine answers as it does while the model is still loading (where it has such a state)."""
    max_running: int | None = None
    """The engine's batch size: beyond it generations wait in the engine's queue (and its metrics say so)."""
    retry_after_s: float = 1.0
    """Retry-After of the generic overload faults."""
    fault_after_events: int = 3
    """Events sent before a generic mid-stream fault strikes."""
    started: list[str] = field(default_factory=list)
    """One entry per generation the engine began: the engine's own request id field ("" where none)."""
    seen: list[Seen] = field(default_factory=list)
    """Every POST that reached the fake."""
    running: int = 0
    """Generations holding a running slot now (see ``admit``)."""

    def take_fault(self) -> str | None:
        fault, self.fail_next = self.fail_next, None
        return fault

    def reset(self) -> None:
        """Every knob back to its default; the records are kept."""
        self.fail_next, self.delay_s, self.token_delay_s = None, 0.0, 0.0
        self.healthy, self.loading, self.max_running = True, False, None
        self.retry_after_s, self.fault_after_events = 1.0, 3

    async def admit(self, request_id: str = "") -> None:
        """For the fakes: a generation starts and waits for a running slot (``max_running``); the fake
        counts it as waiting until this returns and calls ``release`` when it ends."""
        self.started.append(request_id)
        # Polled, not an asyncio primitive: the control outlives event loops (fakes restart in chaos runs).
        while self.max_running is not None and self.running >= self.max_running:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        self.running += 1

    def release(self) -> None:
        self.running = max(0, self.running - 1)


def with_faults(app: ASGIApp, control: FakeControl) -> ASGIApp:
    """``app`` behind the generic faults of ``control`` (see ``GENERIC_FAULTS``)."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        control.seen.append(Seen(scope["path"], headers.get(b"x-request-id", b"").decode("latin-1")))
        fault = control.fail_next if control.fail_next in GENERIC_FAULTS else None
        if fault is not None:
            control.fail_next = None
        if fault == "refuse":
            await _abort(send)
        elif fault == "hang":
            while (await receive())["type"] != "http.disconnect":
                pass
        elif fault in ("status_500", "status_503", "status_429"):
            await _status(send, int(fault[-3:]), control.retry_after_s)
        else:
            faulty = _Faulty(send, control, fault)
            try:
                await app(scope, receive, faulty.send)
            except Exception:
                if not faulty.over:  # the app's own failure, not the one injected
                    raise

    return wrapped


def _transport(send: Send) -> asyncio.Transport | None:
    # uvicorn's ASGI ``send`` is a bound method of its request cycle, which holds the socket's transport:
    # the only way an ASGI app can close a connection without answering, as a crashing engine does.
    return getattr(getattr(send, "__self__", None), "transport", None)


async def _abort(send: Send) -> None:
    transport = _transport(send)
    if transport is None:
        raise ConnectionAbortedError("injected fault: no transport to abort")
    transport.abort()
    cycle: Any = getattr(send, "__self__", None)
    for _ in range(100):  # let the server see its connection gone before it would answer a 500
        if cycle is None or getattr(cycle, "disconnected", True):
            break
        await asyncio.sleep(0.001)


async def _status(send: Send, status: int, retry_after: float) -> None:
    body = b'{"error":{"message":"injected fault","type":"InternalServerError","code":%d}}' % status
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status != 500:
        headers.append((b"retry-after", str(int(retry_after) if retry_after.is_integer() else retry_after).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


ERROR_EVENT = b'data: {"error":{"message":"injected engine failure","type":"InternalServerError","code":500}}\n\n'
MALFORMED_EVENT = b'data: {"choices": [{"delta": \n\n'


class _Faulty:
    """The app's ``send``, with the mid-stream faults and slow tokens applied."""

    def __init__(self, send: Send, control: FakeControl, fault: str | None) -> None:
        self._send, self._control, self._fault = send, control, fault
        self._events = self._pieces = 0
        self._sse = False
        self.over = False
        """The injected fault ended the response (what the app raises after that is expected)."""

    async def send(self, message: Message) -> None:
        if self.over:  # the fault ended the response: the app sees its client gone
            raise OSError("injected fault: response already ended")
        if message["type"] == "http.response.start":
            if self._fault == "drop":
                self.over = True
                await _abort(self._send)
                raise OSError("injected fault: connection dropped")
            content_type = dict(message.get("headers", [])).get(b"content-type", b"")
            self._sse = content_type.startswith(b"text/event-stream")
            if self._fault in ("error_event", "malformed", "cut") and not self._sse:
                # a whole answer: drop any length so the body can end early
                message = {**message, "headers": [h for h in message["headers"] if h[0] != b"content-length"]}
            await self._send(message)
            return
        if message["type"] != "http.response.body":
            await self._send(message)
            return
        body: bytes = message.get("body", b"")
        if body and self._pieces and self._control.token_delay_s > 0:
            await asyncio.sleep(self._control.token_delay_s)
        self._pieces += bool(body)
        final = not message.get("more_body", False)
        if self._fault is None or (not body and not (final and self._sse)):
            await self._send(message)
            return
        if not self._sse:  # a whole answer: the fault spoils its body
            if self._fault == "cut":
                await self._send({"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True})
                await self._end_abruptly()
            spoilt = ERROR_EVENT[len(b"data: ") :].strip() if self._fault == "error_event" else body[: len(body) // 2]
            self.over = True
            await self._send({"type": "http.response.body", "body": spoilt, "more_body": False})
            raise OSError("injected fault: response ended")
        self._events += body.count(b"\n\n")
        if self._events < self._control.fault_after_events and not final:
            await self._send(message)
            return
        # Struck after enough events, or before the last piece of a shorter stream (a whole answer in one
        # event): that piece is where a stream says it ended, so it is what the fault replaces.
        if not final:
            await self._send({"type": "http.response.body", "body": body, "more_body": True})
        if self._fault == "cut":
            await self._end_abruptly()
        tail = ERROR_EVENT if self._fault == "error_event" else MALFORMED_EVENT
        self.over = True
        await self._send({"type": "http.response.body", "body": tail, "more_body": False})
        raise OSError("injected fault: response ended")

    async def _end_abruptly(self) -> None:
        self.over = True
        transport = _transport(self._send)
        if transport is not None:
            transport.abort()
        raise OSError("injected fault: connection cut")
