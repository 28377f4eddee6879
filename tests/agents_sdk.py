"""What the OpenAI Agents SDK sends for an agent with one function tool, byte for byte.

Recorded from ``openai-agents`` 0.24.0 (with ``openai`` 3.57.0) against a server that only recorded
bodies; the SDK is not a dependency here (it pins starlette and mcp versions the gateway does not
need). The agent:

    @function_tool
    def get_weather(city: str) -> str:
        \"\"\"Get the current weather in a city.\"\"\"

    Agent(name="Assistant", instructions="You are a helpful assistant.", tools=[get_weather])
    Runner.run(agent, "What is the weather in Paris?")

``function_tool`` makes the schema strict: a ``title`` per property and for the whole, and
``"additionalProperties": false``; the tool carries ``"strict": true``. Nothing else is set: no
``temperature`` (so the engine samples), no ``max_tokens``, no ``tool_choice``. With
``ModelSettings(temperature=0, tool_choice="auto", parallel_tool_calls=True)`` the body gains exactly
those three fields. Through ``OpenAIChatCompletionsModel`` it is a chat completion (``stream`` true
under ``Runner.run_streamed``); by default the SDK uses the Responses API.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import openai

PARAMETERS: dict[str, Any] = {
    "properties": {"city": {"title": "City", "type": "string"}},
    "required": ["city"],
    "title": "get_weather_args",
    "type": "object",
    "additionalProperties": False,
}
DESCRIPTION = "Get the current weather in a city."
INSTRUCTIONS = "You are a helpful assistant."
QUESTION = "What is the weather in Paris?"
CALL = ("get_weather", {"city": "Paris"})
"""The call every engine answers that request with, greedily."""

GREEDY: dict[str, Any] = {"temperature": 0.0, "tool_choice": "auto", "parallel_tool_calls": True}
"""What ``ModelSettings(temperature=0, tool_choice="auto", parallel_tool_calls=True)`` adds."""


def chat_body(model: str, **settings: Any) -> dict[str, Any]:
    """The chat completion body (``OpenAIChatCompletionsModel``), with the model settings' fields."""
    return {
        "model": model,
        "messages": [{"content": INSTRUCTIONS, "role": "system"}, {"role": "user", "content": QUESTION}],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": DESCRIPTION,
                    "parameters": PARAMETERS,
                    "strict": True,
                },
            }
        ],
        **settings,
    }


def responses_body(model: str, **settings: Any) -> dict[str, Any]:
    """The Responses API body (the SDK's default model, ``Runner.run_streamed``)."""
    return {
        "model": model,
        "stream": True,
        "include": [],
        "input": [{"content": QUESTION, "role": "user"}],
        "instructions": INSTRUCTIONS,
        "tools": [
            {
                "name": "get_weather",
                "parameters": PARAMETERS,
                "strict": True,
                "type": "function",
                "description": DESCRIPTION,
            }
        ],
        **settings,
    }


@dataclass(frozen=True)
class Answer:
    content: str
    calls: list[tuple[str, Any]]
    """(name, arguments parsed from their JSON) per call, in index order."""
    finish: str | None
    backend: str
    """The gateway's ``x-enginegate-backend``: which engine answered."""


def ask(client: openai.OpenAI, model: str, *, stream: bool, **settings: Any) -> Answer:
    """The SDK's chat request with ``settings`` (its model settings' fields) through the official
    client, streamed or whole, read as an OpenAI client reads it."""
    body = chat_body(model, **settings)
    kwargs = {k: v for k, v in body.items() if k not in ("model", "messages", "tools")}
    create = client.chat.completions.with_raw_response.create
    if not stream:
        raw = create(model=model, messages=body["messages"], tools=body["tools"], **kwargs)
        choice = raw.parse().choices[0]
        calls = [
            (c.function.name, json.loads(c.function.arguments))
            for c in choice.message.tool_calls or ()
            if c.type == "function"
        ]
        return Answer(choice.message.content or "", calls, choice.finish_reason, raw.headers["x-enginegate-backend"])
    streamed = create(model=model, messages=body["messages"], tools=body["tools"], stream=True, **kwargs)
    content, finish = "", None
    slots: dict[int, list[str]] = {}
    for chunk in streamed.parse():
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for piece in choice.delta.tool_calls or ():
                slot = slots.setdefault(piece.index, ["", ""])
                if piece.function is not None:
                    slot[0] += piece.function.name or ""
                    slot[1] += piece.function.arguments or ""
            finish = choice.finish_reason or finish
    calls = [(name, json.loads(args)) for _, (name, args) in sorted(slots.items())]
    return Answer(content, calls, finish, streamed.headers["x-enginegate-backend"])
