"""OpenAI-format errors: one exception type, one mapping from backend errors, one renderer.

The same JSON goes out as a plain HTTP error and, after a stream has begun, as
an SSE ``data:`` event; the official ``openai`` client raises the exception
class that matches the status (BadRequestError, NotFoundError, RateLimitError...).
"""

from __future__ import annotations

import math
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
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def json(self) -> bytes:
        return orjson.dumps(self.body())

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"retry-after": str(max(1, math.ceil(self.retry_after)))}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
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
}


def from_backend(exc: BackendError) -> ApiError:
    """The client's view of an engine failure: no engine hosts, URLs, paths or tracebacks (those stay in
    ``exc.detail``, for the logs)."""
    status, type_, code = _KIND[exc.kind]
    message = client_text(exc.message)
    return ApiError(status, message, type=type_, param=exc.param, code=code, retry_after=exc.retry_after)


def error_for_json(exc: Exception) -> ApiError:
    return bad_request(
        "We could not parse the JSON body of your request. The body must be valid JSON "
        f"with Content-Type: application/json ({exc}).",
        code="invalid_json",
    )
