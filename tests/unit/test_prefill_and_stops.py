"""Anthropic fidelity below the HTTP layer: a final assistant turn (a prefill) is rendered open and sent
as each engine continues one, the stop string that ended an answer is carried to ``stop_reason:
stop_sequence``, and Anthropic's content rules are 400s."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from backends.base import BackendError, Chunk, GenerationRequest, Usage
from backends.capabilities import PREFILL, needs, without
from backends.http_base import HttpSettings
from backends.text import CHATML, ChatRenderer, StopStrings
from backends.tgi_messages import TgiMessagesBackend
from backends.tool_calls import with_tool_calls
from backends.vllm import VLLMBackend
from gateway.config import LimitsConfig
from gateway.doors.anthropic_api import MESSAGES
from gateway.doors.anthropic_events import AnthropicAnswer
from gateway.http.errors import ApiError
from tests.conftest import free_port
from tests.unit.test_openai_compat_contract import replay, sse

PREFILLED = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hello! I am"}]


def asked(messages: list[dict[str, Any]], **fields: Any) -> GenerationRequest:
    body = {"model": "m", "max_tokens": 20, "messages": messages, **fields}
    return MESSAGES.asked(body, LimitsConfig(), "r1").gen


def refused(messages: list[dict[str, Any]], **fields: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        asked(messages, **fields)
    assert info.value.status == 400 and info.value.type == "invalid_request_error"
    return info.value


def test_a_final_assistant_turn_is_continued_and_an_empty_one_is_no_prefill() -> None:
    gen = asked(PREFILLED)
    assert gen.continue_final and gen.messages == PREFILLED
    assert needs(gen)[PREFILL] == "messages"
    assert not without(gen, [PREFILL], []).continue_final  # routing.drop_unsupported drops it by name
    empty = asked([*PREFILLED[:1], {"role": "assistant", "content": ""}])
    assert not empty.continue_final and empty.messages == PREFILLED[:1]
    assert not asked(PREFILLED[:1]).continue_final


def test_chatml_renders_the_prefill_open() -> None:
    chat = ChatRenderer(CHATML)
    closed = chat.render(PREFILLED)
    open_ = chat.render(PREFILLED, continue_final=True)
    assert closed.endswith("Hello! I am<|im_end|>\n<|im_start|>assistant\n")
    assert open_ == closed[: closed.index("Hello! I am") + len("Hello! I am")]
    assert open_.endswith("<|im_start|>assistant\nHello! I am")


def test_a_template_that_hides_the_prefill_cannot_continue_it() -> None:
    hides = "{% for m in messages %}{{ m.role }}{% endfor %}"
    with pytest.raises(BackendError) as info:
        ChatRenderer(hides).render(PREFILLED, continue_final=True)
    assert info.value.param == "messages"


@pytest.mark.parametrize(
    ("messages", "fields", "param", "words"),
    [
        ([{"role": "user", "content": ""}], {}, "messages.0.content", "non-empty content"),
        ([{"role": "user", "content": []}], {}, "messages.0.content", "non-empty content"),
        ([{"role": "assistant", "content": ""}, *PREFILLED[:1]], {}, "messages.0.content", "non-empty content"),
        ([{"role": "user", "content": [{"type": "text", "text": ""}]}], {}, "messages.0.content.0.text", "1 character"),
        ([*PREFILLED[:1], {"role": "assistant", "content": "Hi "}], {}, "messages.1.content", "trailing whitespace"),
        (
            [
                *PREFILLED[:1],
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
            ],
            {},
            "messages.1.content",
            "tool_use",
        ),
        (PREFILLED[:1], {"tool_choice": {"type": "auto"}}, "tool_choice", "only be specified while providing tools"),
        (PREFILLED[:1], {"tool_choice": {"type": "none"}, "tools": []}, "tool_choice", "while providing tools"),
    ],
)
def test_anthropics_content_rules_are_400s(
    messages: list[dict[str, Any]], fields: dict[str, Any], param: str, words: str
) -> None:
    err = refused(messages, **fields)
    assert err.param == param and words in err.message and err.message.startswith(f"{param}: ")


def test_the_stop_string_that_begins_first_is_the_one_matched() -> None:
    stops = StopStrings(["cd", "abc"])
    assert stops.feed("xxab") == "xx" and stops.matched is None
    assert stops.feed("cdef") == "" and stops.stopped and stops.matched == "abc"


def _message(chunks: list[Chunk]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The whole Message and the streamed ``message_delta`` of the same chunks."""
    whole, _ = AnthropicAnswer("r", "m").whole(chunks)
    stream = AnthropicAnswer("r", "m")
    raw = b"".join(stream.opening()) + b"".join(stream.chunk(c) or b"" for c in chunks) + stream.closing(None)
    events = [json.loads(e.split("\ndata: ")[1]) for e in raw.decode().split("\n\n")[:-1]]
    return whole, next(e for e in events if e["type"] == "message_delta")["delta"]


