"""OpenAI request bodies, validated at the edge, and their translation into a ``GenerationRequest``.

Every field of OpenAI's spec either takes effect or is refused with OpenAI's 400: the fields engines
honour are carried (the routing then sends the request only where its capabilities are covered),
fields that only describe the caller (``user``, ``metadata``, ``safety_identifier``) go to the
request log, and the rest (``audio``, ``prediction``, ``store: true``...) are refused by name.
Bodies are validated strictly (a string where a number belongs is an error, as OpenAI does it).
Fields OpenAI does not define are kept in ``GenerationRequest.extra``: the routing accepts them only
when a backend serving the model understands them, else ``Unrecognized request argument``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from backends.base import GenerationRequest
from gateway.errors import ApiError, bad_request

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

# Spec fields the gateway cannot honour on any engine: refused by name when set (null is "unset").
_REFUSED = {
    "audio": "Audio output is not supported by this gateway.",
    "prediction": "Predicted outputs are not supported by this gateway.",
    "web_search_options": "Web search is not supported by this gateway.",
    "moderation": "Moderation is not supported by this gateway.",
    "reasoning_effort": "No backend of this gateway serves a reasoning model: 'reasoning_effort' cannot take effect.",
    "verbosity": "'verbosity' is not supported by this gateway's engines.",
    "prompt_cache_retention": "Prompt cache retention is managed by the engines; it cannot be set per request.",
    "prompt_cache_options": "Prompt cache options are managed by the engines; they cannot be set per request.",
    "functions": "'functions' is deprecated and not supported: use 'tools'.",
    "function_call": "'function_call' is deprecated and not supported: use 'tool_choice'.",
    "suffix": "'suffix' (text insertion) is not supported by this gateway's engines.",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ImageUrl(_Strict):
    url: Annotated[str, Field(pattern=r"^(https?://|data:image/[a-zA-Z0-9.+-]+;base64,)", max_length=20_000_000)]
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(_Strict):
    type: Literal["image_url"]
    image_url: ImageUrl


class RefusalPart(_Strict):
    type: Literal["refusal"]
    refusal: str


UserPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]
AssistantPart = Annotated[TextPart | RefusalPart, Field(discriminator="type")]


class FunctionCall(_Strict):
    name: str
    arguments: str


class ToolCall(_Strict):
    id: str
    type: Literal["function"]
    function: FunctionCall


class SystemMessage(_Strict):
    role: Literal["system", "developer"]
    content: str | Annotated[list[TextPart], Field(min_length=1)]
    name: str | None = None


class UserMessage(_Strict):
    role: Literal["user"]
    content: str | Annotated[list[UserPart], Field(min_length=1)]
    name: str | None = None


class AssistantMessage(_Strict):
    role: Literal["assistant"]
    content: str | Annotated[list[AssistantPart], Field(min_length=1)] | None = None
    refusal: str | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    # What OpenAI's clients send back when an agent appends the response's message as it came.
    annotations: list[Any] | None = None
    audio: None = None
    function_call: None = None


class ToolMessage(_Strict):
    role: Literal["tool"]
    content: str | Annotated[list[TextPart], Field(min_length=1)]
    tool_call_id: str


Message = Annotated[SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")]


class FunctionDef(_Strict):
    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Strict):
    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    description: str | None = None
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")] = None
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(_Strict):
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


class CompletionBody(_Common):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)]
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    echo: bool | None = None
    best_of: Annotated[int, Field(ge=1, le=20)] | None = None


_UNION_MEMBERS = ("str", "list[TextPart]", "list[str]", "int", "float", "bool", "constrained-int", "constrained-str")


_TAGS = ("system", "developer", "user", "assistant", "tool", "text", "image_url", "refusal")


def _param(loc: tuple[Any, ...]) -> str:
    out = ""
    after_index = False
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            after_index = True
            continue
        tag = after_index and part in _TAGS  # a discriminated union's tag follows the list index: not a key
        after_index = False
        if tag or part in _UNION_MEMBERS or part.startswith(("list[", "literal[", "function-after[")):
            continue  # pydantic names the union member it tried; not part of the field path
        if part == "NamedToolChoice":
            continue
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
    tools = data.get("tools")
    if isinstance(tools, list) and len(tools) > MAX_TOOLS:
        raise _too_many("tools", f"{len(tools)} tools", MAX_TOOLS)
    metadata = data.get("metadata")
    if isinstance(metadata, dict) and len(metadata) > MAX_METADATA:
        raise _too_many("metadata", f"{len(metadata)} pairs", MAX_METADATA)


def _unsupported(param: str, message: str) -> ApiError:
    return bad_request(message, param, "unsupported_parameter")


def _refuse_unhonourable(data: dict[str, Any]) -> None:
    for name, message in _REFUSED.items():
        if data.get(name) is not None:
            raise _unsupported(name, message)


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
    _refuse_unhonourable(data)
    try:
        body = model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        # A union reports each member it tried: the one that got furthest into the value names the real
        # problem (an image part, not "Input should be a valid string").
        base = _param(errors[0]["loc"])
        err = max((e for e in errors if _param(e["loc"]).startswith(base)), key=lambda e: len(_param(e["loc"])))
        param = _param(err["loc"])
        if err["type"] == "union_tag_invalid":  # the discriminator's value is wrong: name that field
            param += "." + str(err.get("ctx", {}).get("discriminator", "type")).strip("'")
        if err["type"] == "missing":
            raise bad_request(f"Missing required parameter: '{param}'.", param, "missing_required_parameter") from None
        kind = (
            "invalid_type" if err["type"].endswith("_type") or err["type"] == "union_tag_invalid" else "invalid_value"
        )
        raise bad_request(f"Invalid value for '{param}': {err['msg']}.", param, kind) from None
    _check(body)
    return body


def _check(body: ChatBody | CompletionBody) -> None:
    """What the field types alone do not say: OpenAI's cross-field rules and the values no engine honours."""
    if body.stream_options is not None and not body.stream:
        raise bad_request(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            "stream_options",
            "invalid_value",
        )
    for token, bias in (body.logit_bias or {}).items():
        if not token.isascii() or not token.isdigit():
            raise bad_request(
                f"Invalid key in 'logit_bias': {token[:32]!r} is not a token id.", "logit_bias", "invalid_value"
            )
        if not -100 <= bias <= 100:
            raise bad_request(
                f"Invalid value in 'logit_bias' for token {token}: {bias} is outside -100..100.",
                "logit_bias",
                "invalid_value",
            )
    if isinstance(body, CompletionBody):
        if body.best_of is not None and body.best_of > (body.n or 1):
            raise _unsupported(
                "best_of", "'best_of' greater than 'n' is not supported: no engine here ranks candidates."
            )
        if body.best_of is not None and body.best_of < (body.n or 1):
            raise bad_request("'best_of' must be greater than or equal to 'n'.", "best_of", "invalid_value")
        return
    if body.top_logprobs and not body.logprobs:
        raise bad_request("'top_logprobs' requires 'logprobs' to be true.", "top_logprobs", "invalid_value")
    if body.tool_choice is not None and not body.tools:
        raise bad_request(
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
            "tool_choice",
            "invalid_value",
        )
    if isinstance(body.tool_choice, NamedToolChoice):
        name = body.tool_choice.function.name
        if not any(t.function.name == name for t in body.tools or ()):
            raise bad_request(f"Tool choice '{name}' is not one of the tools given.", "tool_choice", "invalid_value")
    if body.parallel_tool_calls is not None and not body.tools:
        raise bad_request(
            "'parallel_tool_calls' is only allowed when 'tools' are specified.", "parallel_tool_calls", "invalid_value"
        )
    fmt = body.response_format
    if fmt is not None and (fmt.type == "json_schema") != (fmt.json_schema is not None):
        what = "requires 'json_schema'" if fmt.type == "json_schema" else f"of type '{fmt.type}' takes no 'json_schema'"
        raise bad_request(f"Invalid 'response_format': a format {what}.", "response_format", "invalid_value")
    for key in body.metadata or ():
        if len(key) > 64:
            raise bad_request(f"Invalid 'metadata': key {key[:64]!r}... is longer than 64 characters.", "metadata")
    if body.store:
        raise _unsupported("store", "Stored completions are not supported by this gateway: 'store' must be false.")
    if body.service_tier not in (None, "auto", "default"):
        raise _unsupported("service_tier", f"Service tier '{body.service_tier}' is not offered by this gateway.")
    if body.modalities is not None and "audio" in body.modalities:
        raise _unsupported(
            "modalities", "Audio output is not supported by this gateway: 'modalities' must be ['text']."
        )
    for i, m in enumerate(body.messages):
        if isinstance(m, AssistantMessage) and m.content is None and not m.tool_calls and m.refusal is None:
            raise bad_request(
                f"Invalid 'messages[{i}]': an assistant message needs 'content' or 'tool_calls'.",
                f"messages[{i}].content",
                "invalid_value",
            )


