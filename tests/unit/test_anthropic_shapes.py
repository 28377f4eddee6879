"""``/v1/messages``: Anthropic bodies translated into one chat request, answers as Message documents
and Anthropic's stream events, errors in Anthropic's shape; scripted engines in a real server, read
by the official ``anthropic`` client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest
from gateway.app import create_app
from gateway.config import LimitsConfig, load_config
from gateway.doors.anthropic_api import MESSAGES
from gateway.doors.anthropic_events import AnthropicAnswer
from gateway.http.errors import ApiError, from_backend
from tests.conftest import write_config
from tests.fakes import factory, serve_in_thread
from tests.scripted_tools import CALL, TEXT, Scripted

TOOL = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
HELLO = [{"role": "user", "content": "Hello"}]


def asked(**fields: Any) -> GenerationRequest:
    return MESSAGES.asked({"model": "m", "max_tokens": 20, "messages": HELLO, **fields}, LimitsConfig(), "r1").gen


def refused(**fields: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        MESSAGES.asked({"model": "m", **fields}, LimitsConfig(), "r1")
    assert info.value.status == 400
    return info.value


def test_a_tool_round_trip_becomes_one_chat_conversation() -> None:
    gen = asked(
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                    {"type": "text", "text": "And so?"},
                ],
            },
        ],
        tools=[TOOL],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        stop_sequences=["\n\n"],
        top_k=5,
        temperature=0,
        metadata={"user_id": "u-1"},
    )
    assert gen.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "user", "content": "And so?"},
    ]
    assert gen.tools == (
        {
            "type": "function",
            "function": {"name": "get_weather", "parameters": TOOL["input_schema"], "description": "Weather in a city"},
        },
    )
    assert gen.tool_choice == "required" and gen.parallel_tool_calls is False
    assert gen.stop == ("\n\n",) and gen.extra == {"top_k": 5} and gen.greedy and gen.user == "u-1"
    assert asked(tools=[TOOL], tool_choice={"type": "tool", "name": "get_weather"}).tool_choice == {
        "type": "function",
        "function": {"name": "get_weather"},
    }


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"messages": HELLO}, "max_tokens"),
        ({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages.0.content.0.text"),
        ({"max_tokens": 5, "messages": HELLO, "temperature": 1.5}, "temperature"),
        ({"max_tokens": 5, "messages": HELLO, "thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
        ({"max_tokens": 5, "messages": HELLO, "tools": [{"type": "web_search_20250305", "name": "w"}]}, "tools.0.type"),
        ({"max_tokens": 5, "messages": HELLO, "unknown": 1}, "unknown"),
        (
            {"max_tokens": 5, "messages": HELLO, "tools": [TOOL], "tool_choice": {"type": "tool", "name": "x"}},
            "tool_choice.name",
        ),
    ],
)
def test_bad_input_is_refused_naming_the_field(fields: dict[str, Any], param: str) -> None:
    err = refused(**fields)
    assert err.param == param and err.message.startswith(f"{param}: ")


def _events(chunks: list[Chunk], fail: BackendError | None = None) -> list[tuple[str, dict[str, Any]]]:
    answer = AnthropicAnswer("r1", "m")
    raw = b"".join(answer.opening())
    usage = None
    for chunk in chunks:
        raw += answer.chunk(chunk) or b""
        usage = chunk.usage or usage
    raw += answer.failure(from_backend(fail)) if fail is not None else answer.closing(usage)
    out = []
    for sse in raw.decode().split("\n\n")[:-1]:
        head, data = sse.split("\n")
        out.append((head.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def test_a_stream_emits_anthropics_event_sequence() -> None:
    events = _events([Chunk(text="Let me check."), *CALL])
    assert [(kind, doc.get("index"), doc.get("delta", {}).get("type")) for kind, doc in events] == [
        ("message_start", None, None),
        ("content_block_start", 0, None),
        ("content_block_delta", 0, "text_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, None),
        ("content_block_delta", 1, "input_json_delta"),
        ("content_block_delta", 1, "input_json_delta"),
        ("content_block_stop", 1, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    assert all(kind == doc["type"] for kind, doc in events)
    assert events[4][1]["content_block"] == {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert events[-2][1]["usage"] == {"input_tokens": 12, "output_tokens": 9}


def test_a_failure_mid_stream_is_an_anthropic_error_event() -> None:
    events = _events(TEXT[:1], BackendError(ErrorKind.UPSTREAM, "engine died"))
    said = "The engine serving the model failed while answering."  # the gateway's words; "engine died" is logged
    assert events[-1] == ("error", {"type": "error", "error": {"type": "api_error", "message": said}})


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = write_config(
        tmp_path_factory.mktemp("anth") / "c.yaml",
        """
