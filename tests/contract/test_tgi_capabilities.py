"""Every capability the TGI adapters declare, against the TGI contract fake.

For each one: the engine receives the field in TGI's own wire form (the body the fake recorded), and
the adapter answers in OpenAI's shapes (``ToolCallDelta`` pieces in OpenAI's order, ``TokenLogprob``,
finish "tool_calls"). Fields TGI cannot honour as OpenAI means them are not declared, and never sent.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from openai.types.chat import (
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
)
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backends import capabilities as cap
from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest, TokenLogprob, ToolCallDelta
from backends.http_base import HttpSettings
from backends.tgi import JSON_OBJECT_REGEX, TgiBackend
from backends.tgi_messages import TgiMessagesBackend
from tests.conftest import GREETING_REPLY, GatewayProcess, write_config
from tests.contract.control import FakeControl
from tests.contract.fake_tgi import ChatState, create_app
from tests.contract.tiny_engine import TinyEngine
from tests.fakes import serve_in_thread

HELLO = [{"role": "user", "content": "Hello"}]
WEATHER_Q = [{"role": "user", "content": "What is the weather in Paris?"}]
CITY_PARAMS: dict[str, object] = {
    "type": "object",
    "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "city": {"type": "string"}},
    "required": ["city"],
}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather now", "parameters": CITY_PARAMS},
}
TIME_PARAMS = {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": TIME_PARAMS}}
PING_FUNCTION: dict[str, Any] = {"name": "ping", "description": "No arguments at all"}
PING = {"type": "function", "function": PING_FUNCTION}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 18}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
JSON_OBJECT = {"type": "json_object"}
OPEN_OBJECT_GRAMMAR = {"type": "regex", "value": JSON_OBJECT_REGEX}  # TGI's json grammar cannot say "any object"
NO_PARAMS = {"type": "object", "properties": {}}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
CALL_BUDGET = 200  # the demo tokenizer spends about a token per character of a call's JSON


@dataclass
class Fake:
    url: str
    received: list[tuple[str, Any]]


@dataclass
class Answer:
    chunks: list[Chunk]
    path: str
    body: dict[str, Any]

    @property
    def text(self) -> str:
        return "".join(c.text for c in self.chunks)

    @property
    def finish(self) -> str | None:
        return self.chunks[-1].finish_reason

    @property
    def deltas(self) -> list[ToolCallDelta]:
        return [d for c in self.chunks for d in c.tool_calls]

    @property
    def logprobs(self) -> list[TokenLogprob]:
        return [lp for c in self.chunks for lp in c.logprobs]

    def calls(self) -> list[tuple[str, str, Any]]:
        """(id, name, parsed arguments) per call, checking OpenAI's order: id and name on a call's first
        piece (with no arguments), then argument fragments only."""
        seen: dict[int, list[Any]] = {}
        for d in self.deltas:
            if d.index not in seen:
                assert d.id and d.name and d.arguments == "", d
                seen[d.index] = [d.id, d.name, ""]
            else:
                assert d.id is None and d.name is None, d
                seen[d.index][2] += d.arguments
        return [(i, n, json.loads(a)) for i, n, a in (seen[k] for k in sorted(seen))]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyEngine]:
    before = set(threading.enumerate())
    yield TinyEngine(tmp_path_factory.mktemp("tgi-caps"))
    for thread in set(threading.enumerate()) - before:
        thread.join(timeout=10)


def _serve(engine: TinyEngine, auto_tool_call: bool) -> Iterator[Fake]:
    received: list[tuple[str, Any]] = []
    app = create_app(engine, FakeControl(), received=received, auto_tool_call=auto_tool_call)
    with serve_in_thread(app, "/health") as url:
        yield Fake(url, received)


@pytest.fixture(scope="module")
def fake(engine: TinyEngine) -> Iterator[Fake]:
    yield from _serve(engine, auto_tool_call=False)


@pytest.fixture(scope="module")
def fake_calling(engine: TinyEngine) -> Iterator[Fake]:
    """A fake whose model calls a tool when it may choose ("auto")."""
    yield from _serve(engine, auto_tool_call=True)


def ask(fake: Fake, cls: type[TgiBackend | TgiMessagesBackend], **kw: Any) -> Answer:
    kw.setdefault("temperature", 0.0)
    kw.setdefault("max_tokens", 60)
    request = GenerationRequest(request_id="t", model="enginegate-demo", **kw)
    settings = HttpSettings(url=fake.url, served_model="enginegate-demo", read_timeout_s=60, default_max_tokens=64)

    async def go() -> list[Chunk]:
        backend = cls("under-test", "enginegate-demo", settings)
        try:
            return [c async for c in backend.generate(request)]
        finally:
            await backend.aclose()

    fake.received.clear()
    chunks = asyncio.run(go())
    assert len(fake.received) == 1, fake.received
    path, body = fake.received[0]
    return Answer(chunks, path, body)


# --- what each adapter declares ---


def test_capability_matrix() -> None:
    assert TgiBackend.capabilities.features == {
        cap.TOOLS, cap.JSON_OBJECT, cap.JSON_SCHEMA, cap.LOGPROBS, cap.TOP_LOGPROBS, cap.SEED, cap.IMAGES,
        cap.PREFILL,  # the gateway renders the prompt: a final assistant turn is left open
    }  # fmt: skip
    assert TgiBackend.capabilities.tools_in_prompt
    assert TgiBackend.capabilities.extras == {"top_k", "repetition_penalty", "typical_p", "truncate", "watermark"}
    assert TgiMessagesBackend.capabilities.features == {
        cap.TOOLS, cap.TOOL_CHOICE_REQUIRED, cap.PARALLEL_TOOL_CALLS, cap.JSON_OBJECT, cap.JSON_SCHEMA,
        cap.LOGPROBS, cap.TOP_LOGPROBS, cap.SEED, cap.IMAGES,
    }  # fmt: skip
    assert not TgiMessagesBackend.capabilities.tools_in_prompt
    assert not TgiMessagesBackend.capabilities.extras
    for cls in (TgiBackend, TgiMessagesBackend):
        caps = cls.capabilities
        assert caps.max_top_logprobs == 5  # TGI's --max-top-n-tokens default
        assert not caps.native_n
        assert not {cap.PENALTIES, cap.LOGIT_BIAS, cap.ECHO} & caps.features


# --- native /generate_stream: TGI's wire form ---

NATIVE_WIRE: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("json_schema", {"response_format": JSON_SCHEMA}, {"grammar": {"type": "json", "value": PERSON}}),
    ("json_object", {"response_format": JSON_OBJECT}, {"grammar": OPEN_OBJECT_GRAMMAR}),
    ("logprobs", {"logprobs": True}, {"details": True}),
    ("top_logprobs", {"logprobs": True, "top_logprobs": 3}, {"details": True, "top_n_tokens": 3}),
    ("seed", {"seed": 7, "temperature": 0.7}, {"seed": 7, "do_sample": True, "temperature": 0.7}),
    ("negative_seed_same_bits", {"seed": -1, "temperature": 0.7}, {"seed": 2**64 - 1, "do_sample": True}),
    (
        "extras",
        {"extra": {"top_k": 5, "repetition_penalty": 1.1, "typical_p": 0.9, "truncate": 100, "watermark": True}},
        {"top_k": 5, "repetition_penalty": 1.1, "typical_p": 0.9, "truncate": 100, "watermark": True},
    ),
]  # fmt: skip


@pytest.mark.parametrize(("request_fields", "wire"), [c[1:] for c in NATIVE_WIRE], ids=[c[0] for c in NATIVE_WIRE])
def test_native_carries_each_capability_as_generate_parameters(
    fake: Fake, request_fields: dict[str, Any], wire: dict[str, Any]
) -> None:
    answer = ask(fake, TgiBackend, messages=HELLO, **request_fields)
    assert answer.path == "/generate_stream"
    params = answer.body["parameters"]
    assert {k: params.get(k) for k in wire} == wire
    assert answer.finish in ("stop", "length")


def test_native_sends_nothing_it_does_not_declare(fake: Fake) -> None:
    # Routing never sends these here; were they to arrive, TGI's look-alikes (frequency_penalty divided by
    # the length, top_n_tokens without logprobs) must not stand in for them.
    answer = ask(
        fake,
        TgiBackend,
        messages=HELLO,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        logit_bias={5: 1.0},
        extra={"top_n_tokens": 2, "frequency_penalty": 1.0},
    )
    params = answer.body["parameters"]
    assert not {"frequency_penalty", "presence_penalty", "logit_bias", "top_n_tokens"} & set(params)
    assert answer.text == GREETING_REPLY
    assert not answer.logprobs


ADAPTERS = [TgiBackend, TgiMessagesBackend]


@pytest.mark.parametrize("cls", ADAPTERS)
def test_json_schema_answer_validates(fake: Fake, cls: type[TgiBackend]) -> None:
    answer = ask(fake, cls, messages=HELLO, response_format=JSON_SCHEMA)
    doc = json.loads(answer.text)
    jsonschema.validate(doc, PERSON)
    assert list(doc) == sorted(doc)  # TGI's grammar writes properties in key order
    assert answer.finish == "stop"


@pytest.mark.parametrize("cls", ADAPTERS)
def test_json_object_answer_is_an_object(fake: Fake, cls: type[TgiBackend]) -> None:
    answer = ask(fake, cls, messages=HELLO, response_format=JSON_OBJECT)
    assert isinstance(json.loads(answer.text), dict)


@pytest.mark.parametrize("cls", ADAPTERS)
def test_logprobs_are_each_answer_token(fake: Fake, cls: type[TgiBackend]) -> None:
    answer = ask(fake, cls, messages=HELLO, logprobs=True, top_logprobs=3)
    assert answer.text == GREETING_REPLY
    assert "".join(lp.token for lp in answer.logprobs) == GREETING_REPLY  # the end token is not listed
    for lp in answer.logprobs:
        assert lp.logprob <= 0.0 and len(lp.top) == 3
        assert [t.logprob for t in lp.top] == sorted((t.logprob for t in lp.top), reverse=True)
        assert abs(lp.logprob - lp.top[0].logprob) < 1e-4  # greedy: each chosen token is the likeliest
    assert all(lp.bytes == tuple(lp.token.encode()) for lp in answer.logprobs)  # OpenAI's bytes: the text's
    assert all(t.bytes == tuple(t.token.encode()) for lp in answer.logprobs for t in lp.top)


def test_native_logprobs_stop_with_the_stop_string(fake: Fake) -> None:
    answer = ask(fake, TgiBackend, messages=HELLO, logprobs=True, stop=("demo",))
    assert answer.text == "Hello! I am the enginegate "
    assert "".join(lp.token for lp in answer.logprobs).startswith(answer.text)
    assert "model" not in "".join(lp.token for lp in answer.logprobs)


def test_native_renders_tools_into_the_prompt(fake: Fake) -> None:
    answer = ask(fake, TgiBackend, messages=WEATHER_Q, tools=(WEATHER,))
    inputs = answer.body["inputs"]
    assert "<tools>" in inputs and '"name": "get_weather"' in inputs
    assert "grammar" not in answer.body["parameters"]  # the gateway parses the model's calls from its text


# --- Messages API: TGI's wire form ---

MESSAGES_WIRE: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "json_schema",
        {"response_format": JSON_SCHEMA},
        {"response_format": {"type": "json_schema", "value": {"name": "person", "schema": PERSON}}},
    ),
    ("json_object", {"response_format": JSON_OBJECT}, {"response_format": OPEN_OBJECT_GRAMMAR}),
    ("logprobs", {"logprobs": True}, {"logprobs": True, "top_logprobs": None}),
    ("top_logprobs", {"logprobs": True, "top_logprobs": 2}, {"logprobs": True, "top_logprobs": 2}),
    ("seed", {"seed": 7, "temperature": 0.7}, {"seed": 7, "temperature": 0.7}),
    ("negative_seed_same_bits", {"seed": -3, "temperature": 0.7}, {"seed": 2**64 - 3}),
    ("tools_required", {"tools": (WEATHER,), "tool_choice": "required"},
     {"tools": [WEATHER], "tool_choice": "required"}),
    (
        "tool_named",
        {"tools": (WEATHER, TIME), "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
        {"tool_choice": {"type": "function", "function": {"name": "get_time"}}},
    ),
    ("tools_auto", {"tools": (WEATHER,)}, {"tools": [WEATHER], "tool_choice": None}),
    ("tool_choice_none", {"tools": (WEATHER,), "tool_choice": "none"}, {"tools": None, "tool_choice": None}),
    ("parallel_tool_calls", {"tools": (WEATHER,), "parallel_tool_calls": False}, {"parallel_tool_calls": None}),
    (
        "tool_without_parameters",
        {"tools": (PING,), "tool_choice": "required"},
        {"tools": [{"type": "function", "function": PING_FUNCTION | {"parameters": NO_PARAMS}}]},
    ),
    (
        "undeclared",
        {"presence_penalty": 0.5, "frequency_penalty": 0.5, "logit_bias": {5: 1.0}, "n": 2, "user": "u1"},
        {"presence_penalty": None, "frequency_penalty": None, "logit_bias": None, "n": None, "user": None},
    ),
]  # fmt: skip


@pytest.mark.parametrize(("request_fields", "wire"), [c[1:] for c in MESSAGES_WIRE], ids=[c[0] for c in MESSAGES_WIRE])
def test_messages_carry_each_capability_in_tgis_chat_request(
    fake: Fake, request_fields: dict[str, Any], wire: dict[str, Any]
) -> None:
    request_fields.setdefault("max_tokens", CALL_BUDGET)
    answer = ask(fake, TgiMessagesBackend, messages=WEATHER_Q, **request_fields)
    assert answer.path == "/v1/chat/completions"
    assert {k: answer.body.get(k) for k in wire} == wire
    assert answer.finish in ("stop", "length", "tool_calls")


def test_messages_required_tool_call_streams_as_openai_does(fake: Fake) -> None:
    answer = ask(
        fake, TgiMessagesBackend, messages=WEATHER_Q, tools=(WEATHER,), tool_choice="required", max_tokens=CALL_BUDGET
    )
    # TGI's id ("0": the history has none), one call, arguments valid against the tool's schema.
    assert answer.calls() == [("0", "get_weather", {"city": "Paris", "unit": "celsius"})]
    jsonschema.validate(answer.calls()[0][2], CITY_PARAMS)
    assert answer.text == ""
    assert answer.finish == "tool_calls"  # TGI sends no finish reason after a call
    assert all(c.finish_reason is None for c in answer.chunks[:-1])
    assert answer.chunks[-1].usage is not None and answer.chunks[-1].usage.completion_tokens > len(answer.deltas)


def test_messages_named_tool_is_the_one_called(fake: Fake) -> None:
    choice = {"type": "function", "function": {"name": "get_time"}}
    answer = ask(
        fake, TgiMessagesBackend, messages=WEATHER_Q, tools=(WEATHER, TIME), tool_choice=choice, max_tokens=CALL_BUDGET
    )
    assert answer.calls() == [("0", "get_time", {"zone": "Paris"})]
    assert answer.finish == "tool_calls"


def test_messages_function_without_arguments_gets_an_empty_object(fake: Fake) -> None:
    answer = ask(fake, TgiMessagesBackend, messages=WEATHER_Q, tools=(PING,), tool_choice="required", max_tokens=80)
    assert answer.calls() == [("0", "ping", {})]


def test_messages_auto_tool_call(fake_calling: Fake) -> None:
    answer = ask(fake_calling, TgiMessagesBackend, messages=WEATHER_Q, tools=(WEATHER,), max_tokens=CALL_BUDGET)
    assert answer.body["tools"] == [WEATHER] and "tool_choice" not in answer.body
    assert [(n, a) for _, n, a in answer.calls()] == [("get_weather", {"city": "Paris", "unit": "celsius"})]
    assert answer.finish == "tool_calls"


def test_messages_auto_without_a_call_answers_in_text(fake: Fake) -> None:
    # The model chose TGI's no_tool: TGI generates again without tools, a plain answer.
    answer = ask(fake, TgiMessagesBackend, messages=HELLO, tools=(WEATHER,), max_tokens=CALL_BUDGET)
    assert answer.text == GREETING_REPLY
    assert not answer.deltas
    assert answer.finish == "stop"


def test_messages_tool_choice_none_keeps_response_format_possible(fake: Fake) -> None:
    # TGI refuses tools beside a grammar ("mutually exclusive"): with "none" the tools are not sent at all.
    answer = ask(
        fake, TgiMessagesBackend, messages=HELLO, tools=(WEATHER,), tool_choice="none", response_format=JSON_SCHEMA
    )
    jsonschema.validate(json.loads(answer.text), PERSON)
    assert answer.finish == "stop"


def test_messages_tool_call_history_reaches_tgi_as_tool_calls(fake: Fake) -> None:
    call = {"id": "0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [
        *WEATHER_Q,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "0", "content": "18 C and sunny"},
    ]
    answer = ask(
        fake, TgiMessagesBackend, messages=history, tools=(WEATHER,), tool_choice="required", max_tokens=CALL_BUDGET
    )
    sent = answer.body["messages"][1]
    assert sent == {"role": "assistant", "tool_calls": [call]}  # no empty content hiding the calls from TGI
    assert answer.calls()[0][0] == "1"  # TGI numbers the next call after the history's
    assert answer.finish == "tool_calls"


def test_messages_tool_call_carries_logprobs_of_its_pieces(fake: Fake) -> None:
    answer = ask(
        fake,
        TgiMessagesBackend,
        messages=WEATHER_Q,
        tools=(WEATHER,),
        tool_choice="required",
        logprobs=True,
        max_tokens=CALL_BUDGET,
    )
    assert answer.finish == "tool_calls"
    assert answer.logprobs and all(lp.logprob <= 0.0 for lp in answer.logprobs)


@pytest.mark.parametrize(
    ("request_fields", "wire"),
    [
        ({"logprobs": True, "top_logprobs": 2}, {"top_n_tokens": 2, "details": True}),
        ({"response_format": JSON_SCHEMA}, {"grammar": {"type": "json", "value": PERSON}}),
    ],
    ids=["logprobs", "json_schema"],
)
def test_messages_completions_needing_more_than_v1_completions_go_native(
    fake: Fake, request_fields: dict[str, Any], wire: dict[str, Any]
) -> None:
    # TGI's /v1/completions takes neither logprobs nor a grammar: the same engine's native route does.
    answer = ask(fake, TgiMessagesBackend, prompt="The answer:", max_tokens=40, **request_fields)
    assert answer.path == "/generate_stream"
    assert {k: answer.body["parameters"].get(k) for k in wire} == wire
    if "logprobs" in request_fields:
        assert "".join(lp.token for lp in answer.logprobs) == answer.text != ""
        assert all(len(lp.top) == 2 for lp in answer.logprobs)
    else:
        jsonschema.validate(json.loads(answer.text), PERSON)


def test_messages_plain_completion_stays_on_v1_completions(fake: Fake) -> None:
    answer = ask(fake, TgiMessagesBackend, prompt="The answer:", max_tokens=10)
    assert answer.path == "/v1/completions"


@pytest.mark.parametrize("cls", [TgiBackend, TgiMessagesBackend])
def test_more_alternatives_than_tgi_gives_are_its_refusal_not_fewer(fake: Fake, cls: type[TgiBackend]) -> None:
    with pytest.raises(BackendError) as err:
        ask(fake, cls, messages=HELLO, logprobs=True, top_logprobs=6)
    assert err.value.kind is ErrorKind.BAD_REQUEST
    assert "`top_n_tokens` must be >= 0 and <= 5. Given: 6" in err.value.message


def test_native_images_are_tgis_markdown_in_the_prompt(fake: Fake) -> None:
    parts = [
        {"type": "text", "text": "What is in it?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    ]
    answer = ask(fake, TgiBackend, messages=[{"role": "user", "content": parts}])
    assert "What is in it?\n![](data:image/png;base64,iVBORw0KGgo=)<|im_end|>" in answer.body["inputs"]
    assert answer.finish in ("stop", "length")


def test_image_parts_reach_tgi_as_sent(fake: Fake) -> None:
    parts = [
        {"type": "text", "text": "What is in it?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    ]
    answer = ask(fake, TgiMessagesBackend, messages=[{"role": "user", "content": parts}])
    assert answer.body["messages"] == [{"role": "user", "content": parts}]  # TGI's MessageChunk shapes
    assert answer.finish in ("stop", "length")


# --- through a gateway process, with the official openai client ---

NATIVE, MESSAGES = "demo-tgi-native", "demo-tgi-messages"
OAI_WEATHER: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather now", "parameters": CITY_PARAMS},
}
# The tool the demo model was trained with (tools/build_demo_model.py).
DEMO_WEATHER: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
OAI_WEATHER_Q: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the weather in Paris?"}]
OAI_HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello"}]


class Person(BaseModel):
    name: str
    age: int


@pytest.fixture(scope="module")
def gateway(fake: Fake, tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[GatewayProcess]:
    config = write_config(
        tmp_path_factory.mktemp("tgi-gw") / "tgi.yaml",
        f"""
