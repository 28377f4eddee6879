"""The demo model calls its tool: rendered through its own chat template, "What is the weather in
Paris?" with a ``get_weather`` tool is answered greedily with the same Hermes call on every engine,
and the answer after the tool's result is the same sentence everywhere.

In-process engines get the prompt the gateway renders (``ChatRenderer``) and their text goes through
the gateway's parser (``with_tool_calls``); llama-server (``--jinja``) and vLLM (hermes parser) render
the template and parse the call themselves.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.base import Chunk, GenerationRequest, ToolCallDelta
from backends.gguf_file import read_gguf
from backends.gguf_vocab import TOKEN_USER_DEFINED
from backends.hf_tokenizer import encode
from backends.text import CHATML, ChatRenderer
from backends.tool_calls import with_tool_calls
from tests import agents_sdk
from tests.conftest import DEMO_GGUF, GREETING_REPLY
from tests.contract.engines import SERVED

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
RESULT = '{"temperature": 18, "condition": "sunny"}'
ANSWER = "It is sunny in Paris, 18 degrees."


def follow_up(arguments: str) -> list[dict[str, Any]]:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    return [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": RESULT},
    ]


def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
    return ChatRenderer(read_gguf(DEMO_GGUF, with_tensors=False).vocab.chat_template).render(messages, tools)


def test_demo_model_carries_the_tool_template_and_tokens() -> None:
    vocab = read_gguf(DEMO_GGUF, with_tensors=False).vocab
    assert vocab.chat_template == CHATML
    for tag in ("<tool_call>", "</tool_call>"):
        assert vocab.types[vocab.tokens.index(tag)] == TOKEN_USER_DEFINED  # printed, one token each


def test_hf_export_keeps_template_and_tool_tokens_printable(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    from tools.gguf_to_hf import export

    out = export(DEMO_GGUF, tmp_path / "hf")
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHATML
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    ids = tok.encode(CALL_TEXT, add_special_tokens=False).ids
    start, end = tok.token_to_id("<tool_call>"), tok.token_to_id("</tool_call>")
    assert ids[0] == start and ids[-1] == end
    assert tok.decode(ids, skip_special_tokens=True) == CALL_TEXT  # what vLLM's parser reads
    flags = {v["content"]: v["special"] for v in config["added_tokens_decoder"].values()}
    assert flags["<tool_call>"] is False and flags["</tool_call>"] is False and flags["<|im_end|>"] is True


@pytest.fixture(scope="module")
def llama() -> Any:
    from llama_cpp import Llama  # built by `make engines`

    return Llama(str(DEMO_GGUF), vocab_only=True, verbose=False)


def test_tool_prompts_tokenize_as_llama_cpp_does(llama: Any) -> None:
    from backends.gguf_file import GgufCache

    tokenizer = GgufCache().tokenizer(DEMO_GGUF)
    sdk = agents_sdk.chat_body(SERVED)
    for text in (
        CALL_TEXT,
        render(ASK, [WEATHER]),
        render(follow_up('{"city":"Paris"}'), [WEATHER]),
        render(sdk["messages"], sdk["tools"]),  # titles, "additionalProperties": false, "strict"
    ):
        ids = encode(tokenizer, text).ids
        assert ids == llama.tokenize(text.encode(), add_bos=False, special=True)
    assert encode(tokenizer, CALL_TEXT).tokens[0] == "<tool_call>"


async def _generate(backend: Any, prompt: str) -> tuple[str, list[Chunk]]:
    request = GenerationRequest("t", SERVED, prompt=prompt, temperature=0.0, max_tokens=48)
    raw: list[Chunk] = []

    async def tee() -> AsyncIterator[Chunk]:
        async for chunk in backend.generate(request):
            raw.append(chunk)
            yield chunk

    parsed = [c async for c in with_tool_calls(tee(), "hermes", seed=0)]
    await backend.aclose()
    return "".join(c.text for c in raw), parsed


def _calls(deltas: list[ToolCallDelta]) -> list[tuple[str | None, dict[str, Any]]]:
    names = {d.index: d.name for d in deltas if d.name}
    args: dict[int, str] = {}
    for d in deltas:
        args[d.index] = args.get(d.index, "") + d.arguments
    return [(names[i], json.loads(args[i])) for i in sorted(args)]


def in_process(kind: str, cache_dir: Path) -> Any:
    if kind == "ctranslate2":
        from backends.ctranslate2_engine import CTranslate2Backend

        return CTranslate2Backend("ct2", SERVED, DEMO_GGUF, cache_dir, tool_parser="hermes")
    from backends.llamacpp_engine import LlamaCppBackend

    return LlamaCppBackend("llama", SERVED, DEMO_GGUF, n_ctx=2048)


@pytest.mark.parametrize("kind", ["ctranslate2", "llama_cpp"])
def test_in_process_engines_call_the_tool_through_the_gateway_parser(kind: str, cache_dir: Path) -> None:
    text, chunks = asyncio.run(_generate(in_process(kind, cache_dir), render(ASK, [WEATHER])))
    assert text == CALL_TEXT
    assert "".join(c.text for c in chunks) == ""
    assert _calls([d for c in chunks for d in c.tool_calls]) == [("get_weather", {"city": "Paris"})]
    assert chunks[-1].finish_reason == "tool_calls"
    # After the tool's answer; the call in history with its arguments as any engine returned them.
    for arguments in ('{"city": "Paris"}', '{"city":"Paris"}'):
        text, chunks = asyncio.run(_generate(in_process(kind, cache_dir), render(follow_up(arguments), [WEATHER])))
        assert text == ANSWER and chunks[-1].finish_reason == "stop"
    text, _ = asyncio.run(
        _generate(in_process(kind, cache_dir), render([{"role": "user", "content": "Hello"}], [WEATHER]))
    )
    assert text == GREETING_REPLY  # tools offered, no call wanted


@pytest.mark.parametrize("kind", ["ctranslate2", "llama_cpp"])
def test_in_process_engines_end_the_agents_sdk_answer_at_its_call(kind: str, cache_dir: Path) -> None:
    """The Agents SDK's request, greedy, no max_tokens: the model writes the call whole, then text where
    the end tag belongs; the engine stops at that text's first token, the same on both engines."""
    body = agents_sdk.chat_body(SERVED)
    request = GenerationRequest("t", SERVED, messages=body["messages"], tools=tuple(body["tools"]), temperature=0.0)
    backend = in_process(kind, cache_dir)

    async def answer() -> tuple[str, list[Chunk]]:
        raw: list[Chunk] = []

        async def tee() -> AsyncIterator[Chunk]:
            async for chunk in backend.generate(request):
                raw.append(chunk)
                yield chunk

        parsed = [c async for c in with_tool_calls(tee(), "hermes", seed=0)]
        await backend.aclose()
        return "".join(c.text for c in raw), parsed

    text, chunks = asyncio.run(answer())
    assert text == CALL_TEXT.removesuffix("</tool_call>") + "It"
    assert "".join(c.text for c in chunks) == ""
    assert _calls([d for c in chunks for d in c.tool_calls]) == [agents_sdk.CALL]
    assert chunks[-1].finish_reason == "tool_calls"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 11


