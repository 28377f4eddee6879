"""A real Prometheus scrapes a running gateway; the shipped scrape config and alert rules pass promtool."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import ROOT, GatewayProcess, free_port, write_config


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


@contextlib.contextmanager
def prometheus(tmp_path: Path, jobs: str) -> Iterator[str]:
    """A real Prometheus scraping every second with these ``scrape_configs`` entries; yields its query URL."""
    config = tmp_path / "prometheus.yml"
    config.write_text(f"global: {{scrape_interval: 1s}}\nscrape_configs:\n{jobs}")
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
        yield f"http://127.0.0.1:{port}/api/v1/query"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def stored(query: str, expr: str) -> list[dict[str, Any]]:
    """The series ``expr`` selects, once Prometheus has them (empty after 30 s of polling)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            reply = httpx.get(query, params={"query": expr}, timeout=5)
        except httpx.HTTPError:
            reply = None
        if reply is not None and reply.status_code == 200 and reply.json()["data"]["result"]:
            found: list[dict[str, Any]] = reply.json()["data"]["result"]
            return found
        time.sleep(1)
    return []


def test_a_real_prometheus_scrapes_the_gateway(gateway: GatewayProcess, tmp_path: Path) -> None:
    target = gateway.base_url.removeprefix("http://")
    job = f"  - job_name: enginegate\n    static_configs:\n      - targets: ['{target}']\n"
    with prometheus(tmp_path, job) as query:
        body = {"model": "enginegate-demo", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
        httpx.post(f"{gateway.base_url}/v1/chat/completions", json=body, timeout=30).raise_for_status()
        found = stored(query, 'enginegate_requests_total{outcome="ok"}')
        assert found, "Prometheus never stored the gateway's series"
        assert any(r["metric"].get("backend") == "ct2-main" and r["metric"]["job"] == "enginegate" for r in found)
        up = httpx.get(query, params={"query": 'up{job="enginegate"}'}, timeout=5).json()["data"]["result"]
        assert up and up[0]["value"][1] == "1"


def test_a_real_prometheus_scrapes_metrics_that_need_a_key(tmp_path: Path, cache_dir: Path) -> None:
    """``metrics.api_key_env``: the scrape config's ``authorization: {credentials: ...}`` gets in, a
    scrape without it is refused (``up`` 0)."""
    config = write_config(
        tmp_path / "gw.yaml",
        """
metrics: {api_key_env: EG_TEST_METRICS_KEY}
models: [{name: enginegate-demo, gguf: "{GGUF}"}]
backends: [{name: ct2-main, engine: ctranslate2, model: enginegate-demo}]
""",
    )
    gw = GatewayProcess(config, cache_dir, env={"EG_TEST_METRICS_KEY": "scrape-secret"})
    target = gw.base_url.removeprefix("http://")
    jobs = (
        f"  - job_name: keyed\n    authorization: {{credentials: scrape-secret}}\n"
        f"    static_configs: [{{targets: ['{target}']}}]\n"
        f"  - job_name: bare\n    static_configs: [{{targets: ['{target}']}}]\n"
    )
    try:
        with prometheus(tmp_path, jobs) as query:
            assert stored(query, 'up{job="keyed"} == 1'), "the keyed scrape never succeeded"
            assert stored(query, 'up{job="bare"} == 0'), "the scrape without the key was not refused"
            assert stored(query, 'enginegate_backend_up{job="keyed",backend="ct2-main"}')
    finally:
        gw.stop()
