"""The client's exceptions: every one an ``OSError`` (a network fault), deadlines also ``TimeoutError``.

HttpError
├── ConnectError            the connection could not be made
│   └── RequestNotSentError the request cannot have reached the server: safe to send again
├── ConnectTimeout          connecting took longer than ``connect_timeout_s``
├── ResponseTimeout         no response head within ``response_timeout_s`` of the request
├── ReadTimeout             a silence between body bytes longer than ``read_timeout_s``
└── ProtocolError           the server broke HTTP/1.1 (or a bound)
    └── RemoteClosed        the server closed the connection mid-exchange
        └── NoResponseError after the request was written, before any response byte
"""

from __future__ import annotations


class HttpError(OSError):
    """Everything this client raises about the network or the server's answer."""


class ConnectError(HttpError):
    """No connection could be made to the server."""


class RequestNotSentError(ConnectError):
    """The request cannot have reached the server (its connection was closed, or broke while the
    request was written): safe to send again, here or elsewhere."""


class ConnectTimeout(HttpError, TimeoutError):
    """Connecting took longer than ``connect_timeout_s``."""


class ResponseTimeout(HttpError, TimeoutError):
    """The response's head did not arrive within ``response_timeout_s`` of the request."""


class ReadTimeout(HttpError, TimeoutError):
    """The server sent nothing for ``read_timeout_s`` while the body was awaited."""


class ProtocolError(HttpError):
    """The server's answer was not valid HTTP/1.1, too large, cut short or undecodable."""


class RemoteClosed(ProtocolError):
    """The server closed the connection before the response was complete."""

    def __init__(self, message: str, before_response: bool) -> None:
        super().__init__(message)
        self.before_response = before_response
        """Not one byte of the response had arrived."""


class NoResponseError(RemoteClosed):
    """The request was sent whole and the connection closed before any response byte: the server
    may have run it (never sent again by this client)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, before_response=True)
