"""``POST /v1/messages``: Anthropic's Messages API on the one generation pipeline.

The body becomes a chat ``GenerationRequest``: ``system`` a system message first; ``tool_use`` blocks
the assistant's ``tool_calls`` (``input`` as JSON text); ``tool_result`` blocks tool messages (before
the user's own text in that turn); tools as OpenAI function tools; ``tool_choice`` auto, any
(required), tool (a named function) and none; ``disable_parallel_tool_use`` as
``parallel_tool_calls: false``; ``stop_sequences`` as ``stop``; ``top_k`` in ``extra`` (only engines
that take it get such a request). Errors are Anthropic's shape, ``{"type": "error", "error": {"type",
"message"}}``, with the status of the gateway's error. Unknown fields are refused, as Anthropic does.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Annotated, Any, Literal, TypeVar

import orjson
from pydantic import ConfigDict, Field, ValidationError

from backends.base import GenerationRequest
from gateway.config import LimitsConfig
from gateway.doors.anthropic_events import AnthropicAnswer, error_doc
from gateway.doors.body_errors import deepest, param_path
from gateway.doors.openai_api import MAX_STOP_CHARS, MAX_STOPS, MAX_TOOLS, NAME_PATTERN
from gateway.http.errors import ApiError, bad_request
from gateway.pipeline.surfaces import Asked
from gateway.strict import Strict


class CacheControl(Strict):
    """A prompt-caching hint: accepted and left to the engines' own prefix caches."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(Strict):
    type: Literal["text"]
    text: Annotated[str, Field(min_length=1)]
    cache_control: CacheControl | None = None
    citations: list[Any] | None = None


class Base64Source(Strict):
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: Annotated[str, Field(max_length=20_000_000)]


class UrlSource(Strict):
    type: Literal["url"]
    url: Annotated[str, Field(pattern=r"^https?://", max_length=20_000)]


class ImageBlock(Strict):
    type: Literal["image"]
    source: Annotated[Base64Source | UrlSource, Field(discriminator="type")]
    cache_control: CacheControl | None = None


class ToolUseBlock(Strict):
    type: Literal["tool_use"]
    id: Annotated[str, Field(min_length=1)]
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None


ResultPart = Annotated[TextBlock | ImageBlock, Field(discriminator="type")]


class ToolResultBlock(Strict):
    type: Literal["tool_result"]
    tool_use_id: Annotated[str, Field(min_length=1)]
    content: str | list[ResultPart] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None


