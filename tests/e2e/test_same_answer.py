"""Same answer everywhere: one greedy request through the gateway, answered by every real engine here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests import agents_sdk
from tests.conftest import GREETING_REPLY, ZEN_CONTINUATION, ZEN_PROMPT, GatewayProcess, write_config

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello"}]
ROUTES = {"via-ct2": "ct2", "via-llama-cpp": "llama-cpp", "via-llama-server": "llama-server", "via-vllm": "vllm"}


@pytest.fixture(scope="module")
def mixed_gateway(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path, vllm_url: str, llama_server_url: str
) -> Iterator[GatewayProcess]:
    """A gateway in front of four engines, one model name each so a request picks its engine."""
    config = write_config(
        tmp_path_factory.mktemp("mixed") / "mixed.yaml",
        f"""
models:
  - {{name: via-ct2, gguf: "{{GGUF}}", tool_parser: hermes}}
  - {{name: via-llama-cpp, gguf: "{{GGUF}}", tool_parser: hermes}}
  - {{name: via-llama-server, gguf: "{{GGUF}}", tool_parser: hermes}}
  - {{name: via-vllm, gguf: "{{GGUF}}", tool_parser: hermes}}
backends:
  - {{name: ct2, engine: ctranslate2, model: via-ct2}}
  - {{name: llama-cpp, engine: llama_cpp, model: via-llama-cpp}}
  - {{name: llama-server, engine: llama_server, model: via-llama-server, url: "{llama_server_url}",
      served_model: enginegate-demo}}
  - {{name: vllm, engine: vllm, model: via-vllm, url: "{vllm_url}", served_model: enginegate-demo}}
""",
    )
    proc = GatewayProcess(config, cache_dir)
    yield proc
    proc.stop()


@pytest.mark.parametrize("model", sorted(ROUTES))
def test_greedy_chat_is_the_same_on_every_engine(mixed_gateway: GatewayProcess, model: str) -> None:
    client = openai.OpenAI(base_url=f"{mixed_gateway.base_url}/v1", api_key="unused", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model=model, messages=HELLO, temperature=0)
    assert raw.headers["x-enginegate-backend"] == ROUTES[model]
    assert raw.parse().choices[0].message.content == GREETING_REPLY
    stream = client.completions.create(model=model, prompt=ZEN_PROMPT, temperature=0, max_tokens=40, stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices).startswith(ZEN_CONTINUATION)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("model", sorted(ROUTES))
def test_agents_sdk_tool_request_is_the_same_call_on_every_engine(
    mixed_gateway: GatewayProcess, model: str, stream: bool
) -> None:
    """The OpenAI Agents SDK's request (tests/agents_sdk.py), greedy: llama-server forces the call's end
    tag with its lazy grammar, the gateway reads the in-process engines' call at its closing brace."""
    client = openai.OpenAI(base_url=f"{mixed_gateway.base_url}/v1", api_key="unused", max_retries=0)
    answer = agents_sdk.ask(client, model, stream=stream, **agents_sdk.GREEDY)
    assert answer.backend == ROUTES[model]
    assert answer.calls == [agents_sdk.CALL]
    assert (answer.content, answer.finish) == ("", "tool_calls")
