"""``/v1/responses``: the body's translation into one chat request, and the answer's chunks as a
Response object and as its typed stream events, with scripted engines in a real server and the
official ``openai`` client reading them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest, ToolCallDelta, Usage
from gateway.app import create_app
from gateway.config import LimitsConfig, load_config
from gateway.doors.responses_api import RESPONSES
from gateway.doors.responses_events import ResponsesAnswer
from gateway.http.errors import ApiError
from tests.conftest import write_config
from tests.fakes import factory, serve_in_thread
from tests.scripted_tools import CALL, TEXT, WEATHER, Scripted


def asked(**fields: Any) -> GenerationRequest:
    return RESPONSES.asked({"model": "m", "input": "hi", **fields}, LimitsConfig(), "r1").gen


def refused(**fields: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        RESPONSES.asked({"model": "m", **fields}, LimitsConfig(), "r1")
    assert info.value.status == 400
    return info.value


def test_input_items_become_one_chat_conversation() -> None:
    gen = asked(
        instructions="Be brief.",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city":"Lyon"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]},
            {"type": "message", "role": "developer", "content": "Answer now."},
        ],
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=30,
        temperature=0,
    )
    assert gen.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
                {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Lyon"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
        {"role": "system", "content": "Answer now."},
    ]
    assert gen.tools == ({"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}},)
    assert gen.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert gen.max_tokens == 30 and gen.greedy


def test_text_format_json_schema_is_the_chat_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    gen = asked(text={"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}})
    assert gen.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": schema, "strict": True},
    }
    assert asked(text={"format": {"type": "text"}}).response_format is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": "hi", "store": True}, "store"),
        ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "hi", "temperature": "hot"}, "temperature"),
        ({"input": "hi", "max_output_tokens": 10**9}, "max_output_tokens"),
        ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input[0].content[0].text"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
        ({"input": "hi", "tool_choice": "auto"}, "tool_choice"),
        ({}, "input"),
    ],
)
def test_bad_input_is_an_openai_400_naming_the_parameter(fields: dict[str, Any], param: str) -> None:
    assert refused(**fields).param == param


def _events(answer: ResponsesAnswer, chunks: list[Chunk], fail: BackendError | None = None) -> list[dict[str, Any]]:
    from gateway.http.errors import from_backend

    raw = b"".join(answer.opening())
    usage = None
    for chunk in chunks:
        raw += answer.chunk(chunk) or b""
        usage = chunk.usage or usage
    raw += answer.failure(from_backend(fail)) if fail is not None else answer.closing(usage)
    out = []
    for sse in raw.decode().split("\n\n")[:-1]:
        head, data = sse.split("\n")
        doc = json.loads(data.removeprefix("data: "))
        assert head == f"event: {doc['type']}"
        out.append(doc)
    assert [d["sequence_number"] for d in out] == list(range(len(out)))
    return out


def test_a_stream_of_text_then_a_call_emits_the_typed_events_in_order() -> None:
    chunks = [Chunk(text="Let me check."), *CALL]
    events = _events(ResponsesAnswer("r1", "m", {}), chunks)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    done = events[-1]["response"]
    assert [i["type"] for i in done["output"]] == ["message", "function_call"]
    assert done["output"][1]["arguments"] == '{"city": "Paris"}' and done["output"][1]["call_id"] == "call_1"
    assert done["usage"]["input_tokens"] == 12 and done["usage"]["output_tokens"] == 9
    assert events[8]["item"]["arguments"] == "" and events[8]["output_index"] == 1


def test_a_failure_mid_stream_sends_error_then_response_failed() -> None:
    events = _events(ResponsesAnswer("r1", "m", {}), TEXT[:1], BackendError(ErrorKind.UPSTREAM, "engine died"))
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    assert events[-1]["response"]["status"] == "failed"
    assert events[-1]["response"]["error"]["code"] == "upstream_error"


def test_the_length_running_out_is_an_incomplete_response() -> None:
    doc, _ = ResponsesAnswer("r1", "m", {}).whole([Chunk(text="Hel"), Chunk(finish_reason="length")])
    assert doc["status"] == "incomplete" and doc["incomplete_details"] == {"reason": "max_output_tokens"}
    events = _events(ResponsesAnswer("r1", "m", {}), [Chunk(text="Hel"), Chunk(finish_reason="length")])
    assert events[-1]["type"] == "response.incomplete"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Scripted]]]:
    config = write_config(
        tmp_path_factory.mktemp("resp") / "c.yaml",
        """
models: [{name: m}, {name: broken}]
backends:
  - {name: a, engine: vllm, model: m, url: "http://127.0.0.1:9"}
  - {name: b, engine: vllm, model: broken, url: "http://127.0.0.1:9"}