@pytest.fixture(scope="module")
def prompt_tokens() -> Iterator[Any]:
    from backends.gguf_file import GgufCache

    tokenizer = GgufCache().tokenizer(DEMO_GGUF)
    yield lambda messages, tools: len(encode(tokenizer, render(messages, tools)).ids)


def _chat(base: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    body = {"model": SERVED, "messages": messages, "tools": [WEATHER], "temperature": 0, "max_tokens": 48, **extra}
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def _stream(base: str, messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]], str | None]:
    """Content, tool-call delta entries and finish reason of a streamed chat answer."""
    body = {"model": SERVED, "messages": messages, "tools": [WEATHER], "temperature": 0, "max_tokens": 48}
    content, finish = "", None
    calls: list[dict[str, Any]] = []
    with httpx.stream("POST", f"{base}/v1/chat/completions", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                delta = choice.get("delta") or {}
                content += delta.get("content") or ""
                calls += delta.get("tool_calls") or []
                finish = choice.get("finish_reason") or finish
    return content, calls, finish


def _streamed_calls(entries: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    by_index: dict[int, dict[str, str]] = {}
    for e in entries:
        slot = by_index.setdefault(e["index"], {"name": "", "arguments": ""})
        fn = e.get("function") or {}
        slot["name"] += fn.get("name") or ""
        slot["arguments"] += fn.get("arguments") or ""
    return [(s["name"], json.loads(s["arguments"])) for _, s in sorted(by_index.items())]


def _check_server(base: str, prompt_tokens: Any) -> None:
    doc = _chat(base, ASK)
    choice = doc["choices"][0]
    assert choice["finish_reason"] == "tool_calls", doc
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert not choice["message"].get("content")
    # The engine rendered the template to the very prompt the gateway renders.
    assert doc["usage"]["prompt_tokens"] == prompt_tokens(ASK, [WEATHER])
    content, entries, finish = _stream(base, ASK)
    assert (content, finish) == ("", "tool_calls")
    assert _streamed_calls(entries) == [("get_weather", {"city": "Paris"})]
    assert entries[0].get("id") and entries[0]["function"]["name"] == "get_weather"
    # The round trip: the engine's own call, as it returned it, then the tool's result.
    again = _chat(base, follow_up(call["function"]["arguments"]))
    assert again["choices"][0]["message"]["content"] == ANSWER
    assert again["choices"][0]["finish_reason"] == "stop"
    # Raw text, no template or parser: the same greedy tokens as the in-process engines.
    r = httpx.post(
        f"{base}/v1/completions",
        json={"model": SERVED, "prompt": render(ASK, [WEATHER]), "temperature": 0, "max_tokens": 48},
        timeout=120,
    )
    assert r.json()["choices"][0]["text"] == CALL_TEXT


def test_llama_server_returns_tool_calls(llama_server_url: str, prompt_tokens: Any) -> None:
    _check_server(llama_server_url, prompt_tokens)


def test_vllm_hermes_parser_returns_tool_calls(vllm_url: str, prompt_tokens: Any) -> None:
    _check_server(vllm_url, prompt_tokens)