def _content(m: SystemMessage | UserMessage | AssistantMessage | ToolMessage) -> str | list[dict[str, Any]]:
    """Text parts joined as one string; a list of parts only when the message holds images."""
    content = m.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if any(isinstance(p, ImagePart) for p in content):
        return [p.model_dump(exclude_none=True) for p in content]
    return "".join(p.text if isinstance(p, TextPart) else p.refusal for p in content)  # type: ignore[union-attr]


def _message(m: SystemMessage | UserMessage | AssistantMessage | ToolMessage) -> dict[str, Any]:
    # developer is what newer OpenAI models call system: every engine here knows system.
    out: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": _content(m)}
    if isinstance(m, AssistantMessage) and m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in m.tool_calls
        ]
    if isinstance(m, ToolMessage):
        out["tool_call_id"] = m.tool_call_id
    if not isinstance(m, ToolMessage) and m.name is not None:
        out["name"] = m.name
    return out


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
    common: dict[str, Any] = {
        "request_id": request_id,
        "model": body.model,
        "max_tokens": max_tokens,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "stop": stop,
        "seed": body.seed,
        "extra": dict(body.model_extra) if body.model_extra else {},
        "n": body.n or 1,
        "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty,
        "logit_bias": {int(k): float(v) for k, v in body.logit_bias.items()} if body.logit_bias else None,
        "user": body.user,
        "stream": bool(body.stream),
    }
    if isinstance(body, ChatBody):
        if len(body.messages) > max_messages:
            raise bad_request(f"Too many messages: at most {max_messages}.", "messages", "invalid_value")
        fmt = body.response_format
        response_format: dict[str, Any] | None = None
        if fmt is not None and fmt.type != "text":
            response_format = fmt.model_dump(exclude_none=True, by_alias=True)
        tool_choice = body.tool_choice
        return GenerationRequest(
            messages=[_message(m) for m in body.messages],
            tools=tuple(t.model_dump(exclude_none=True) for t in body.tools or ()),
            tool_choice=tool_choice.model_dump() if isinstance(tool_choice, NamedToolChoice) else tool_choice,
            parallel_tool_calls=body.parallel_tool_calls,
            response_format=response_format,
            logprobs=bool(body.logprobs),
            top_logprobs=body.top_logprobs or 0 if body.logprobs else 0,
            **common,
        )
    prompt = body.prompt if isinstance(body.prompt, str) else body.prompt[0]
    return GenerationRequest(
        prompt=prompt,
        logprobs=body.logprobs is not None,
        top_logprobs=body.logprobs or 0,
        echo=bool(body.echo),
        **common,
    )


def prompt_texts(req: GenerationRequest) -> list[str]:
    if req.messages is None:
        return [req.prompt or ""]
    texts = []
    for m in req.messages:
        content = m["content"]
        texts.append(content if isinstance(content, str) else "".join(p.get("text", "") for p in content))
        for call in m.get("tool_calls") or ():
            texts.append(call["function"]["arguments"])
    return texts


def described(body: ChatBody | CompletionBody) -> dict[str, Any]:
    """What the caller said about itself, for the request log: OpenAI's ``user``, ``metadata`` and
    ``safety_identifier`` take effect there (the gateway's record of who asked)."""
    out: dict[str, Any] = {}
    if body.user is not None:
        out["user"] = body.user
    if isinstance(body, ChatBody):
        if body.metadata:
            out["metadata"] = body.metadata
        if body.safety_identifier is not None:
            out["safety_identifier"] = body.safety_identifier
    return out


def error_for_json(exc: Exception) -> ApiError:
    return bad_request(
        "We could not parse the JSON body of your request. The body must be valid JSON "
        f"with Content-Type: application/json ({exc}).",
        code="invalid_json",
    )