""",
    )
    fakes = {"a": Scripted("a", "m"), "b": Scripted("b", "broken", fail_after=1)}
    app = create_app(load_config(config), factory(dict(fakes)))
    with serve_in_thread(app) as base:
        yield base, fakes


@pytest.fixture
def client(served: tuple[str, dict[str, Scripted]]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served[0]}/v1", api_key="unused", max_retries=0, timeout=10)


def test_the_openai_client_reads_a_whole_response(client: openai.OpenAI) -> None:
    resp = client.responses.create(model="m", input="hi", instructions="Be brief.")
    assert resp.output_text == "Hello there" and resp.status == "completed"
    assert resp.usage is not None and resp.usage.total_tokens == 7


def test_the_openai_client_reads_a_function_call_and_its_stream(client: openai.OpenAI) -> None:
    tools: Any = [WEATHER]
    resp = client.responses.create(model="m", input="Weather in Paris?", tools=tools)
    call = resp.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    with client.responses.stream(model="m", input="Weather in Paris?", tools=tools) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
    item = final.output[0]
    assert item.type == "function_call" and item.arguments == '{"city": "Paris"}'


def test_routing_refuses_a_format_no_backend_honours_by_name(
    client: openai.OpenAI, served: tuple[str, dict[str, Scripted]]
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="m", input="hi", text={"format": {"type": "json_object"}})
    assert info.value.param == "response_format"


def test_a_failure_after_the_first_byte_ends_the_stream_with_response_failed(served: tuple[str, Any]) -> None:
    body = {"model": "broken", "input": "hi", "stream": True}
    with httpx.stream("POST", f"{served[0]}/v1/responses", json=body, timeout=10) as r:
        assert r.status_code == 200
        kinds = [json.loads(line[6:])["type"] for line in r.iter_lines() if line.startswith("data: ")]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-2:] == ["error", "response.failed"] and "response.output_text.delta" in kinds


def test_a_bad_body_is_openai_error_json_with_the_status(served: tuple[str, Any], tmp_path: Path) -> None:
    r = httpx.post(f"{served[0]}/v1/responses", json={"model": "m", "input": "hi", "store": True}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "store"
    r = httpx.post(f"{served[0]}/v1/responses", json={"model": "nope", "input": "hi"}, timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_parallel_calls_become_one_item_each_even_when_their_pieces_interleave() -> None:
    chunks = [
        Chunk(tool_calls=(ToolCallDelta(0, id="a", name="get_weather"), ToolCallDelta(0, arguments='{"city":'))),
        Chunk(tool_calls=(ToolCallDelta(1, id="b", name="get_weather"),)),
        Chunk(tool_calls=(ToolCallDelta(0, arguments='"Paris"}'), ToolCallDelta(1, arguments='{"city":"Lyon"}'))),
        Chunk(finish_reason="tool_calls", usage=Usage(3, 4)),
    ]
    doc, _ = ResponsesAnswer("r1", "m", {}).whole(chunks)
    assert [(i["call_id"], i["arguments"]) for i in doc["output"]] == [
        ("a", '{"city":"Paris"}'),
        ("b", '{"city":"Lyon"}'),
    ]
    events = _events(ResponsesAnswer("r1", "m", {}), chunks)
    deltas = [(e["output_index"], e["delta"]) for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert deltas == [(0, '{"city":'), (0, '"Paris"}'), (1, '{"city":"Lyon"}')]
    done = [e["item"]["arguments"] for e in events if e["type"] == "response.output_item.done"]
    assert sorted(done) == ['{"city":"Lyon"}', '{"city":"Paris"}']


def test_stream_options_are_taken_and_obfuscation_pads_the_deltas(client: openai.OpenAI) -> None:
    """``stream_options.include_obfuscation`` as OpenAI defines it: with ``true`` every delta event carries
    an ``obfuscation`` string that brings it to a uniform size; with ``false`` (or none) it carries none."""
    tools: Any = [WEATHER]
    for include in (True, False):
        options: Any = {"include_obfuscation": include}
        stream = client.responses.create(model="m", input="Weather?", tools=tools, stream=True, stream_options=options)
        deltas: list[Any] = [e for e in stream if e.type.endswith(".delta")]
        assert deltas and all(e.type == "response.function_call_arguments.delta" for e in deltas)
        pads = [getattr(e, "obfuscation", None) for e in deltas]
        if include:
            assert all(p and (len(e.delta) + len(p)) % 32 == 0 for e, p in zip(deltas, pads, strict=True)), pads
        else:
            assert pads == [None] * len(deltas)
    texts = client.responses.create(model="m", input="hi", stream=True, stream_options={"include_obfuscation": True})
    pads = [getattr(e, "obfuscation", None) for e in texts if e.type == "response.output_text.delta"]
    assert pads and all(pads)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="m", input="hi", stream_options={"include_obfuscation": False})
    assert info.value.param == "stream_options"
