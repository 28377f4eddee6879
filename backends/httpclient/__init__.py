"""A small asyncio HTTP/1.1 client: exactly what the engine adapters need, and cheap per request.

One ``HttpClient`` talks to one origin (scheme, host, port) through a keep-alive
pool: idle connections are reused last-in first-out, at most ``max_connections``
are open at once, and requests beyond that wait for a free one. A request is a
``POST`` of a JSON body or a ``GET``; its ``Response`` has the status, the headers
(case-insensitive), the trailers apart, and a body read as it arrives. Responses
are parsed with ``httptools`` (llhttp) in an ``asyncio.Protocol``: bodies framed by
Content-Length, chunked, or ended by the server closing the connection.

- At most one delivery: a request whose bytes all went to the socket is never
  sent again. Only a request that cannot have reached the server (its pooled
  connection was found closed, or broke during the write) is sent once more, on a
  new connection; each such retry is counted in ``retries`` and logged. A
  connection closed after the request was written and before any response byte
  raises ``NoResponseError``: the engine may have run the request.
- Reuse: an idle connection is reused only within ``idle_timeout_s`` (kept below
  the engines' keep-alive, so that the server never closes a connection just as
  it is reused) and within the server's own ``Keep-Alive: timeout``; older ones
  are closed. ``Connection: close`` is honoured, and a pooled connection with
  anything to read (an end of file, a reset) is closed instead of reused.
- Deadlines per phase, each a ``TimeoutError`` subclass: connecting
  (``connect_timeout_s``), the response's head after the request was written
  (``response_timeout_s``), and the longest silence between body bytes
  (``read_timeout_s``), each moved by every wait on one timer per connection
  (``deadline``).
- Bounds: the response head (and trailers) at ``max_head_bytes``; body bytes
  held unread at ``read_limit`` (reading from the socket pauses beyond it).
- Encoding: ``Accept-Encoding: identity`` is sent; a gzip or deflate body sent
  anyway is decoded incrementally as it is read, anything else is a
  ``ProtocolError``.
- Releasing: a response received to the end gives its connection back to the
  pool; a response left early (cancellation, errors) closes its connection,
  which is how engines learn that a request was abandoned.
- Writing: with other requests in flight, a request waits for the end of the
  event loop's turn and goes out with the turn's others (``outbox``: one
  wake-up of the engine for all of them); one alone is written at once.

Laid out as httpcore is: ``errors`` (the exception tree), ``connection`` (one connection, its parser
and the small ``Pool`` interface it needs), ``response`` (what callers read), ``pool`` (``HttpClient``),
``outbox`` (writes held to the loop's turn; the gateway's server writes through it too), ``deadline``
(a connection's wait deadline on one timer).
"""

from __future__ import annotations

from backends.httpclient.connection import CLOSE_HEADER
from backends.httpclient.errors import (
    ConnectError,
    ConnectTimeout,
    HttpError,
    NoResponseError,
    ProtocolError,
    ReadTimeout,
    RemoteClosed,
    RequestNotSentError,
    ResponseTimeout,
)
from backends.httpclient.pool import (
    DEFAULT_HEAD_LIMIT,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_READ_LIMIT,
    HttpClient,
    tls_context,
)
from backends.httpclient.response import Headers, Response

__all__ = [
    "CLOSE_HEADER",
    "DEFAULT_HEAD_LIMIT",
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_READ_LIMIT",
    "ConnectError",
    "ConnectTimeout",
    "Headers",
    "HttpClient",
    "HttpError",
    "NoResponseError",
    "ProtocolError",
    "ReadTimeout",
    "RemoteClosed",
    "RequestNotSentError",
    "Response",
    "ResponseTimeout",
    "tls_context",
]
