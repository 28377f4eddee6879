"""What every abuse probe measures: health latency against a baseline, memory, descriptors, and a
legitimate request sent alongside the attack.

``Monitor`` runs in a thread while a probe attacks: every 50 ms it asks ``/healthz`` on a fresh
connection and samples the gateway's RSS (``/proc/<pid>/status`` VmRSS) and open descriptors.
"""

from __future__ import annotations

import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.conftest import ROOT, GatewayProcess, free_port, wait_ready

RESPONSIVE_MS = 100.0
"""A health check during an attack may take this much longer than without one (its 90th percentile)."""
STALL_MS = 1000.0
"""No health check during an attack may take longer than this."""


def rss_mb(pid: int) -> float:
    m = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(m.group(1)) / 1024 if m else 0.0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def request(port: int, raw: bytes, timeout: float = 5.0) -> bytes:
    """Send ``raw`` on a fresh connection and read until the server closes it or a response is whole."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(raw)
        return read_response(s)


def read_response(s: socket.socket) -> bytes:
    data = b""
    while True:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if sep:
            m = re.search(rb"content-length: (\d+)", head, re.I)
            if m and len(rest) >= int(m.group(1)):
                return data
        chunk = s.recv(65536)
        if not chunk:
            return data
        data += chunk


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else 0


def health_ms(port: int, timeout: float = 5.0) -> float:
    started = time.perf_counter()
    answer = request(port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", timeout)
    if status_of(answer) != 200:
        raise AssertionError(f"/healthz answered {answer[:200]!r}")
    return (time.perf_counter() - started) * 1000


def baseline_ms(port: int, n: int = 20) -> float:
    return statistics.median(health_ms(port) for _ in range(n))


@dataclass
class Monitor:
    """Health latency, RSS and descriptors of a gateway, sampled while an attack runs."""

    gateway: GatewayProcess
    pids: list[int] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    rss: list[float] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.pids = self.pids or [self.gateway.proc.pid]
        self.baseline = baseline_ms(self.gateway.port)
        self.rss_before = sum(rss_mb(p) for p in self.pids)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Monitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def sampling(self, n: int, timeout: float = 10.0) -> bool:
        """True until ``n`` health checks were made since the monitor started (for attacks to repeat)."""
        if not hasattr(self, "_sampling_until"):
            self._sampling_until = time.monotonic() + timeout
            return True
        return len(self.latencies) < n and time.monotonic() < self._sampling_until

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.latencies.append(health_ms(self.gateway.port))
            except (OSError, AssertionError) as exc:
                self.failures.append(repr(exc))
            self.rss.append(sum(rss_mb(p) for p in self.pids))
            self.fds.append(sum(open_fds(p) for p in self.pids))

    def assert_healthy(self, rss_growth_mb: float) -> None:
        """Every health check answered, in about its normal time; memory grew less than stated."""
        assert not self.failures, self.failures[:3]
        assert len(self.latencies) >= 3, "the attack ended before the gateway could be probed"
        ordered = sorted(self.latencies)
        p90 = ordered[int(len(ordered) * 0.9) - 1] if len(ordered) >= 10 else ordered[-1]
        assert p90 <= self.baseline + RESPONSIVE_MS, (self.baseline, ordered[-5:])
        assert ordered[-1] <= self.baseline + STALL_MS, (self.baseline, ordered[-5:])
        grown = max(self.rss) - self.rss_before
        assert grown <= rss_growth_mb, f"RSS grew {grown:.0f} MB (from {self.rss_before:.0f} MB)"


def legit_chat(gateway: GatewayProcess, model: str = "fast") -> None:
    """A well-behaved request completes normally."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    resp = httpx.post(f"{gateway.base_url}/v1/chat/completions", json=body, timeout=10)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == "x" * 8 * 4


class Engine:
    """tests/abuse/engine.py in its own process."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.abuse.engine", str(self.port)], cwd=ROOT)
        wait_ready(self.url, self.proc, timeout=20, path="/stats")

    def stats(self) -> dict[str, int]:
        doc: dict[str, int] = httpx.get(f"{self.url}/stats", timeout=5).json()
        return doc

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def config_text(engine: Engine, server: str) -> str:
    """A gateway in front of the fake engine: ``fast`` (tiny tokens at once), ``drip`` (8 KB tokens
    every 10 ms, 0.8 MB/s) and ``slow`` (a tiny token every 50 ms); ``server`` is the server section's
    YAML flow body."""
    models = {"fast": "tok8-0", "drip": "tok8192-10", "slow": "tok8-50"}
    return "\n".join(
        [
            f"server: {{{server}}}",
            "limits: {health_interval_s: 0.5}",
            "models:",
            *(f"  - {{name: {name}, params_b: 1, context: 131072}}" for name in models),
            "backends:",
            *(
                f"  - {{name: {name}-engine, engine: vllm, url: '{engine.url}', model: {name}, "
                f"served_model: {served}, gpu: H100}}"
                for name, served in models.items()
            ),
            "",
        ]
    )
