"""``POST /v1/responses``: OpenAI's Responses API, stateless, on the one generation pipeline.

The body becomes a chat ``GenerationRequest`` (``instructions`` a system message first; input
messages, ``function_call`` items as the assistant's ``tool_calls`` and ``function_call_output``
items as tool messages; function tools, ``tool_choice``, ``text.format`` as ``response_format``);
the answer's chunks become a Response object or its typed stream events (``gateway.doors.responses_events``).
Nothing is stored: ``store: true``, ``previous_response_id``, item references and conversations are
refused by name. Fields outside the spec go to ``extra`` as they do for chat (engines that know them
take them, else the routing refuses them by name). The body's models are in
``gateway/doors/responses_bodies.py``.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from pydantic import ValidationError

from backends.base import GenerationRequest
from gateway.config import LimitsConfig
from gateway.doors.body_errors import param_path, validation_error
from gateway.doors.openai_api import MAX_METADATA
from gateway.doors.responses_bodies import (
    FunctionCallItem,
    InputImage,
    MessageItem,
    NamedFunction,
    Refusal,
    ResponsesBody,
    TextFormatJsonObject,
    TextFormatJsonSchema,
    TextFormatPlain,
)
from gateway.doors.responses_events import ResponsesAnswer
from gateway.http.errors import ApiError, bad_request
from gateway.pipeline.surfaces import Asked
from values import value

__all__ = ["RESPONSES", "ResponsesBody", "ResponsesSurface", "messages", "parse", "to_generation"]


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


@value(frozen=True)
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
