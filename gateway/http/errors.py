"""OpenAI-format errors: one exception type, one mapping from backend errors, one renderer.

The same JSON goes out as a plain HTTP error and, after a stream has begun, as
an SSE ``data:`` event; the official ``openai`` client raises the exception
class that matches the status (BadRequestError, NotFoundError, RateLimitError...).
"""

from __future__ import annotations

import math
import re
from typing import Any

import orjson

from backends.base import BackendError, ErrorKind
from backends.http_errors import client_text


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",  # noqa: A002 - OpenAI's field name
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
        failure: BackendError | None = None,
    ) -> None:
        if len(message) > MAX_MESSAGE_CHARS:  # a backstop: whatever a message quotes, it stays short
            message = message[: MAX_MESSAGE_CHARS - 1] + "…"
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after = retry_after
        self.failure = failure
        """The engine failure this answers (``from_backend``), kept by name rather than as ``__cause__``:
        the compiled request path (setup.py, mypyc) does not set ``__cause__`` on ``raise ... from``."""

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def json(self) -> bytes:
        return orjson.dumps(self.body())

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"retry-after": str(max(1, math.ceil(self.retry_after)))}


MAX_MESSAGE_CHARS = 2048
ECHO_CHARS = 256
"""What a message quotes of the client's input (a model name, a path, a field name) is shown whole up
to this length; longer, only its first ``ECHO_SHOWN`` characters and an ellipsis."""
ECHO_SHOWN = 64


def clip(text: str) -> str:
    """``text`` as an error message may quote it: whole when short, else its beginning and "…"."""
    return text if len(text) <= ECHO_CHARS else text[:ECHO_SHOWN] + "…"


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404,
        f"The model `{clip(model)}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


_KIND = {
    ErrorKind.BAD_REQUEST: (400, "invalid_request_error", "invalid_value"),
    ErrorKind.CONTEXT_LENGTH: (400, "invalid_request_error", "context_length_exceeded"),
    ErrorKind.OVERLOADED: (429, "rate_limit_error", "engine_overloaded"),
    ErrorKind.TIMEOUT: (504, "api_error", "upstream_timeout"),
    ErrorKind.CONNECT: (502, "api_error", "upstream_unreachable"),
    ErrorKind.UPSTREAM: (502, "api_error", "upstream_error"),
    ErrorKind.PROTOCOL: (502, "api_error", "upstream_protocol_error"),
    ErrorKind.INTERNAL: (500, "api_error", "internal_error"),
    ErrorKind.CONTENT_REFUSED: (400, "invalid_request_error", "content_policy_violation"),
}


_WORDS = {
    ErrorKind.OVERLOADED: "The engines serving the model are overloaded; retry after the Retry-After interval.",
    ErrorKind.TIMEOUT: "The engine serving the model did not answer in time.",
    ErrorKind.CONNECT: "The engine serving the model could not be reached.",
    ErrorKind.UPSTREAM: "The engine serving the model failed while answering.",
    ErrorKind.PROTOCOL: "The engine serving the model sent an answer the gateway could not read.",
    ErrorKind.INTERNAL: "The gateway hit an internal error; the request id identifies it in the logs.",
    ErrorKind.BAD_REQUEST: "The engine refused the request as invalid.",
    ErrorKind.CONTEXT_LENGTH: "The request does not fit the model's context: shorten the prompt or lower max_tokens.",
    ErrorKind.CONTENT_REFUSED: "The engine refused the request's content.",
}
"""The gateway's own words for each kind of engine failure."""
_REFUSALS = (ErrorKind.BAD_REQUEST, ErrorKind.CONTEXT_LENGTH, ErrorKind.CONTENT_REFUSED)
"""Kinds whose engine words may reach the client: they say what to change in the request."""
_HEAD = re.compile(r"^\S+ (?:answered \d{3}|stream error): ")
"""How ``backends.http_errors`` starts a message: the backend's name and what it did."""
_RAW = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\ufffd]|<(?!(?:url|path|host|source)>)[A-Za-z/!?]|^\s*[{\[]")
"""Bytes no sentence holds: control characters, undecodable bytes, markup, JSON."""


def from_backend(exc: BackendError) -> ApiError:
    """The client's view of an engine failure, in the gateway's words: what kind of failure it was. Only
    a refusal of the request (bad request, too long) keeps the engine's explanation, without the
    backend's name, hosts, URLs, paths or tracebacks, and only when it reads as a sentence. The
    engine's own words stay in ``exc.detail``, logged with the request id (``RequestLife``)."""
    status, type_, code = _KIND[exc.kind]
    message = _WORDS[exc.kind]
    if exc.kind in _REFUSALS:
        message = _refusal(exc) or message
    return ApiError(status, message, type=type_, param=exc.param, code=code, retry_after=exc.retry_after, failure=exc)


def error_for_json(exc: Exception) -> ApiError:
    return bad_request(
        "We could not parse the JSON body of your request. The body must be valid JSON "
        f"with Content-Type: application/json ({exc}).",
        code="invalid_json",
    )


def _refusal(exc: BackendError) -> str:
    """The engine's explanation of a refusal, fit for the client, or "" when it has none such."""
    text = _HEAD.sub("", exc.message, count=1)
    for name, _ in exc.failures:
        text = text.removeprefix(f"{name}: ")
    if _RAW.search(text):
        return ""
    return client_text(text)