models: [{name: m}, {name: broken}, {name: plain}]
backends:
  - {name: a, engine: vllm, model: m, url: "http://127.0.0.1:9"}
  - {name: b, engine: vllm, model: broken, url: "http://127.0.0.1:9"}
  - {name: c, engine: vllm, model: plain, url: "http://127.0.0.1:9"}
""",
    )
    fakes: dict[str, Any] = {"a": Scripted("a", "m"), "b": Scripted("b", "broken", fail_after=1)}
    from tests.fakes import ScriptedBackend

    fakes["c"] = ScriptedBackend("c", "plain")
    with serve_in_thread(create_app(load_config(config), factory(fakes))) as url:
        yield url


@pytest.fixture
def client(base: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=10)


def test_the_anthropic_client_reads_text_and_tool_use(client: anthropic.Anthropic) -> None:
    msg = client.messages.create(model="m", max_tokens=20, messages=[{"role": "user", "content": "hi"}])
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == "Hello there"  # type: ignore[union-attr]
    assert msg.stop_reason == "end_turn" and msg.usage.input_tokens == 5 and msg.usage.output_tokens == 2
    tools: Any = [TOOL]
    msg = client.messages.create(model="m", max_tokens=20, messages=[{"role": "user", "content": "w?"}], tools=tools)
    use = msg.content[0]
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "Paris"}
    assert msg.stop_reason == "tool_use"


def test_the_anthropic_client_streams_text_and_tool_use(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model="m", max_tokens=20, messages=[{"role": "user", "content": "hi"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hello there" and final.usage.output_tokens == 2 and final.usage.input_tokens == 5
    tools: Any = [TOOL]
    with client.messages.stream(
        model="m", max_tokens=20, messages=[{"role": "user", "content": "w?"}], tools=tools
    ) as stream:
        final = stream.get_final_message()
    use = final.content[0]
    assert use.type == "tool_use" and use.input == {"city": "Paris"} and final.stop_reason == "tool_use"


def test_errors_are_anthropic_shaped_with_their_status(client: anthropic.Anthropic, base: str) -> None:
    with pytest.raises(anthropic.NotFoundError) as nf:
        client.messages.create(model="nope", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert isinstance(nf.value.body, dict) and nf.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}], extra_body={"temperature": 3}
        )
    assert isinstance(bad.value.body, dict) and bad.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError) as unsupported:  # routing: no backend for `plain` takes tools
        client.messages.create(model="plain", max_tokens=5, messages=[{"role": "user", "content": "hi"}], tools=[TOOL])  # type: ignore[list-item]
    assert "tools" in unsupported.value.message
    r = httpx.post(f"{base}/v1/messages", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"


def test_a_failure_after_the_first_byte_raises_in_the_client(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.APIStatusError) as info:  # noqa: SIM117
        with client.messages.stream(model="broken", max_tokens=5, messages=[{"role": "user", "content": "hi"}]) as s:
            for _ in s:
                pass
    assert "The engine serving the model failed while answering." in str(info.value) and "died" not in str(info.value)


def test_x_api_key_and_anthropic_version_are_accepted(base: str) -> None:
    body = {"model": "m", "max_tokens": 5, "messages": HELLO}
    r = httpx.post(
        f"{base}/v1/messages", json=body, headers={"x-api-key": "sk-whatever", "anthropic-version": "2023-06-01"}
    )
    assert r.status_code == 200 and r.json()["type"] == "message"


def test_x_api_key_is_the_api_key_when_keys_are_required(tmp_path: Path) -> None:
    from gateway.tenancy.keys import digest, new_token

    key_id, token = new_token()
    config = write_config(
        tmp_path / "c.yaml",
        f"""
auth: {{required: true, keys: [{{id: "{key_id}", sha256: "{digest(token)}"}}]}}
models: [{{name: m}}]
backends: [{{name: a, engine: vllm, model: m, url: "http://127.0.0.1:9"}}]
""",
    )
    with serve_in_thread(create_app(load_config(config), factory({"a": Scripted("a", "m")}))) as url:
        good = anthropic.Anthropic(base_url=url, api_key=token, max_retries=0, timeout=10)
        msg = good.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
        assert msg.content[0].type == "text"
        bad = anthropic.Anthropic(base_url=url, api_key="sk-eg-00000000_" + "x" * 43, max_retries=0, timeout=10)
        with pytest.raises(anthropic.AuthenticationError) as info:
            bad.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
        assert isinstance(info.value.body, dict) and info.value.body["error"]["type"] == "authentication_error"
