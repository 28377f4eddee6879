"""Idle sockets are closed and open connections are capped below the descriptor limit; beyond the
cap a request gets a fast 503 with Retry-After, and the health routes are still answered."""

from __future__ import annotations

import resource
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from gateway.http.limits import HEALTH_ROOM
from tests.abuse.conftest import SERVER
from tests.abuse.probes import Engine, Monitor, config_text, health_ms, legit_chat, open_fds, request, status_of
from tests.conftest import GatewayProcess
from tests.polling import wait_until

pytestmark = pytest.mark.abuse

IDLE = 2000


@pytest.fixture()
def many_fds() -> Iterator[None]:
    """This process holds thousands of sockets for the probe."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = IDLE + 512
    if soft != resource.RLIM_INFINITY and soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.fail(f"the open-file hard limit {hard} is below the {wanted} this probe needs")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_idle_connections_are_closed_and_capped(guarded: GatewayProcess, many_fds: None) -> None:
    pid = guarded.proc.pid
    fds_before = open_fds(pid)
    socks: list[socket.socket] = []
    with Monitor(guarded) as mon:
        try:
            for _ in range(IDLE):
                socks.append(socket.create_connection(("127.0.0.1", guarded.port)))
            legit_chat(guarded)
            closed: set[socket.socket] = set()

            def all_closed() -> bool:
                for s in [s for s in socks if s not in closed]:
                    try:
                        while s.recv(65536, socket.MSG_DONTWAIT):  # a fast 503 beyond the cap, then the end
                            pass
                        closed.add(s)
                    except BlockingIOError:
                        pass  # still open
                    except OSError:
                        closed.add(s)
                return len(closed) == IDLE

            # keep_alive_timeout_s is 1 s: left open, they would stay open past the deadline
            wait_until(all_closed, timeout=8, interval=0.1, message="idle connections left open")
        finally:
            for s in socks:
                s.close()
    # The gateway never held more than its cap (200), the health room and what it had before.
    assert max(mon.fds) <= fds_before + 200 + HEALTH_ROOM + 8, (fds_before, max(mon.fds))
    mon.assert_healthy(rss_growth_mb=40)


@pytest.fixture()
def capped(tmp_path: Path, engine: Engine, cache_dir: Path) -> Iterator[GatewayProcess]:
    config = tmp_path / "capped.yaml"
    config.write_text(config_text(engine, SERVER.replace("max_connections: 200", "max_connections: 10")))
    gw = GatewayProcess(config, cache_dir)
    yield gw
    gw.stop()


def stream(port: int, tokens: int, out: list[bytes]) -> None:
    body = orjson.dumps({"model": "slow", "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens,
                         "stream": True})  # fmt: skip
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=20) as client:
        resp = client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        out.append(resp.content)


def test_connections_beyond_the_cap_get_a_fast_503(capped: GatewayProcess, engine: Engine) -> None:
    port = capped.port
    active = engine.stats()["active"]
    bodies: list[bytes] = []
    streams = [threading.Thread(target=stream, args=(port, 40, bodies)) for _ in range(10)]  # 2 s each
    for t in streams:
        t.start()
    try:
        wait_until(lambda: engine.stats()["active"] == active + 10, timeout=5, message="streams did not start")
        answer = request(port, b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert status_of(answer) == 503, answer[:300]
        head, _, body = answer.partition(b"\r\n\r\n")
        assert b"retry-after: 1" in head.lower()
        assert orjson.loads(body)["error"]["code"] == "too_many_connections"
        health_ms(port)  # the health routes are still answered beyond the cap (200, or it raises)
        # Fast: both were answered while every stream still ran, not queued behind one of them.
        assert engine.stats()["active"] == active + 10 and not bodies
        answer = request(port, b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert status_of(answer) == 200
    finally:
        for t in streams:
            t.join(timeout=20)
    assert len(bodies) == 10 and all(b.endswith(b"data: [DONE]\n\n") for b in bodies)  # the legitimate ones
