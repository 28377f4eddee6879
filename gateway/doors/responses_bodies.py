"""The request body of ``POST /v1/responses`` as strict pydantic models (input items, tools, text
format), declared so that the OpenAPI document refuses what ``gateway/doors/responses_api.py`` refuses."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from gateway.doors.openai_bodies import MAX_TOOLS, NAME_PATTERN
from gateway.strict import Strict


class InputText(Strict):
    type: Literal["input_text"]
    text: str


class OutputText(Strict):
    """An earlier answer's text, as a client sends it back in the conversation."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class Refusal(Strict):
    type: Literal["refusal"]
    refusal: str


class InputImage(Strict):
    type: Literal["input_image"]
    image_url: Annotated[str, Field(pattern=r"^(https?://|data:image/[a-zA-Z0-9.+-]+;base64,)", max_length=20_000_000)]
    detail: Literal["auto", "low", "high"] | None = None


Part = Annotated[InputText | OutputText | Refusal | InputImage, Field(discriminator="type")]


class MessageItem(Strict):
    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | Annotated[list[Part], Field(min_length=1)]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallItem(Strict):
    type: Literal["function_call"]
    call_id: Annotated[str, Field(min_length=1)]
    name: str
    arguments: str
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutputItem(Strict):
    type: Literal["function_call_output"]
    call_id: Annotated[str, Field(min_length=1)]
    output: str | Annotated[list[InputText], Field(min_length=1)]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


def _item_kind(value: Any) -> str:
    if isinstance(value, dict):
        kind = value.get("type", "message")
        return kind if isinstance(kind, str) else "message"
    return "message"


Item = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(_item_kind),
]


class FunctionTool(Strict):
    type: Literal["function"]
    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(Strict):
    type: Literal["function"]
    name: str


class TextFormatPlain(Strict):
    type: Literal["text"]


class TextFormatJsonObject(Strict):
    type: Literal["json_object"]


class TextFormatJsonSchema(Strict):
    type: Literal["json_schema"]
    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    schema_: Annotated[dict[str, Any], Field(alias="schema")]
    description: str | None = None
    strict: bool | None = None


TextFormat = Annotated[TextFormatPlain | TextFormatJsonObject | TextFormatJsonSchema, Field(discriminator="type")]


class TextConfig(Strict):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None
    """Only the default: no engine here takes a verbosity."""


class StreamOptions(Strict):
    include_obfuscation: bool | None = None
    """``true``: delta events carry an ``obfuscation`` string that pads them to a uniform size (a
    mitigation against reading lengths off encrypted traffic); omitted or ``false``: they carry none."""


def _set_only_with(field: str, needs: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema: when ``field`` is set (not null), the body also holds ``needs``."""
    return {
        "if": {"required": [field], "properties": {field: {"not": {"type": "null"}}}},
        "then": {"required": list(needs), "properties": needs},
    }


# What the handler checks across fields, stated in the OpenAPI document too.
_TOGETHER: dict[str, Any] = {
    "allOf": [
        _set_only_with("tool_choice", {"tools": {"type": "array", "minItems": 1}}),
        _set_only_with("stream_options", {"stream": {"const": True}}),
    ]
}


class ResponsesBody(BaseModel):
    """The request body of ``POST /v1/responses``. Fields that need stored state or features this gateway
    lacks are declared with the only values it takes (unset, or what it does anyway), so the OpenAPI
    document refuses what the handler refuses."""

    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=_TOGETHER)
    model: Annotated[str, Field(min_length=1)]
    input: str | Annotated[list[Item], Field(min_length=1)]
    instructions: str | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    store: Literal[False] | None = None
    previous_response_id: None = None
    conversation: None = None
    background: Literal[False] | None = None
    prompt: None = None
    reasoning: None = None
    max_tool_calls: Literal[0] | None = None
    top_logprobs: Literal[0] | None = None
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = None
    user: Annotated[str, Field(max_length=256)] | None = None
    safety_identifier: Annotated[str, Field(max_length=64)] | None = None
    prompt_cache_key: Annotated[str, Field(max_length=1024)] | None = None
    service_tier: Literal["auto", "default"] | None = None
    truncation: Literal["disabled"] | None = None
    include: Annotated[list[str], Field(max_length=0)] | None = None
    """Extra output (reasoning content, logprobs, search results): none exists here, so only empty."""
