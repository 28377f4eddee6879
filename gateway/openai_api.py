"""OpenAI request bodies (validated at the edge) and response shapes.

Bodies are validated strictly (a string where a number belongs is an error,
as OpenAI does it); fields OpenAI does not define are kept in
``GenerationRequest.extra`` for engines that know them. Responses are plain
dicts built in one place, for JSON and for SSE chunks alike.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from backends.base import Chunk, GenerationRequest, Usage
from gateway.errors import ApiError, bad_request

Role = Literal["system", "developer", "user", "assistant", "tool"]
# Fields we accept but cannot honour with every engine: rejected clearly instead of ignored.
_UNSUPPORTED = ("tools", "functions", "logprobs", "top_logprobs", "echo", "best_of", "suffix", "audio")
# Bounds on what a body may hold, checked on the decoded JSON before validation (validating 100,000
# messages took 0.7 s of event loop to refuse them): OpenAI's 4 stop sequences, each at most
# MAX_STOP_CHARS; content parts in all at most PARTS_PER_MESSAGE times the message limit; OpenAI's
# 300 logit_bias entries.
MAX_STOPS = 4
MAX_STOP_CHARS = 1024
PARTS_PER_MESSAGE = 4
MAX_LOGIT_BIAS = 300


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: Role
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    model: Annotated[str, Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    n: Annotated[int, Field(ge=1, le=128)] | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOPS)] | None = None
    seed: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: Annotated[str, Field(max_length=256)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None


class ChatBody(_Common):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None


class CompletionBody(_Common):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)]


def _param(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("str", "list[TextPart]", "list[str]", "int", "float", "bool", "constrained-int"):
            continue  # pydantic names the union member it tried; not part of the field path
        else:
            out += f".{part}" if out else str(part)
    return out


def _too_many(param: str, what: str, limit: int) -> ApiError:
    return bad_request(f"Invalid '{param}': {what}; this gateway allows at most {limit}.", param, "invalid_value")


def check_bounds(data: dict[str, Any], max_messages: int, max_stop_chars: int = MAX_STOP_CHARS) -> None:
    """Refuse oversized lists in O(number of messages), before the costly validation sees them.
    Values of the wrong type are left for validation to name."""
    messages = data.get("messages")
    if isinstance(messages, list):
        if len(messages) > max_messages:
            raise _too_many("messages", f"{len(messages)} messages", max_messages)
        parts = sum(len(c) for m in messages if isinstance(m, dict) and isinstance(c := m.get("content"), list))
        if parts > max_messages * PARTS_PER_MESSAGE:
            raise _too_many("messages", f"{parts} content parts", max_messages * PARTS_PER_MESSAGE)
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) > 1:
        raise bad_request("Only one prompt per request is supported.", "prompt", "invalid_value")
    stop = data.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    if len(stops) > MAX_STOPS:
        raise _too_many("stop", f"{len(stops)} stop sequences", MAX_STOPS)
    for i, s in enumerate(stops):
        if isinstance(s, str) and len(s) > max_stop_chars:
            param = "stop" if isinstance(stop, str) else f"stop[{i}]"
            raise _too_many(param, f"a stop sequence of {len(s)} characters", max_stop_chars)
    bias = data.get("logit_bias")
    if isinstance(bias, dict) and len(bias) > MAX_LOGIT_BIAS:
        raise _too_many("logit_bias", f"{len(bias)} entries", MAX_LOGIT_BIAS)


def parse_body(
    model: type[ChatBody] | type[CompletionBody],
    data: Any,
    max_messages: int | None = None,
    max_stop_chars: int = MAX_STOP_CHARS,
) -> ChatBody | CompletionBody:
    """The validated body; with ``max_messages``, oversized bodies are refused before validation."""
    if not isinstance(data, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_type")
    if max_messages is not None:
        check_bounds(data, max_messages, max_stop_chars)
    try:
        body = model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        param = _param(err["loc"])
        if err["type"] == "missing":
            raise bad_request(f"Missing required parameter: '{param}'.", param, "missing_required_parameter") from None
        kind = (
            "invalid_type" if err["type"].endswith("_type") or err["type"] == "union_tag_invalid" else "invalid_value"
        )
        raise bad_request(f"Invalid value for '{param}': {err['msg']}.", param, kind) from None
    if body.n not in (None, 1):
        raise bad_request("Only n=1 is supported: ask for one choice per request.", "n", "unsupported_value")
    if body.stream_options is not None and not body.stream:
        raise bad_request(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            "stream_options",
            "invalid_value",
        )
    for name in _UNSUPPORTED:
        if body.model_extra and body.model_extra.get(name) not in (None, False, [], 0):
            raise bad_request(
                f"The '{name}' parameter is not supported by this gateway.", name, "unsupported_parameter"
            )
    return body


def to_generation(
    body: ChatBody | CompletionBody, request_id: str, max_tokens_cap: int, max_messages: int
) -> GenerationRequest:
    max_tokens = body.max_tokens
    param = "max_tokens"
    if isinstance(body, ChatBody) and body.max_completion_tokens is not None:
        max_tokens, param = body.max_completion_tokens, "max_completion_tokens"
    if max_tokens is not None and max_tokens > max_tokens_cap:
        raise bad_request(
            f"'{param}' is {max_tokens}; this gateway allows at most {max_tokens_cap}.", param, "invalid_value"
        )
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    extra = dict(body.model_extra or {})
    common: dict[str, Any] = {
        "request_id": request_id,
        "model": body.model,
        "max_tokens": max_tokens,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "stop": stop,
        "seed": body.seed,
        "extra": extra,
    }
    if isinstance(body, ChatBody):
        if len(body.messages) > max_messages:
            raise bad_request(f"Too many messages: at most {max_messages}.", "messages", "invalid_value")
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        return GenerationRequest(messages=messages, **common)
    prompt = body.prompt if isinstance(body.prompt, str) else body.prompt[0]
    return GenerationRequest(prompt=prompt, **common)


def prompt_texts(req: GenerationRequest) -> list[str]:
    if req.messages is not None:
        return [m["content"] for m in req.messages]
    return [req.prompt or ""]


def usage_dict(usage: Usage | None) -> dict[str, int] | None:
    if usage is None:
        return None
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


class ResponseShape:
    """Builds the JSON documents of one response, chat or completion, whole or streamed."""

    def __init__(self, chat: bool, request_id: str, model: str, include_usage: bool) -> None:
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + request_id
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage
        self._object = "chat.completion.chunk" if chat else "text_completion"

    def whole(self, text: str, finish: str | None, usage: Usage | None) -> dict[str, Any]:
        choice: dict[str, Any]
        if self.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": finish,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage_dict(usage),
            "system_fingerprint": None,
        }

    def _chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "id": self.id,
            "object": self._object,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }
        if self.include_usage:
            doc["usage"] = None
        return doc

    def role_chunk(self) -> dict[str, Any] | None:
        """Chat streams open with the assistant role, as OpenAI's do."""
        if not self.chat:
            return None
        return self._chunk(
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        )

    def delta(self, chunk: Chunk) -> dict[str, Any] | None:
        if not chunk.text and chunk.finish_reason is None:
            return None
        if self.chat:
            delta = {"content": chunk.text} if chunk.text else {}
            return self._chunk({"index": 0, "delta": delta, "logprobs": None, "finish_reason": chunk.finish_reason})
        return self._chunk({"index": 0, "text": chunk.text, "logprobs": None, "finish_reason": chunk.finish_reason})

    def usage_chunk(self, usage: Usage | None) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": self._object,
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage_dict(usage),
        }


def error_for_json(exc: Exception) -> ApiError:
    return bad_request(
        "We could not parse the JSON body of your request. The body must be valid JSON "
        f"with Content-Type: application/json ({exc}).",
        code="invalid_json",
    )
