"""``serve --workers 2``: SIGHUP to the supervisor and an admin reload reload the config in every worker,
under traffic, without a refused connection (uvicorn's own supervisor restarts every worker on
SIGHUP, and a drained worker used to shut the shared listener down for all of them)."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import httpx

from tests.conftest import GatewayProcess, write_config
from tests.polling import wait_until

ADMIN_KEY = "workers-admin-key"
CONFIG = """
limits: {health_interval_s: 0.5}
admin: {api_key_env: EG_TEST_WORKERS_ADMIN}
models:
%s
backends:
  - {name: a, engine: ctranslate2, model: enginegate-demo}
"""


def models(*names: str) -> str:
    return CONFIG % "\n".join(f'  - {{name: {n}, gguf: "{{GGUF}}"}}' for n in names)


def every_worker_lists(base: str, name: str) -> bool:
    """Fresh connections land on either worker: twenty in a row all list ``name``."""
    return all(name in {m["id"] for m in httpx.get(f"{base}/v1/models", timeout=5).json()["data"]} for _ in range(20))


def test_reloads_reach_every_worker_and_no_connection_is_refused(tmp_path: Path, cache_dir: Path) -> None:
    config = write_config(tmp_path / "w.yaml", models("enginegate-demo"))
    gw = GatewayProcess(config, cache_dir, env={"EG_TEST_WORKERS_ADMIN": ADMIN_KEY}, args=("--workers", "2"))
    errors: list[str] = []
    answered = 0
    stop = threading.Event()

    def traffic() -> None:
        nonlocal answered
        body = {"model": "enginegate-demo", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
        while not stop.is_set():
            try:  # a new connection each time: both workers and the shared listener are exercised
                status = httpx.post(f"{gw.base_url}/v1/chat/completions", json=body, timeout=30).status_code
                if status != 200:
                    errors.append(str(status))
                else:
                    answered += 1
            except httpx.HTTPError as exc:
                errors.append(f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=traffic)
    thread.start()
    try:
        wait_until(lambda: answered >= 5, timeout=30)
        write_config(config, models("enginegate-demo", "second"))
        os.kill(gw.proc.pid, signal.SIGHUP)
        wait_until(lambda: every_worker_lists(gw.base_url, "second"), timeout=30, message="SIGHUP reached a worker")
        write_config(config, models("enginegate-demo", "second", "third"))
        reply = httpx.post(f"{gw.base_url}/admin/reload", headers={"authorization": f"Bearer {ADMIN_KEY}"})
        assert reply.status_code == 200, reply.text
        wait_until(lambda: every_worker_lists(gw.base_url, "third"), timeout=30, message="admin reload spread")
        before = answered
        wait_until(lambda: answered >= before + 5, timeout=30)
    finally:
        stop.set()
        thread.join(timeout=60)
        gw.stop()
    assert errors == [], errors[:5]
    assert "Traceback" not in gw.log.read_text()
