"""Anthropic fidelity through a real gateway process, read by the official ``anthropic`` client: a prefill
is continued (the answer goes on from the prefix), a stop sequence is ``stop_reason: stop_sequence``
naming it, ``count_tokens`` equals the engine's own count of the prompt (tools included) for a model
without a GGUF, counted by the engine's tokenize route (the contract fake TGI over the demo model's real
tokenizer), and Anthropic's content rules are its 400s. CTranslate2 in process and the fake TGI: no
engine build needed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import GREETING_REPLY, GatewayProcess, free_port, write_config
from tests.contract import fake_tgi
from tests.contract.control import FakeControl
from tests.contract.tiny_engine import TinyEngine
from tests.fakes import serve_in_thread
from tests.polling import wait_until

WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
QUESTION: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
HELLO: Any = [{"role": "user", "content": "Hello"}]
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[GatewayProcess]:
    with serve_in_thread(fake_tgi.create_app(TinyEngine(cache_dir), FakeControl()), "/health") as tgi:
        config = write_config(
            tmp_path_factory.mktemp("fidelity") / "fleet.yaml",
            f"""
limits: {{health_interval_s: 0.5}}
models:
  - {{name: demo, gguf: "{{GGUF}}"}}
  - {{name: tgi-native, tool_parser: hermes}}
  - {{name: tgi-chat}}
  - {{name: nowhere}}
backends:
  - {{name: ct2, engine: ctranslate2, model: demo}}
  - {{name: tgi-n, engine: tgi, model: tgi-native, url: "{tgi}", served_model: enginegate-demo}}
  - {{name: tgi-m, engine: tgi_messages, model: tgi-chat, url: "{tgi}", served_model: enginegate-demo}}
  - {{name: gone, engine: vllm, model: nowhere, url: "http://127.0.0.1:{free_port()}"}}
