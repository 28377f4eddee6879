"""``POST /v1/responses``: OpenAI's Responses API, stateless, on the one generation pipeline.

The body becomes a chat ``GenerationRequest`` (``instructions`` a system message first; input
messages, ``function_call`` items as the assistant's ``tool_calls`` and ``function_call_output``
items as tool messages; function tools, ``tool_choice``, ``text.format`` as ``response_format``);
the answer's chunks become a Response object or its typed stream events (``gateway.doors.responses_events``).
Nothing is stored: ``store: true``, ``previous_response_id``, item references and conversations are
refused by name. Fields outside the spec go to ``extra`` as they do for chat (engines that know them
take them, else the routing refuses them by name).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError

from backends.base import GenerationRequest
from gateway.config import LimitsConfig
from gateway.doors.body_errors import param_path, validation_error
from gateway.doors.openai_api import MAX_METADATA, MAX_TOOLS, NAME_PATTERN
from gateway.doors.responses_events import ResponsesAnswer
from gateway.http.errors import ApiError, bad_request
from gateway.pipeline.surfaces import Asked
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


# Spec fields that need state, tools or models this gateway does not have: refused by name when set.
_REFUSED = {
    "previous_response_id": "Responses are not stored by this gateway: 'previous_response_id' cannot be resolved; "
    "send the whole conversation in 'input'.",
    "conversation": "Conversations are not stored by this gateway: send the whole conversation in 'input'.",
    "background": "Background responses need storage, which this gateway does not keep.",
    "prompt": "Stored prompt templates are not supported by this gateway.",
    "reasoning": "No backend of this gateway serves a reasoning model: 'reasoning' cannot take effect.",
    "max_tool_calls": "'max_tool_calls' is not supported: the engines here answer with one turn of calls.",
    "top_logprobs": "Log probabilities are not offered on the Responses API here: use chat completions.",
}
_TAGS = frozenset(
    {"message", "function_call", "function_call_output", "input_text", "output_text", "refusal", "input_image"}
    | {"function", "text", "json_object", "json_schema"}
)


def _param(loc: tuple[Any, ...]) -> str:
    return param_path(loc, _TAGS, ("format", "tool_choice"))


def _unsupported(param: str, message: str) -> ApiError:
    return bad_request(message, param, "unsupported_parameter")


def parse(data: Any, limits: LimitsConfig) -> ResponsesBody:
    if not isinstance(data, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_type")
    items = data.get("input")
    if isinstance(items, list) and len(items) > limits.max_messages:  # before the costly validation
        raise bad_request(
            f"Invalid 'input': {len(items)} items; this gateway allows at most {limits.max_messages}.",
            "input",
            "invalid_value",
        )
    tools = data.get("tools")
    if isinstance(tools, list):
        for i, tool in enumerate(tools):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if isinstance(kind, str) and kind != "function":
                raise _unsupported(f"tools[{i}].type", f"Tool type '{kind[:64]}' is not supported: only 'function'.")
    if isinstance(items, list):
        for i, item in enumerate(items):
            kind = item.get("type") if isinstance(item, dict) else None
            if kind == "item_reference":
                raise _unsupported(f"input[{i}]", "Item references need stored responses, which this gateway lacks.")
    for name, message in _REFUSED.items():
        if data.get(name) not in (None, False, 0):  # unset, or set to what this gateway does anyway
            raise _unsupported(name, message)
    if data.get("store") is True:
        raise _unsupported("store", "Responses are not stored by this gateway: 'store' must be false (stateless).")
    if data.get("include"):
        raise _unsupported("include", "Nothing extra can be included: no engine here returns reasoning or search data.")
    try:
        body = ResponsesBody.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, _param) from None
    if body.stream_options is not None and not body.stream:
        why = "The 'stream_options' parameter is only allowed when 'stream' is enabled."
        raise bad_request(why, "stream_options", "invalid_value")
    if body.metadata is not None and len(body.metadata) > MAX_METADATA:
        raise bad_request(f"Invalid 'metadata': at most {MAX_METADATA} pairs.", "metadata", "invalid_value")
    if body.tool_choice is not None and not body.tools:
        raise bad_request("'tool_choice' is only allowed when 'tools' are specified.", "tool_choice", "invalid_value")
    if isinstance(body.tool_choice, NamedFunction):
        name = body.tool_choice.name
        if not any(t.name == name for t in body.tools or ()):
            raise bad_request(f"Tool choice '{name}' is not one of the tools given.", "tool_choice", "invalid_value")
    if body.max_output_tokens is not None and body.max_output_tokens > limits.max_tokens:
        raise bad_request(
            f"'max_output_tokens' is {body.max_output_tokens}; this gateway allows at most {limits.max_tokens}.",
            "max_output_tokens",
            "invalid_value",
        )
    return body


def _content(content: str | list[Any]) -> str | list[dict[str, Any]]:
    """Text parts joined; a list of chat parts only when the message holds images."""
    if isinstance(content, str):
        return content
    if any(isinstance(p, InputImage) for p in content):
        out: list[dict[str, Any]] = []
        for p in content:
            if isinstance(p, InputImage):
                url: dict[str, Any] = {"url": p.image_url} | ({"detail": p.detail} if p.detail else {})
                out.append({"type": "image_url", "image_url": url})
            else:
                out.append({"type": "text", "text": p.refusal if isinstance(p, Refusal) else p.text})
        return out
    return "".join(p.refusal if isinstance(p, Refusal) else p.text for p in content)


def messages(body: ResponsesBody) -> list[dict[str, Any]]:
    """The conversation in OpenAI chat shape: function calls join the assistant turn before them."""
    out: list[dict[str, Any]] = []
    if body.instructions:
        out.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        out.append({"role": "user", "content": body.input})
        return out
    for item in body.input:
        if isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            out.append({"role": role, "content": _content(item.content)})
        elif isinstance(item, FunctionCallItem):
            function = {"name": item.name, "arguments": item.arguments}
            call = {"id": item.call_id, "type": "function", "function": function}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and isinstance(last["content"], str):
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        else:
            output = item.output if isinstance(item.output, str) else "".join(p.text for p in item.output)
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
    if not any(m["role"] != "system" for m in out):
        raise bad_request("'input' holds no message for the model to answer.", "input", "invalid_value")
    return out


def to_generation(body: ResponsesBody, request_id: str) -> GenerationRequest:
    choice = body.tool_choice
    tools = body.tools or ()
    fmt = body.text.format if body.text is not None else None
    response_format: dict[str, Any] | None = None
    if isinstance(fmt, TextFormatJsonObject):
        response_format = {"type": "json_object"}
    elif isinstance(fmt, TextFormatJsonSchema):
        schema: dict[str, Any] = {"name": fmt.name, "schema": fmt.schema_}
        if fmt.strict is not None:
            schema["strict"] = fmt.strict
        if fmt.description is not None:
            schema["description"] = fmt.description
        response_format = {"type": "json_schema", "json_schema": schema}
    return GenerationRequest(
        request_id=request_id,
        model=body.model,
        max_tokens=body.max_output_tokens,
        messages=messages(body),
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        extra=dict(body.model_extra) if body.model_extra else {},
        tools=tuple({"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})} for t in tools),
        tool_choice={"type": "function", "function": {"name": choice.name}}
        if isinstance(choice, NamedFunction)
        else choice,
        parallel_tool_calls=body.parallel_tool_calls,
        response_format=response_format,
        user=body.user,
    )


def _described(body: ResponsesBody) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if body.user is not None:
        out["user"] = body.user
    if body.metadata:
        out["metadata"] = body.metadata
    if body.safety_identifier is not None:
        out["safety_identifier"] = body.safety_identifier
    return out


@dataclass(frozen=True, slots=True)
class AskedResponse(Asked):
    echo: dict[str, Any] = field(default_factory=dict)
    """The request's settings the Response object repeats."""
    obfuscate: bool = False
    """``stream_options.include_obfuscation``."""


