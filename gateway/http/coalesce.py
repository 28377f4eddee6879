"""One write per response: the response head goes out with the body's first bytes.

uvicorn's request cycle writes the status line and headers as soon as the app starts its response,
then the body: two ``write()`` calls, and two ``send`` system calls, for every whole answer (about
half of the protocol layer's cost per request in a profile). The cycle's transport is this instead:
it holds the head until the next write and sends both as one. Only the cycle writes through it (the
protocol keeps the socket's own transport for refusals and flow control); whatever else the cycle
does (closing when the app failed mid-response) sends what is held first.

A whole response (``Exchange.respond``) skips the two ASGI messages altogether where it can:
``send_whole`` does on the cycle what its ``send`` does for a start and a last body message (the
same head, the same state after), in one call and one write, checking the header lines with two
searches in all where ``send`` makes two per line (5% of the gateway's CPU per whole answer went to
``send``). Where anything is unusual (a connection header, a paused or gone client, an access log)
it leaves the response to ``send``. A stream's head and events go the same way (``start_chunked``,
``send_chunk``: what ``send`` writes for a start without a length and for each body message, chunked),
except while the client is slow to read: a paused transport is ``send``'s, which waits for its drain.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE, STATUS_LINE, RequestResponseCycle

if TYPE_CHECKING:
    import asyncio

_OWN = frozenset((b"connection", b"transfer-encoding", b"content-length"))
"""Header names whose lines change what the cycle does with the connection or the body: never sent by
``send_whole`` (the content length is its own)."""
_USUAL: Final = frozenset((
    b"server", b"date", b"content-type", b"cache-control", b"x-accel-buffering", b"retry-after",
    b"x-request-id", b"x-client-request-id", b"x-enginegate-route", b"x-enginegate-rule", b"x-enginegate-arm",
    b"x-enginegate-model", b"x-enginegate-backend", b"x-enginegate-overhead-ms", b"x-enginegate-cache",
    b"x-enginegate-dropped",
))  # fmt: skip
"""The header names of the gateway's usual responses, already as ``send`` writes them (lower case) and
none of ``_OWN``: a look-up instead of a ``lower()`` and a look-up of its result (about 600 instructions a
line under callgrind, nine lines a response)."""


def _refusals(refused: re.Pattern[bytes]) -> bytes:
    """A ``bytes.translate`` table that maps each byte ``refused`` matches to NUL and every other byte to
    itself: a NUL in the translation of header bytes is exactly a match in them, since NUL is one of the
    bytes both of uvicorn's patterns refuse. One pass of a table in C, where the pattern's search costs
    several times as much (about 7,000 instructions for a response's header names)."""
    if not refused.match(b"\x00"):
        raise RuntimeError(f"{refused.pattern!r} takes NUL: no table for it")
    return bytes(0 if refused.match(bytes((b,))) else b for b in range(256))


_NAME_REFUSALS: Final = _refusals(HEADER_RE)
_VALUE_REFUSALS: Final = _refusals(HEADER_VALUE_RE)

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


def cycle_of(send: object) -> RequestResponseCycle | None:
    """The uvicorn request cycle whose ``send`` the app was given, or None (another server, a wrapper)."""
    owner = getattr(send, "__self__", None)
    return owner if isinstance(owner, RequestResponseCycle) else None


def _head(cycle: RequestResponseCycle, status: int, headers: list[tuple[bytes, bytes]]) -> list[bytes] | None:
    """The status line and header lines ``send`` would write for a start message with ``headers`` (none of
    them a length, an encoding or a connection header), in pieces to join, the closing blank line not yet
    added; None when the response is one for ``send``."""
    if cycle.response_started or cycle.disconnected or cycle.flow.write_paused or cycle.access_log:
        return None
    if cycle.scope["method"] == "HEAD" or status not in STATUS_LINE:
        return None
    lines = [*cycle.default_headers, *headers]
    names = b"".join([name for name, _ in lines])
    values = b"".join([value for _, value in lines])
    # uvicorn's character classes, as tables: one pass over the joined names (values) finds what its
    # search of each line finds. NUL is looked for as the int 0 (see ``values.calls``).
    if 0 in names.translate(_NAME_REFUSALS) or 0 in values.translate(_VALUE_REFUSALS):
        return None  # send raises for it, as it should
    content = [STATUS_LINE[status]]
    for name, value in lines:
        if name not in _USUAL:
            name = name.lower()
            if name in _OWN:
                return None
        content += (name, b": ", value, b"\r\n")
    return content


def send_whole(cycle: RequestResponseCycle, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
    """The response (``headers`` without its length) in one write, as the cycle's ``send`` of a start and
    a last body message would write it, and the cycle left as it would leave it; False, nothing done,
    when this response is one for ``send`` (see the module docstring)."""
    content = _head(cycle, status, headers)
    if content is None:
        return False
    content.append(b"content-length: %d\r\n" % len(body))
    _started(cycle, content, chunked=False)
    content.append(body)
    transport = cycle.transport
    (transport.transport if isinstance(transport, HeadWithBody) else transport).write(b"".join(content))
    _complete(cycle)
    return True


def start_chunked(cycle: RequestResponseCycle, status: int, headers: list[tuple[bytes, bytes]]) -> bool:
    """A streamed response's head, as the cycle's ``send`` of a start message without a length writes
    it (chunked), held by the cycle's transport for the first body bytes; False, nothing done, when it
    is one for ``send``."""
    content = _head(cycle, status, headers) if status not in (204, 304) else None
    if content is None:
        return False
    _started(cycle, content, chunked=True)
    cycle.transport.write(b"".join(content))
    return True


def send_chunk(cycle: RequestResponseCycle, body: bytes, more: bool) -> bool:
    """A body message of a chunked response, as the cycle's ``send`` writes it, and the response's end
    when not ``more``; False, nothing done, when it is one for ``send`` (a paused transport waits for
    its drain there)."""
    if not chunk_now(cycle):
        return False
    write_chunk(cycle, body, more)
    return True


def write_chunk(cycle: RequestResponseCycle, body: bytes, more: bool = True) -> None:
    """What ``send_chunk`` writes, for a caller that has just been told ``chunk_now`` (nothing ran since)."""
    data = b"%x\r\n%s\r\n" % (len(body), body) if body else b""
    cycle.transport.write(data if more else data + b"0\r\n\r\n")
    if not more:
        _complete(cycle)


def chunk_now(cycle: RequestResponseCycle) -> bool:
    """``send_chunk`` would write now (a chunked response under way, its transport not paused)."""
    if not chunk_open(cycle) or not cycle.chunked_encoding:
        return False
    return cycle.response_started and cycle.scope["method"] != "HEAD"


def chunk_open(cycle: RequestResponseCycle) -> bool:
    """What ``chunk_now`` asks of a response it once said True for: the rest cannot change until the
    response is complete (a chunked response under way stays one)."""
    return not (cycle.disconnected or cycle.flow.write_paused or cycle.response_complete)


def _started(cycle: RequestResponseCycle, content: list[bytes], chunked: bool) -> None:
    """The head's last lines (after its length, if any), and the cycle's state as ``send`` leaves it
    once it wrote a head."""
    if not cycle.keep_alive:
        content.append(b"connection: close\r\n")
    if chunked:
        content.append(b"transfer-encoding: chunked\r\n")
    content.append(b"\r\n")
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    cycle.chunked_encoding = chunked
    cycle.expected_content_length = 0


def _complete(cycle: RequestResponseCycle) -> None:
    """What the cycle's ``send`` does once the response's last bytes are written."""
    cycle.response_complete = True
    cycle.message_event.set()
    if not cycle.keep_alive:
        cycle.transport.close()
    cycle.on_response()
