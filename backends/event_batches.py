"""An engine's server-sent events as batches of JSON documents, as the network delivers them.

Each batch holds the events one read of the body completed, so that events which arrived together are
forwarded together (one write to the client, not one per event). ``[DONE]`` ends the events (the body
is still read to its end, so that the connection goes back to the pool); an error event raises as the
engine's error (``http_errors.from_event``), after the batch of events that came before it in the same
read, so the commit point does not depend on how the engine's bytes were split. Time spent waiting
for the body goes on the request's engine clock.

An iterator class, not an async generator: every stream's every read passes here, and the module is
compiled by mypyc (``pyproject.toml``), which compiles no async generators.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

import orjson

from backends import http_errors
from backends.base import BackendError, EngineClock, ErrorKind
from backends.httpclient import Response
from backends.sse import Event, EventParser, lone_data
from values.calls import json_loads, perf_counter


class EventSource(Protocol):
    """What the batches need of the engine's adapter (``HttpBackend``)."""

    @property
    def name(self) -> str: ...

    def transport_error(self, exc: Exception) -> BackendError:
        """A failure while reading a stream that had started."""
        ...


def json_doc(name: str, data: str) -> Any:
    """An event's data (or a whole answer) parsed; a ``BackendError`` from engine ``name`` when it is not
    JSON. Here rather than on the adapter, which stays interpreted: once per streamed event."""
    try:
        return json_loads(data)
    except orjson.JSONDecodeError as exc:
        raise BackendError(ErrorKind.PROTOCOL, f"{name}: not JSON in stream: {data[:200]!r}") from exc