""",
        )
        proc = GatewayProcess(config, cache_dir)
        # Both TGI backends have had their first health reading before a count asks them.
        wait_until(lambda: all(httpx.get(f"{proc.base_url}/readyz").json()["backends"][b] for b in ("tgi-n", "tgi-m")))
        yield proc
        proc.stop()


@pytest.fixture(scope="module")
def client(gw: GatewayProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=60)


@pytest.mark.parametrize("model", ["demo", "tgi-native"])
def test_a_prefill_is_continued_whole_and_streamed(client: anthropic.Anthropic, model: str) -> None:
    prefix = "Hello! I am the"
    prefilled: Any = [*HELLO, {"role": "assistant", "content": prefix}]
    msg = client.messages.create(model=model, max_tokens=64, messages=prefilled, extra_body=GREEDY)
    text = "".join(b.text for b in msg.content if b.type == "text")
    assert prefix + text == GREETING_REPLY and msg.stop_reason == "end_turn"  # the greedy answer, from the prefix on
    with client.messages.stream(model=model, max_tokens=64, messages=prefilled, extra_body=GREEDY) as stream:
        assert "".join(stream.text_stream) == text
    fresh = client.messages.create(model=model, max_tokens=64, messages=HELLO, extra_body=GREEDY)
    assert msg.usage.input_tokens > fresh.usage.input_tokens and msg.usage.output_tokens < fresh.usage.output_tokens


def test_a_prefill_is_refused_by_name_where_the_engine_cannot_continue_one(client: anthropic.Anthropic) -> None:
    prefilled: Any = [*HELLO, {"role": "assistant", "content": "Hello!"}]
    with pytest.raises(anthropic.BadRequestError) as info:  # TGI's Messages API always opens a new turn
        client.messages.create(model="tgi-chat", max_tokens=8, messages=prefilled)
    assert "supports assistant_prefill" in info.value.message and "tgi-m" not in info.value.message  # no backend names


@pytest.mark.parametrize("model", ["demo", "tgi-native", "tgi-chat"])
def test_a_stop_sequence_is_named_in_stop_reason(client: anthropic.Anthropic, model: str) -> None:
    stops = ["nowhere", "demo"]
    msg = client.messages.create(model=model, max_tokens=64, messages=HELLO, stop_sequences=stops, extra_body=GREEDY)
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", "demo")
    assert "".join(b.text for b in msg.content if b.type == "text") == GREETING_REPLY.split("demo")[0]
    with client.messages.stream(
        model=model, max_tokens=64, messages=HELLO, stop_sequences=stops, extra_body=GREEDY
    ) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "demo")
    ended = client.messages.create(model=model, max_tokens=64, messages=HELLO, stop_sequences=["nowhere"])
    assert ended.stop_reason in ("end_turn", "max_tokens") and ended.stop_sequence is None


def _count(gw: GatewayProcess, model: str, **fields: Any) -> tuple[int, str]:
    r = httpx.post(f"{gw.base_url}/v1/messages/count_tokens", json={"model": model, **fields}, timeout=30)
    assert r.status_code == 200, r.text
    return int(r.json()["input_tokens"]), r.headers["x-enginegate-token-count"]


@pytest.mark.parametrize(("model", "choice"), [("tgi-native", {"type": "auto"}), ("tgi-chat", {"type": "any"})])
def test_count_tokens_without_a_gguf_is_the_engines_own_count_with_tools(
    client: anthropic.Anthropic, gw: GatewayProcess, model: str, choice: Any
) -> None:
    counted = client.messages.count_tokens(model=model, messages=QUESTION, tools=[WEATHER], tool_choice=choice)
    msg = client.messages.create(
        model=model, max_tokens=64, messages=QUESTION, tools=[WEATHER], tool_choice=choice, extra_body=GREEDY
    )
    assert counted.input_tokens == msg.usage.input_tokens > 100  # the tools are most of this prompt
    plain = client.messages.count_tokens(model=model, messages=QUESTION)
    assert plain.input_tokens < counted.input_tokens
    assert _count(gw, model, messages=QUESTION)[1] == f"engine:{'tgi-n' if model == 'tgi-native' else 'tgi-m'}"


def test_without_any_tokenizer_the_estimate_renders_the_template_and_tools(
    client: anthropic.Anthropic, gw: GatewayProcess
) -> None:
    exact, source = _count(gw, "demo", messages=QUESTION, tools=[WEATHER])
    assert source == "gguf"
    guess, source = _count(gw, "nowhere", messages=QUESTION, tools=[WEATHER])
    assert source == "estimate"
    assert exact / 2 <= guess <= exact * 2, (guess, exact)  # the same ChatML and tools, four characters a token
    small, _ = _count(gw, "nowhere", messages=HELLO)
    assert 8 <= small <= 32  # "Hello" alone is 16 tokens in ChatML, never the 2 its characters suggest


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"messages": [{"role": "user", "content": ""}]}, "non-empty content"),
        ({"messages": HELLO, "tool_choice": {"type": "auto"}}, "tool_choice may only be specified while providing"),
        ({"messages": [*HELLO, {"role": "assistant", "content": "Hi "}]}, "trailing whitespace"),
    ],
)
def test_anthropics_rules_are_its_400s(client: anthropic.Anthropic, fields: dict[str, Any], words: str) -> None:
    calls = (
        lambda: client.messages.create(model="demo", max_tokens=5, **fields),
        lambda: client.messages.count_tokens(model="demo", **fields),
    )
    for call in calls:
        with pytest.raises(anthropic.BadRequestError) as info:
            call()
        body = info.value.body
        assert isinstance(body, dict) and body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error" and words in body["error"]["message"]


def test_on_vllm_count_tokens_prefill_and_stop_sequence_are_vllms_own(
    vllm_url: str, tmp_path: Path, cache_dir: Path
) -> None:
    """A real vLLM serving a model the gateway has no GGUF for: ``count_tokens`` is vLLM's ``/tokenize``
    of the conversation and tools (equal to the usage vLLM reports for them), a prefill goes out as
    ``continue_final_message``, and vLLM's ``stop_reason`` names the stop sequence."""
    config = write_config(
        tmp_path / "vllm.yaml",
        f"""
models: [{{name: hf-demo}}]
backends: [{{name: vllm, engine: vllm, model: hf-demo, url: "{vllm_url}", served_model: enginegate-demo}}]
""",
    )
    gw = GatewayProcess(config, cache_dir)
    try:
        client = anthropic.Anthropic(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=120)
        tools: Any = [WEATHER]
        counted = client.messages.count_tokens(model="hf-demo", messages=QUESTION, tools=tools)
        msg = client.messages.create(model="hf-demo", max_tokens=16, messages=QUESTION, tools=tools, extra_body=GREEDY)
        assert counted.input_tokens == msg.usage.input_tokens > 100
        assert _count(gw, "hf-demo", messages=QUESTION)[1] == "engine:vllm"
        prefilled: Any = [*HELLO, {"role": "assistant", "content": "Hello! I am the"}]
        cont = client.messages.create(model="hf-demo", max_tokens=64, messages=prefilled, extra_body=GREEDY)
        assert "Hello! I am the" + "".join(b.text for b in cont.content if b.type == "text") == GREETING_REPLY
        assert client.messages.count_tokens(model="hf-demo", messages=prefilled).input_tokens == cont.usage.input_tokens
        stopped = client.messages.create(
            model="hf-demo", max_tokens=64, messages=HELLO, stop_sequences=["demo"], extra_body=GREEDY
        )
        assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "demo")
    finally:
        gw.stop()
