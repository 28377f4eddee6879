"""Every OpenAI field a client sends through the gateway is visible upstream or refused, never lost.

The official ``openai`` client talks to a real gateway (uvicorn) in front of the trtllm-serve contract
fake, which records each body it receives; each field of the table must arrive in trtllm-serve's form.
Fields the gateway takes itself (``user`` to the log, ``stream_options`` to the answer) are checked
where they take effect.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from gateway.app import create_app
from gateway.config import load_config
from tests.conftest import write_config
from tests.contract import fake_trtllm_serve
from tests.contract.control import FakeControl
from tests.contract.engines import SERVED
from tests.contract.tiny_engine import TinyEngine
from tests.fakes import serve_in_thread

WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@dataclass
class Upstream:
    base: str
    received: list[dict[str, Any]]


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    engine = TinyEngine(tmp_path_factory.mktemp("upstream-cache"))
    received: list[dict[str, Any]] = []
    with serve_in_thread(fake_trtllm_serve.create_app(engine, FakeControl(), received=received), "/health") as url:
        config = write_config(
            tmp_path_factory.mktemp("upstream") / "fleet.yaml",
            f"""
limits: {{max_tokens: 64}}
models:
  - {{name: trt, gguf: "{{GGUF}}"}}
backends:
  - {{name: trt, engine: trtllm_serve, url: "{url}", model: trt, served_model: {SERVED}, tool_parser: qwen3}}
""",
        )
        with serve_in_thread(create_app(load_config(config))) as base:
            yield Upstream(base, received)


# (field, value the client sends, check of the body trtllm-serve received)
CARRIED: list[tuple[str, Any, Any]] = [
    ("temperature", 0.3, lambda b: b["temperature"] == 0.3),
    ("top_p", 0.8, lambda b: b["top_p"] == 0.8),
    ("max_tokens", 5, lambda b: b["max_tokens"] == 5),
    ("max_completion_tokens", 6, lambda b: b["max_tokens"] == 6),
    ("stop", ["\n\n", "zz"], lambda b: b["stop"] == ["\n\n", "zz"]),
    ("seed", 42, lambda b: b["seed"] == 42),
    ("n", 2, lambda b: b["n"] == 2),
    ("presence_penalty", 0.5, lambda b: b["presence_penalty"] == 0.5),
    ("frequency_penalty", -0.5, lambda b: b["frequency_penalty"] == -0.5),
    ("logit_bias", {"17": -100}, lambda b: b["logit_bias"] == {"17": -100.0}),
    ("logprobs", True, lambda b: b["logprobs"] is True),
    ("top_logprobs", 2, lambda b: b["top_logprobs"] == 2),
    ("tools", [WEATHER], lambda b: b["tools"][0]["function"]["name"] == "get_weather"),
    ("tool_choice", "auto", lambda b: b["tool_choice"] == "auto"),  # a named choice: 400 here, nothing forces it
    (
        "response_format",
        {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA}},
        lambda b: b["response_format"]["json_schema"]["schema"] == SCHEMA,
    ),
    ("response_format", {"type": "json_object"}, lambda b: b["response_format"] == {"type": "json_object"}),
    ("top_k", 3, lambda b: b["top_k"] == 3),
    ("min_p", 0.1, lambda b: b["min_p"] == 0.1),
    ("repetition_penalty", 1.1, lambda b: b["repetition_penalty"] == 1.1),
    ("ignore_eos", True, lambda b: b["ignore_eos"] is True),
    ("min_tokens", 2, lambda b: b["min_tokens"] == 2),
    ("user", "u-7", lambda b: b["user"] == "u-7"),
]
NEEDS: dict[str, dict[str, Any]] = {"top_logprobs": {"logprobs": True}, "tool_choice": {"tools": [WEATHER]}}


@pytest.mark.parametrize(("field", "value", "check"), CARRIED, ids=[f"{f}={v!r}"[:60] for f, v, _ in CARRIED])
def test_each_field_reaches_the_engine_in_its_form(upstream: Upstream, field: str, value: Any, check: Any) -> None:
    client = openai.OpenAI(base_url=f"{upstream.base}/v1", api_key="unused", max_retries=0, timeout=30)
    before = len(upstream.received)
    body = {field: value, **NEEDS.get(field, {})}
    client.chat.completions.create(
        model="trt", messages=[{"role": "user", "content": "Hello"}], max_tokens=body.pop("max_tokens", 8),
        extra_body=body,
    )  # fmt: skip
    bodies = upstream.received[before:]
    assert len(bodies) == 1, "one request reached the engine"
    assert check(bodies[0]), bodies[0]


def test_a_plain_request_carries_no_capability_field(upstream: Upstream) -> None:
    client = openai.OpenAI(base_url=f"{upstream.base}/v1", api_key="unused", max_retries=0, timeout=30)
    before = len(upstream.received)
    client.chat.completions.create(model="trt", messages=[{"role": "user", "content": "Hello"}], max_tokens=4)
    body = upstream.received[before]
    assert not set(body) & {"tools", "tool_choice", "response_format", "logprobs", "n", "logit_bias", "seed"}
