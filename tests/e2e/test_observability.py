"""What operators read: Prometheus exposition (checked by promtool) and structured JSON logs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import httpx

from tests.conftest import GatewayProcess, write_config
from tests.polling import wait_until

SECRET = "purple elephant pancake"


def test_metrics_pass_promtool_and_cover_the_request_path(gateway: GatewayProcess) -> None:
    url = f"{gateway.base_url}/v1/chat/completions"
    for stream in (False, True):
        body = {"model": "enginegate-demo", "messages": [{"role": "user", "content": "Hello"}], "stream": stream}
        assert httpx.post(url, json={**body, "temperature": 0}, timeout=30).status_code == 200
    text = httpx.get(f"{gateway.base_url}/metrics").text
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: make test installs Debian's prometheus package"
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    for family in (
        "enginegate_request_duration_seconds_bucket",
        "enginegate_time_to_first_token_seconds_bucket",
        "enginegate_time_per_output_token_seconds_bucket",
        "enginegate_prompt_tokens_total",
        "enginegate_completion_tokens_total",
        "enginegate_requests_in_flight",
        "enginegate_routing_decisions_total",
        "enginegate_attempts_total",
        "enginegate_gateway_overhead_seconds_bucket",
        "enginegate_backend_up",
        "enginegate_backend_breaker_state",
    ):
        assert re.search(rf"^{family}\{{", text, re.M), family
    assert re.search(r'^enginegate_backend_breaker_state\{backend="ct2-main",state="closed"\} 1\.0$', text, re.M)
    assert re.search(r'^enginegate_requests_in_flight\{route="chat"\} 0\.0$', text, re.M)


def test_logs_are_json_with_request_context_and_never_prompt_text(gateway: GatewayProcess) -> None:
    resp = httpx.post(
        f"{gateway.base_url}/v1/chat/completions",
        json={"model": "enginegate-demo", "messages": [{"role": "user", "content": SECRET}], "max_tokens": 5},
        headers={"x-request-id": "trace-me-123", "authorization": "Bearer sk-not-logged"},
        timeout=30,
    )
    assert resp.status_code == 200
    lines = [json.loads(line) for line in gateway.log.read_text().splitlines() if line.startswith("{")]
    mine = [entry for entry in lines if entry.get("client_request_id") == "trace-me-123"]
    assert len(mine) == 1
    entry = mine[0]
    assert entry["request_id"] == resp.headers["x-request-id"] != "trace-me-123"  # the gateway's own id
    assert entry["model"] == "enginegate-demo" and entry["backend"] == "ct2-main" and entry["outcome"] == "ok"
    assert entry["route_reason"] == "no_budget" and entry["completion_tokens"] == 5 and entry["ttft_ms"] > 0
    log_text = gateway.log.read_text()
    assert SECRET not in log_text and "sk-not-logged" not in log_text


def test_metrics_count_every_workers_requests(tmp_path: Path, cache_dir: Path) -> None:
    """Two worker processes (prometheus-client's multiprocess mode): whichever worker answers the
    scrape, the counters hold the requests both served."""
    config = write_config(
        tmp_path / "workers.yaml",
        """
limits: {health_interval_s: 0.5}
models: [{name: enginegate-demo, gguf: "{GGUF}"}]
backends: [{name: ct2-main, engine: ctranslate2, model: enginegate-demo}]
""",
    )
    shared = tmp_path / "prometheus"
    shared.mkdir()
    gw = GatewayProcess(config, cache_dir, env={"PROMETHEUS_MULTIPROC_DIR": str(shared)}, args=("--workers", "2"))
    try:
        body = {"model": "enginegate-demo", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3}
        for _ in range(30):  # a new connection each time: the workers take turns accepting
            assert httpx.post(f"{gw.base_url}/v1/chat/completions", json=body, timeout=30).status_code == 200
        pids = {p.stem.rsplit("_", 1)[-1] for p in shared.glob("*.db")}
        assert len(pids) == 2, sorted(p.name for p in shared.glob("*.db"))
        served = (
            r'enginegate_requests_total\{backend="ct2-main",code="2xx",model="enginegate-demo",'
            r'outcome="ok",route="chat"\}'
        )
        # Another worker's counts reach the shared files within a tenth of a second (telemetry/pending.py).
        wait_until(lambda: re.search(rf"^{served} 30\.0$", httpx.get(f"{gw.base_url}/metrics").text, re.M))
        for _ in range(4):
            text = httpx.get(f"{gw.base_url}/metrics").text
            assert re.search(rf"^{served} 30\.0$", text, re.M), text
            assert re.search(r'^enginegate_requests_in_flight\{route="chat"\} 0\.0$', text, re.M)
            assert re.search(r'^enginegate_backend_up\{backend="ct2-main"\} 1\.0$', text, re.M)
        check = subprocess.run([shutil.which("promtool") or "promtool", "check", "metrics"], input=text,
                               capture_output=True, text=True)  # fmt: skip
        assert check.returncode == 0, check.stdout + check.stderr
    finally:
        gw.stop()
