"""``/v1/messages`` through a real gateway process on the in-process engines, read by the official
``anthropic`` client: the greedy chat answer whole and streamed, a tool round trip (llama.cpp forces
the call with ``tool_choice: any``), Anthropic's errors, the route's own metrics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import GREETING_REPLY, GatewayProcess, write_config

pytestmark = pytest.mark.engines  # llama.cpp in process

WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
HELLO: Any = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[GatewayProcess]:
    config = write_config(
        tmp_path_factory.mktemp("anthropic") / "fleet.yaml",
        """
models:
  - {name: demo-ct2, gguf: "{GGUF}"}
  - {name: demo-llama, gguf: "{GGUF}", tool_parser: hermes}
backends:
  - {name: ct2-only, engine: ctranslate2, model: demo-ct2}
  - {name: llama-only, engine: llama_cpp, model: demo-llama}
""",
    )
    proc = GatewayProcess(config, cache_dir)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(gw: GatewayProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=60)


@pytest.mark.parametrize("model", ["demo-ct2", "demo-llama"])
def test_a_message_is_the_greedy_chat_answer_whole_and_streamed(client: anthropic.Anthropic, model: str) -> None:
    extra = {"temperature": 0}
    msg = client.messages.create(model=model, max_tokens=64, messages=HELLO, extra_body=extra)
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == GREETING_REPLY  # type: ignore[union-attr]
    assert msg.stop_reason == "end_turn" and msg.usage.input_tokens > 0 and msg.usage.output_tokens > 0
    with client.messages.stream(model=model, max_tokens=64, messages=HELLO, extra_body=extra) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == GREETING_REPLY and final.stop_reason == "end_turn"
    assert final.usage.input_tokens == msg.usage.input_tokens and final.usage.output_tokens == msg.usage.output_tokens
    short = client.messages.create(model=model, max_tokens=3, messages=HELLO, extra_body=extra)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3


def test_a_tool_round_trip(client: anthropic.Anthropic) -> None:
    question: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    forced: Any = {"type": "any"}
    msg = client.messages.create(
        model="demo-llama", max_tokens=64, messages=question, tools=[WEATHER], tool_choice=forced,
        extra_body={"temperature": 0},
    )  # fmt: skip
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert uses and uses[0].name == "get_weather" and isinstance(uses[0].input, dict)
    assert msg.stop_reason == "tool_use"
    with client.messages.stream(
        model="demo-llama", max_tokens=64, messages=question, tools=[WEATHER], tool_choice=forced,
        extra_body={"temperature": 0},
    ) as stream:  # fmt: skip
        final = stream.get_final_message()
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert streamed and streamed[0].input == uses[0].input and final.stop_reason == "tool_use"
    follow_up: Any = [
        *question,
        {"role": "assistant", "content": [u.model_dump(exclude_none=True) for u in uses]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "sunny, 21 degrees"}],
        },
    ]
    answer = client.messages.create(
        model="demo-llama", max_tokens=16, messages=follow_up, tools=[WEATHER], tool_choice={"type": "none"},
        extra_body={"temperature": 0},
    )  # fmt: skip
    assert answer.content and all(b.type == "text" for b in answer.content)


def test_errors_are_anthropics(client: anthropic.Anthropic, gw: GatewayProcess) -> None:
    with pytest.raises(anthropic.NotFoundError) as nf:
        client.messages.create(model="nope", max_tokens=5, messages=HELLO)
    assert isinstance(nf.value.body, dict) and nf.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as missing:
        client.post("/v1/messages", body={"model": "demo-ct2", "messages": HELLO}, cast_to=httpx.Response)
    assert isinstance(missing.value.body, dict) and missing.value.body["error"]["message"].startswith("max_tokens:")
    with pytest.raises(anthropic.BadRequestError) as forced:  # CTranslate2 cannot force a call: refused, naming why
        client.messages.create(
            model="demo-ct2", max_tokens=5, messages=HELLO, tools=[WEATHER], tool_choice={"type": "any"}
        )
    assert (
        "cannot be honoured" in forced.value.message and "no backend serving it supports tools" in forced.value.message
    )


def test_messages_count_under_their_own_route(client: anthropic.Anthropic, gw: GatewayProcess) -> None:
    client.messages.create(model="demo-ct2", max_tokens=4, messages=HELLO)
    text = httpx.get(f"{gw.base_url}/metrics").text
    assert any(
        line.startswith("enginegate_requests_total{") and 'route="messages"' in line and 'code="2xx"' in line
        for line in text.splitlines()
    )


@pytest.mark.parametrize("model", ["demo-ct2", "demo-llama"])
def test_count_tokens_is_the_prompt_the_engine_counts(client: anthropic.Anthropic, model: str) -> None:
    conversation: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    counted = client.messages.count_tokens(model=model, messages=conversation, system="Be brief.")
    msg = client.messages.create(model=model, max_tokens=2, messages=conversation, system="Be brief.")
    assert counted.input_tokens == msg.usage.input_tokens > 0
    with_tools = client.messages.count_tokens(model=model, messages=conversation, tools=[WEATHER])
    assert with_tools.input_tokens > counted.input_tokens  # the tools are part of the prompt
    with pytest.raises(anthropic.NotFoundError) as nf:
        client.messages.count_tokens(model="nope", messages=conversation)
    assert isinstance(nf.value.body, dict) and nf.value.body["error"]["type"] == "not_found_error"
