"""Request heads and bodies that are too big, too many or too slow are refused with OpenAI error
JSON and cost the gateway neither memory nor responsiveness."""

from __future__ import annotations

import re
import select
import socket
import threading
import time

import httpx
import orjson
import pytest

from tests.abuse.probes import Monitor, legit_chat, read_response, request, status_of
from tests.conftest import GatewayProcess

pytestmark = pytest.mark.abuse

HEAD = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"


def error_code(answer: bytes) -> str:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), head
    return str(orjson.loads(body)["error"]["code"])


def flood(port: int, prefix: bytes, total: int, result: list[tuple[bytes, float]]) -> None:
    """Send ``prefix`` then ``total`` bytes of one endless header value, reading whatever comes back,
    until the gateway closes the connection; ``result`` gets (answer, seconds until closed)."""
    started = time.monotonic()
    s = socket.create_connection(("127.0.0.1", port))
    s.setblocking(False)
    pending, sent, answer = prefix, 0, b""
    chunk = b"a" * (1 << 20)
    try:
        while time.monotonic() - started < 20:
            readable, writable, _ = select.select([s], [s] if sent < total else [], [], 0.5)
            if readable:
                data = s.recv(65536)
                if not data:
                    break
                answer += data
            if writable:
                n = s.send(pending or chunk)
                sent += n
                pending = (pending or chunk)[n:] if pending else b""
    except OSError:
        pass  # reset once the gateway is done with it
    finally:
        s.close()
    result.append((answer, time.monotonic() - started))


def test_huge_and_numerous_headers_get_431(guarded: GatewayProcess) -> None:
    port = guarded.port
    huge = HEAD + b"X-Big: " + b"a" * (16 << 20) + b"\r\n\r\n"
    numerous = HEAD + b"".join(b"X-%d: 1\r\n" % i for i in range(100_000)) + b"\r\n"
    counted = HEAD + b"".join(b"X-%d: 1\r\n" % i for i in range(150)) + b"\r\n"  # small, but too many
    with Monitor(guarded) as mon:
        while mon.sampling(5):  # the attack lasts until the gateway was probed during it
            for raw, code in ((huge, "request_header_too_large"), (numerous, "request_header_too_large")):
                answer = request(port, raw, timeout=10)
                assert status_of(answer) == 431 and error_code(answer) == code
            answer = request(port, counted)
            assert status_of(answer) == 431 and error_code(answer) == "too_many_headers"
        legit_chat(guarded)
    mon.assert_healthy(rss_growth_mb=30)


def test_unterminated_64mb_heads_from_four_connections(guarded: GatewayProcess) -> None:
    results: list[tuple[bytes, float]] = []
    rounds = 0
    with Monitor(guarded) as mon:
        while mon.sampling(5):  # the gateway answers each flood at once: flood again until probed
            rounds += 1
            threads = [
                threading.Thread(target=flood, args=(guarded.port, HEAD + b"X-Big: ", 64 << 20, results))
                for _ in range(4)
            ]
            for t in threads:
                t.start()
            legit_chat(guarded)
            for t in threads:
                t.join(timeout=30)
    assert len(results) == 4 * rounds
    for answer, closed_after in results:
        assert status_of(answer) == 431, answer[:200]
        assert closed_after < 5
    mon.assert_healthy(rss_growth_mb=30)


