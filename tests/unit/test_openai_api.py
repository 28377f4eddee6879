"""Request validation at the edge: strict types, OpenAI param paths, extras kept for engines."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import ApiError
from gateway.openai_api import ChatBody, CompletionBody, parse_body, to_generation

MSG = [{"role": "user", "content": "hi"}]


def err(model: type[ChatBody] | type[CompletionBody], data: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        body = parse_body(model, data)
        to_generation(body, "r", 100, 3)
    return info.value


@pytest.mark.parametrize(
    ("data", "param", "code"),
    [
        ({"messages": MSG}, "model", "missing_required_parameter"),
        ({"model": "m", "messages": MSG, "temperature": "0.5"}, "temperature", "invalid_type"),
        ({"model": "m", "messages": MSG, "max_tokens": True}, "max_tokens", "invalid_type"),
        ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content", "invalid_type"),
        ({"model": "m", "messages": MSG, "n": 3}, "n", "unsupported_value"),
        ({"model": "m", "messages": MSG, "logprobs": True}, "logprobs", "unsupported_parameter"),
        ({"model": "m", "messages": MSG * 4}, "messages", "invalid_value"),
        ({"model": "m", "messages": MSG, "max_completion_tokens": 101}, "max_completion_tokens", "invalid_value"),
    ],
)
def test_chat_errors(data: dict[str, Any], param: str, code: str) -> None:
    e = err(ChatBody, data)
    assert (e.status, e.param, e.code) == (400, param, code)


def test_chat_translation_keeps_extras_and_prefers_max_completion_tokens() -> None:
    body = parse_body(
        ChatBody,
        {
            "model": "m",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
            "max_tokens": 9,
            "max_completion_tokens": 7,
            "stop": "x",
            "top_k": 4,
            "temperature": 0,
        },
    )
    gen = to_generation(body, "r", 100, 3)
    assert gen.messages == [{"role": "user", "content": "ab"}]
    assert (gen.max_tokens, gen.stop, gen.extra, gen.greedy) == (7, ("x",), {"top_k": 4}, True)


def test_completion_prompt_as_one_element_list() -> None:
    gen = to_generation(parse_body(CompletionBody, {"model": "m", "prompt": ["hey"]}), "r", 100, 3)
    assert gen.prompt == "hey" and gen.messages is None
    assert err(CompletionBody, {"model": "m", "prompt": ["a", "b"]}).param == "prompt"