class ResponsesSurface:
    """``/v1/responses``."""

    route = "responses"

    def asked(self, data: Any, limits: LimitsConfig, request_id: str) -> Asked:
        body = parse(data, limits)
        gen = to_generation(body, request_id)
        if len(gen.messages or ()) > limits.max_messages:
            raise bad_request(f"Too many messages: at most {limits.max_messages}.", "input", "invalid_value")
        obfuscate = body.stream_options is not None and bool(body.stream_options.include_obfuscation)
        return AskedResponse(gen, bool(body.stream), caller=_described(body), echo=_echo(body), obfuscate=obfuscate)

    def answer(self, asked: Asked, request_id: str) -> ResponsesAnswer:
        if isinstance(asked, AskedResponse):
            return ResponsesAnswer(request_id, asked.gen.model, asked.echo, asked.obfuscate)
        return ResponsesAnswer(request_id, asked.gen.model, {})

    def error_body(self, error: ApiError) -> bytes:
        return error.json()


def _echo(body: ResponsesBody) -> dict[str, Any]:
    """The request's settings a Response object repeats."""
    fmt = body.text.format if body.text is not None and body.text.format is not None else TextFormatPlain(type="text")
    return {
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "metadata": body.metadata or {},
        "parallel_tool_calls": True if body.parallel_tool_calls is None else body.parallel_tool_calls,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "tool_choice": "auto" if body.tool_choice is None else _dumped(body.tool_choice),
        "tools": [t.model_dump() for t in body.tools or ()],
        "text": {"format": fmt.model_dump(by_alias=True)},
        "user": body.user,
    }


def _dumped(choice: str | NamedFunction) -> Any:
    return choice if isinstance(choice, str) else choice.model_dump()


RESPONSES = ResponsesSurface()
