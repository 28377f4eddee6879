"""What a real gateway process tells its operator: each backend's first probe and why (one down from
the start included), a placement that can never serve, the reason in ``/admin/fleet``, the text log's
request fields as ``key=value``, and ``enginegate_build_info``."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from gateway.telemetry.logs import TextFormatter
from gateway.telemetry.metrics import version
from tests.conftest import GatewayProcess, free_port, write_config
from tests.polling import wait_until

ADMIN_KEY = "ops-admin-key-for-tests"


@pytest.fixture(scope="module")
def gateway_with_a_dead_backend(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[GatewayProcess]:
    closed = free_port()  # bound once and released: nothing listens there
    config = write_config(
        tmp_path_factory.mktemp("ops") / "ops.yaml",
        f"""
models:
  - {{name: enginegate-demo, gguf: "{{GGUF}}"}}
  - {{name: huge, params_b: 70, dtype: bf16, context: 8192}}
backends:
  - {{name: local, engine: ctranslate2, model: enginegate-demo}}
  - {{name: down, engine: vllm, model: enginegate-demo, url: "http://127.0.0.1:{closed}", served_model: x}}
  - {{name: too-small, engine: vllm, model: huge, url: "http://127.0.0.1:{closed}", gpu: L4}}
admin: {{api_key_env: EG_OPS_ADMIN}}
""",
    )
    proc = GatewayProcess(config, cache_dir, env={"EG_OPS_ADMIN": ADMIN_KEY}, args=("--log-format", "text"))
    yield proc
    proc.stop()


def test_a_backend_down_from_the_start_is_logged_with_why(gateway_with_a_dead_backend: GatewayProcess) -> None:
    gw = gateway_with_a_dead_backend
    log = gw.log.read_text()
    down = [line for line in log.splitlines() if "backend down is unhealthy (first probe)" in line]
    assert len(down) == 1, log
    assert " WARNING enginegate.fleet " in down[0] and "first_probe=true" in down[0] and "detail=" in down[0]
    assert re.search(r"detail=\"[^\"]*(Connect|refused)", down[0]), down[0]
    assert sum("backend local is healthy (first probe)" in line for line in log.splitlines()) == 1


def test_serve_logs_a_placement_that_can_never_serve(gateway_with_a_dead_backend: GatewayProcess) -> None:
    lines = gateway_with_a_dead_backend.log.read_text().splitlines()
    errors = [line for line in lines if " ERROR enginegate.fleet " in line]
    assert len(errors) == 1, errors
    assert "backends[2]: backend too-small: model huge needs 140.0 GB of weights" in errors[0]
    assert "1× L4 has 24 GB" in errors[0]


def test_admin_fleet_says_why_a_backend_is_unhealthy(gateway_with_a_dead_backend: GatewayProcess) -> None:
    gw = gateway_with_a_dead_backend
    fleet = httpx.get(f"{gw.base_url}/admin/fleet", headers={"authorization": f"Bearer {ADMIN_KEY}"}).json()
    assert fleet["down"]["healthy"] is False and re.search("Connect|refused", fleet["down"]["detail"])
    assert fleet["local"]["healthy"] is True and isinstance(fleet["local"]["detail"], str)


def test_the_text_log_prints_the_request_fields(gateway_with_a_dead_backend: GatewayProcess) -> None:
    gw = gateway_with_a_dead_backend
    client = openai.OpenAI(base_url=f"{gw.base_url}/v1", api_key="none", max_retries=0)
    answer = client.chat.completions.create(
        model="enginegate-demo", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )

    def request_line() -> str | None:
        lines = [line for line in gw.log.read_text().splitlines() if " enginegate.request request " in line]
        return lines[-1] if lines else None

    line = wait_until(request_line, timeout=10, message="the request is logged") or ""
    fields = dict(re.findall(r" ([a-z_]+)=(\"[^\"]*\"|\S+)", line))
    assert fields["model"] == "enginegate-demo" and fields["backend"] == "local" and fields["outcome"] == "ok"
    assert fields["route_reason"] == "no_budget" and fields["status"] == "200" and fields["stream"] == "false"
    assert {"request_id", "ttft_ms", "duration_ms", "prompt_tokens", "completion_tokens"} <= set(fields)
    assert fields["completion_tokens"] == str(answer.usage.completion_tokens if answer.usage else -1)
    assert "Hi" not in line  # never prompt text


def test_build_info_is_one_series(gateway_with_a_dead_backend: GatewayProcess) -> None:
    gw = gateway_with_a_dead_backend
    text = httpx.get(f"{gw.base_url}/metrics", headers={"authorization": f"Bearer {ADMIN_KEY}"}).text
    lines = [line for line in text.splitlines() if line.startswith("enginegate_build_info{")]
    assert len(lines) == 1, lines
    assert f'version="{version()}"' in lines[0] and 'python="3.' in lines[0] and lines[0].endswith(" 1.0")


def test_text_format_quotes_what_has_spaces_and_leaves_out_what_is_unset() -> None:
    record = logging.makeLogRecord(
        {"name": "enginegate.request", "levelname": "INFO", "msg": "request", "model": "m", "detail": "a b=c",
         "ttft_ms": 12.5, "key_id": None, "prompt": "secret words", "stream": False}
    )  # fmt: skip
    line = TextFormatter().format(record)
    assert line.endswith(' INFO enginegate.request request model=m detail="a b=c" ttft_ms=12.5 stream=false')
    assert "secret" not in line and "key_id" not in line
    assert os.linesep not in line
