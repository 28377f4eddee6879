"""One write per response: the response head goes out with the body's first bytes.

uvicorn's request cycle writes the status line and headers as soon as the app starts its response,
then the body: two ``write()`` calls, and two ``send`` system calls, for every whole answer (about
half of the protocol layer's cost per request in a profile). The cycle's transport is this instead:
it holds the head until the next write and sends both as one. Only the cycle writes through it (the
protocol keeps the socket's own transport for refusals and flow control); whatever else the cycle
does (closing when the app failed mid-response) sends what is held first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

_INTERIM = b"HTTP/1.1 1"
"""An interim response (``100 Continue``): the client waits for it before sending its body, so it is
never held."""


class HeadWithBody:
    """The request cycle's transport (``write``, ``close``, ``is_closing``: the members the cycle uses)."""

    __slots__ = ("_head", "_started", "transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self._head: bytes | None = None
        self._started = False

    def write(self, data: bytes) -> None:
        if not self._started:
            if not data.startswith(_INTERIM):
                self._started = True
                self._head = data  # the head: held for the body's first bytes
            else:
                self.transport.write(data)
            return
        head = self._head
        if head is not None:
            self._head = None
            data = head + data
        self.transport.write(data)

    def flush(self) -> None:
        """Send what is held (a head whose body never came)."""
        head = self._head
        if head is not None:
            self._head = None
            self.transport.write(head)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()
