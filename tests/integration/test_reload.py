"""Hot reload: SIGHUP and the admin endpoint swap the config under steady load without losing a request."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.conftest import GatewayProcess, write_config
from tests.polling import wait_until

ADMIN_KEY = "test-admin-key"
HEAD = """
limits: {health_interval_s: 0.5}
admin: {api_key_env: EG_TEST_ADMIN_KEY}
models:
  - {name: enginegate-demo, gguf: "{GGUF}"}
backends:
  - {name: a, engine: ctranslate2, model: enginegate-demo}
  - {name: b, engine: ctranslate2, model: enginegate-demo}
"""


def prefer(name: str) -> str:
    return HEAD + f"routing:\n  rules:\n    - {{name: prefer-{name}, prefer: [{name}]}}\n"


def reloads(gateway: GatewayProcess, outcome: str) -> float:
    text = httpx.get(f"{gateway.base_url}/metrics").text
    m = re.search(rf'^enginegate_config_reloads_total\{{outcome="{outcome}"\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


@pytest.fixture()
def gateway(tmp_path: Path, cache_dir: Path) -> GatewayProcess:
    config = write_config(tmp_path / "live.yaml", prefer("a"))
    proc = GatewayProcess(config, cache_dir, env={"EG_TEST_ADMIN_KEY": ADMIN_KEY})
    proc.config = config  # type: ignore[attr-defined]
    return proc


def steady_load(gateway: GatewayProcess, stop: threading.Event, seen: list[tuple[float, int, str]]) -> None:
    body = {"model": "enginegate-demo", "messages": [{"role": "user", "content": "Hello"}], "temperature": 0}
    with httpx.Client(timeout=30) as client:
        while not stop.is_set():
            for stream in (False, True):
                r = client.post(f"{gateway.base_url}/v1/chat/completions", json={**body, "stream": stream})
                ok = (
                    r.status_code == 200 and ("Hello" in r.text) and (not stream or r.text.endswith("data: [DONE]\n\n"))
                )
                seen.append(
                    (
                        time.monotonic(),
                        r.status_code if ok else -r.status_code,
                        r.headers.get("x-enginegate-backend", ""),
                    )
                )


def test_sighup_reload_under_load_loses_nothing_and_changes_routing(gateway: GatewayProcess) -> None:
    config: Path = gateway.config  # type: ignore[attr-defined]
    try:
        stop, seen = threading.Event(), []  # type: ignore[var-annotated]
        workers = [threading.Thread(target=steady_load, args=(gateway, stop, seen)) for _ in range(4)]
        for w in workers:
            w.start()
        try:
            # Load runs through the old routing first, then through the reload and well past it.
            wait_until(lambda: len(seen) >= 24, timeout=30, message="the steady load never got going")
            write_config(config, prefer("b"))
            reloaded_at = time.monotonic()
            os.kill(gateway.proc.pid, signal.SIGHUP)
            wait_until(lambda: reloads(gateway, "ok") >= 1, timeout=10, interval=0.05, message="SIGHUP: no reload")
            wait_until(
                lambda: sum(t > reloaded_at + 0.5 for t, _, _ in list(seen)) >= 20,
                timeout=30,
                message="too few requests after the reload",
            )
        finally:
            stop.set()
            for w in workers:
                w.join()
        assert len(seen) > 40
        assert all(status == 200 for _, status, _ in seen), Counter(s for _, s, _ in seen)
        before = Counter(b for t, _, b in seen if t < reloaded_at)
        after = Counter(b for t, _, b in seen if t > reloaded_at + 0.5)
        assert set(before) == {"a"} and set(after) == {"b"}, (before, after)
        assert reloads(gateway, "ok") == 1
    finally:
        gateway.stop()


def test_a_broken_file_is_rejected_and_the_running_config_kept(gateway: GatewayProcess) -> None:
    config: Path = gateway.config  # type: ignore[attr-defined]
    url = f"{gateway.base_url}/admin/reload"
    auth = {"authorization": f"Bearer {ADMIN_KEY}"}
    try:
        config.write_text(prefer("b").replace("engine: ctranslate2", "engine: ctranslate3", 1))
        resp = httpx.post(url, headers=auth)
        assert resp.status_code == 422
        assert "unknown engine 'ctranslate3'" in resp.json()["problems"][0]
        assert resp.json()["problems"][0].startswith(f"{config}:7: backends[0].engine")
        os.kill(gateway.proc.pid, signal.SIGHUP)
        wait_until(lambda: reloads(gateway, "error") >= 2, timeout=10, interval=0.05, message="SIGHUP never tried")
        assert reloads(gateway, "error") == 2
        r = httpx.post(
            f"{gateway.base_url}/v1/completions",
            json={"model": "enginegate-demo", "prompt": "The Zen", "max_tokens": 3},
        )
        assert r.status_code == 200 and r.headers["x-enginegate-backend"] == "a"
        assert httpx.post(url).status_code == 401
        write_config(config, prefer("b"))
        assert httpx.post(url, headers=auth).json()["status"] == "reloaded"
        r = httpx.post(
            f"{gateway.base_url}/v1/completions",
            json={"model": "enginegate-demo", "prompt": "The Zen", "max_tokens": 3},
        )
        assert r.headers["x-enginegate-backend"] == "b" and r.headers["x-enginegate-rule"] == "prefer-b"
        explain = httpx.post(
            f"{gateway.base_url}/admin/route/explain",
            headers=auth,
            json={"model": "enginegate-demo", "prompt_tokens": 10, "max_tokens": 5, "ttft_budget_ms": 1000},
        ).json()
        assert explain["rule"] == "prefer-b" and [c["backend"] for c in explain["candidates"]] == ["b", "a"]
        assert explain["reason"] == "meets_budget"
    finally:
        gateway.stop()
