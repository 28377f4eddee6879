"""Debian's HAProxy in front of gateway replicas, and clients that keep traffic flowing through it.

``HAProxy`` writes its config in a test's directory (the settings of deploy/haproxy/haproxy.cfg,
with round robin and a short health-check interval so a test sees it act within seconds) and reads
what it thinks of each replica from its stats page. ``Traffic`` runs many streaming clients (the
official ``openai`` client) in a thread while the test kills, restarts or drains replicas, and
records how each request ended and when it started, so a test can tell the requests in flight at a
kill from those that started after it.
"""

from __future__ import annotations

import asyncio
import csv
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai

from tests.conftest import free_port
from tests.polling import wait_until

CHECK_MS = 250
"""HAProxy's health-check interval: with ``fall 2`` a draining replica (``/readyz`` 503) is out
within about 0.5 s, well inside the replicas' ``server.drain_delay_s``."""

_CONFIG = """
global
  maxconn 4096

defaults
  mode http
  timeout connect 5s
  timeout http-request 10s
  timeout client 610s
  timeout server 610s
  timeout http-keep-alive 5s
  # A connection refused (a replica gone) is tried again on another replica, never answered 503.
  retries 3
  option redispatch 1

frontend api
  bind 127.0.0.1:{port}
  default_backend gateways

frontend stats
  bind 127.0.0.1:{stats_port}
  stats enable
  stats uri /stats

backend gateways
  balance roundrobin
  # HTTP/1.1 with a Host the replicas accept on a loopback address (server.allowed_hosts).
  option httpchk
  http-check send meth GET uri /readyz ver HTTP/1.1 hdr Host localhost
  http-check expect status 200
  http-response set-header x-served-by %s
  default-server check inter {check_ms} fall 2 rise 2
{servers}
"""


class HAProxy:
    def __init__(self, directory: Path, ports: list[int]) -> None:
        self.port = free_port()
        self.stats_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.names = [f"g{i}" for i in range(len(ports))]
        servers = "\n".join(f"  server {n} 127.0.0.1:{p}" for n, p in zip(self.names, ports, strict=True))
        self.config = directory / "haproxy.cfg"
        self.config.write_text(
            _CONFIG.format(port=self.port, stats_port=self.stats_port, check_ms=CHECK_MS, servers=servers)
        )
        check = subprocess.run(["haproxy", "-c", "-q", "-f", str(self.config)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
        self.log = directory / "haproxy.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(["haproxy", "-db", "-f", str(self.config)], stdout=out, stderr=out)
        wait_until(lambda: self.up() == set(self.names), timeout=30, interval=0.1, message="replicas not up in HAProxy")

    def status(self) -> dict[str, str]:
        """Each replica's state as HAProxy sees it (``UP``, ``DOWN``, ``UP 1/2`` while it counts checks...)."""
        try:
            text = httpx.get(f"http://127.0.0.1:{self.stats_port}/stats;csv", timeout=5).text
        except httpx.HTTPError:
            return {}
        rows = csv.DictReader(text.removeprefix("# ").splitlines())
        return {r["svname"]: r["status"] for r in rows if r["pxname"] == "gateways" and r["svname"] in self.names}

    def up(self) -> set[str]:
        return {name for name, state in self.status().items() if state == "UP"}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


@dataclass(frozen=True)
class Outcome:
    started: float
    ended: float
    kind: str
    """``ok`` (a finish reason came), ``cut`` (the connection ended inside the body), ``closed`` (the
    connection closed before any response), an HTTP status (``502``), ``error-event`` (the gateway's
    SSE error), ``short`` (ended cleanly without a finish reason: never acceptable), ``connection:
    ...`` (HAProxy itself unreachable) or ``other: ...``."""
    server: str = ""


async def stream_once(client: openai.AsyncOpenAI, model: str, max_tokens: int) -> tuple[str, str]:
    """One streamed chat answer: how it ended and which replica HAProxy sent it to."""
    server = ""
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens, stream=True
        )
        server = raw.headers.get("x-served-by", "")
        finish = None
        async for chunk in raw.parse():
            finish = next((c.finish_reason for c in chunk.choices if c.finish_reason), finish)
        return ("ok" if finish else "short"), server
    except openai.APIStatusError as exc:
        return str(exc.status_code), server
    except (openai.APIConnectionError, httpx.TransportError) as exc:
        if server:  # after the headers: the body broke off, and the client knows it is incomplete
            return "cut", server
        cause = exc.__cause__ if isinstance(exc, openai.APIConnectionError) else exc
        # HAProxy closes a kept-alive client connection without an answer when the server's side
        # failed before any response on it (as servers do to idle connections: clients retry those).
        # By name: the SDK's HTTP library may be httpx, httpcore or a vendored copy.
        closed = type(cause).__name__ == "RemoteProtocolError"
        return ("closed" if closed else f"connection: {cause!r}"), server
    except openai.APIError:  # the SDK raises this for an SSE error event
        return "error-event", server


@dataclass
class Traffic:
    """``workers`` clients, each sending streamed requests one after another until ``stop``."""

    url: str
    key: str
    workers: int = 12
    model: str = "slow"
    max_tokens: int = 10
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def __enter__(self) -> Traffic:
        self._thread.start()
        wait_until(lambda: len(self.outcomes) >= self.workers, timeout=30, message="no traffic got through")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    async def _run(self) -> None:
        async with openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=self.key, max_retries=0, timeout=60) as c:
            await asyncio.gather(*(self._worker(c) for _ in range(self.workers)))

    async def _worker(self, client: openai.AsyncOpenAI) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                kind, server = await stream_once(client, self.model, self.max_tokens)
            except Exception as exc:  # recorded, so the test names it instead of losing a worker
                kind, server = f"other: {exc!r}", ""
            self.outcomes.append(Outcome(started, time.monotonic(), kind, server))

    def completed_since(self, moment: float) -> int:
        return sum(1 for o in self.outcomes if o.started > moment)

    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.kind != "ok"]


def burst(url: str, key: str, n: int, **kw: Any) -> list[int | str]:
    """``n`` non-streamed requests at once: each one's status, or the error code of a refusal."""

    async def run() -> list[int | str]:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60) as c:

            async def one() -> int | str:
                try:
                    await c.chat.completions.create(
                        model=kw.get("model", "fast"), messages=[{"role": "user", "content": "hi"}],
                        max_tokens=kw.get("max_tokens", 2),
                    )  # fmt: skip
                except openai.APIStatusError as exc:
                    return str(exc.code or exc.status_code)
                return 200

            return list(await asyncio.gather(*(one() for _ in range(n))))

    return asyncio.run(run())
