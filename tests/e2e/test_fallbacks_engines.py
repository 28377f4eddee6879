"""Fallback chains over an engine's contract fake and a real in-process engine (docs/traffic.md): the
TGI fake fails the way TGI does (overloaded, unreachable, an error mid-stream) and the request goes on
to the demo model on CTranslate2 in process before its first token, never after it; a prompt past a
model's context goes to its ``context_window`` fallback, which the real engine answers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.config import load_config
from tests.conftest import write_config
from tests.contract import fake_tgi
from tests.contract.control import FakeControl
from tests.contract.tiny_engine import TinyEngine
from tests.fakes import serve_in_thread


class Gateway:
    def __init__(self, base: str, control: FakeControl) -> None:
        self.base, self.control = base, control
        self.client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)

    def fallbacks(self, source: str, to: str, cause: str) -> float:
        text = httpx.get(f"{self.base}/metrics").text
        series = f'enginegate_fallbacks_total{{cause="{cause}",from_model="{source}",to_model="{to}"}} '
        line = next((x for x in text.splitlines() if x.startswith(series)), None)
        return float(line.rsplit(" ", 1)[1]) if line is not None else 0.0


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[Gateway]:
    control = FakeControl()
    with serve_in_thread(fake_tgi.create_app(TinyEngine(cache_dir), control), "/health") as tgi:
        config = write_config(
            tmp_path_factory.mktemp("fallbacks") / "c.yaml",
            f"""
limits: {{health_interval_s: 0.3}}
models:
  - {{name: on-tgi, gguf: "{{GGUF}}", fallbacks: [demo]}}
  - {{name: short, gguf: "{{GGUF}}", context: 24, fallbacks: [{{model: demo, when: [context_window]}}]}}
  - {{name: demo, gguf: "{{GGUF}}", aliases: [chat-default]}}
  - {{name: demo-embed, gguf: "{{GGUF}}", kind: embed, aliases: [text-embedding-3-small]}}
backends:
  - {{name: tgi, engine: tgi, url: "{tgi}", model: on-tgi}}
  - {{name: ct2-short, engine: ctranslate2, model: short, threads: 1}}
  - {{name: ct2, engine: ctranslate2, model: demo, threads: 1}}
  - {{name: ct2-embed, engine: ctranslate2, model: demo-embed}}
""",
        )
        with serve_in_thread(create_app(load_config(config))) as base:
            yield Gateway(base, control)


@pytest.fixture(autouse=True)
def _reset(gateway: Gateway) -> Iterator[None]:
    yield
    gateway.control.reset()


@pytest.mark.parametrize(("fault", "cause"), [("status_503", "overloaded"), ("refuse", "unavailable")])
def test_the_engine_s_refusal_before_any_token_hands_the_request_to_the_real_engine(
    gateway: Gateway, fault: str, cause: str
) -> None:
    gateway.control.fail_next = fault
    before = gateway.fallbacks("on-tgi", "demo", cause)
    raw = gateway.client.chat.completions.with_raw_response.create(
        model="on-tgi", messages=[{"role": "user", "content": "Hello"}], max_tokens=8
    )
    answer = raw.parse()
    assert raw.headers["x-enginegate-model"] == "demo" and answer.model == "demo"
    assert answer.choices[0].message.content  # the demo model's own words
    assert gateway.fallbacks("on-tgi", "demo", cause) == before + 1


def test_an_error_after_the_first_token_ends_the_stream_without_another_model(gateway: Gateway) -> None:
    gateway.control.fail_next, gateway.control.fault_after_events = "error_event", 2
    before = gateway.fallbacks("on-tgi", "demo", "unavailable")
    stream = gateway.client.chat.completions.create(
        model="on-tgi", messages=[{"role": "user", "content": "Hello"}], max_tokens=8, stream=True
    )
    models = []
    with pytest.raises(openai.APIError):
        for chunk in stream:
            models.append(chunk.model)
    assert models and set(models) == {"on-tgi"}  # tokens came from TGI, then the error: no second answer
    assert gateway.fallbacks("on-tgi", "demo", "unavailable") == before


def test_a_prompt_past_the_context_is_answered_by_the_context_window_fallback(gateway: Gateway) -> None:
    prompt = "Tell me about the weather in the mountains today and tomorrow " * 4
    raw = gateway.client.chat.completions.with_raw_response.create(
        model="short", messages=[{"role": "user", "content": prompt}], max_tokens=8
    )
    assert raw.headers["x-enginegate-model"] == "demo" and raw.parse().model == "demo"
    assert gateway.fallbacks("short", "demo", "context_window") == 1
    short = gateway.client.chat.completions.create(
        model="short", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )
    assert short.model == "short"  # a prompt that fits stays on its model


def test_aliases_reach_the_real_engines_on_every_door(gateway: Gateway) -> None:
    vectors = gateway.client.embeddings.with_raw_response.create(model="text-embedding-3-small", input="Hello")
    assert vectors.parse().model == "demo-embed" and vectors.headers["x-enginegate-model"] == "demo-embed"
    chat = gateway.client.chat.completions.create(
        model="chat-default", messages=[{"role": "user", "content": "Hello"}], max_tokens=4
    )
    assert chat.model == "demo"
    counted = httpx.post(
        f"{gateway.base}/v1/messages/count_tokens",
        json={"model": "chat-default", "messages": [{"role": "user", "content": "Hello"}]},
    )
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 0
