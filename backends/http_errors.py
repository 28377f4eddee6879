"""Engine HTTP errors to ``BackendError`` kinds: every engine's error shape, read in one place.

Shapes seen in the references: OpenAI's ``{"error": {"message", "type", "code"}}``
(vLLM >= 0.10.1, llama-server), vLLM's and trtllm-serve's flat
``{"object": "error", "message", "type", "code"}``, TGI's
``{"error": "...", "error_type": "..."}``, TGI chat streams'
``{"error": {"message", "http_status_code"}}``, Triton's and trtllm-serve's
validation ``{"error": "..."}``, MII's ``{"message": ...}`` and fastchat codes.

What the engine wrote stays in the error's ``detail`` (for logs); its ``message`` is what a client may
read: the engine's own words only where they tell the client what to change (a bad request, a prompt
too long), with URLs, hosts, file paths and tracebacks taken out; otherwise what kind of failure it was.
A refusal the engine sent inside a 200 stream (TGI validates there) reads as the engine refusing the
request, never as a stream error: the client may have asked for a whole answer.

A context refusal names the engine's limit, and mostly the prompt's size as the engine counted it
(``context_figures``): vLLM ("maximum context length is 4096 tokens and your request has 7 input
tokens"), TGI ("must be <= 2048. Given: 2000 `inputs` tokens"), trtllm-serve ("prompt length (4000.0)
... should not exceed max_seq_len (4096)", "= max_seq_len (4096) - `splited_prompt_len` (4100)"),
llama-server ("request (9412 tokens) exceeds the available context size (8192 tokens)") and the
in-process engines. The gateway learns the backend's real context from them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from backends.base import BackendError, ErrorKind

_CONTEXT = re.compile(
    r"context length|context size|maximum context|max_model_len|must be <= \d+|max_total_tokens|too long"
    r"|must have less than \d+ tokens"
    r"|maximum input length|should not exceed max_num_tokens|prompt length .* exceed|max_seq_len",
    re.IGNORECASE,
)
# (limit, prompt) patterns of engines' context refusals; a pattern without a prompt group names the limit only.
_FIGURES = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (
        r"maximum context length is (?P<limit>\d+) tokens and your request has (?P<prompt>\d+) input tokens",
        r"maximum context length is (?P<limit>\d+) tokens\. However, your request has (?P<prompt>\d+) input tokens",
        r"maximum context length is (?P<limit>\d+) tokens\. However, you requested \d+ tokens \((?P<prompt>\d+) in",
        r"maximum context length is (?P<limit>\d+) tokens\. However, your \w+ resulted in (?P<prompt>\d+) tokens",
        r"must be <= (?P<limit>\d+)\. Given: (?P<prompt>\d+) `inputs` tokens",
        r"prompt length \((?P<prompt>\d+)(?:\.\d*)?\) and query length \((?P<query>\d+)\)"
        r".*max_seq_len \((?P<limit>\d+)\)",
        r"max_seq_len \((?P<limit>\d+)\) - `splited_prompt_len` \((?P<prompt>\d+)\)"
        r" - `query_token_len` \((?P<query>\d+)\)",
        r"request \((?P<prompt>\d+) tokens\) exceeds the available context size \((?P<limit>\d+) tokens\)",
        r"context length is only (?P<limit>\d+) tokens",
        r"maximum context length is (?P<limit>\d+) tokens",
        r"max_model_len=(?P<limit>\d+)",
    )
)
_INVALID = re.compile(r"^input validation error", re.IGNORECASE)
# trtllm-serve reports a full queue as a 400 with this text; it is an overload, worth retrying elsewhere.
_BUSY = re.compile(r"queue size of \d+ has been reached|try again later|model is overloaded", re.IGNORECASE)
# Tuples, not sets: an engine's type or code may be any JSON value, an unhashable object included.
_CONTENT_CODES = ("content_filter", "content_policy_violation")
_OVERLOADED_TYPES = ("overloaded", "unavailable_error", "rate_limit_error", "RateLimitError")


class EngineError(BackendError):
    """A ``BackendError`` from what an engine answered: ``message`` is safe to show a client, ``detail``
    keeps the engine's own words (hosts, paths, tracebacks included) for the logs."""

    def __init__(self, kind: ErrorKind, message: str, *, detail: str, **options: Any) -> None:
        super().__init__(kind, message, **options)
        self.detail = detail


# Engine words worth showing a client: those saying what was wrong with the request.
_SHOWN = (ErrorKind.BAD_REQUEST, ErrorKind.CONTEXT_LENGTH, ErrorKind.CONTENT_REFUSED)
_SUMMARY = {
    ErrorKind.OVERLOADED: "the engine is overloaded",
    ErrorKind.TIMEOUT: "the engine timed out",
    ErrorKind.UPSTREAM: "the engine failed",
    ErrorKind.PROTOCOL: "the engine answered something unreadable",
    ErrorKind.CONNECT: "the engine is unreachable",
}
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\s*File \"", re.MULTILINE)
_SCRUB = (
    (re.compile(r"\b[a-zA-Z][\w+.-]*://\S+"), "<url>"),
    (re.compile(r"\b[\w/.-]*\.(?:cc|cpp|cu|cuh|h|hpp|py|rs|go)(?::\d+)+"), "<source>"),
    (re.compile(r"(?<![\w.])(?:/[\w.@+-]+){2,}/?"), "<path>"),
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b|\[[0-9a-fA-F:]+\](?::\d+)?"), "<host>"),
    (re.compile(r"\b[a-zA-Z][\w-]*(?:\.[\w-]+)*:\d{2,5}\b"), "<host>"),
    (re.compile(r"\b(?:[a-zA-Z0-9-]+\.)+(?:svc|local|internal|lan|cluster|com|net|org|io|cloud)\b"), "<host>"),
)
_SHOWN_CHARS = 500


