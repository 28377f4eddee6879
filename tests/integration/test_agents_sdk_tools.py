"""The OpenAI Agents SDK's tool request on the embedded default (``make serve``: CTranslate2 in
process, the demo model, configs/default.yaml): the tool is called, and tool-call markup never
reaches the client as text.

The demo model's greedy answer to that request opens a Hermes call and writes it whole, then, instead
of ``</tool_call>``, goes on with text (a second ``<tool_call>`` among it): the SDK's strict schema
(titles, ``additionalProperties``) is not what it was trained on. llama-server forces the end tag
with its lazy call grammar; the gateway reads the call at its closing brace and ends the answer there
(CTranslate2 stops generating). The request bodies are the SDK's own (tests/agents_sdk.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests import agents_sdk
from tests.conftest import DEMO_GGUF, ROOT, GatewayProcess

MODEL = "enginegate-demo"
MARKUP = ("<tool_call>", "</tool_call>", "tool_call>")


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[GatewayProcess]:
    """The gateway as ``make serve`` runs it: the repository's default config (its model path made
    absolute, the file copied so the gateway's log lands beside the copy)."""
    text = (ROOT / "configs" / "default.yaml").read_text()
    assert "../models/enginegate-demo.gguf" in text
    config = tmp_path_factory.mktemp("embedded") / "default.yaml"
    config.write_text(text.replace("../models/enginegate-demo.gguf", str(DEMO_GGUF)))
    proc = GatewayProcess(config, cache_dir)
    yield proc
    proc.stop()


def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("stream", [False, True])
def test_agents_sdk_greedy_request_calls_the_tool(embedded: GatewayProcess, stream: bool) -> None:
    answer = agents_sdk.ask(client(embedded), MODEL, stream=stream, **agents_sdk.GREEDY)
    assert answer.calls == [agents_sdk.CALL]
    assert (answer.content, answer.finish) == ("", "tool_calls")


def test_agents_sdk_default_request_never_leaks_call_markup(embedded: GatewayProcess) -> None:
    """The SDK's body as it is (no temperature: sampled), several times: whatever is sampled, an
    answer is a parsed call of the offered tool or text without tags."""
    for stream in (False, True, True, True, False, True):
        answer = agents_sdk.ask(client(embedded), MODEL, stream=stream)
        assert not any(tag in answer.content for tag in MARKUP), answer.content
        assert all(name == "get_weather" and isinstance(args, dict) for name, args in answer.calls)
        assert answer.finish == ("tool_calls" if answer.calls else "stop")


def test_agents_sdk_responses_request_calls_the_tool(embedded: GatewayProcess) -> None:
    body = agents_sdk.responses_body(MODEL, temperature=0.0)
    events: list[dict[str, Any]] = []
    with httpx.stream("POST", f"{embedded.base_url}/v1/responses", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    [done] = [e["response"] for e in events if e["type"] == "response.completed"]
    [call] = done["output"]
    assert call["type"] == "function_call" and call["status"] == "completed"
    assert (call["name"], json.loads(call["arguments"])) == agents_sdk.CALL
    assert not any(e["type"] == "response.output_text.delta" for e in events)


def test_the_engine_stops_at_the_end_of_the_call(embedded: GatewayProcess) -> None:
    """Greedy, the model would write on to the whole context's end (the SDK sets no max_tokens)."""
    body = agents_sdk.chat_body(MODEL, **agents_sdk.GREEDY)
    done = client(embedded).chat.completions.create(
        model=MODEL, messages=body["messages"], tools=body["tools"], temperature=0.0
    )
    # <tool_call>, \n, {"name":, "get_weather",, "arguments":, {"city":, ", Paris, "}}, \n, and the
    # first token of the text that ended the answer.
    assert done.usage is not None and done.usage.completion_tokens == 11
