"""One request to an engine over HTTP as every HTTP adapter sends it, and its failures as ``BackendError``.

``HttpBackend`` (every HTTP engine's adapter subclasses it, so it stays interpreted) hands its requests
to these functions: they run once or twice per request, and this module is compiled by mypyc
(``pyproject.toml``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from backends import http_errors
from backends.base import BackendError, EngineClock, ErrorKind, GenerationRequest
from backends.httpclient import (
    CLOSE_HEADER,
    ConnectError,
    HttpClient,
    HttpError,
    NoResponseError,
    RequestNotSentError,
    Response,
)
from values.calls import json_dumps, perf_counter


def header_lines(headers: Mapping[str, str]) -> bytes:
    """The request's extra headers as header lines; one that could break its line (not printable ASCII,
    or a name with a colon or space) is left out rather than sent mangled."""
    lines = b""
    for name, value in headers.items():
        fits = name.isascii() and name.isprintable() and value.isascii() and value.isprintable()
        if fits and name and ":" not in name and " " not in name:
            lines += b"%s: %s\r\n" % (name.encode(), value.encode())
    return lines


async def open_response(
    client: HttpClient, name: str, request: GenerationRequest, path: str, payload: dict[str, Any], closes: bool
) -> Response:
    """POST ``payload`` to the engine ``name`` (with the request's id in ``X-Request-Id``; ``closes``: its
    server closes connections after streams, ``HttpBackend.closes_streams``) and the response once its
    status is 2xx; the caller releases it (``Response.release``: back to the pool if its body came in
    whole, else closed: leaving before the body's end is how engines learn that a request was cancelled)."""
    clock = request.clock
    started = perf_counter()
    rid = request.request_id
    # The id goes into a header line: only when it cannot break one (the gateway's ids always can't).
    headers = b"x-request-id: %s\r\n" % rid.encode() if rid.isascii() and rid.isprintable() else b""
    if closes and payload.get("stream"):
        headers += CLOSE_HEADER
    if request.headers:
        headers += header_lines(request.headers)
    try:
        response = await client.request("POST", path, json_dumps(payload), headers)
    except BaseException as exc:
        clock.waited_s += perf_counter() - started
        if isinstance(exc, OSError):
            raise request_error(name, exc) from exc
        raise
    # Waited until the response's bytes arrived; parsing them after that is the gateway's work.
    clock.waited_s += max(0.0, response.arrived_at - started)
    try:
        status = response.status
        if status >= 300:
            if status >= 400:
                body = await read_body(name, response)
                raise http_errors.from_response(name, status, body, response.headers)
            location = response.headers.get("location", "")
            raise BackendError(
                ErrorKind.PROTOCOL,
                f"{name}: the engine answered {status} (redirect to {location or 'nowhere'}); "
                "redirects are not followed: point the backend's url at the engine itself",
            )
        if response.content_type == "text/html":
            raise BackendError(
                ErrorKind.PROTOCOL,
                f"{name}: the engine answered {status} with text/html instead of JSON or "
                "an event stream (a login page or a proxy's error page?)",
            )
    except BaseException:
        response.release()  # an error's body was read whole: back to the pool
        raise
    return response


async def read_body(name: str, response: Response, clock: EngineClock | None = None) -> bytes:
    """The response's whole body; the wait goes on ``clock``, a broken read is a ``BackendError``."""
    started = perf_counter()
    try:
        return await response.read()
    except OSError as exc:
        raise transport_error(name, exc) from exc
    finally:
        if clock is not None:
            clock.waited_s += perf_counter() - started


def request_error(name: str, exc: OSError) -> BackendError:
    """A request that got no response head."""
    if isinstance(exc, TimeoutError):
        return BackendError(ErrorKind.TIMEOUT, f"{name}: timed out waiting for the engine")
    if isinstance(exc, RequestNotSentError):
        return BackendError(ErrorKind.CONNECT, f"{name}: the request could not be sent: {exc}")
    if isinstance(exc, ConnectError):
        return BackendError(ErrorKind.CONNECT, f"{name}: cannot connect: {exc}")
    if isinstance(exc, NoResponseError):
        return BackendError(ErrorKind.PROTOCOL, f"{name}: no response: {exc}")
    if isinstance(exc, HttpError):
        return BackendError(ErrorKind.PROTOCOL, f"{name}: {type(exc).__name__}: {exc}")
    return BackendError(ErrorKind.CONNECT, f"{name}: {type(exc).__name__}: {exc}")


def transport_error(name: str, exc: Exception) -> BackendError:
    """A failure while reading a stream that had started."""
    if isinstance(exc, TimeoutError):
        return BackendError(ErrorKind.TIMEOUT, f"{name}: timed out reading from the engine")
    return BackendError(ErrorKind.PROTOCOL, f"{name}: stream broke: {type(exc).__name__}: {exc}")
