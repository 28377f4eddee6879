"""OpenAI's request bodies (chat and completions) as strict pydantic models, and the bounds on them.

``gateway/doors/openai_api.py`` validates a body against them (``parse_body``) and
``gateway/doors/openai_generation.py`` turns the result into a ``GenerationRequest``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, final

from pydantic import BaseModel, ConfigDict, Field

from gateway.strict import Strict

# Bounds on what a body may hold, checked on the decoded JSON before validation (validating 100,000
# messages took 0.7 s of event loop to refuse them): OpenAI's 4 stop sequences, each at most
# MAX_STOP_CHARS; content parts in all at most PARTS_PER_MESSAGE times the message limit; OpenAI's
# 300 logit_bias entries; OpenAI's 128 tools and 16 metadata pairs.
MAX_STOPS = 4
MAX_STOP_CHARS = 1024
PARTS_PER_MESSAGE = 4
MAX_LOGIT_BIAS = 300
MAX_TOOLS = 128
MAX_METADATA = 16
NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"

# The models the door tells apart are final: it does so with ``type(x) is C``, one comparison in
# compiled code (and narrowing both ways for mypy), where ``isinstance`` runs pydantic's metaclass
# ``__instancecheck__``, interpreted, whenever the answer is no (about 850 instructions a test).


@final
class TextPart(Strict):
    type: Literal["text"]
    text: str


class ImageUrl(Strict):
    url: Annotated[str, Field(pattern=r"^(https?://|data:image/[a-zA-Z0-9.+-]+;base64,)", max_length=20_000_000)]
    detail: Literal["auto", "low", "high"] | None = None


@final
class ImagePart(Strict):
    type: Literal["image_url"]
    image_url: ImageUrl


class RefusalPart(Strict):
    type: Literal["refusal"]
    refusal: str


UserPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]
AssistantPart = Annotated[TextPart | RefusalPart, Field(discriminator="type")]


class FunctionCall(Strict):
    name: str
    arguments: str


class ToolCall(Strict):
    id: str
    type: Literal["function"]
    function: FunctionCall


class SystemMessage(Strict):
    role: Literal["system", "developer"]
    content: str | Annotated[list[TextPart], Field(min_length=1)]
    name: str | None = None


class UserMessage(Strict):
    role: Literal["user"]
    content: str | Annotated[list[UserPart], Field(min_length=1)]
    name: str | None = None


@final
class AssistantMessage(Strict):
    role: Literal["assistant"]
    content: str | Annotated[list[AssistantPart], Field(min_length=1)] | None = None
    refusal: str | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    # What OpenAI's clients send back when an agent appends the response's message as it came.
    annotations: list[Any] | None = None
    audio: None = None
    function_call: None = None


@final
class ToolMessage(Strict):
    role: Literal["tool"]
    content: str | Annotated[list[TextPart], Field(min_length=1)]
    tool_call_id: str


Message = Annotated[SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")]


class FunctionDef(Strict):
    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Strict):
    name: str


@final
class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(Strict):
    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    description: str | None = None
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")] = None
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(Strict):
    include_usage: bool | None = False
    include_obfuscation: Literal[False] | None = None
    """OpenAI pads stream events with random text when true; this gateway does not, so only false."""


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
    logit_bias: dict[str, int | float] | None = None


@final
class ChatBody(_Common):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = None
    store: bool | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    modalities: list[Literal["text", "audio"]] | None = None
    safety_identifier: Annotated[str, Field(max_length=64)] | None = None
    prompt_cache_key: Annotated[str, Field(max_length=1024)] | None = None


@final
class CompletionBody(_Common):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)]
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    echo: bool | None = None
    best_of: Annotated[int, Field(ge=1, le=20)] | None = None
