"""The SSE reader on the framings engines really send, cut at every byte boundary."""

from __future__ import annotations

import random

import pytest

from backends.sse import Event, EventParser

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
