"""``/v1/responses`` through a real gateway process on the in-process engines (CTranslate2 and
llama.cpp on the demo model), read by the official ``openai`` client: the same greedy answer as
chat, streamed as typed events, a function tool round trip (llama.cpp forces the call), structured
output, refusals of what needs storage, and the route's own metrics."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import GREETING_REPLY, GatewayProcess, write_config
from tests.polling import settles

pytestmark = pytest.mark.engines  # llama.cpp in process

WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[GatewayProcess]:
    config = write_config(
        tmp_path_factory.mktemp("responses") / "fleet.yaml",
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
def client(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.base_url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.mark.parametrize("model", ["demo-ct2", "demo-llama"])
def test_a_response_is_the_greedy_chat_answer_whole_and_streamed(client: openai.OpenAI, model: str) -> None:
    resp = client.responses.create(model=model, input="Hello", temperature=0)
    assert resp.status == "completed" and resp.output_text == GREETING_REPLY
    assert resp.usage is not None and resp.usage.output_tokens > 0
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello"}], temperature=0)
    assert chat.usage is not None and resp.usage.input_tokens == chat.usage.prompt_tokens
    deltas = []
    kinds = []
    with client.responses.stream(model=model, input=[{"role": "user", "content": "Hello"}], temperature=0) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert "".join(deltas) == GREETING_REPLY == final.output_text
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.completed"
    assert final.usage is not None and final.usage.output_tokens == resp.usage.output_tokens


def test_a_function_tool_round_trip(client: openai.OpenAI) -> None:
    question: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    resp = client.responses.create(
        model="demo-llama", input=question, tools=[WEATHER], tool_choice="required", temperature=0, max_output_tokens=64
    )
    calls = [item for item in resp.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    args = json.loads(calls[0].arguments)
    assert isinstance(args, dict) and isinstance(args.get("city"), str)
    with client.responses.stream(
        model="demo-llama", input=question, tools=[WEATHER], tool_choice="required", temperature=0, max_output_tokens=64
    ) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    streamed_call = next(item for item in streamed.output if item.type == "function_call")
    assert streamed_call.arguments == calls[0].arguments  # greedy: the same call both ways
    follow_up: Any = [
        *question,
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"sky": "sunny", "celsius": 21}'},
    ]
    answer = client.responses.create(
        model="demo-llama", input=follow_up, tools=[WEATHER], tool_choice="none", temperature=0, max_output_tokens=16
    )
    assert answer.status in ("completed", "incomplete") and answer.output_text
    assert all(item.type == "message" for item in answer.output)


def test_text_format_json_schema_constrains_the_answer(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "maxLength": 12}, "count": {"type": "integer"}},
        "required": ["answer", "count"],
        "additionalProperties": False,
    }
    fmt: Any = {"format": {"type": "json_schema", "name": "reply", "schema": schema, "strict": True}}
    resp = client.responses.create(model="demo-llama", input="Hello", text=fmt, temperature=0, max_output_tokens=64)
    doc = json.loads(resp.output_text)
    assert set(doc) == {"answer", "count"} and isinstance(doc["count"], int)
    with pytest.raises(openai.BadRequestError) as info:  # CTranslate2 does not constrain: refused by name
        client.responses.create(model="demo-ct2", input="Hello", text=fmt)
    assert info.value.param == "response_format"


def test_storage_is_refused_by_name(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as store:
        client.responses.create(model="demo-ct2", input="Hello", store=True)
    assert store.value.param == "store"
    with pytest.raises(openai.BadRequestError) as previous:
        client.responses.create(model="demo-ct2", input="Hello", previous_response_id="resp_123")
    assert previous.value.param == "previous_response_id"


def test_responses_count_under_their_own_route(client: openai.OpenAI, gw: GatewayProcess) -> None:
    client.responses.create(model="demo-ct2", input="Hello", temperature=0, max_output_tokens=4)
    text = httpx.get(f"{gw.base_url}/metrics").text
    assert any(
        line.startswith("enginegate_requests_total{") and 'route="responses"' in line and 'code="2xx"' in line
        for line in text.splitlines()
    )


def engine_tokens(gw: GatewayProcess, backend: str) -> float:
    text = httpx.get(f"{gw.base_url}/metrics", timeout=10).text
    m = re.search(rf'^enginegate_engine_generated_tokens_total\{{backend="{backend}"\}} (\S+)$', text, re.M)
    assert m, text
    return float(m.group(1))


@pytest.mark.parametrize(("model", "backend"), [("demo-ct2", "ct2-only"), ("demo-llama", "llama-only")])
def test_a_client_leaving_a_response_stream_stops_the_engine(
    client: openai.OpenAI, gw: GatewayProcess, model: str, backend: str
) -> None:
    """The engine's own token counter stops growing once the client has gone (ignore_eos would have it
    write 4,000 tokens); left alone, the same request writes them all."""
    before = engine_tokens(gw, backend)
    extra = {"ignore_eos": True}
    with client.responses.stream(
        model=model, input="The Zen", max_output_tokens=4000, temperature=0, extra_body=extra
    ) as stream:
        deltas = 0
        for event in stream:
            deltas += event.type == "response.output_text.delta"
            if deltas == 3:
                break
    stopped = settles(lambda: engine_tokens(gw, backend), message="the engine kept generating")
    # Events the client never read still fill the socket and the gateway's output buffer first (a
    # fast engine gets some way ahead), but it stops short of the 4,000 it would write.
    assert 3 <= stopped - before < 4000
    whole = client.responses.create(model=model, input="The Zen", max_output_tokens=64, temperature=0, extra_body=extra)
    assert whole.usage is not None and whole.usage.output_tokens == 64 and whole.status == "incomplete"
