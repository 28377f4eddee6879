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

from typing import Any

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
