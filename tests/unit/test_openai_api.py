"""Request validation at the edge: every OpenAI field either lands in the GenerationRequest (where
the routing and the adapters carry it) or is refused with OpenAI's 400 naming it; strict types,
OpenAI param paths, extras kept for engines that understand them."""

from __future__ import annotations

from typing import Any

import pytest

from backends.base import GenerationRequest
from backends.capabilities import (
    ECHO,
    IMAGES,
    JSON_OBJECT,
    JSON_SCHEMA,
    LOGIT_BIAS,
    LOGPROBS,
    PARALLEL_TOOL_CALLS,
    PENALTIES,
    SEED,
    TOOL_CHOICE_REQUIRED,
    TOOLS,
    TOP_LOGPROBS,
    needs,
    without,
)
from gateway.doors.openai_api import ChatBody, CompletionBody, described, parse_body, to_generation
from gateway.http.errors import ApiError

MSG = [{"role": "user", "content": "hi"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def err(model: type[ChatBody] | type[CompletionBody], data: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        body = parse_body(model, data)
        to_generation(body, "r", 100, 3)
    return info.value


def chat(**fields: Any) -> GenerationRequest:
    return to_generation(parse_body(ChatBody, {"model": "m", "messages": MSG, **fields}), "r", 100, 3)


def completion(**fields: Any) -> GenerationRequest:
    return to_generation(parse_body(CompletionBody, {"model": "m", "prompt": "hi", **fields}), "r", 100, 3)


@pytest.mark.parametrize(
    ("data", "param", "code"),
    [
        ({"messages": MSG}, "model", "missing_required_parameter"),
        ({"model": "m", "messages": MSG, "temperature": "0.5"}, "temperature", "invalid_type"),
        ({"model": "m", "messages": MSG, "max_tokens": True}, "max_tokens", "invalid_type"),
        ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content", "invalid_type"),
        ({"model": "m", "messages": MSG, "n": 0}, "n", "invalid_value"),
        ({"model": "m", "messages": MSG * 4}, "messages", "invalid_value"),
        ({"model": "m", "messages": MSG, "max_completion_tokens": 101}, "max_completion_tokens", "invalid_value"),
        ({"model": "m", "messages": MSG, "metadata": 3}, "metadata", "invalid_type"),
        ({"model": "m", "messages": MSG, "metadata": {"k": 3}}, "metadata.k", "invalid_type"),
        ({"model": "m", "messages": MSG, "logit_bias": {"x": 1}}, "logit_bias", "invalid_value"),
        ({"model": "m", "messages": MSG, "logit_bias": {"5": 101}}, "logit_bias", "invalid_value"),
        ({"model": "m", "messages": MSG, "top_logprobs": 2}, "top_logprobs", "invalid_value"),
        ({"model": "m", "messages": MSG, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "invalid_value"),
        ({"model": "m", "messages": MSG, "tool_choice": "auto"}, "tool_choice", "invalid_value"),
        ({"model": "m", "messages": MSG, "parallel_tool_calls": False}, "parallel_tool_calls", "invalid_value"),
        (
            {
                "model": "m",
                "messages": MSG,
                "tools": [WEATHER],
                "tool_choice": {"type": "function", "function": {"name": "x"}},
            },
            "tool_choice",
            "invalid_value",
        ),
        (
            {"model": "m", "messages": MSG, "tools": [{"type": "function", "function": {"name": "a b"}}]},
            "tools[0].function.name",
            "invalid_value",
        ),
        (
            {"model": "m", "messages": MSG, "response_format": {"type": "json_schema"}},
            "response_format",
            "invalid_value",
        ),
        ({"model": "m", "messages": MSG, "response_format": {"type": "yaml"}}, "response_format.type", "invalid_value"),
        ({"model": "m", "messages": MSG, "store": True}, "store", "unsupported_parameter"),
        ({"model": "m", "messages": MSG, "service_tier": "flex"}, "service_tier", "unsupported_parameter"),
        ({"model": "m", "messages": MSG, "modalities": ["text", "audio"]}, "modalities", "unsupported_parameter"),
        (
            {"model": "m", "messages": MSG, "audio": {"voice": "alloy", "format": "mp3"}},
            "audio",
            "unsupported_parameter",
        ),
        (
            {"model": "m", "messages": MSG, "prediction": {"type": "content", "content": "x"}},
            "prediction",
            "unsupported_parameter",
        ),
        ({"model": "m", "messages": MSG, "reasoning_effort": "low"}, "reasoning_effort", "unsupported_parameter"),
        ({"model": "m", "messages": MSG, "functions": [{"name": "f"}]}, "functions", "unsupported_parameter"),
        ({"model": "m", "messages": MSG, "web_search_options": {}}, "web_search_options", "unsupported_parameter"),
        (
            {"model": "m", "messages": MSG, "stream": True, "stream_options": {"include_obfuscation": True}},
            "stream_options.include_obfuscation",
            "invalid_value",
        ),
        (
            {"model": "m", "messages": [{"role": "tool", "content": "x"}]},
            "messages[0].tool_call_id",
            "missing_required_parameter",
        ),
        ({"model": "m", "messages": [{"role": "assistant"}]}, "messages[0].content", "invalid_value"),
        (
            {"model": "m", "messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
            "messages[0].content[0].type",
            "invalid_type",
        ),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "ftp://x"}}]}],
            },
            "messages[0].content[0].image_url.url",
            "invalid_value",
        ),
        (
            {"model": "m", "messages": [{"role": "function", "content": "x", "name": "f"}]},
            "messages[0].role",
            "invalid_type",
        ),
    ],
)
def test_chat_errors(data: dict[str, Any], param: str, code: str) -> None:
    e = err(ChatBody, data)
    assert (e.status, e.param, e.code) == (400, param, code), e.message


