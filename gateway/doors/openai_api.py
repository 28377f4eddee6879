"""OpenAI request bodies validated at the edge (``parse_body``): bounds, refused fields, cross-field rules.

The models are in ``gateway/doors/openai_bodies.py`` and the translation into a ``GenerationRequest``
in ``gateway/doors/openai_generation.py``; this module re-exports what the doors import.

Every field of OpenAI's spec either takes effect or is refused with OpenAI's 400: the fields engines
honour are carried (the routing then sends the request only where its capabilities are covered),
fields that only describe the caller (``user``, ``metadata``, ``safety_identifier``) go to the
request log, and the rest (``audio``, ``prediction``, ``store: true``...) are refused by name.
Bodies are validated strictly (a string where a number belongs is an error, as OpenAI does it).
Fields OpenAI does not define are kept in ``GenerationRequest.extra``: the routing accepts them only
when a backend serving the model understands them, else ``Unrecognized request argument``.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from gateway.doors.body_errors import validation_error
from gateway.doors.openai_bodies import (
    MAX_LOGIT_BIAS,
    MAX_METADATA,
    MAX_STOP_CHARS,
    MAX_STOPS,
    MAX_TOOLS,
    NAME_PATTERN,
    PARTS_PER_MESSAGE,
    AssistantMessage,
    ChatBody,
    CompletionBody,
    NamedToolChoice,
)
from gateway.doors.openai_generation import described, to_generation
from gateway.http.errors import ApiError, bad_request

# The models and the translation were defined here first: the doors and tests import them from here.
__all__ = [
    "MAX_METADATA",
    "MAX_STOPS",
    "MAX_STOP_CHARS",
    "MAX_TOOLS",
    "NAME_PATTERN",
    "ChatBody",
    "CompletionBody",
    "check_bounds",
    "described",
    "parse_body",
    "to_generation",
]

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
    if data.keys().isdisjoint(_REFUSED):  # one C call for the usual body
        return
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
        raise validation_error(exc, _param) from None
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
    if type(body) is CompletionBody:
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
    if type(body.tool_choice) is NamedToolChoice:
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
        if type(m) is AssistantMessage and m.content is None and not m.tool_calls and m.refusal is None:
            raise bad_request(
                f"Invalid 'messages[{i}]': an assistant message needs 'content' or 'tool_calls'.",
                f"messages[{i}].content",
                "invalid_value",
            )