models:
  - {{name: {NATIVE}, gguf: "{{GGUF}}", tool_parser: hermes}}
  - {{name: {MESSAGES}, gguf: "{{GGUF}}"}}
backends:
  - {{name: tgi-native, engine: tgi, url: "{fake.url}", model: {NATIVE}}}
  - {{name: tgi-messages, engine: tgi_messages, url: "{fake.url}", model: {MESSAGES}}}
""",
    )
    gw = GatewayProcess(config, cache_dir)
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture()
def client(gateway: GatewayProcess, fake: Fake) -> openai.OpenAI:
    fake.received.clear()
    return openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="-", max_retries=0)


def function_calls(calls: list[Any] | None) -> list[ChatCompletionMessageFunctionToolCall]:
    return [c for c in calls or [] if isinstance(c, ChatCompletionMessageFunctionToolCall)]


def test_gateway_tool_call_round_trip_on_the_messages_api(client: openai.OpenAI, fake: Fake) -> None:
    chat = client.chat.completions
    whole = chat.create(
        model=MESSAGES, messages=OAI_WEATHER_Q, tools=[OAI_WEATHER], tool_choice="required", max_tokens=200
    )
    assert whole.choices[0].finish_reason == "tool_calls"
    call = function_calls(whole.choices[0].message.tool_calls)[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}

    stream = chat.create(
        model=MESSAGES, messages=OAI_WEATHER_Q, tools=[OAI_WEATHER], tool_choice="required", max_tokens=200, stream=True
    )
    pieces = list(stream)
    deltas = [d for p in pieces for c in p.choices for d in c.delta.tool_calls or []]
    assert deltas[0].id == "0" and deltas[0].function is not None and deltas[0].function.name == "get_weather"
    assert all(d.id is None for d in deltas[1:])
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function is not None)
    assert json.loads(arguments) == {"city": "Paris", "unit": "celsius"}
    assert [c.finish_reason for p in pieces for c in p.choices if c.finish_reason] == ["tool_calls"]

    follow_up: list[ChatCompletionMessageParam] = [
        *OAI_WEATHER_Q,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},  # type: ignore[list-item]
        {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"},
    ]
    fake.received.clear()
    answer = chat.create(model=MESSAGES, messages=follow_up, max_tokens=20)
    assert answer.choices[0].message.content
    sent = fake.received[-1][1]["messages"]
    assert sent[1]["tool_calls"][0]["id"] == "0" and "content" not in sent[1]
    assert sent[2] == {"role": "tool", "tool_call_id": "0", "content": "18 C and sunny"}


def test_gateway_native_tool_call_round_trip_with_the_models_own_calls(client: openai.OpenAI, fake: Fake) -> None:
    # The demo model was trained to call this tool in Hermes style: the gateway renders the tools into
    # TGI's prompt and parses the calls from its text, streaming and not.
    chat = client.chat.completions
    whole = chat.create(model=NATIVE, messages=OAI_WEATHER_Q, tools=[DEMO_WEATHER], max_tokens=100, temperature=0)
    assert whole.choices[0].finish_reason == "tool_calls"
    call = function_calls(whole.choices[0].message.tool_calls)[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    inputs = fake.received[-1][1]["inputs"]
    assert "<tools>" in inputs and '"name": "get_weather"' in inputs

    pieces = list(
        chat.create(
            model=NATIVE, messages=OAI_WEATHER_Q, tools=[DEMO_WEATHER], max_tokens=100, temperature=0, stream=True
        )
    )
    deltas = [d for p in pieces for c in p.choices for d in c.delta.tool_calls or []]
    assert deltas[0].function is not None and deltas[0].function.name == "get_weather" and deltas[0].id
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function is not None)
    assert json.loads(arguments) == {"city": "Paris"}
    assert [c.finish_reason for p in pieces for c in p.choices if c.finish_reason] == ["tool_calls"]

    follow_up: list[ChatCompletionMessageParam] = [
        *OAI_WEATHER_Q,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},  # type: ignore[list-item]
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18, "condition": "sunny"}'},
    ]
    answer = chat.create(model=NATIVE, messages=follow_up, tools=[DEMO_WEATHER], max_tokens=40, temperature=0)
    assert answer.choices[0].message.content == "It is sunny in Paris, 18 degrees."
    assert answer.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("model", [NATIVE, MESSAGES])
def test_gateway_structured_output_parses(client: openai.OpenAI, fake: Fake, model: str) -> None:
    answer = client.chat.completions.parse(model=model, messages=OAI_WEATHER_Q, response_format=Person, max_tokens=80)
    assert isinstance(answer.choices[0].message.parsed, Person)
    sent = fake.received[-1][1]
    grammar = sent["parameters"]["grammar"] if model == NATIVE else sent["response_format"]
    assert grammar["type"] == ("json" if model == NATIVE else "json_schema")


@pytest.mark.parametrize("model", [NATIVE, MESSAGES])
def test_gateway_logprobs(client: openai.OpenAI, model: str) -> None:
    answer = client.chat.completions.create(
        model=model, messages=OAI_HELLO, max_tokens=10, temperature=0, logprobs=True, top_logprobs=2
    )
    logprobs = answer.choices[0].logprobs
    content = logprobs.content if logprobs is not None else None
    assert content
    assert "".join(t.token for t in content) == answer.choices[0].message.content
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)


@pytest.mark.parametrize(
    ("field", "value"), [("presence_penalty", 0.5), ("frequency_penalty", 0.5), ("logit_bias", {"5": 1})]
)
@pytest.mark.parametrize("model", [NATIVE, MESSAGES])
def test_gateway_refuses_what_tgi_cannot_honour(client: openai.OpenAI, model: str, field: str, value: Any) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model, messages=OAI_HELLO, max_tokens=5, extra_body={field: value})
    assert isinstance(err.value.body, dict) and err.value.body.get("param") == field


def test_messages_tools_beside_a_response_format_are_refused_before_tgi_sees_them(fake: Fake) -> None:
    # TGI answers 422 "Grammar and tools are mutually exclusive"; the refusal lets another backend try.
    with pytest.raises(BackendError) as err:
        ask(fake, TgiMessagesBackend, messages=WEATHER_Q, tools=(WEATHER,), response_format=JSON_SCHEMA)
    assert (err.value.kind, err.value.param, err.value.retryable) == (ErrorKind.BAD_REQUEST, "response_format", True)
    assert not fake.received


# --- TGI streams as TGI's ChatState makes them for token splits the demo tokenizer does not make ---


def replayed(tokens: list[str]) -> list[bytes]:
    """The SSE body TGI writes for a tool stream whose model said ``tokens`` (then its end token)."""
    head = {"id": "", "created": 0, "model": "m", "system_fingerprint": "3.3.6-dev0-native"}
    state, out = ChatState(True, True, head, False, "0"), []
    details = {"finish_reason": "eos_token", "generated_tokens": len(tokens) + 1, "input_length": 9, "seed": None}
    for i, text in enumerate([*tokens, "<|im_end|>"], 1):
        last = i == len(tokens) + 1
        token = {"id": i, "text": text, "logprob": -0.1, "special": last}
        for chunk in state.push({"index": i, "token": token, "details": details if last else None}) or []:
            out.append(b"data:" + json.dumps(chunk).encode() + b"\n\n")
    return [*out, b"data:[DONE]\n\n"]


def replay(body: list[bytes], received: list[tuple[str, Any]]) -> Any:
    async def chat(request: Request) -> Response:
        received.append((request.url.path, await request.json()))
        return Response(b"".join(body), media_type="text/event-stream")

    async def health(request: Request) -> Response:
        return Response()

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/health", health)])


@pytest.mark.parametrize(
    ("tokens", "call"),
    [
        # The name's closing quote alone in its token: TGI's arguments start "{," (the comma is cut).
        (['{"function": {"_name": "get_weather', '"', ",", ' "city": "Paris"', "}}"], {"city": "Paris"}),
        # router/src/chat.rs test_chat_stream_tool_get_weather's split: the comma came with the quote.
        (['{"function": {"_name": "get_weather', '",', ' "city":', ' "Paris"}}'], {"city": "Paris"}),
        # No arguments, the name closed with both braces: TGI streams "{" alone (the "}" is added).
        (['{"function": {"_name": "ping', '"}}'], {}),
    ],
    ids=["comma_after_the_name", "tgis_own_split", "no_arguments"],
)
def test_messages_tool_streams_become_valid_openai_calls(tokens: list[str], call: dict[str, Any]) -> None:
    body = replayed(tokens)
    assert not any(b'"finish_reason":"' in line for line in body[:-2])  # TGI's: no finish after a call
    received: list[tuple[str, Any]] = []
    with serve_in_thread(replay(body, received), "/health") as url:
        answer = ask(Fake(url, received), TgiMessagesBackend, messages=HELLO, tools=(WEATHER,))
    assert [(i, a) for i, _, a in answer.calls()] == [("0", call)]
    assert answer.finish == "tool_calls"