@pytest.mark.parametrize(
    ("data", "param", "code"),
    [
        ({"model": "m", "prompt": "x", "suffix": "y"}, "suffix", "unsupported_parameter"),
        ({"model": "m", "prompt": "x", "best_of": 2}, "best_of", "unsupported_parameter"),
        ({"model": "m", "prompt": "x", "n": 2, "best_of": 1}, "best_of", "invalid_value"),
        ({"model": "m", "prompt": "x", "logprobs": 6}, "logprobs", "invalid_value"),
        ({"model": "m", "prompt": "x", "echo": "yes"}, "echo", "invalid_type"),
    ],
)
def test_completion_errors(data: dict[str, Any], param: str, code: str) -> None:
    e = err(CompletionBody, data)
    assert (e.status, e.param, e.code) == (400, param, code), e.message


def test_every_carried_chat_field_lands_in_the_request() -> None:
    gen = chat(
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA, "strict": True}},
        logprobs=True,
        top_logprobs=3,
        n=2,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        logit_bias={"17": -100, "3": 5},
        seed=7,
        user="u1",
        temperature=0.7,
        top_p=0.9,
        stop=["a", "b"],
        max_completion_tokens=9,
    )
    assert gen.tools == (WEATHER,)
    assert gen.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert gen.parallel_tool_calls is False
    assert gen.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "s", "schema": SCHEMA, "strict": True},
    }
    assert (gen.logprobs, gen.top_logprobs, gen.n, gen.seed, gen.user) == (True, 3, 2, 7, "u1")
    assert (gen.presence_penalty, gen.frequency_penalty) == (0.5, -0.5)
    assert gen.logit_bias == {17: -100.0, 3: 5.0}
    assert (gen.temperature, gen.top_p, gen.stop, gen.max_tokens) == (0.7, 0.9, ("a", "b"), 9)
    assert needs(gen) == {
        TOOLS: "tools",
        TOOL_CHOICE_REQUIRED: "tool_choice",
        PARALLEL_TOOL_CALLS: "parallel_tool_calls",
        JSON_SCHEMA: "response_format",
        LOGPROBS: "logprobs",
        TOP_LOGPROBS: "top_logprobs",
        PENALTIES: "presence_penalty",
        LOGIT_BIAS: "logit_bias",
        SEED: "seed",
    }


