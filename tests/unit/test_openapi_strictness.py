"""``/openapi.json`` is as strict as the handlers: every body a front door refuses with a 400 is also one
the document's schema does not allow (a client generated from the document cannot build it), and the
bodies the handlers take are valid there too."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gateway.app import create_app
from gateway.config import LimitsConfig, load_config
from gateway.doors.anthropic_api import MESSAGES, parse_conversation
from gateway.doors.responses_api import RESPONSES
from gateway.http.errors import ApiError
from tests.fakes import ScriptedBackend, factory

HELLO = [{"role": "user", "content": "Hello"}]
TOOL = {"name": "f", "input_schema": {"type": "object"}}
FN = {"type": "function", "name": "f", "parameters": {"type": "object"}}
MESSAGE = {"model": "m", "max_tokens": 5, "messages": HELLO}
COUNT = {"model": "m", "messages": HELLO}
RESPONSE = {"model": "m", "input": "Hello"}

Handler = Callable[[dict[str, Any]], object]
HANDLERS: dict[str, tuple[str, Handler]] = {
    "messages": ("MessagesBody", lambda body: MESSAGES.asked(body, LimitsConfig(), "r")),
    "count_tokens": ("Conversation", lambda body: parse_conversation(body, LimitsConfig())),
    "responses": ("ResponsesBody", lambda body: RESPONSES.asked(body, LimitsConfig(), "r")),
}

REFUSED: list[tuple[str, dict[str, Any]]] = [
    ("messages", MESSAGE | {"tool_choice": {"type": "auto"}}),
    ("messages", MESSAGE | {"tool_choice": {"type": "any"}, "tools": []}),
    ("messages", MESSAGE | {"messages": [{"role": "user", "content": ""}]}),
    ("messages", MESSAGE | {"messages": [{"role": "user", "content": []}]}),
    ("messages", MESSAGE | {"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]}),
    ("messages", MESSAGE | {"system": [{"type": "text", "text": ""}]}),
    ("messages", MESSAGE | {"stop_sequences": ["x" * 1025]}),
    ("messages", MESSAGE | {"thinking": {"type": "enabled", "budget_tokens": 1024}}),
    ("messages", MESSAGE | {"tools": [{"type": "web_search_20250305", "name": "w"}]}),
    ("count_tokens", COUNT | {"tool_choice": {"type": "none"}}),
    ("count_tokens", COUNT | {"messages": [{"role": "user", "content": ""}]}),
    ("responses", RESPONSE | {"store": True}),
    ("responses", RESPONSE | {"previous_response_id": "resp_1"}),
    ("responses", RESPONSE | {"background": True}),
    ("responses", RESPONSE | {"conversation": "conv_1"}),
    ("responses", RESPONSE | {"prompt": {"id": "pmpt_1"}}),
    ("responses", RESPONSE | {"reasoning": {"effort": "low"}}),
    ("responses", RESPONSE | {"max_tool_calls": 2}),
    ("responses", RESPONSE | {"top_logprobs": 3}),
    ("responses", RESPONSE | {"include": ["reasoning.encrypted_content"]}),
    ("responses", RESPONSE | {"tool_choice": "auto"}),
    ("responses", RESPONSE | {"tool_choice": "required", "tools": []}),
    ("responses", RESPONSE | {"stream_options": {"include_obfuscation": False}}),
    ("responses", RESPONSE | {"stream": False, "stream_options": {"include_obfuscation": True}}),
    ("responses", RESPONSE | {"tools": [{"type": "web_search"}]}),
]
TAKEN: list[tuple[str, dict[str, Any]]] = [
    ("messages", MESSAGE),
    ("messages", MESSAGE | {"tools": [TOOL], "tool_choice": {"type": "any"}}),
    ("messages", MESSAGE | {"messages": [*HELLO, {"role": "assistant", "content": "Hi, I"}]}),
    ("messages", MESSAGE | {"messages": [*HELLO, {"role": "assistant", "content": ""}]}),
    ("messages", MESSAGE | {"tool_choice": None}),
    ("count_tokens", COUNT | {"tools": [TOOL], "tool_choice": {"type": "none"}}),
    ("responses", RESPONSE),
    ("responses", RESPONSE | {"stream": True, "stream_options": {"include_obfuscation": True}}),
    ("responses", RESPONSE | {"store": False, "background": False, "top_logprobs": 0, "previous_response_id": None}),
    ("responses", RESPONSE | {"tools": [FN], "tool_choice": "auto"}),
]


@pytest.fixture(scope="module")
def components(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    config = tmp_path_factory.mktemp("openapi") / "c.yaml"
    config.write_text('models: [{name: m}]\nbackends: [{name: a, engine: vllm, model: m, url: "http://127.0.0.1:9"}]\n')
    app: Any = create_app(load_config(Path(config)), factory({"a": ScriptedBackend("a", "m")}))
    doc: dict[str, Any] = app.app.openapi()
    out: dict[str, Any] = doc["components"]
    return out


def _schema_errors(components: dict[str, Any], route: str, body: dict[str, Any]) -> list[str]:
    name, _ = HANDLERS[route]
    schema = {"$ref": f"#/components/schemas/{name}", "components": components}
    validator = jsonschema.Draft202012Validator(schema)
    return [e.message for e in validator.iter_errors(body)]


@pytest.mark.parametrize(("route", "body"), REFUSED, ids=[f"{r}:{sorted(b)[-1]}" for r, b in REFUSED])
def test_what_a_handler_refuses_the_document_does_not_allow(
    components: dict[str, Any], route: str, body: dict[str, Any]
) -> None:
    with pytest.raises(ApiError) as info:
        HANDLERS[route][1](body)
    assert info.value.status == 400
    assert _schema_errors(components, route, body), f"the document allows what {route} refuses: {body}"


@pytest.mark.parametrize(("route", "body"), TAKEN, ids=[f"{r}:{sorted(b)[-1]}" for r, b in TAKEN])
def test_what_a_handler_takes_the_document_allows(components: dict[str, Any], route: str, body: dict[str, Any]) -> None:
    HANDLERS[route][1](body)
    assert _schema_errors(components, route, body) == []
