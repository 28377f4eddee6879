"""The gateway's choice follows the request's budget: real gateway process, contract fakes with injected latency."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.conftest import GatewayProcess, write_config
from tests.contract import fake_trtllm_serve
from tests.contract.control import FakeControl
from tests.contract.tiny_engine import TinyEngine
from tests.fakes import serve_in_thread

# About 1000 prompt tokens: prefill takes ~30 ms on an H100 and ~230 ms on an A10G for an 8B model.
LONG = "Beautiful is better than ugly. " * 130
REQUEST = {"model": "enginegate-demo", "messages": [{"role": "user", "content": LONG}], "max_tokens": 20}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[GatewayProcess]:
    """Two trtllm-serve fakes for an 8B model: one declared on an H100 (fast, costly), one on an A10G
    (slower prefill, cheap), whose injected latency makes it really slower. Routing prices a request
    at the backend's hourly cost x its time there / the sequences it runs at once, so the A10G must be
    cheap enough to stay cheaper per request while its injected delay makes it ten times slower."""
    work = tmp_path_factory.mktemp("budget")
    with ExitStack() as stack:
        fast_engine, slow_engine = TinyEngine(cache_dir), TinyEngine(cache_dir)
        slow_control = FakeControl(delay_s=0.4)
        fast = stack.enter_context(serve_in_thread(fake_trtllm_serve.create_app(fast_engine, FakeControl()), "/health"))
        slow = stack.enter_context(serve_in_thread(fake_trtllm_serve.create_app(slow_engine, slow_control), "/health"))
        config = write_config(
            work / "budget.yaml",
            f"""
limits: {{health_interval_s: 0.5}}
models:
  - {{name: enginegate-demo, params_b: 8, dtype: bf16, context: 8192}}
backends:
  - {{name: h100, engine: trtllm_serve, url: "{fast}", model: enginegate-demo, gpu: H100, cost_per_hour: 6}}
  - {{name: a10g, engine: trtllm_serve, url: "{slow}", model: enginegate-demo, gpu: A10G, cost_per_hour: 0.01}}
""",
        )
        proc = GatewayProcess(config, cache_dir)
        yield proc
        proc.stop()


def ask(gateway: GatewayProcess, headers: dict[str, str]) -> httpx.Response:
    resp = httpx.post(f"{gateway.base_url}/v1/chat/completions", json=REQUEST, headers=headers, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp


def test_tight_first_token_budget_goes_to_the_fast_backend(gateway: GatewayProcess) -> None:
    for _ in range(5):
        resp = ask(gateway, {"x-ttft-budget-ms": "150"})
        assert resp.headers["x-enginegate-backend"] == "h100"
        assert resp.headers["x-enginegate-route"] == "meets_budget"


def test_relaxed_budget_goes_to_the_cheap_backend(gateway: GatewayProcess) -> None:
    for _ in range(5):
        resp = ask(gateway, {"x-latency-budget-ms": "60000"})
        assert resp.headers["x-enginegate-backend"] == "a10g"
        assert resp.headers["x-enginegate-route"] == "meets_budget"


def test_llm_d_header_names_work_too(gateway: GatewayProcess) -> None:
    assert ask(gateway, {"x-slo-ttft-ms": "150"}).headers["x-enginegate-backend"] == "h100"


def test_impossible_budget_is_answered_best_effort_on_the_cheap_backend(gateway: GatewayProcess) -> None:
    # Out of reach everywhere: it is still answered, but leaves the fast backend to requests that can
    # make their budgets.
    resp = ask(gateway, {"x-ttft-budget-ms": "0.001"})
    assert resp.headers["x-enginegate-route"] == "best_effort"
    assert resp.headers["x-enginegate-backend"] == "a10g"


@pytest.fixture(scope="module")
def real_gateway(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path, vllm_url: str, llama_server_url: str
) -> Iterator[GatewayProcess]:
    """Real engines with declared placements: vLLM as an H100 deployment, llama-server as a costly A10G one,
    CTranslate2 in process on the CPU, free. The demo model is declared as an 8B model for routing."""
    config = write_config(
        tmp_path_factory.mktemp("real-budget") / "real.yaml",
        f"""
limits: {{health_interval_s: 0.5}}
models:
  - {{name: enginegate-demo, gguf: "{{GGUF}}", params_b: 8, dtype: bf16}}
backends:
  - {{name: vllm-h100, engine: vllm, url: "{vllm_url}", model: enginegate-demo, gpu: H100, cost_per_hour: 6}}
  - {{name: llama-a10g, engine: llama_server, url: "{llama_server_url}", model: enginegate-demo, gpu: A10G,
      cost_per_hour: 8}}
  - {{name: ct2-cpu, engine: ctranslate2, model: enginegate-demo, gpu: CPU, memory_gb: 64}}
""",
    )
    proc = GatewayProcess(config, cache_dir)
    yield proc
    proc.stop()


def test_real_engines_follow_the_budget_header(real_gateway: GatewayProcess) -> None:
    body = {
        "model": "enginegate-demo",
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 40,
        "temperature": 0,
    }
    url = f"{real_gateway.base_url}/v1/chat/completions"
    # 16 prompt tokens of an "8B" model: any GPU meets 50 ms to first token; the CPU does not.
    tight = httpx.post(url, json=body, headers={"x-ttft-budget-ms": "50"}, timeout=60)
    assert tight.status_code == 200 and tight.headers["x-enginegate-backend"] == "vllm-h100"
    # A budget of minutes: everything meets it and the free CPU engine wins on cost.
    relaxed = httpx.post(url, json=body, headers={"x-latency-budget-ms": "600000"}, timeout=60)
    assert relaxed.status_code == 200 and relaxed.headers["x-enginegate-backend"] == "ct2-cpu"
    for resp in (tight, relaxed):
        text = resp.json()["choices"][0]["message"]["content"]
        assert text == "Hello! I am the enginegate demo model. Beautiful is better than ugly.", resp.headers