def test_fields_that_need_no_engine_feature() -> None:
    plain = chat(
        response_format={"type": "text"},
        store=False,
        service_tier="auto",
        modalities=["text"],
        metadata={"app": "x"},
        safety_identifier="s",
        prompt_cache_key="k",
        tools=[WEATHER],
        tool_choice="none",
        seed=3,
        temperature=0,
        logprobs=False,
        stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False},
    )
    assert plain.response_format is None and plain.tool_choice == "none"
    assert needs(plain) == {}  # tool_choice none: no call can come; greedy: a seed changes nothing
    assert needs(chat(response_format={"type": "json_object"})) == {JSON_OBJECT: "response_format"}


def test_caller_description_goes_to_the_log() -> None:
    body = parse_body(
        ChatBody, {"model": "m", "messages": MSG, "user": "u", "metadata": {"a": "b"}, "safety_identifier": "s"}
    )
    assert described(body) == {"user": "u", "metadata": {"a": "b"}, "safety_identifier": "s"}


def test_tool_history_kept_intact_and_developer_is_system() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    gen = to_generation(
        parse_body(
            ChatBody,
            {
                "model": "m",
                "messages": [
                    {"role": "developer", "content": "be brief"},
                    {"role": "user", "content": "weather?", "name": "ann"},
                    {"role": "assistant", "content": None, "tool_calls": [call], "refusal": None, "annotations": []},
                    {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sunny"}]},
                ],
                "tools": [WEATHER],
            },
        ),
        "r",
        100,
        8,
    )
    assert gen.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather?", "name": "ann"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]
    history_only = to_generation(
        parse_body(ChatBody, {"model": "m", "messages": gen.messages}), "r", 100, 8
    )  # no tools now, but a tool-call history the engine must render
    assert needs(history_only) == {TOOLS: "messages"}


def test_image_parts_kept_for_engines_that_take_images_and_text_parts_joined() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}}
    gen = chat(messages=[{"role": "user", "content": [{"type": "text", "text": "what is"}, image]}])
    assert gen.messages == [{"role": "user", "content": [{"type": "text", "text": "what is"}, image]}]
    assert needs(gen) == {IMAGES: "messages[0].content"}
    assert without(gen, [IMAGES], []).messages == [{"role": "user", "content": "what is"}]
    joined = chat(
        messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    )
    assert joined.messages == [{"role": "user", "content": "ab"}]


def test_chat_translation_keeps_extras_and_prefers_max_completion_tokens() -> None:
    gen = chat(max_tokens=9, max_completion_tokens=7, stop="x", top_k=4, temperature=0)
    assert (gen.max_tokens, gen.stop, gen.extra, gen.greedy) == (7, ("x",), {"top_k": 4}, True)


def test_completion_fields() -> None:
    gen = completion(logprobs=2, echo=True, n=3, best_of=3)
    assert (gen.logprobs, gen.top_logprobs, gen.echo, gen.n) == (True, 2, True, 3)
    assert needs(gen) == {LOGPROBS: "logprobs", TOP_LOGPROBS: "logprobs", ECHO: "echo"}
    assert completion(logprobs=0).logprobs is True and completion().logprobs is False


def test_completion_prompt_as_one_element_list() -> None:
    gen = to_generation(parse_body(CompletionBody, {"model": "m", "prompt": ["hey"]}), "r", 100, 3)
    assert gen.prompt == "hey" and gen.messages is None
    assert err(CompletionBody, {"model": "m", "prompt": ["a", "b"]}).param == "prompt"


def test_without_drops_what_it_names() -> None:
    gen = chat(tools=[WEATHER], seed=1, logit_bias={"1": 1}, top_k=3, min_p=0.1)
    dropped = without(gen, [TOOLS, SEED], ["top_k"])
    assert (dropped.tools, dropped.seed, dropped.extra) == ((), None, {"min_p": 0.1})
    assert dropped.logit_bias == {1: 1.0}
