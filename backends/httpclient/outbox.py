"""Writes held until the event loop's turn ends, then sent one after another.

On a fast link (loopback, a pod's network) a write to a peer that sleeps in its poll wakes it, and the
writer pays for the wake-up inside its ``send`` (on the two-core development machine, a virtual one,
a sixth of the gateway's CPU per whole answer went there at 64 clients, in the kernel's
``sock_def_readable``). A gateway that serves one request, writes, serves the next, writes, finds its
peer asleep again at every write: a fast upstream (or client) answers one request and goes back to
its poll before the next arrives. Held to the turn's end, the writes of every request served in that
turn go out together: the first wakes the peer, the rest find it awake. Nothing waits longer than the
loop's turn (one more pass of the loop, without blocking), and a request alone in flight is written at
once (held, it would pay that pass for nothing).

``Outbox`` holds the writes of one event loop; ``Held`` is a transport whose writes go through it, in
order with everything else done to the transport (closing, ending the output, handing it to another
protocol first sends what is held for it). Neither library on the path does this: uvloop's and
asyncio's transports write at once, and uvicorn writes as the application sends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sized
from typing import Any, Protocol

log = logging.getLogger("enginegate.http")


class Sender(Protocol):
    """Told when its held write could not go out: the transport was closing, or closed in the write."""

    def unsent(self) -> None: ...


class Outbox:
    """The writes one event loop's turn has made so far, sent when the turn ends."""

    __slots__ = ("_held", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._held: list[tuple[asyncio.WriteTransport, bytes, Sender | None]] = []

    def write(self, transport: asyncio.WriteTransport, data: bytes, sender: Sender | None, alone: bool) -> None:
        """Send ``data`` on ``transport`` when this turn of the loop ends (at once when the writer is
        ``alone``, the only request in flight, and nothing is held); ``sender`` is told if it could not
        be sent."""
        held = self._held
        if not held:
            if alone:
                _send(transport, data, sender)
                return
            self.loop.call_soon(self.flush)
        held.append((transport, data, sender))

    def flush(self) -> None:
        """Send everything held, in the order it was written."""
        held = self._held
        if not held:
            return
        self._held = []
        for transport, data, sender in held:
            _send(transport, data, sender)

    def release(self, transport: asyncio.WriteTransport) -> None:
        """Send now what is held for ``transport`` (before something else is done to it)."""
        held = self._held
        if not held:
            return
        rest = []
        for entry in held:
            if entry[0] is transport:
                _send(transport, entry[1], entry[2])
            else:
                rest.append(entry)
        self._held = rest
        # flush is still scheduled: with nothing left it returns at once


def _send(transport: asyncio.WriteTransport, data: bytes, sender: Sender | None) -> None:
    if not transport.is_closing():
        try:
            transport.write(data)
        except Exception:
            # The transport reports a failed send itself (it closes and tells its protocol); anything
            # else raised here would take the other transports' held bytes with it.
            log.exception("a held write failed; the connection is closed")
            transport.abort()
        # A transport that closed in the write sent nothing (what the socket took is written at once).
        if not transport.is_closing():
            return
    # Closed (aborted, lost) while its bytes were held, or in the write: they had nowhere to go.
    if sender is not None:
        sender.unsent()


class Held:
    """A transport whose writes wait for the end of the loop's turn (``Outbox``); everything else is the
    wrapped transport's, done after what is held for it is sent."""

    __slots__ = ("outbox", "tasks", "transport")

    def __init__(self, transport: asyncio.Transport, outbox: Outbox, tasks: Sized) -> None:
        self.transport = transport
        self.outbox = outbox
        self.tasks = tasks
        """The requests in flight on the server (uvicorn's tasks): one alone writes at once."""

    def write(self, data: bytes) -> None:
        if data:
            self.outbox.write(self.transport, data, None, len(self.tasks) < 2)

    def writelines(self, lines: list[bytes]) -> None:
        self.write(b"".join(lines))

    def close(self) -> None:
        self.outbox.release(self.transport)
        self.transport.close()

    def abort(self) -> None:
        self.transport.abort()  # what is held is dropped: it is never sent on a closing transport

    def write_eof(self) -> None:
        self.outbox.release(self.transport)
        self.transport.write_eof()

    def can_write_eof(self) -> bool:
        return self.transport.can_write_eof()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self.transport.pause_reading()

    def resume_reading(self) -> None:
        self.transport.resume_reading()

    def is_reading(self) -> bool:
        return self.transport.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.outbox.release(self.transport)
        self.transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.transport.get_protocol()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.transport.set_write_buffer_limits(high, low)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.transport.get_write_buffer_limits()

    def get_write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size()
