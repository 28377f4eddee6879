"""``enginegate epp`` as operators run it: its own process, real vLLM adapters polling endpoints.

The endpoints serve only what the fleet's poll reads of a vLLM server, ``/health`` and ``/metrics`` in
vLLM's exposition (the recorded excerpt, gauges set by the test): the picker never calls an engine's
generation routes, the proxy does. Health and load reach the pick within a poll or two.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gateway.epp.server import SERVICE
from tests.conftest import ROOT, free_port, write_config
from tests.epp.harness import chat, destination, refused, request_body, request_headers
from tests.fakes import serve_in_thread
from tests.polling import wait_until

RECORDED = (ROOT / "tests" / "data" / "vllm_docs_excerpt.metrics.txt").read_text()


@dataclass
class Gauges:
    """What one endpoint's ``/health`` and ``/metrics`` say now."""

    healthy: bool = True
    running: int = 0
    waiting: int = 0

    def app(self) -> Starlette:
        async def health(request: Request) -> PlainTextResponse:
            return PlainTextResponse("", status_code=200 if self.healthy else 503)

        async def metrics(request: Request) -> PlainTextResponse:
            text = re.sub(r"(vllm:num_requests_running\{.*\}) \S+", rf"\1 {self.running}.0", RECORDED)
            return PlainTextResponse(re.sub(r"(vllm:num_requests_waiting\{.*\}) \S+", rf"\1 {self.waiting}.0", text))

        return Starlette(routes=[Route("/health", health), Route("/metrics", metrics)])


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[dict[str, Gauges], dict[str, str], grpc.Channel, subprocess.Popen[bytes]]]:
    gauges = {"fast": Gauges(), "cheap": Gauges()}
    with ExitStack() as stack:
        urls = {name: stack.enter_context(serve_in_thread(g.app(), "/health")) for name, g in gauges.items()}
        config = write_config(
            tmp_path / "epp.yaml",
            f"""
limits: {{health_interval_s: 0.2}}
models:
  - {{name: m8b, params_b: 8, dtype: bf16, context: 8192}}
backends:
  - {{name: fast, engine: vllm, url: "{urls["fast"]}", model: m8b, gpu: H100, cost_per_hour: 6}}
  - {{name: cheap, engine: vllm, url: "{urls["cheap"]}", model: m8b, gpu: A10G, cost_per_hour: 0.01}}
""",
        )
        port = free_port()
        log = (tmp_path / "epp.log").open("wb")
        command = [sys.executable, "-m", "gateway.cli", "epp", "--config", str(config), "--host", "127.0.0.1"]
        proc = subprocess.Popen([*command, "--port", str(port)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stack.callback(channel.close)
        stack.callback(proc.kill)  # a no-op once it exited
        endpoints = {name: url.removeprefix("http://") for name, url in urls.items()}
        yield gauges, endpoints, channel, proc


def _ready(channel: grpc.Channel) -> bool:
    try:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="readiness"), timeout=2
        )
    except grpc.RpcError:
        return False
    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


def _ask(channel: grpc.Channel) -> Any:
    messages = [request_headers(headers=[("x-ttft-budget-ms", "150")]), *request_body(chat())]
    return next(iter(ext_grpc.ExternalProcessorStub(channel).Process(iter(messages), timeout=10)))


def test_the_picker_process_follows_the_endpoints_health_and_load(
    fleet: tuple[dict[str, Gauges], dict[str, str], grpc.Channel, subprocess.Popen[bytes]],
) -> None:
    gauges, endpoints, channel, proc = fleet
    wait_until(lambda: _ready(channel), timeout=60, message="the picker never became ready")
    stub = health_pb2_grpc.HealthStub(channel)
    for service in ("liveness", SERVICE):
        assert (
            stub.Check(health_pb2.HealthCheckRequest(service=service)).status == health_pb2.HealthCheckResponse.SERVING
        )
    assert destination(_ask(channel))[0] == f"{endpoints['fast']},{endpoints['cheap']}"
    gauges["fast"].healthy = False  # the fast one goes down: the next polls take it out
    wait_until(lambda: destination(_ask(channel))[0] == endpoints["cheap"], message="a down endpoint was still picked")
    gauges["cheap"].running, gauges["cheap"].waiting = 256, 5000  # and the other is swamped: shed
    wait_until(lambda: _ask(channel).WhichOneof("response") == "immediate_response", message="never shed")
    assert refused(_ask(channel))[:1] == (429,)
    proc.terminate()
    assert proc.wait(timeout=30) == 0
