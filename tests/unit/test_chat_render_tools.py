"""Chat rendering with tools: the ChatML fallback renders tools as Qwen2.5 does, and messages reach
templates the way Hugging Face templates expect them."""

from __future__ import annotations

import copy
import json
from typing import Any

from backends.text import CHATML, ChatRenderer

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOLS_BLOCK = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + json.dumps(WEATHER)
    + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
)


def call(arguments: Any, name: str = "get_weather") -> dict[str, Any]:
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}


def test_plain_chat_renders_as_chatml() -> None:
    r = ChatRenderer(None)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert r.render(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tools_go_into_the_system_turn() -> None:
    r = ChatRenderer(None)
    user = {"role": "user", "content": "What is the weather in Paris?"}
    prompt = r.render([user], [WEATHER])
    assert prompt == "<|im_start|>system\n" + TOOLS_BLOCK + (
        "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n"
    )
    with_system = r.render([{"role": "system", "content": "Be brief."}, user], [WEATHER])
    assert with_system.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert with_system.count("<|im_start|>system") == 1


def test_tool_fields_engines_add_are_left_out() -> None:
    # vLLM sends "description": null, llama-server "description": "": both render as no description.
    bare = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    r = ChatRenderer(None)
    user = [{"role": "user", "content": "x"}]
    expected = r.render(user, [bare])
    assert (
        '{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}'
        in expected
    )
    for extra in (None, ""):
        tool = copy.deepcopy(bare)
        tool["function"]["description"] = extra  # type: ignore[index]
        assert r.render(user, [tool]) == expected


def test_tool_call_history_and_results_render_hermes_style() -> None:
    r = ChatRenderer(None)
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [call('{"city":"Paris"}'), call('{"city": "Rome"}')]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18}'},
        {"role": "tool", "tool_call_id": "call_2", "content": '{"temperature": 21}'},
    ]
    prompt = r.render(messages, [WEATHER])
    assert prompt.endswith(
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
        '{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>\n{"temperature": 18}\n</tool_response>\n'
        '<tool_response>\n{"temperature": 21}\n</tool_response><|im_end|>\n<|im_start|>assistant\n'
    )


def test_history_renders_without_tools_offered_too() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [call("{}", "f")]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
    ]
    assert ChatRenderer(None).render(messages) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nChecking.\n<tool_call>\n"
        '{"name": "f", "arguments": {}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_arguments_reach_templates_as_a_mapping() -> None:
    # Hugging Face templates index the arguments (Llama 3.1's iterates them): a string would break them.
    template = (
        "{% for m in messages %}{% for c in m.tool_calls or [] %}"
        "{{ c.function.name }}({% for k, v in c.function.arguments.items() %}{{ k }}={{ v }}{% endfor %})"
        "{% endfor %}{% endfor %}"
    )
    messages = [{"role": "assistant", "content": None, "tool_calls": [call('{"city": "Paris"}')]}]
    original = copy.deepcopy(messages)
    assert ChatRenderer(template).render(messages) == "get_weather(city=Paris)"
    assert messages == original, "the request's messages are not changed"


def test_arguments_that_are_not_json_render_as_given() -> None:
    messages = [{"role": "assistant", "content": None, "tool_calls": [call("not json")]}]
    assert '"arguments": not json}' in ChatRenderer(None).render(messages)


def test_content_parts_are_joined_and_none_is_empty() -> None:
    r = ChatRenderer(None)
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": parts}, {"role": "assistant", "content": None}]
    assert r.render(messages) == (
        "<|im_start|>user\none\ntwo<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tojson_is_transformers_own() -> None:
    # Not jinja's: no key sorting, no HTML escaping, non-ASCII kept, as every engine renders it.
    tool = {"type": "function", "function": {"name": "f", "description": "<b>café</b> & 'x'",
            "parameters": {"z": 1, "a": 2}}}  # fmt: skip
    prompt = ChatRenderer(None).render([{"role": "user", "content": "x"}], [tool])
    assert '"description": "<b>café</b> & \'x\'", "parameters": {"z": 1, "a": 2}}}' in prompt


def test_template_has_no_whitespace_between_tags() -> None:
    # Engines differ in trim_blocks/lstrip_blocks; a one-line template renders the same under any.
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    messages = [{"role": "user", "content": "x"}]
    env = ImmutableSandboxedEnvironment()  # neither trim_blocks nor lstrip_blocks
    env.filters["tojson"] = json.dumps
    plain = env.from_string(CHATML)
    assert "\n" not in CHATML.replace("\\n", "")
    assert plain.render(messages=messages, tools=[WEATHER], add_generation_prompt=True) == ChatRenderer(None).render(
        messages, [WEATHER]
    )


def test_tools_count_toward_the_prompt_size_that_sends_rendering_to_a_thread() -> None:
    from backends.base import GenerationRequest
    from backends.text import INLINE_PROMPT_CHARS, prompt_chars

    big = copy.deepcopy(WEATHER)
    big["function"]["description"] = "x" * INLINE_PROMPT_CHARS
    short = [{"role": "user", "content": "Hi"}]
    assert prompt_chars(GenerationRequest("r", "m", messages=short)) == 2
    assert prompt_chars(GenerationRequest("r", "m", messages=short, tools=(big,))) > INLINE_PROMPT_CHARS