def client_text(message: str) -> str:
    """``message`` without what only the engine's operators should see: tracebacks, URLs, hosts, paths."""
    found = _TRACEBACK.search(message)
    if found is not None:
        message = message[: found.start()]
    for pattern, replacement in _SCRUB:
        message = pattern.sub(replacement, message)
    message = " ".join(message.split())
    return message[:_SHOWN_CHARS].rstrip(" ,:;")


def context_figures(text: str) -> tuple[int | None, int | None]:
    """(the engine's context limit, the prompt's tokens as the engine counted them) named in a context
    refusal's text; None for what it does not say."""
    for pattern in _FIGURES:
        found = pattern.search(text)
        if found is None:
            continue
        groups = found.groupdict()
        prompt = groups.get("prompt")
        query = int(groups.get("query") or 0)
        return int(groups["limit"]), None if prompt is None else int(prompt) + query
    return None, None


def _error(kind: ErrorKind, head: str, message: str, param: Any, retry_after: float | None) -> EngineError:
    shown = client_text(message) if kind in _SHOWN else ""
    return EngineError(
        kind,
        f"{head}: {shown or _SUMMARY.get(kind, 'the engine failed')}",
        detail=f"{head}: {message or 'no message'}",
        param=param if isinstance(param, str) else None,
        retry_after=retry_after,
    )


def _message(doc: Any) -> tuple[str, Any, Any, Any]:
    """(message, type, code, param) from any known error body."""
    if not isinstance(doc, Mapping):
        return (str(doc)[:500] if doc else "", None, None, None)
    err = doc.get("error")
    if isinstance(err, Mapping):
        return (
            str(err.get("message", "")),
            err.get("type"),
            err.get("code", err.get("http_status_code")),
            err.get("param"),
        )
    if isinstance(err, str):
        return err, doc.get("error_type"), None, None
    detail = doc.get("detail")
    if isinstance(detail, Mapping):
        return _message(detail)
    msg = doc.get("message", detail if isinstance(detail, str) else "")
    return str(msg), doc.get("type"), doc.get("code"), doc.get("param")


def _kind(status: int | None, message: str, type_: Any, code: Any) -> ErrorKind:
    if code == "context_length_exceeded" or type_ == "exceed_context_size_error" or _CONTEXT.search(message):
        return ErrorKind.CONTEXT_LENGTH
    if code in _CONTENT_CODES or type_ in _CONTENT_CODES:  # a content policy (OpenAI's and Azure's codes)
        return ErrorKind.CONTENT_REFUSED
    if status == 429 or type_ in _OVERLOADED_TYPES or _BUSY.search(message):
        return ErrorKind.OVERLOADED
    if status in (408, 504):
        return ErrorKind.TIMEOUT
    if status == 503:
        return ErrorKind.OVERLOADED
    if status in (400, 413, 422) or type_ in ("validation", "BadRequestError", "invalid_request_error"):
        return ErrorKind.BAD_REQUEST
    if _INVALID.search(message):
        return ErrorKind.BAD_REQUEST
    return ErrorKind.UPSTREAM


def parse_body(body: bytes) -> Any:
    """JSON, or JSON framed as one SSE event (Triton answers stream errors so), or the text itself."""
    text = body.strip()
    if text.startswith(b"data:"):
        text = text[5:].strip()
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace").strip()


def from_response(engine: str, status: int, body: bytes, headers: Mapping[str, str]) -> EngineError:
    """An HTTP error status from the engine, before any token."""
    message, type_, code, param = _message(parse_body(body))
    if isinstance(code, int) and 100 <= code < 600 and status == 200:
        status = code
    kind = _kind(status, message, type_, code)
    retry_after = None
    raw_retry = headers.get("retry-after")
    if raw_retry is not None:
        try:
            retry_after = float(raw_retry)
        except ValueError:
            retry_after = None
    if kind is ErrorKind.OVERLOADED and retry_after is None:
        retry_after = 1.0
    return _error(kind, f"{engine} answered {status}", message, param, retry_after)


def from_event(engine: str, doc: Any, trust_status: bool = True) -> EngineError:
    """An error the engine sent inside a stream (after a 200). ``trust_status`` False: the event's
    status code says nothing (TGI's Messages API writes 422 on every stream error)."""
    message, type_, code, param = _message(doc)
    status = code if trust_status and isinstance(code, int) and 100 <= code < 600 else None
    kind = _kind(status, message, type_, code)
    head = f"{engine} refused the request" if kind in _SHOWN else f"{engine} stream error"
    return _error(kind, head, message, param, 1.0 if kind is ErrorKind.OVERLOADED else None)