def test_long_url_and_invalid_http_answer_openai_json(guarded: GatewayProcess) -> None:
    answer = request(guarded.port, b"GET /v1/models?" + b"q" * 20_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert status_of(answer) == 414 and error_code(answer) == "url_too_long"
    answer = request(guarded.port, b"NOT HTTP AT ALL\r\n\r\n")
    assert status_of(answer) == 400 and error_code(answer) == "invalid_http_request"


def trickle(port: int, head: bytes, drip: bytes, n: int, within: float) -> list[tuple[int, float]]:
    """``n`` connections send ``head`` then ``drip`` every 0.2 s; (status, seconds) as each is answered."""
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
    started = time.monotonic()
    for s in socks:
        s.sendall(head)
    answers: dict[socket.socket, tuple[int, float]] = {}
    while len(answers) < n and time.monotonic() - started < within:
        waiting = [s for s in socks if s not in answers]
        readable, _, _ = select.select(waiting, [], [], 0.2)
        for s in readable:
            answers[s] = (status_of(read_response(s)), time.monotonic() - started)
        for s in waiting:
            if s not in answers:
                try:
                    s.sendall(drip)
                except OSError:
                    answers[s] = (0, time.monotonic() - started)
    for s in socks:
        s.close()
    return list(answers.values())


def test_slowloris_heads_time_out_with_408(guarded: GatewayProcess) -> None:
    with Monitor(guarded) as mon:
        answers = trickle(guarded.port, HEAD, b"X-Slow: 1\r\n", 50, within=6)
        legit_chat(guarded)
    assert len(answers) == 50
    assert all(status == 408 and 0.9 < seconds < 3 for status, seconds in answers), answers[:5]
    mon.assert_healthy(rss_growth_mb=20)


def test_body_trickle_times_out_with_408(guarded: GatewayProcess) -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n{"
    )
    with Monitor(guarded) as mon:
        answers = trickle(guarded.port, head, b" " * 10, 20, within=6)
        legit_chat(guarded)
    assert len(answers) == 20
    assert all(status == 408 and 0.9 < seconds < 3 for status, seconds in answers), answers[:5]
    mon.assert_healthy(rss_growth_mb=20)


def protocol_refusals(gateway: GatewayProcess, status_class: str) -> float:
    text = httpx.get(f"{gateway.base_url}/metrics", timeout=5).text
    pattern = rf'^enginegate_requests_total\{{[^}}]*code="{status_class}"[^}}]*route="protocol"\}} (\S+)$'
    return sum(float(v) for v in re.findall(pattern, text, re.M))


def test_protocol_refusals_are_counted_like_every_other_response(guarded: GatewayProcess) -> None:
    """An error-ratio alert sees them too (an outside audit found 431/414/400s uncounted)."""
    before = protocol_refusals(guarded, "4xx")
    assert status_of(request(guarded.port, b"NOT HTTP AT ALL\r\n\r\n")) == 400
    too_many = HEAD + b"".join(b"X-%d: 1\r\n" % i for i in range(150)) + b"\r\n"
    assert status_of(request(guarded.port, too_many)) == 431
    assert protocol_refusals(guarded, "4xx") == before + 2


def test_a_head_just_over_the_limit_is_refused_however_it_arrives(guarded: GatewayProcess) -> None:
    """One read or several: 70,000 bytes against a 65,536-byte limit is a 431 (an audit saw a 200)."""
    over = HEAD + b"X-Big: " + b"a" * 70_000 + b"\r\n\r\n"
    assert status_of(request(guarded.port, over)) == 431
    under = HEAD + b"X-Big: " + b"a" * 60_000 + b"\r\n\r\n"
    assert status_of(request(guarded.port, under)) == 200


@pytest.mark.parametrize(
    ("raw", "status", "code"),
    [
        (b"GET /healthz HTTP/1.1\r\n\r\n", 400, "missing_host"),
        (b"GET http://evil.example/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 400, "invalid_target"),
        (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Encoding: gzip\r\nContent-Length: 2\r\n\r\n{}",
            415,
            "unsupported_media",
        ),
    ],
    ids=["no host", "absolute-form target", "compressed body"],
)
def test_requests_the_gateway_cannot_serve_as_meant_are_refused(
    guarded: GatewayProcess, raw: bytes, status: int, code: str
) -> None:
    """Found by an outside audit: these got 200 (the Host check and the body were bypassed)."""
    answer = request(guarded.port, raw)
    assert status_of(answer) == status and error_code(answer) == code