class EventBatches:
    """``async for batch in EventBatches(...)``: lists of JSON objects until the body ends."""

    __slots__ = ("_clock", "_done", "_ended", "_error", "_name", "_parser", "_response", "_source", "_trust",
                 "_waiting")  # fmt: skip

    def __init__(self, source: EventSource, response: Response, clock: EngineClock, trust_status: bool) -> None:
        self._source = source
        self._name = source.name
        self._response = response
        self._clock = clock
        self._trust = trust_status
        self._parser = EventParser()
        self._done = False  # [DONE] came: what follows is read, not parsed
        self._ended = False
        self._error: BackendError | None = None  # raised once the batch before it was taken
        self._waiting = 0.0  # time.perf_counter() when a wait for the body began (0: none)

    def __aiter__(self) -> EventBatches:
        return self

    @property
    def over(self) -> bool:
        """No more events will come, and the body is in (the next ``__anext__`` would stop without
        waiting): ``[DONE]`` came and the body was received whole, or the body ended."""
        return self._error is None and (self._ended or (self._done and self._response.complete))

    @property
    def reading(self) -> bool:
        """More events may come (the body has not ended, no error is waiting to be raised)."""
        return not self._ended

    @property
    def ended(self) -> bool:
        """The body has ended: ``next_batch`` has no more to give."""
        return self._ended and self._error is None

    async def __anext__(self) -> list[Any]:
        while True:
            batch = self.next_batch()
            if batch is not None:
                return batch
            if self.ended:
                raise StopAsyncIteration
            try:
                await self.wait()
            except BaseException as exc:
                error = self.failure(exc)
                if error is exc:
                    raise
                raise error from exc

    def next_batch(self) -> list[Any] | None:
        """The next batch from the bytes that have arrived, without waiting: None when no event is
        complete yet (await ``wait``, then ask again) or the body has ended (``ended``)."""
        error = self._error
        if error is not None:
            self._error = None
            raise error
        started = self._waiting
        if started:
            self._waiting = 0.0
            self._clock.waited_s += max(0.0, self._response.arrived_at - started)  # 0 when it was there
        while not self._ended:
            try:
                piece = self._response.take_chunk()
            except OSError as exc:
                self._ended = True
                raise self._source.transport_error(exc) from exc
            if piece is None:
                return None
            if not piece:
                self._ended = True
                done = self._done
                tail = [self._item(e) for e in self._parser.close() if not done and e.data != "[DONE]"]
                return tail or None
            batch = self._batch(piece)
            if batch:
                return batch
        return None

    def wait(self, listener: Callable[[], bool] | None = None) -> asyncio.Future[None]:
        """Resolved when more of the body has arrived (``next_batch`` then); the time waited goes on
        the request's engine clock. ``listener``: see ``Response.wait``. If the wait fails, ``failure``
        says what to raise."""
        self._waiting = perf_counter()
        return self._response.wait(listener)

    def wait_on(self) -> None:
        """A listener took what arrived (``next_batch``) and the wait goes on: its clock and deadline
        start again."""
        self._waiting = perf_counter()
        self._response.waiting_on()

    def failure(self, exc: BaseException) -> BaseException:
        """What a failed ``wait`` raises (the engine's ``BackendError`` for a transport failure); the
        response is closed (a cancelled read included: the engine sees the connection close)."""
        self._ended = True
        self._response.close()
        return self._source.transport_error(exc) if isinstance(exc, OSError) else exc

    async def aclose(self) -> None:
        self._ended = True

    def _batch(self, piece: bytes) -> list[Any]:
        batch: list[Any] = []
        at = self._scan(piece, batch) if not self._done and self._parser.idle() else 0
        if at < 0 or at == len(piece):
            return batch
        for event in self._parser.feed(piece[at:] if at else piece):
            done = self._done = self._done or event.data == "[DONE]"
            if done:
                continue
            if not self._took(event, batch):
                return batch
        return batch

    def _scan(self, piece: bytes, batch: list[Any]) -> int:
        """The events at the start of ``piece`` that are each one ``data:`` line and a blank line
        (``sse.lone_data``) read into ``batch`` without the parser: how far they went (the parser reads
        the rest), or -1 when one was the engine's error (raised now if it came first, else after
        ``batch``). One split into lines, as the parser's, and whole-bytes tests per event: the
        operations mypyc compiles to C calls (a split at blank lines costs several times as much)."""
        lines = piece.split(b"\n")
        at, last = 0, len(lines) - 2  # the last line: what follows the last line break
        i = 0
        while i < last and not lines[i + 1]:
            line = lines[i]
            if not self._wire_item(line, batch):
                if not lone_data(line):
                    break
                data = line[6:].decode("utf-8", "replace")
                if data == "[DONE]":
                    break  # the parser's: what follows is read, not parsed
                if not self._took(Event(data), batch):
                    return -1
            at += len(line) + 2
            i += 2
        return at

    def _took(self, event: Event, batch: list[Any]) -> bool:
        """``event``'s item added to ``batch``; False when it was the engine's error, which is raised now
        if nothing came before it in this read, else kept for after the batch."""
        try:
            batch.append(self._item(event))
        except BackendError as exc:
            self._ended = True
            if not batch:
                raise
            self._error = exc  # what came before the error is delivered first
            return False
        return True

    def _wire_item(self, line: bytes, batch: list[Any]) -> bool:
        """A subclass may read the event that is ``line`` (its one line, without its line break) as the
        wire brought it: its item added to ``batch``, True; False (this class) to have it decoded and
        read by ``_item``."""
        return False

    def _item(self, event: Event) -> Any:
        """What the batch holds of one event: its document (a subclass may read some events otherwise)."""
        return self._doc(event)

    def _doc(self, event: Event) -> dict[str, Any]:
        name = self._name
        doc = json_doc(name, event.data)
        if event.field == "error" or (isinstance(doc, dict) and "error" in doc):
            raise http_errors.from_event(name, doc, self._trust)
        if not isinstance(doc, dict):
            raise BackendError(ErrorKind.PROTOCOL, f"{name}: unexpected event {event.data[:200]!r}")
        return doc