class ThinkingBlock(Strict):
    """An earlier answer's reasoning, sent back by clients that keep it: not shown to these models."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(Strict):
    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class Message(Strict):
    # The document says what the handler checks: a user message has content (only a final assistant
    # message may be empty, which a schema of one message cannot see).
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "if": {"properties": {"role": {"const": "user"}}},
            "then": {"properties": {"content": {"minLength": 1, "minItems": 1}}},
        },
    )

    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(Strict):
    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None
    strict: bool | None = None


class ToolChoiceAuto(Strict):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(Strict):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(Strict):
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(Strict):
    type: Literal["none"]


ToolChoice = Annotated[ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")]


class Metadata(Strict):
    user_id: Annotated[str, Field(max_length=256)] | None = None


NEEDS_TOOLS: dict[str, Any] = {
    "if": {"required": ["tool_choice"], "properties": {"tool_choice": {"not": {"type": "null"}}}},
    "then": {"required": ["tools"], "properties": {"tools": {"type": "array", "minItems": 1}}},
}
"""JSON Schema for "``tool_choice`` only with ``tools``" (the OpenAPI document states the handlers' rule)."""


class Conversation(Strict):
    """What a message's prompt is made of: the body of ``POST /v1/messages/count_tokens``."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=NEEDS_TOOLS)

    model: Annotated[str, Field(min_length=1)]
    messages: Annotated[list[Message], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None


class MessagesBody(Conversation):
    """The request body of ``POST /v1/messages``."""

    max_tokens: Annotated[int, Field(ge=1)]
    stop_sequences: (
        Annotated[list[Annotated[str, Field(max_length=MAX_STOP_CHARS)]], Field(max_length=MAX_STOPS)] | None
    ) = None
    stream: bool | None = False
    temperature: Annotated[float, Field(ge=0, le=1)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None


C = TypeVar("C", bound=Conversation)

_REFUSED = {
    "thinking": "Extended thinking is not supported: no backend of this gateway serves a reasoning model.",
    "mcp_servers": "MCP servers are not supported by this gateway.",
    "container": "Containers are not supported by this gateway.",
    "context_management": "Context management is not supported by this gateway.",
    "output_format": "Structured outputs are not offered on the Messages API here: use chat completions.",
}
_TAGS = frozenset({"text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking"})
_TAGS |= {"auto", "any", "tool", "none", "base64", "url"}


def _param(loc: tuple[Any, ...]) -> str:
    return param_path(loc, _TAGS, ("tool_choice", "source"), index=".{}")


def _invalid(message: str, param: str | None = None) -> ApiError:
    return bad_request(f"{param}: {message}" if param else message, param, "invalid_request_error")


def _validated(data: Any, limits: LimitsConfig, body_type: type[C]) -> C:
    if not isinstance(data, dict):
        raise _invalid("The request body must be a JSON object.")
    messages = data.get("messages")
    if isinstance(messages, list) and len(messages) > limits.max_messages:  # before the costly validation
        raise _invalid(f"{len(messages)} messages; this gateway allows at most {limits.max_messages}.", "messages")
    tools = data.get("tools")
    if isinstance(tools, list):
        for i, tool in enumerate(tools):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if isinstance(kind, str) and kind != "custom":
                raise _invalid(f"Tool type '{kind[:64]}' is not supported: only custom tools.", f"tools.{i}.type")
    for name, message in _REFUSED.items():
        if data.get(name) is not None:
            raise _invalid(message, name)
    try:
        body = body_type.model_validate(data)
    except ValidationError as exc:
        param, err = deepest(exc, _param)
        raise _invalid("Field required" if err["type"] == "missing" else err["msg"], param) from None
    choice = body.tool_choice
    if choice is not None and not body.tools:
        raise _invalid("tool_choice may only be specified while providing tools.", "tool_choice")
    if isinstance(choice, ToolChoiceTool) and not any(t.name == choice.name for t in body.tools or ()):
        raise _invalid(f"Tool '{choice.name}' is not one of the tools given.", "tool_choice.name")
    _check_contents(body.messages)
    return body


def _check_contents(messages: list[Message]) -> None:
    """Anthropic's rules for content: every message has some (the final assistant one may be empty: no
    prefill), and a prefill (a final assistant turn, continued) is text that does not end in whitespace,
    since the answer's first token would have to start inside it. (Empty text blocks fail validation.)"""
    last = len(messages) - 1
    for i, m in enumerate(messages):
        blocks = [m.content] if isinstance(m.content, str) else m.content
        prefill = i == last and m.role == "assistant"
        if not blocks or (isinstance(m.content, str) and not m.content):
            if not prefill:
                raise _invalid(
                    "all messages must have non-empty content except for the optional final assistant message",
                    f"messages.{i}.content",
                )
            continue
        if prefill:
            if any(isinstance(b, ToolUseBlock) for b in blocks):
                raise _invalid(
                    "a final assistant message is continued as text: it cannot hold tool_use blocks",
                    f"messages.{i}.content",
                )
            text = m.content if isinstance(m.content, str) else _text(m.content)
            if text != text.rstrip():
                raise _invalid("final assistant content cannot end with trailing whitespace", f"messages.{i}.content")


def parse_conversation(data: Any, limits: LimitsConfig) -> Conversation:
    return _validated(data, limits, Conversation)


def parse(data: Any, limits: LimitsConfig) -> MessagesBody:
    body = _validated(data, limits, MessagesBody)
    for i, stop in enumerate(body.stop_sequences or ()):
        if len(stop) > limits.max_stop_chars or len(stop) > MAX_STOP_CHARS:
            raise _invalid(f"a stop sequence of {len(stop)} characters is too long.", f"stop_sequences.{i}")
    if body.max_tokens > limits.max_tokens:
        raise _invalid(f"{body.max_tokens} is more than this gateway allows ({limits.max_tokens}).", "max_tokens")
    return body


