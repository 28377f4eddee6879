"""A real Prometheus scrapes a running gateway; the shipped scrape config and alert rules pass promtool."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import ROOT, GatewayProcess, free_port


def tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} missing: make test installs Debian's prometheus package"
    return path


def test_shipped_prometheus_config_and_alert_rules_pass_promtool() -> None:
    promtool = tool("promtool")
    for args in (
        ["check", "config", "prometheus.yml"],
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts_test.yml"],
    ):
        result = subprocess.run([promtool, *args], cwd=ROOT / "deploy/prometheus", capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_a_real_prometheus_scrapes_the_gateway(gateway: GatewayProcess, tmp_path: Path) -> None:
    target = gateway.base_url.removeprefix("http://")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: enginegate\n    static_configs:\n      - targets: ['{target}']\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            tool("prometheus"),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        body = {"model": "enginegate-demo", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
        httpx.post(f"{gateway.base_url}/v1/chat/completions", json=body, timeout=30).raise_for_status()
        query = f"http://127.0.0.1:{port}/api/v1/query"
        found: list[dict[str, Any]] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not found:
            time.sleep(1)
            try:
                reply = httpx.get(query, params={"query": 'enginegate_requests_total{outcome="ok"}'}, timeout=5)
            except httpx.HTTPError:
                continue
            if reply.status_code == 200:
                found = reply.json()["data"]["result"]
        assert found, "Prometheus never stored the gateway's series"
        assert any(r["metric"].get("backend") == "ct2-main" and r["metric"]["job"] == "enginegate" for r in found)
        up = httpx.get(query, params={"query": 'up{job="enginegate"}'}, timeout=5).json()["data"]["result"]
        assert up and up[0]["value"][1] == "1"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
