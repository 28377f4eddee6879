"""SIGTERM drains: /readyz turns 503 at once, new connections are refused after the delay, requests
in flight get the grace, streams still open then end with an error event and [DONE], the engine's
streams stop, the exit code is 0 and the log has no traceback. In one process and with workers."""

from __future__ import annotations

import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import orjson
import pytest

from tests.abuse.probes import Engine, config_text, status_of
from tests.abuse.probes import request as raw_request
from tests.conftest import GatewayProcess
from tests.polling import wait_until

pytestmark = pytest.mark.abuse

DELAY_S, GRACE_S = 0.5, 1.5
LONG, SHORT = 5, 1


def stream(port: int, tokens: int, out: list[str]) -> None:
    body = {"model": "slow", "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens, "stream": True}
    with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=30) as resp:
        assert resp.status_code == 200
        out.append(resp.read().decode())


def refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            return s.recv(100) == b""  # accepted by a backlog nobody reads: closed unanswered
    except OSError:
        return True


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_drains_streams_with_an_error_event_and_done(
    tmp_path: Path, engine: Engine, cache_dir: Path, workers: int
) -> None:
    config = tmp_path / "drain.yaml"
    config.write_text(config_text(engine, f"drain_delay_s: {DELAY_S}, shutdown_grace_s: {GRACE_S}"))
    gw = GatewayProcess(config, cache_dir, args=("--workers", str(workers)) if workers > 1 else ())
    before = engine.stats()
    long_bodies: list[str] = []
    short_bodies: list[str] = []
    threads = [threading.Thread(target=stream, args=(gw.port, 1000, long_bodies)) for _ in range(LONG)]  # 50 s
    threads += [threading.Thread(target=stream, args=(gw.port, 20, short_bodies)) for _ in range(SHORT)]  # 1 s
    try:
        for t in threads:
            t.start()
        wait_until(lambda: engine.stats()["active"] == before["active"] + LONG + SHORT, timeout=10)
        gw.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        # At once; uvicorn's worker supervisor looks at its signals every 0.5 s before passing them on.
        noticed = 0.4 if workers == 1 else 0.9
        wait_until(lambda: httpx.get(f"{gw.base_url}/readyz", timeout=2).status_code == 503, timeout=noticed)
        assert status_of(raw_request(gw.port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")) == 200
        wait_until(lambda: refused(gw.port), timeout=DELAY_S + 1.5, interval=0.05, message="still accepting")
        assert time.monotonic() - signalled >= DELAY_S - 0.05
        for t in threads:
            t.join(timeout=DELAY_S + GRACE_S + 10)
        code = gw.proc.wait(timeout=10)
    finally:
        gw.stop()
    assert code == 0
    log = gw.log.read_text()
    assert "Traceback" not in log and '"level":"error"' not in log, log[-3000:]
    assert len(short_bodies) == SHORT and all(b.endswith("data: [DONE]\n\n") and "error" not in b for b in short_bodies)
    assert len(long_bodies) == LONG
    for body in long_bodies:
        events = [e for e in body.split("\n\n") if e]
        assert events[-1] == "data: [DONE]"
        assert orjson.loads(events[-2].removeprefix("data: "))["error"]["code"] == "shutting_down"
        assert len(events) > 10  # the stream ran through the grace before it was ended
    after = engine.stats()
    assert after["active"] == before["active"]
    assert after["cut"] == before["cut"] + LONG  # the engine's work for the cut streams stopped


def anthropic_stream(port: int, out: list[str]) -> None:
    body = {"model": "slow", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000, "stream": True}
    with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/messages", json=body, timeout=30) as resp:
        assert resp.status_code == 200
        out.append(resp.read().decode())


def test_a_stream_cut_by_shutdown_ends_in_its_own_front_doors_events(
    tmp_path: Path, engine: Engine, cache_dir: Path
) -> None:
    """An Anthropic client ignores OpenAI's unnamed error event: to it that stream would just stop."""
    config = tmp_path / "drain.yaml"
    config.write_text(config_text(engine, f"drain_delay_s: 0, shutdown_grace_s: {GRACE_S}"))
    gw = GatewayProcess(config, cache_dir)
    before = engine.stats()
    bodies: list[str] = []
    thread = threading.Thread(target=anthropic_stream, args=(gw.port, bodies))
    try:
        thread.start()
        wait_until(lambda: engine.stats()["active"] == before["active"] + 1, timeout=10)
        gw.proc.send_signal(signal.SIGTERM)
        thread.join(timeout=GRACE_S + 10)
        assert gw.proc.wait(timeout=10) == 0
    finally:
        gw.stop()
    assert len(bodies) == 1
    last = [e for e in bodies[0].split("\n\n") if e][-1]
    assert last.startswith("event: error\n"), last
    assert "[DONE]" not in bodies[0]
    assert orjson.loads(last.split("data: ", 1)[1])["type"] == "error"
