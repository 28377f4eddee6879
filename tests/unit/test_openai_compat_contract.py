"""The OpenAI-speaking adapters carry every capability field in the engine's form and map answers back.

Engine documents here were recorded from the real engines ``make test`` runs (vLLM 0.32 on CPU with
``--tool-call-parser hermes``, llama-server b1-0c1e570 from llama-cpp-python 0.3.36), trimmed of ids,
timestamps and null fields the adapter does not read; shapes are as the engines sent them.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import orjson
import pytest

from backends import capabilities as cap
from backends.answer_stream import AnswerStream
from backends.base import (
    BackendError,
    Chunk,
    ErrorKind,
    GenerationRequest,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
)
from backends.capabilities import PLAIN, Capabilities
from backends.http_base import HttpSettings
from backends.llama_server import LlamaServerBackend
from backends.openai_compat import OpenAICompatBackend, parse_chunk, to_payload
from backends.vllm import VLLMBackend
from tests.conftest import free_port

SETTINGS = HttpSettings(url="http://127.0.0.1:9", served_model="served")
TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
)
HISTORY = [
    {"role": "system", "content": "Be brief.", "name": "setup"},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Weather?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
        ],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "w", "strict": True, "schema": {"type": "object"}}}


def req(**kw: Any) -> GenerationRequest:
    if "prompt" not in kw:
        kw.setdefault("messages", [{"role": "user", "content": "Hello"}])
    return GenerationRequest(request_id="r", model="m", **kw)


def payload(cls: type[OpenAICompatBackend], request: GenerationRequest) -> dict[str, Any]:
    return cls("b", "m", SETTINGS).payload(request)


# ---- requests -------------------------------------------------------------------------------------


def test_plain_text_payload_carries_no_capability_field() -> None:
    body = payload(VLLMBackend, req(max_tokens=5, temperature=0.0, stop=("x",)))
    assert body == {
        "model": "served",
        "stream": True,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 5,
        "temperature": 0.0,
        "stop": ["x"],
        "stream_options": {"include_usage": True},
    }


def test_vllm_gets_every_chat_field_as_openai_spells_it_and_history_intact() -> None:
    request = req(
        messages=HISTORY,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
        response_format=SCHEMA_FORMAT,
        logprobs=True,
        top_logprobs=3,
        n=2,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        logit_bias={320: 100.0, 7: -100.0},
        user="u-1",
        seed=11,
        temperature=0.7,
    )
    body = payload(VLLMBackend, request)
    assert body["messages"] == HISTORY  # tool_calls, tool_call_id, name and content parts untouched
    assert body["tools"] == list(TOOLS)
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["parallel_tool_calls"] is False
    assert body["response_format"] == SCHEMA_FORMAT
    assert (body["logprobs"], body["top_logprobs"]) == (True, 3)
    assert body["n"] == 2
    assert (body["presence_penalty"], body["frequency_penalty"]) == (0.5, -0.5)
    assert body["logit_bias"] == {"320": 100.0, "7": -100.0}  # JSON object keys are strings
    assert (body["user"], body["seed"]) == ("u-1", 11)
    assert "echo" not in body


def test_completion_logprobs_are_one_integer_and_echo_goes_to_vllm() -> None:
    body = payload(VLLMBackend, req(prompt="The Zen", logprobs=True, top_logprobs=2, echo=True))
    assert (body["logprobs"], body["echo"]) == (2, True)
    assert "top_logprobs" not in body


def test_llama_server_gets_only_what_it_declares() -> None:
    request = req(prompt="The Zen", logprobs=True, top_logprobs=0, echo=True, n=2, tools=TOOLS)
    body = payload(LlamaServerBackend, request)
    assert body["logprobs"] == 1  # llama-server's 0 means none at all: one is asked, none kept
    assert body["n"] == 2
    assert "echo" not in body  # llama-server never repeats the prompt
    chat = payload(LlamaServerBackend, req(tools=TOOLS, tool_choice="required", parallel_tool_calls=False))
    assert chat["tools"] == list(TOOLS)
    assert "tool_choice" not in chat and "parallel_tool_calls" not in chat


def test_vllm_greedy_choices_are_asked_as_top_k_1_sampling() -> None:
    body = payload(VLLMBackend, req(n=2, temperature=0.0))
    assert (body["n"], body["temperature"], body["top_k"]) == (2, 1.0, 1)  # vLLM: n > 1 needs sampling
    assert "top_k" not in payload(VLLMBackend, req(n=2, temperature=0.5))


def test_llama_server_samples_the_whole_distribution_as_openai_does() -> None:
    sampled = payload(LlamaServerBackend, req(temperature=0.8))
    assert (sampled["top_p"], sampled["top_k"], sampled["min_p"]) == (1.0, 0, 0.0)
    own = payload(LlamaServerBackend, req(temperature=0.8, top_p=0.9, extra={"top_k": 5}))
    assert (own["top_p"], own["top_k"], own["min_p"]) == (0.9, 5, 0.0)
    greedy = payload(LlamaServerBackend, req(temperature=0.0))
    assert "top_k" not in greedy and "min_p" not in greedy


def test_an_adapter_without_capabilities_sends_none_of_the_fields() -> None:
    class Plain(OpenAICompatBackend):
        capabilities: ClassVar[Capabilities] = PLAIN

    request = req(tools=TOOLS, response_format={"type": "json_object"}, logprobs=True, n=3, seed=1)
    request = GenerationRequest(**{**_fields(request), "presence_penalty": 1.0, "logit_bias": {1: 1.0}})
    body = payload(Plain, request)
    for key in ("tools", "response_format", "logprobs", "n", "seed", "presence_penalty", "logit_bias"):
        assert key not in body, key


def _fields(request: GenerationRequest) -> dict[str, Any]:
    return {name: getattr(request, name) for name in request.__dataclass_fields__}


def test_extras_go_out_only_when_the_engine_names_them() -> None:
    extra = {"top_k": 5, "repeat_penalty": 1.1, "frobnicate": 1}
    vllm = payload(VLLMBackend, req(extra=extra))
    llama = payload(LlamaServerBackend, req(extra=extra))
    assert vllm["top_k"] == 5 and "repeat_penalty" not in vllm and "frobnicate" not in vllm
    assert llama["repeat_penalty"] == 1.1 and "frobnicate" not in llama


def test_engine_fields_hook_renames_and_drops() -> None:
    class Renaming(OpenAICompatBackend):
        capabilities: ClassVar[Capabilities] = Capabilities(frozenset({cap.JSON_SCHEMA, cap.PENALTIES}))

        def engine_fields(self, request: GenerationRequest) -> dict[str, Any]:
            fields = super().engine_fields(request)
            fields["guided_json"] = fields.pop("response_format")["json_schema"]["schema"]
            fields["user"] = None  # this engine refuses the field
            return fields

    body = payload(Renaming, req(response_format=SCHEMA_FORMAT, presence_penalty=1.0, user="u"))
    assert body["guided_json"] == {"type": "object"} and body["presence_penalty"] == 1.0
    assert "response_format" not in body and "user" not in body


def test_to_payload_alone_writes_the_capability_fields_it_covers() -> None:
    caps = Capabilities(frozenset({cap.PENALTIES}), frozenset({"top_k"}))
    request = req(extra={"top_k": 1, "x": 2}, presence_penalty=0.5, logprobs=True)
    body = to_payload(request, "s", caps, ask_usage=False)
    assert body["top_k"] == 1 and body["presence_penalty"] == 0.5
    assert "x" not in body and "logprobs" not in body and "stream_options" not in body


# ---- answers --------------------------------------------------------------------------------------


def test_vllm_tool_call_pieces_become_tool_call_deltas() -> None:
    first = {
        "choices": [
            {
                "index": 0,
                "delta": {
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "chatcmpl-tool-8ea3",
                            "type": "function",
                            "index": 0,
                            "function": {"name": "get_weather"},
                        }
                    ],
                },
                "logprobs": None,
                "finish_reason": None,
            }
        ]
    }
    piece = {
        "choices": [
            {"index": 0, "delta": {"content": None, "tool_calls": [{"index": 0, "function": {"arguments": "al"}}]}}
        ]
    }
    end = {"choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "tool_calls", "stop_reason": None}]}
    assert parse_chunk(first).choices[0].tool_calls == (ToolCallDelta(0, "chatcmpl-tool-8ea3", "get_weather", ""),)
    assert parse_chunk(piece).choices[0].tool_calls == (ToolCallDelta(0, None, None, "al"),)
    assert parse_chunk(end).finish == "tool_calls"


def test_chat_logprobs_map_with_alternatives_and_bytes() -> None:
    doc = {
        "choices": [
            {
                "index": 1,
                "delta": {"content": "Hello"},
                "logprobs": {
                    "content": [
                        {
                            "token": "Hello",
                            "logprob": -0.00068,
                            "bytes": [72, 101, 108, 108, 111],
                            "top_logprobs": [
                                {"token": "Hello", "logprob": -0.00068, "bytes": [72, 101, 108, 108, 111]},
                                {"token": "d", "logprob": -9.2, "bytes": [100]},
                            ],
                        }
                    ]
                },
                "finish_reason": None,
            }
        ]
    }
    choice = parse_chunk(doc).choices[0]
    assert choice.index == 1 and choice.text == "Hello"
    assert choice.logprobs == (
        TokenLogprob(
            "Hello",
            -0.00068,
            (72, 101, 108, 108, 111),
            (TopLogprob("Hello", -0.00068, (72, 101, 108, 108, 111)), TopLogprob("d", -9.2, (100,))),
        ),
    )


def test_vllm_completion_logprobs_with_echo_map_from_parallel_lists() -> None:
    doc = {
        "choices": [
            {
                "index": 0,
                "text": "The of",
                "logprobs": {
                    "text_offset": [0, 3],
                    "token_logprobs": [None, -0.0025],
                    "tokens": ["The", " of"],
                    "top_logprobs": [None, {" of": -0.0025, " a": -7.3}],
                },
                "finish_reason": None,
            }
        ]
    }
    lps = parse_chunk(doc).choices[0].logprobs
    assert lps[0] == TokenLogprob("The", -9999.0)  # the echoed first prompt token has no log probability
    assert lps[1] == TokenLogprob(" of", -0.0025, None, (TopLogprob(" of", -0.0025), TopLogprob(" a", -7.3)))


def test_cached_tokens_from_usage_details_or_llama_server_timings() -> None:
    vllm = {
        "choices": [],
        "usage": {
            "prompt_tokens": 104,
            "total_tokens": 106,
            "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": 96},
        },
    }
    llama = {
        "choices": [],
        "usage": {"completion_tokens": 2, "prompt_tokens": 16, "total_tokens": 18},
        "timings": {"cache_n": 15, "prompt_n": 1},
    }
    none = {"choices": [], "usage": {"prompt_tokens": 6, "completion_tokens": 2, "prompt_tokens_details": None}}
    assert parse_chunk(vllm).usage == Usage(104, 2, 96)
    assert parse_chunk(llama).usage == Usage(16, 2, 15)
    assert parse_chunk(none).usage == Usage(6, 2, None)


def test_every_choice_of_one_chunk_is_read() -> None:
    doc = {"choices": [{"index": 0, "text": "a"}, {"index": 1, "text": "b", "finish_reason": "length"}]}
    choices = parse_chunk(doc).choices
    assert [(c.index, c.text, c.finish) for c in choices] == [(0, "a", None), (1, "b", "length")]


# ---- whole streams through generate() -------------------------------------------------------------


def sse(*docs: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(d) + b"\n\n" for d in docs) + b"data: [DONE]\n\n"


def replay(
    cls: type[OpenAICompatBackend], request: GenerationRequest, body: bytes
) -> tuple[list[Chunk], dict[str, Any]]:
    """``request`` through an adapter of ``cls`` against an engine that answers ``body``; the chunks
    and the JSON the engine received. Read twice, chunk by chunk and with ``AnswerStream.rest`` (how
    an attempt reads a whole answer): the same chunks, or the same error, both ways."""
    received: list[dict[str, Any]] = []

    async def scenario() -> list[Chunk]:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
            )
            received.append(orjson.loads(await reader.readexactly(length)))
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n" + body)
            await writer.drain()
            writer.close()

        port = free_port()
        server = await asyncio.start_server(handle, "127.0.0.1", port)
        backend = cls("b", "m", HttpSettings(url=f"http://127.0.0.1:{port}", served_model="m"))
        try:
            failures: list[str] = []
            try:
                one_by_one = [c async for c in backend.generate(request)]
            except BackendError as exc:
                failures.append(repr(exc))
            stream = backend.generate(request)
            assert isinstance(stream, AnswerStream)
            try:
                drained = await stream.rest()
            except BackendError as exc:
                failures.append(repr(exc))
            if failures:
                assert len(failures) == 2 and failures[0] == failures[1], failures
                raise BackendError(ErrorKind.PROTOCOL, failures[0])
            assert drained == one_by_one
            return one_by_one
        finally:
            await backend.aclose()
            server.close()
            await server.wait_closed()

    chunks = asyncio.run(scenario())
    return chunks, received[0]


def test_vllm_n2_stream_ends_each_choice_and_puts_the_whole_usage_on_the_last() -> None:
    body = sse(
        {
            "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            ]
        },
        {
            "choices": [
                {"index": 1, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            ]
        },
        {"choices": [{"index": 0, "delta": {"content": "Hel"}, "logprobs": None, "finish_reason": None}]},
        {"choices": [{"index": 1, "delta": {"content": "Hi"}, "logprobs": None, "finish_reason": None}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": "lo"},
                    "logprobs": None,
                    "finish_reason": "length",
                    "stop_reason": None,
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 1,
                    "delta": {"content": "!"},
                    "logprobs": None,
                    "finish_reason": "length",
                    "stop_reason": None,
                }
            ]
        },
        {
            "choices": [],
            "usage": {
                "prompt_tokens": 16,
                "total_tokens": 20,
                "completion_tokens": 4,
                "prompt_tokens_details": {"cached_tokens": 0},
            },
        },
    )
    chunks, sent = replay(VLLMBackend, req(n=2, temperature=1.0), body)
    assert sent["n"] == 2
    assert "".join(c.text for c in chunks if c.index == 0) == "Hello"
    assert "".join(c.text for c in chunks if c.index == 1) == "Hi!"
    finals = [c for c in chunks if c.finish_reason]
    assert [(c.index, c.finish_reason) for c in finals] == [(0, "length"), (1, "length")]
    assert finals[0].usage is None and chunks[-1] is finals[1] and finals[1].usage == Usage(16, 4, 0)


def test_llama_server_usage_once_per_choice_is_added_up() -> None:
    usage = {
        "completion_tokens": 2,
        "prompt_tokens": 16,
        "total_tokens": 18,
        "prompt_tokens_details": {"cached_tokens": 15},
    }
    body = sse(
        {"choices": [{"finish_reason": None, "index": 0, "delta": {"content": "Hello"}}]},
        {"choices": [{"finish_reason": None, "index": 1, "delta": {"content": "Hello"}}]},
        {"choices": [{"finish_reason": "length", "index": 0, "delta": {}}]},
        {"choices": [], "usage": usage, "timings": {"cache_n": 15}},
        {"choices": [{"finish_reason": "length", "index": 1, "delta": {}}]},
        {"choices": [], "usage": usage, "timings": {"cache_n": 15}},
    )
    chunks, _ = replay(LlamaServerBackend, req(n=2, temperature=1.0), body)
    assert chunks[-1].usage == Usage(16, 4, 15)
    assert [c.index for c in chunks if c.finish_reason] == [0, 1]


def test_stop_strings_are_cut_per_choice() -> None:
    body = sse(
        {"choices": [{"index": 0, "text": "ab STOP cd"}]},
        {"choices": [{"index": 1, "text": "xy ST"}]},
        {"choices": [{"index": 1, "text": "OP z", "finish_reason": "length"}]},
        {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9}},
    )
    chunks, _ = replay(VLLMBackend, req(prompt="p", n=2, stop=("STOP",)), body)
    assert "".join(c.text for c in chunks if c.index == 0) == "ab "
    assert "".join(c.text for c in chunks if c.index == 1) == "xy "
    assert [c.finish_reason for c in chunks if c.finish_reason] == ["stop", "stop"]


def test_tool_call_stream_keeps_its_finish_reason_and_pieces() -> None:
    body = sse(
        {
            "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "content": None,
                        "tool_calls": [
                            {"id": "c1", "type": "function", "index": 0, "function": {"name": "get_weather"}}
                        ],
                    },
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": None, "tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": None, "tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
                }
            ]
        },
        {"choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "tool_calls", "stop_reason": None}]},
        {"choices": [], "usage": {"prompt_tokens": 33, "total_tokens": 96, "completion_tokens": 63}},
    )
    chunks, sent = replay(VLLMBackend, req(tools=TOOLS, tool_choice="required"), body)
    assert sent["tool_choice"] == "required" and sent["tools"] == list(TOOLS)
    calls = [d for c in chunks for d in c.tool_calls]
    assert calls[0] == ToolCallDelta(0, "c1", "get_weather", "")
    assert "".join(d.arguments for d in calls) == '{"city": "Paris"}'
    assert chunks[-1].finish_reason == "tool_calls" and chunks[-1].usage == Usage(33, 63)


@pytest.mark.parametrize("asked", [0, 1])
def test_alternatives_beyond_what_was_asked_are_dropped(asked: int) -> None:
    tops = [
        {"id": 350, "token": "Hello", "bytes": [72], "logprob": -0.1},
        {"id": 289, "token": "d", "bytes": [100], "logprob": -9.2},
    ]
    token = {"id": 350, "token": "Hello", "bytes": [72], "logprob": -0.1, "top_logprobs": tops}
    body = sse(
        {
            "choices": [
                {"finish_reason": None, "index": 0, "delta": {"content": "Hello"}, "logprobs": {"content": [token]}}
            ]
        },
        {"choices": [{"finish_reason": "length", "index": 0, "delta": {}}]},
        {"choices": [], "usage": {"completion_tokens": 1, "prompt_tokens": 16}},
    )
    chunks, sent = replay(LlamaServerBackend, req(logprobs=True, top_logprobs=asked), body)
    assert sent["logprobs"] is True and sent.get("top_logprobs", 0) == asked
    (lp,) = [t for c in chunks for t in c.logprobs]
    assert (lp.token, lp.logprob, len(lp.top)) == ("Hello", -0.1, asked)


def test_include_stop_str_in_output_leaves_the_stop_to_vllm() -> None:
    body = sse(
        {"choices": [{"index": 0, "text": "ab STOP", "finish_reason": "stop", "stop_reason": "STOP"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}},
    )
    request = req(prompt="p", stop=("STOP",), extra={"include_stop_str_in_output": True})
    chunks, sent = replay(VLLMBackend, request, body)
    assert sent["include_stop_str_in_output"] is True
    assert "".join(c.text for c in chunks) == "ab STOP"


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\ndata: [DONE]\n\n', "without a finish"),
        (b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\ndata: {"error":{"message":"x"}}\n\n', "error"),
        (b"data: {not json\n\n", "not JSON"),
    ],
)
def test_a_failed_answer_fails_alike_read_whole_or_by_chunk(body: bytes, why: str) -> None:
    with pytest.raises(BackendError, match=why):
        replay(VLLMBackend, req(), body)