def test_a_matched_stop_string_is_stop_reason_stop_sequence() -> None:
    done = [Chunk(text="Hello"), Chunk(finish_reason="stop", usage=Usage(3, 2), stop_sequence="!")]
    whole, delta = _message(done)
    assert (whole["stop_reason"], whole["stop_sequence"]) == ("stop_sequence", "!")
    assert delta == {"stop_reason": "stop_sequence", "stop_sequence": "!"}
    whole, delta = _message([Chunk(text="Hello"), Chunk(finish_reason="stop")])
    assert (whole["stop_reason"], whole["stop_sequence"]) == ("end_turn", None) and delta["stop_sequence"] is None


def test_parsing_tool_calls_out_of_the_text_keeps_the_stop_string() -> None:
    async def engine() -> AsyncIterator[Chunk]:
        yield Chunk(text="Sure")
        yield Chunk(finish_reason="stop", usage=Usage(3, 1), stop_sequence="END")

    async def run() -> list[Chunk]:
        return [c async for c in with_tool_calls(engine(), "hermes")]

    assert asyncio.run(run())[-1].stop_sequence == "END"


def test_vllm_continues_the_final_message_and_names_its_stop() -> None:
    body = sse(
        {"choices": [{"index": 0, "delta": {"content": " the demo"}}]},
        {"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "stop", "stop_reason": " model"}]},
        {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}},
    )
    request = GenerationRequest("r", "m", messages=PREFILLED, continue_final=True, stop=(" model",))
    chunks, sent = replay(VLLMBackend, request, body)
    assert sent["continue_final_message"] is True and sent["add_generation_prompt"] is False
    assert sent["messages"] == PREFILLED
    assert "".join(c.text for c in chunks) == " the demo"
    assert (chunks[-1].finish_reason, chunks[-1].stop_sequence) == ("stop", " model")
    plain, sent = replay(VLLMBackend, GenerationRequest("r", "m", messages=PREFILLED[:1]), body)
    assert "continue_final_message" not in sent and plain[-1].stop_sequence is None  # " model" was not asked


@pytest.mark.parametrize(
    ("text", "answer", "matched"), [("one, two<|im_end|>", "one", ", "), ("one<|im_end|>", "one", None)]
)
def test_the_gateways_own_cut_names_the_stop_and_not_an_end_of_turn_text(
    text: str, answer: str, matched: str | None
) -> None:
    """TGI's Messages API streams its end-of-turn text, which the adapter cuts like a stop: not the client's."""
    body = sse(
        {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}},
    )
    request = GenerationRequest("r", "m", messages=PREFILLED[:1], stop=(", ",))
    chunks, _ = replay(TgiMessagesBackend, request, body)
    assert "".join(c.text for c in chunks) == answer and chunks[-1].stop_sequence == matched


def test_vllm_counts_a_prompt_with_its_tokenize_route() -> None:
    received: list[tuple[str, dict[str, Any]]] = []

    async def scenario() -> int:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
            received.append((head.split(b" ")[1].decode(), orjson.loads(await reader.readexactly(length))))
            doc = orjson.dumps({"count": 41, "max_model_len": 4096, "tokens": list(range(41)), "token_strs": None})
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(doc))
            writer.write(doc)
            await writer.drain()
            writer.close()

        port = free_port()
        server = await asyncio.start_server(handle, "127.0.0.1", port)
        backend = VLLMBackend("b", "m", HttpSettings(url=f"http://127.0.0.1:{port}", served_model="served"))
        tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        try:
            gen = GenerationRequest("r", "m", messages=PREFILLED, tools=(tool,), continue_final=True)
            return await backend.count_prompt(gen)
        finally:
            await backend.aclose()
            server.close()
            await server.wait_closed()

    assert asyncio.run(scenario()) == 41
    ((path, body),) = received
    assert path == "/tokenize" and body["model"] == "served" and body["messages"] == PREFILLED
    assert body["tools"][0]["function"]["name"] == "f"
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
