"""Clients that stop reading a stream are dropped once their output buffer stays full past
``write_timeout_s``: memory stays bounded and the engine's own stream count shows its work stopped."""

from __future__ import annotations

import socket

import orjson
import pytest

from tests.abuse.probes import Engine, Monitor, legit_chat
from tests.conftest import GatewayProcess
from tests.polling import wait_until

pytestmark = pytest.mark.abuse

READERS = 20


def test_slow_readers_are_dropped_and_their_engine_streams_cancelled(guarded: GatewayProcess, engine: Engine) -> None:
    before = engine.stats()
    body = orjson.dumps(
        {"model": "drip", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 30000, "stream": True}
    )  # 0.8 MB/s for 5 minutes if nobody stopped it
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    socks = []
    with Monitor(guarded) as mon:
        try:
            for _ in range(READERS):
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # and never read
                s.connect(("127.0.0.1", guarded.port))
                s.sendall(head + body)
                socks.append(s)
            wait_until(lambda: engine.stats()["started"] >= before["started"] + READERS, timeout=5)
            legit_chat(guarded)
            # write_timeout_s is 1.5 s: every reader's stream is cut at the engine soon after.
            wait_until(
                lambda: engine.stats()["cut"] >= before["cut"] + READERS, timeout=8, message="engine streams still run"
            )
            legit_chat(guarded)
        finally:
            for s in socks:
                s.close()
    after = engine.stats()
    assert after["active"] == before["active"]
    assert after["finished"] == before["finished"] + 2  # only the two legitimate requests ran to their end
    # Each stalled reader costs its output buffer (64 KB here) plus what the engine client read ahead
    # until the cut (0.8 MB/s for about 2 s): some 35 MB for all. Left uncut they grow by 0.8 MB/s each.
    mon.assert_healthy(rss_growth_mb=60)
