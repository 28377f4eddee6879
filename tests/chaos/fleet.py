"""The chaos fleet: one fake process per engine kind (killable, restartable on its port) and the gateway's config.

Each start of a fake is an incarnation with its own records file (``<name>.<incarnation>.jsonl``);
``upstream()`` reads them all back, a stream cut by a kill ending at the kill.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import ROOT, free_port

MODEL = "enginegate-demo"
BACKENDS = {
    "trtllm-serve": "trtllm_serve",
    "triton": "triton_trtllm",
    "tgi": "tgi",
    "tgi-messages": "tgi_messages",
    "mii-rest": "mii_rest",
    "mii-openai": "mii_openai",
}
"""Backend name in the gateway's config -> engine kind (and the fake serving it)."""
ADMIN_ENV, ADMIN_KEY = "EG_CHAOS_ADMIN_KEY", "chaos-admin-key"
FIRST_TOKEN_TIMEOUT_S = 2.0
ANSWER_TIMEOUT_S = 8.0
"""Engines that answer whole (Triton's ensemble, MII REST) have no first token to time: a hung one is cut
by this. Left at the 20 s read timeout, two hangs drawn for one request (seed 11) took 30 s, the
clients' deadline; the fakes' whole answers take well under a second."""
HEALTH_INTERVAL_S = 0.3
DECODE_S = 0.02
"""Every fake's time per token (streaming or not): the tiny model answers in microseconds; a real
engine's answer lasts long enough for reloads, kills and leaving clients to land in the middle of it."""


@dataclass(frozen=True)
class Upstream:
    """One POST as a fake saw it."""

    backend: str
    incarnation: int
    n: int
    header: str
    """Its X-Request-Id ("" without)."""
    marker: str
    """The chaos request id found in its body ("" for probes)."""
    fault: str | None
    start: float
    end: float | None
    """None: still open when read."""

    @property
    def key(self) -> str:
        return self.header or self.marker

    @property
    def generated(self) -> bool:
        """The engine began a generation (the generic ``refuse`` and ``hang`` never reach the engine)."""
        return self.fault not in ("refuse", "hang")


@dataclass
class FakeProcess:
    name: str
    kind: str
    workdir: Path
    seed: int
    fault_rate: float
    port: int = field(default_factory=free_port)
    incarnation: int = 0
    proc: subprocess.Popen[bytes] | None = None
    killed_at: dict[int, float] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def records(self, incarnation: int) -> Path:
        return self.workdir / f"{self.name}.{incarnation}.jsonl"

    def start(self) -> None:
        self.incarnation += 1
        log = (self.workdir / f"{self.name}.{self.incarnation}.log").open("wb")
        cmd = [sys.executable, "-m", "tests.chaos.fake_process", "--kind", self.kind, "--port", str(self.port)]
        cmd += ["--records", str(self.records(self.incarnation)), "--cache", str(self.workdir / "cache")]
        cmd += ["--seed", str(self.seed), "--fault-rate", str(self.fault_rate), "--decode-s", str(DECODE_S)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def kill(self) -> None:
        """SIGKILL, as a crashing engine or an OOM kill: open connections die with it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            self.killed_at[self.incarnation] = time.monotonic()

    async def ready(self, client: httpx.AsyncClient, timeout: float = 30.0) -> float:
        """Polls until the fake answers (its chaos state, healthy or not); returns when it did."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"fake {self.name} exited: {self.proc.returncode}")
            try:
                if (await client.get(f"{self.url}/_chaos/state", timeout=1.0)).status_code == 200:
                    return time.monotonic()
            except httpx.HTTPError:
                pass
            if time.monotonic() >= deadline:
                raise AssertionError(f"fake {self.name} not ready after {timeout}s")
            await asyncio.sleep(0.05)  # polled with a deadline

    async def state(self, client: httpx.AsyncClient) -> dict[str, Any]:
        return dict((await client.get(f"{self.url}/_chaos/state", timeout=2.0)).json())

    async def knobs(self, client: httpx.AsyncClient, **values: float | bool | str | None) -> None:
        (await client.post(f"{self.url}/_chaos/knobs", json=values, timeout=2.0)).raise_for_status()

    def upstream(self) -> list[Upstream]:
        out: list[Upstream] = []
        for inc in range(1, self.incarnation + 1):
            starts: dict[int, dict[str, Any]] = {}
            ends: dict[int, float] = {}
            path = self.records(inc)
            for line in path.read_text().splitlines() if path.exists() else []:
                try:
                    doc = json.loads(line)
                except json.JSONDecodeError:  # a line cut by SIGKILL
                    continue
                if doc["ev"] == "start":
                    starts[doc["n"]] = doc
                else:
                    ends[doc["n"]] = doc["t"]
            for n, doc in starts.items():
                end = ends.get(n, self.killed_at.get(inc))
                out.append(Upstream(self.name, inc, n, doc["header"], doc["marker"], doc["fault"], doc["t"], end))
        return out

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def gateway_config(fakes: dict[str, FakeProcess], read_timeouts: dict[str, float]) -> str:
    """The gateway's YAML: every fake as a backend of one model; a probe rule per backend (a request with
    ``x-enginegate-class: probe-<name>`` prefers it). ``read_timeouts`` differ between reloads to make the
    gateway rebuild a backend (its settings changed)."""
    lines = [
        f"routing: {{first_token_timeout_s: {FIRST_TOKEN_TIMEOUT_S}, answer_timeout_s: {ANSWER_TIMEOUT_S},"
        " max_attempts: 3, rules: [",
        *(
            f"  {{name: probe-{name}, match: {{headers: {{x-enginegate-class: probe-{name}}}}}, prefer: [{name}]}},"
            for name in fakes
        ),
        "]}",
        f"limits: {{health_interval_s: {HEALTH_INTERVAL_S}}}",
        f"admin: {{api_key_env: {ADMIN_ENV}}}",
        f'models: [{{name: {MODEL}, gguf: "{{GGUF}}"}}]',
        "backends:",
    ]
    for name, fake in fakes.items():
        extra = f", deployment: {MODEL}" if fake.kind == "mii_rest" else ""
        lines.append(
            f"  - {{name: {name}, engine: {fake.kind}, url: '{fake.url}', model: {MODEL}, connect_timeout_s: 1.0,"
            f" read_timeout_s: {read_timeouts[name]}, default_max_tokens: 32{extra}}}"
        )
    return "\n".join(lines) + "\n"
