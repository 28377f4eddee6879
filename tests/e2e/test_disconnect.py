"""A client that goes away mid-stream stops the engine: its own token count stops growing."""

from __future__ import annotations

import re

import httpx
import openai
import pytest

from tests.conftest import GatewayProcess
from tests.polling import settles

MAX_TOKENS = 4000  # with ignore_eos the engines would run for seconds if nobody stopped them


def engine_tokens(gateway: GatewayProcess, backend: str) -> float:
    text = httpx.get(f"{gateway.base_url}/metrics", timeout=10).text
    m = re.search(rf'^enginegate_engine_generated_tokens_total\{{backend="{backend}"\}} (\S+)$', text, re.M)
    assert m, text
    return float(m.group(1))


@pytest.mark.parametrize(("model", "backend"), [("demo-ct2", "ct2-only"), ("demo-llama", "llama-only")])
def test_disconnect_mid_stream_stops_generation(gateway: GatewayProcess, model: str, backend: str) -> None:
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0)
    before = engine_tokens(gateway, backend)
    stream = client.completions.create(
        model=model,
        prompt="The Zen",
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    received = 0
    for _ in stream:
        received += 1
        if received == 3:
            break
    stream.close()
    # Left running, the engine would count on to MAX_TOKENS: its count must stop well short of it.
    settled = settles(
        lambda: engine_tokens(gateway, backend), quiet_s=0.7, timeout=20, message="the engine kept generating"
    )
    assert received <= settled - before < MAX_TOKENS / 2, "the engine kept generating after the client left"


@pytest.mark.parametrize(("model", "backend"), [("demo-ct2", "ct2-only"), ("demo-llama", "llama-only")])
def test_uncancelled_stream_runs_to_max_tokens(gateway: GatewayProcess, model: str, backend: str) -> None:
    """The control for the test above: left alone, the same request really does generate them all."""
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0)
    before = engine_tokens(gateway, backend)
    resp = client.completions.create(
        model=model, prompt="The Zen", max_tokens=MAX_TOKENS, temperature=0, extra_body={"ignore_eos": True}
    )
    assert resp.usage is not None and resp.usage.completion_tokens == MAX_TOKENS
    assert resp.choices[0].finish_reason == "length"
    assert engine_tokens(gateway, backend) - before == MAX_TOKENS
