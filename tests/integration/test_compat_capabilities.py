"""What vLLM and llama-server adapters declare, proven on the real engines: each field reaches the
engine and changes its answer, and the answer comes back in OpenAI's shapes.

The adapters are driven directly (as the conformance suite does). ``ENGINEGATE_VLLM_URL`` and
``ENGINEGATE_LLAMA_SERVER_URL`` point the tests at engines already running (started as
tests/contract/engines.py starts them) instead of starting their own.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, replace
from typing import Any

import httpx
import jsonschema
import pytest

from backends import capabilities as cap
from backends.base import Chunk, GenerationRequest, TokenLogprob
from backends.http_base import HttpSettings
from backends.llama_server import LlamaServerBackend
from backends.openai_compat import OpenAICompatBackend
from backends.vllm import VLLMBackend
from tests.conftest import ZEN_CONTINUATION, ZEN_PROMPT
from tests.contract.engines import SERVED

HELLO = [{"role": "user", "content": "Hello"}]
WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
GET_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}


@dataclass
class Engine:
    name: str
    cls: type[OpenAICompatBackend]
    url: str
    whole: bool = False
    """Every request taken whole (``GenerationRequest.whole``): the engine is asked ``stream: false``."""

    def run(self, request: GenerationRequest) -> list[Chunk]:
        request = replace(request, whole=self.whole)

        async def go() -> list[Chunk]:
            settings = HttpSettings(url=self.url, served_model=SERVED, read_timeout_s=120)
            backend = self.cls("under-test", SERVED, settings)
            try:
                return [c async for c in backend.generate(request)]
            finally:
                await backend.aclose()

        return asyncio.run(go())

    def token_id(self, text: str) -> int:
        if self.name == "vllm":
            tokens = httpx.post(f"{self.url}/tokenize", json={"model": SERVED, "prompt": text}).json()["tokens"]
        else:
            tokens = httpx.post(f"{self.url}/tokenize", json={"content": text}).json()["tokens"]
        assert len(tokens) == 1, tokens
        return int(tokens[0])


CLASSES: dict[str, type[OpenAICompatBackend]] = {"vllm": VLLMBackend, "llama_server": LlamaServerBackend}


def _engine(request: pytest.FixtureRequest, name: str, whole: bool) -> Engine:
    url = os.environ.get(f"ENGINEGATE_{name.upper()}_URL") or str(request.getfixturevalue(f"{name}_url"))
    return Engine(name, CLASSES[name], url, whole)


# Each test twice: the answer streamed, and asked whole (what a client that does not stream gets).
ASKED = {"streamed": False, "whole": True}


@pytest.fixture(params=[f"{e}-{a}" for e in ("vllm", "llama_server") for a in ASKED])
def engine(request: pytest.FixtureRequest) -> Engine:
    name, asked = str(request.param).rsplit("-", 1)
    return _engine(request, name, ASKED[asked])


@pytest.fixture(params=list(ASKED))
def vllm(request: pytest.FixtureRequest) -> Engine:
    return _engine(request, "vllm", ASKED[request.param])


@pytest.fixture(params=list(ASKED))
def llama_server(request: pytest.FixtureRequest) -> Engine:
    return _engine(request, "llama_server", ASKED[request.param])


pytestmark = pytest.mark.engines


def req(**kw: Any) -> GenerationRequest:
    kw.setdefault("temperature", 0.0)
    return GenerationRequest(request_id="t", model=SERVED, **kw)


def text_of(chunks: list[Chunk], index: int = 0) -> str:
    return "".join(c.text for c in chunks if c.index == index)


def logprobs_of(chunks: list[Chunk]) -> list[TokenLogprob]:
    return [t for c in chunks for t in c.logprobs]


def test_json_schema_output_parses_and_validates(engine: Engine) -> None:
    assert cap.JSON_SCHEMA in engine.cls.capabilities.features
    fmt = {"type": "json_schema", "json_schema": {"name": "forecast", "strict": True, "schema": SCHEMA}}
    chunks = engine.run(req(messages=HELLO, max_tokens=120, response_format=fmt))
    assert chunks[-1].finish_reason == "stop", text_of(chunks)
    doc = json.loads(text_of(chunks))  # the greeting the model would say is not JSON: the engine forced it
    jsonschema.validate(doc, SCHEMA)


def test_json_object_output_is_a_json_object(engine: Engine) -> None:
    chunks = engine.run(req(messages=HELLO, max_tokens=60, response_format={"type": "json_object"}))
    text = text_of(chunks)
    assert text.startswith("{"), text  # the model's own answer would be the greeting
    # The demo model on vLLM (no whitespace allowed) writes one endless key until max_tokens; where
    # the engine ends the answer itself, it is a whole JSON object.
    if chunks[-1].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:
        assert engine.name == "vllm", text


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_logprobs_map_into_token_logprobs_with_alternatives(engine: Engine, route: str) -> None:
    shape: dict[str, Any] = {"messages": HELLO} if route == "chat" else {"prompt": ZEN_PROMPT}
    chunks = engine.run(req(**shape, max_tokens=6, logprobs=True, top_logprobs=2))
    tokens = logprobs_of(chunks)
    assert len(tokens) == 6
    assert "".join(t.token for t in tokens) == text_of(chunks)
    for t in tokens:
        assert t.logprob <= 0.0 and len(t.top) == 2
        assert t.top[0].token == t.token  # greedy: the chosen token is the likeliest
        assert t.top[1].logprob < t.top[0].logprob


def test_completion_logprobs_without_alternatives_still_have_the_chosen_token(engine: Engine) -> None:
    chunks = engine.run(req(prompt=ZEN_PROMPT, max_tokens=3, logprobs=True, top_logprobs=0))
    tokens = logprobs_of(chunks)
    assert len(tokens) == 3 and all(t.top == () and t.logprob <= 0.0 for t in tokens)


def test_seed_gives_the_same_sampled_text_twice(engine: Engine) -> None:
    def sample(seed: int) -> str:
        return text_of(engine.run(req(prompt="Once", max_tokens=16, temperature=1.8, seed=seed)))

    first = sample(7)
    assert sample(7) == first
    # Sampling is really random here: other seeds give other texts (else the check above proves nothing).
    assert any(sample(s) != first for s in (8, 9, 10))


def test_n2_yields_two_indexed_choices_each_ending_with_its_finish(engine: Engine) -> None:
    chunks = engine.run(req(prompt="Once", max_tokens=8, temperature=1.8, n=2, seed=11))  # seeded: unseeded, a choice
    # sometimes sampled its end of text early and the usage check below failed by chance
    finals = [c for c in chunks if c.finish_reason is not None]
    assert sorted(c.index for c in finals) == [0, 1]
    assert text_of(chunks, 0) and text_of(chunks, 1)
    assert chunks[-1].usage is not None and [c.usage for c in finals[:-1]] == [None]
    assert chunks[-1].usage.completion_tokens == 16  # both choices ran to max_tokens: the whole usage


def test_greedy_n2_gives_the_greedy_answer_twice(engine: Engine) -> None:
    chunks = engine.run(req(prompt=ZEN_PROMPT, max_tokens=20, n=2))
    assert text_of(chunks, 0) == text_of(chunks, 1) == ZEN_CONTINUATION[: len(text_of(chunks, 0))]
    assert len(text_of(chunks, 0)) > 20 and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 40


def test_penalties_reach_the_engine_and_change_the_answer(engine: Engine) -> None:
    plain = text_of(engine.run(req(prompt=ZEN_PROMPT, max_tokens=80)))
    penalised = text_of(engine.run(req(prompt=ZEN_PROMPT, max_tokens=80, presence_penalty=2.0, frequency_penalty=2.0)))
    assert plain.startswith(ZEN_CONTINUATION) and penalised != plain


def test_logit_bias_forces_a_token(engine: Engine) -> None:
    token = engine.token_id(" is")
    chunks = engine.run(req(prompt=ZEN_PROMPT, max_tokens=4, logit_bias={token: 100.0}))
    assert text_of(chunks) == " is" * 4


def test_top_k_extra_takes_effect(engine: Engine) -> None:
    # top_k 1 at a high temperature is greedy: the answer is the greedy one, every time.
    chunks = engine.run(req(prompt=ZEN_PROMPT, max_tokens=20, temperature=1.9, extra={"top_k": 1}))
    assert text_of(chunks) == ZEN_CONTINUATION[: len(text_of(chunks))] and len(text_of(chunks)) > 20


def test_llama_server_cached_tokens_on_a_repeated_prompt(llama_server: Engine) -> None:
    request = req(messages=[{"role": "user", "content": "Hello " * 40}], max_tokens=2)
    llama_server.run(request)
    usage = llama_server.run(request)[-1].usage
    assert usage is not None and usage.cached_tokens is not None
    assert usage.cached_tokens >= usage.prompt_tokens - 1  # all but the last prompt token came from the cache


def test_llama_server_receives_its_sampling_extras(llama_server: Engine) -> None:
    extra = {"top_k": 7, "min_p": 0.11, "repeat_penalty": 1.07, "typical_p": 0.93}
    llama_server.run(req(prompt="Once", max_tokens=2, temperature=0.5, extra=extra))
    slots = httpx.get(f"{llama_server.url}/slots").json()
    params = [s["params"] for s in slots if s.get("params", {}).get("top_k") == 7]
    assert params, slots
    assert params[0]["min_p"] == pytest.approx(0.11) and params[0]["repeat_penalty"] == pytest.approx(1.07)
    assert params[0]["typical_p"] == pytest.approx(0.93)


def test_vllm_echo_returns_the_prompt_first(vllm: Engine) -> None:
    chunks = vllm.run(req(prompt=ZEN_PROMPT, max_tokens=3, echo=True))
    assert text_of(chunks).startswith(ZEN_PROMPT + " ugly")


def test_vllm_include_stop_str_in_output_keeps_the_stop(vllm: Engine) -> None:
    extra = {"include_stop_str_in_output": True}
    chunks = vllm.run(req(prompt=ZEN_PROMPT, max_tokens=40, stop=("Simple",), extra=extra))
    assert text_of(chunks) == " ugly.\nExplicit is better than implicit.\nSimple"
    assert chunks[-1].finish_reason == "stop"


@pytest.mark.parametrize(
    ("choice", "finish"),
    [("required", "tool_calls"), ({"type": "function", "function": {"name": "get_weather"}}, "stop")],
)
def test_vllm_forces_a_tool_call(vllm: Engine, choice: str | dict[str, Any], finish: str) -> None:
    # A greeting: the model would answer it with text, so a call proves the engine forced it.
    chunks = vllm.run(req(messages=HELLO, max_tokens=200, tools=(GET_WEATHER,), tool_choice=choice))
    calls = [d for c in chunks for d in c.tool_calls]
    assert calls, text_of(chunks)
    assert calls[0].index == 0 and calls[0].id and calls[0].name == "get_weather"
    assert all(d.index == 0 and d.name is None for d in calls[1:])
    json.loads("".join(d.arguments for d in calls))  # the argument fragments make one JSON text
    assert chunks[-1].finish_reason == finish  # vLLM, like OpenAI, says "stop" when the call was named


def test_vllm_cached_tokens_on_a_repeated_prompt(vllm: Engine) -> None:
    request = req(prompt="The Zen of Python, by Tim Peters. " * 8, max_tokens=2)
    vllm.run(request)
    usage = vllm.run(request)[-1].usage
    assert usage is not None and usage.cached_tokens is not None and usage.cached_tokens >= 16, usage


def test_tool_call_comes_back_as_openai_tool_call_pieces(engine: Engine) -> None:
    chunks = engine.run(req(messages=WEATHER, max_tokens=100, tools=(GET_WEATHER,)))
    calls = [d for c in chunks for d in c.tool_calls]
    assert calls, text_of(chunks)
    assert calls[0].index == 0 and calls[0].id and calls[0].name == "get_weather"
    assert all(d.index == 0 and d.id is None and d.name is None for d in calls[1:])
    assert json.loads("".join(d.arguments for d in calls)) == {"city": "Paris"}
    assert text_of(chunks).strip() == "" and chunks[-1].finish_reason == "tool_calls"


def test_tool_result_in_history_is_answered(engine: Engine) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [
        *WEATHER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 25, "condition": "sunny"}'},
    ]
    chunks = engine.run(req(messages=history, max_tokens=60, tools=(GET_WEATHER,)))
    # The engine rendered the call and its result (nothing was dropped on the way): the model reports them.
    assert text_of(chunks) == "It is sunny in Paris, 25 degrees." and chunks[-1].finish_reason == "stop"


def test_llama_server_required_tool_choice_does_not_force_a_call(llama_server: Engine) -> None:
    """Why llama-server does not declare tool_choice "required": asked to call a tool about a greeting,
    it writes free text until max_tokens. If a newer build forces the call, widen its capabilities."""
    assert cap.TOOL_CHOICE_REQUIRED not in LlamaServerBackend.capabilities.features
    body = {"model": SERVED, "messages": HELLO, "max_tokens": 40, "temperature": 0.0}
    body |= {"tools": [GET_WEATHER], "tool_choice": "required"}
    answer = httpx.post(f"{llama_server.url}/v1/chat/completions", json=body, timeout=60).json()["choices"][0]
    assert answer["finish_reason"] == "length" and not answer["message"].get("tool_calls"), answer