def _text(content: str | list[Any] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(p.text for p in content if isinstance(p, TextBlock))


def _image(block: ImageBlock) -> dict[str, Any]:
    src = block.source
    url = src.url if isinstance(src, UrlSource) else f"data:{src.media_type};base64,{src.data}"
    return {"type": "image_url", "image_url": {"url": url}}


def _user_content(blocks: list[TextBlock | ImageBlock]) -> str | list[dict[str, Any]]:
    if not any(isinstance(b, ImageBlock) for b in blocks):
        return "".join(b.text for b in blocks if isinstance(b, TextBlock))
    return [_image(b) if isinstance(b, ImageBlock) else {"type": "text", "text": b.text} for b in blocks]


def _turn(m: Message) -> list[dict[str, Any]]:
    """One Anthropic turn as OpenAI chat messages."""
    if isinstance(m.content, str):
        return [{"role": m.role, "content": m.content}]
    if m.role == "assistant":
        calls = [
            {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input)}}
            for b in m.content
            if isinstance(b, ToolUseBlock)
        ]
        out: dict[str, Any] = {"role": "assistant", "content": _text(m.content)}
        if calls:
            out["tool_calls"] = calls
        return [out]
    turn: list[dict[str, Any]] = []
    for b in m.content:
        if isinstance(b, ToolResultBlock):
            text = _text(b.content)
            turn.append(
                {"role": "tool", "tool_call_id": b.tool_use_id, "content": f"Error: {text}" if b.is_error else text}
            )
    rest = [b for b in m.content if isinstance(b, TextBlock | ImageBlock)]
    if rest or not turn:
        turn.append({"role": "user", "content": _user_content(rest)})
    return turn


def prompt_of(body: Conversation, request_id: str) -> GenerationRequest:
    """The conversation as a chat request: messages, tools and how they may be called."""
    messages: list[dict[str, Any]] = []
    system = _text(body.system) if body.system is not None else ""
    if system:
        messages.append({"role": "system", "content": system})
    final = body.messages[-1]
    # A final assistant turn is a prefill: the answer continues it. An empty one is no prefill at all.
    prefill = final.role == "assistant" and bool(
        final.content if isinstance(final.content, str) else _text(final.content)
    )
    turns = body.messages if prefill or final.role != "assistant" else body.messages[:-1]
    for m in turns:
        messages.extend(_turn(m))
    choice = body.tool_choice
    tool_choice: str | dict[str, Any] | None = None
    if isinstance(choice, ToolChoiceAuto):
        tool_choice = "auto"
    elif isinstance(choice, ToolChoiceAny):
        tool_choice = "required"
    elif isinstance(choice, ToolChoiceTool):
        tool_choice = {"type": "function", "function": {"name": choice.name}}
    elif isinstance(choice, ToolChoiceNone):
        tool_choice = "none"
    single = choice is not None and not isinstance(choice, ToolChoiceNone) and choice.disable_parallel_tool_use
    tools = tuple(
        {
            "type": "function",
            "function": {"name": t.name, "parameters": t.input_schema}
            | ({"description": t.description} if t.description is not None else {})
            | ({"strict": t.strict} if t.strict is not None else {}),
        }
        for t in body.tools or ()
    )
    return GenerationRequest(
        request_id=request_id,
        model=body.model,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice if tools else None,
        parallel_tool_calls=False if single and tools else None,
        continue_final=prefill,
    )


def to_generation(body: MessagesBody, request_id: str) -> GenerationRequest:
    return replace(
        prompt_of(body, request_id),
        max_tokens=body.max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        stop=tuple(body.stop_sequences or ()),
        extra={"top_k": body.top_k} if body.top_k is not None else {},
        user=body.metadata.user_id if body.metadata is not None else None,
    )


class AnthropicSurface:
    """``/v1/messages``."""

    route = "messages"

    def asked(self, data: Any, limits: LimitsConfig, request_id: str) -> Asked:
        body = parse(data, limits)
        gen = to_generation(body, request_id)
        if len(gen.messages or ()) > limits.max_messages:
            raise _invalid(f"at most {limits.max_messages} messages.", "messages")
        caller = {"user": gen.user} if gen.user is not None else {}
        return Asked(gen, bool(body.stream), caller=caller)

    def answer(self, asked: Asked, request_id: str) -> AnthropicAnswer:
        return AnthropicAnswer(request_id, asked.gen.model)

    def error_body(self, error: ApiError) -> bytes:
        return orjson.dumps(error_doc(error))


MESSAGES = AnthropicSurface()
