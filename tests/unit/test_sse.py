"""The SSE reader on the framings engines really send, cut at every byte boundary."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import orjson
import pytest

from backends.base import BackendError, EngineClock
from backends.event_batches import EventBatches
from backends.httpclient import HttpClient
from backends.sse import Event, EventParser, lone_data
from tests.fakes import sse_engine

STREAMS = [
    # vLLM / OpenAI
    (b'data: {"a":1}\n\ndata: [DONE]\n\n', [Event('{"a":1}'), Event("[DONE]")]),
    # TGI: no space after the colon, keep-alive comments
    (b':\n\ndata:{"token":"\xc3\xa9"}\n\n:\n\n', [Event('{"token":"\xe9"}')]),
    # CRLF line ends, multi-line data
    (b"data: one\r\ndata: two\r\n\r\n", [Event("one\ntwo")]),
    # older llama-server: a non-standard error field
    (b'error: {"code":400}\n\n', [Event('{"code":400}', "error")]),
    # the connection closes without the final blank line
    (b'data: {"last":true}', [Event('{"last":true}')]),
    # fields we do not use are ignored
    (b"event: ping\nid: 7\nretry: 10\ndata: x\n\n", [Event("x")]),
]


def parse(chunks: list[bytes]) -> list[Event]:
    parser = EventParser()
    out = [e for c in chunks for e in parser.feed(c)]
    return out + list(parser.close())


@pytest.mark.parametrize(("raw", "events"), STREAMS)
def test_events_are_the_same_whatever_the_network_chunking(raw: bytes, events: list[Event]) -> None:
    assert parse([raw]) == events
    for cut in range(1, len(raw)):
        assert parse([raw[:cut], raw[cut:]]) == events, cut
    assert parse([raw[i : i + 1] for i in range(len(raw))]) == events


def _reference(raw: bytes) -> list[Event]:
    """The SSE reading rules applied to a whole stream, line by line (the parser's contract)."""
    events, data, field = [], [], "data"
    lines = raw.split(b"\n")
    for line in [*lines, b""] if lines[-1] else lines:
        line = line[:-1] if line.endswith(b"\r") else line
        if line.startswith(b"data:"):
            data.append(line[6:] if line[5:6] == b" " else line[5:])
        elif line.startswith(b"error:"):
            field = "error"
            data.append(line[7:] if line[6:7] == b" " else line[6:])
        elif not line:
            if data:
                events.append(Event(b"\n".join(data).decode("utf-8", "replace"), field))
            data, field = [], "data"
    if data:
        events.append(Event(b"\n".join(data).decode("utf-8", "replace"), field))
    return events


PIECES = [
    b'data: {"a":1}\n\n', b"data:x\n\n", b"data: one\ndata: two\n\n", b": ping\n\n", b"data: crlf\r\n\r\n",
    b'error: {"code":1}\n\n', b"\n", b"event: e\ndata: y\n\n", b"data: \xc3\xa9\n\n", b"data: [DONE]\n\n",
    b"data:\n\n", b"retry: 3\n", b"data: q\r\n\n", b"data: a\rb\n\n", b"data: z",
]  # fmt: skip


@pytest.mark.parametrize("seed", range(40))
def test_any_stream_in_any_pieces_reads_as_the_rules_say(seed: int) -> None:
    """The same events as the rules give (``_reference``, on the whole stream), however the stream is
    framed and cut into reads."""
    rng = random.Random(seed)
    raw = b"".join(rng.choice(PIECES) for _ in range(rng.randint(1, 12)))
    cuts = sorted(rng.sample(range(1, len(raw)), min(len(raw) - 1, rng.randint(0, 4)))) if len(raw) > 1 else []
    chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    want = _reference(raw)
    assert parse(chunks) == want, (raw, cuts)
    for cut in range(1, len(raw)):
        assert parse([raw[:cut], raw[cut:]]) == want, (raw, cut)


@pytest.mark.parametrize(
    ("line", "lone"),
    [
        (b"data: x", True),
        (b"data: ", True),  # empty data: an event all the same
        (b"data: a\rb", True),  # a carriage return inside the line is the line's
        (b"data: x\r", False),
        (b"data:x", False),  # no space: the parser's
        (b": ping", False),
        (b"event: e", False),
        (b"", False),
    ],
)
def test_a_lone_data_line_is_told_from_anything_else(line: bytes, lone: bool) -> None:
    assert lone_data(line) is lone


JSON_PIECES = [
    b'data: {"a":1}\n\n', b'data:{"b":2}\n\n', b'data: {"c":\ndata: 3}\n\n', b": ping\n\n", b'data: {"d":4}\r\n\r\n',
    b"\n", b'event: e\ndata: {"e":5}\n\n', b'data: {"f":"\xc3\xa9"}\n\n', b"retry: 3\n", b'data: {"g":6}\r\n\n',
    b'data: {"h":"a b"}\n\n', b'data: {"i":[1,2]}\n\n',
]  # fmt: skip


class _Engine:
    name = "e"

    def transport_error(self, exc: Exception) -> BackendError:
        raise AssertionError(exc)


async def _batched(pieces: list[bytes], pace_s: float = 0.0) -> list[Any]:
    """The documents ``EventBatches`` reads from an engine that writes ``pieces`` (``pace_s`` apart)."""
    server, url = await sse_engine(pieces, pace_s)
    client = HttpClient(url)
    try:
        response = await client.request("POST", "/v1/chat/completions", b"{}")
        return [doc async for batch in EventBatches(_Engine(), response, EngineClock(), True) for doc in batch]
    finally:
        await client.aclose()
        server.close()


@pytest.mark.parametrize("seed", range(16))
def test_event_batches_read_what_the_rules_say_however_the_reads_fall(seed: int) -> None:
    """Events read from the read's bytes where each is one ``data: `` line, by the parser otherwise: the
    same documents as the rules give, in one read or cut anywhere."""
    rng = random.Random(seed)
    raw = b"".join(rng.choice(JSON_PIECES) for _ in range(rng.randint(1, 12)))
    want = [orjson.loads(e.data) for e in _reference(raw)]
    body = raw + b"data: [DONE]\n\n"
    cuts = sorted(rng.sample(range(1, len(body)), 4))
    chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    assert asyncio.run(_batched([body])) == want, raw
    assert asyncio.run(_batched(chunks)) == want, (raw, cuts)


def test_an_event_whose_blank_line_has_not_come_is_not_read_before_it() -> None:
    """A read that ends after a ``data:`` line's line break: the event may go on in the next read."""
    pieces = [b'data: {"a":\n', b"data: 1}\n\n", b'data: {"b":2}\n', b"\n", b"data: [DONE]\n\n"]
    assert asyncio.run(_batched(pieces, pace_s=0.01)) == [{"a": 1}, {"b": 2}]
