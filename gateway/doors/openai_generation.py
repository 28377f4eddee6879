"""A validated OpenAI body (chat or completions) as the neutral ``GenerationRequest``, and what the
caller said about itself for the request log."""

from __future__ import annotations

from typing import Any

from backends.base import GenerationRequest
from gateway.doors.openai_bodies import (
    AssistantMessage,
    ChatBody,
    CompletionBody,
    ImagePart,
    NamedToolChoice,
    SystemMessage,
    TextPart,
    ToolMessage,
    UserMessage,
)
from gateway.http.errors import bad_request


def _content(m: SystemMessage | UserMessage | AssistantMessage | ToolMessage) -> str | list[dict[str, Any]]:
    """Text parts joined as one string; a list of parts only when the message holds images."""
    content = m.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if any(type(p) is ImagePart for p in content):
        return [p.model_dump(exclude_none=True) for p in content]
    return "".join(p.text if type(p) is TextPart else p.refusal for p in content)  # type: ignore[union-attr]


def _message(m: SystemMessage | UserMessage | AssistantMessage | ToolMessage) -> dict[str, Any]:
    # developer is what newer OpenAI models call system: every engine here knows system.
    out: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": _content(m)}
    if type(m) is AssistantMessage and m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in m.tool_calls
        ]
    if type(m) is ToolMessage:
        out["tool_call_id"] = m.tool_call_id
    elif m.name is not None:
        out["name"] = m.name
    return out


def to_generation(
    body: ChatBody | CompletionBody, request_id: str, max_tokens_cap: int, max_messages: int
) -> GenerationRequest:
    max_tokens = body.max_tokens
    param = "max_tokens"
    if type(body) is ChatBody and body.max_completion_tokens is not None:
        max_tokens, param = body.max_completion_tokens, "max_completion_tokens"
    if max_tokens is not None and max_tokens > max_tokens_cap:
        raise bad_request(
            f"'{param}' is {max_tokens}; this gateway allows at most {max_tokens_cap}.", param, "invalid_value"
        )
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    parallel_tool_calls, echo = None, False
    if type(body) is ChatBody:
        if len(body.messages) > max_messages:
            raise bad_request(f"Too many messages: at most {max_messages}.", "messages", "invalid_value")
        messages = [_message(m) for m in body.messages]
        tools = tuple(t.model_dump(exclude_none=True) for t in body.tools or ())
        choice = body.tool_choice
        tool_choice = choice.model_dump() if type(choice) is NamedToolChoice else choice
        parallel_tool_calls = body.parallel_tool_calls
        fmt = body.response_format
        if fmt is not None and fmt.type != "text":
            response_format = fmt.model_dump(exclude_none=True, by_alias=True)
        logprobs, top_logprobs = bool(body.logprobs), body.top_logprobs or 0 if body.logprobs else 0
    else:
        prompt = body.prompt if isinstance(body.prompt, str) else body.prompt[0]
        logprobs, top_logprobs, echo = body.logprobs is not None, body.logprobs or 0, bool(body.echo)
    stream = bool(body.stream)
    # Every field by keyword in one call: GenerationRequest(**fields) was a generic call whose keyword
    # parsing cost more than all the rest of this function (compiled, a direct call).
    return GenerationRequest(
        request_id=request_id,
        model=body.model,
        max_tokens=max_tokens,
        messages=messages,
        prompt=prompt,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        stop=stop,
        seed=body.seed,
        extra=dict(extra) if (extra := body.__pydantic_extra__) else {},
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel_tool_calls,
        response_format=response_format,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        n=body.n or 1,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        logit_bias={int(k): float(v) for k, v in body.logit_bias.items()} if body.logit_bias else None,
        user=body.user,
        echo=echo,
        stream=stream,
        whole=not stream,
    )


def described(body: ChatBody | CompletionBody) -> dict[str, Any]:
    """What the caller said about itself, for the request log: OpenAI's ``user``, ``metadata`` and
    ``safety_identifier`` take effect there (the gateway's record of who asked)."""
    out: dict[str, Any] = {}
    if body.user is not None:
        out["user"] = body.user
    if type(body) is ChatBody:
        if body.metadata:
            out["metadata"] = body.metadata
        if body.safety_identifier is not None:
            out["safety_identifier"] = body.safety_identifier
    return out
